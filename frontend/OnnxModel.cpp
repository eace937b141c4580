// Reading ONNX files (OnnxModel.h), the graph-input listing and the
// resolver for ONNX tensor references in .cir text (OnnxImporter.h).
#include "frontend/OnnxModel.h"

#include "frontend/ImportContext.h"
#include "frontend/OnnxImporter.h"
#include "frontend/OnnxTensor.h"
#include "support/FileIO.h"

#include "llvm/Support/MemoryBuffer.h"
#include "llvm/Support/Path.h"

#include <google/protobuf/io/coded_stream.h>

#include <climits>
#include <set>

namespace cleave::frontend {

using namespace cleave::ir;

llvm::Expected<std::unique_ptr<onnx::ModelProto>>
readOnnxModel(const std::string &path) {
  auto buf = support::readFile(path, "ONNX file");
  if (!buf)
    return buf.takeError();
  size_t size = (*buf)->getBufferSize();
  if (size == 0)
    return importError("'{0}' is empty, not an ONNX model", path);
  if (size > size_t(INT_MAX))
    return importError(
        "'{0}' is larger than 2 GiB; save the model with its weights "
        "as external data",
        path);
  auto model = std::make_unique<onnx::ModelProto>();
  google::protobuf::io::CodedInputStream in(
      reinterpret_cast<const uint8_t *>((*buf)->getBufferStart()), int(size));
  in.SetTotalBytesLimit(INT_MAX);
  if (!model->ParseFromCodedStream(&in) || !in.ConsumedEntireMessage())
    return importError(
        "'{0}' is not a valid ONNX model (truncated or not an ONNX "
        "protobuf file)",
        path);
  if (!model->has_graph() || model->ir_version() <= 0)
    return importError("'{0}' is not an ONNX model (no graph or IR version)",
                       path);
  return model;
}

llvm::Expected<std::vector<std::string>>
onnxInputNames(const std::string &path) {
  auto model = readOnnxModel(path);
  if (!model)
    return model.takeError();
  std::set<std::string> inits;
  for (const auto &t : (*model)->graph().initializer())
    inits.insert(t.name());
  std::vector<std::string> names;
  for (const auto &in : (*model)->graph().input())
    if (!inits.count(in.name()))
      names.push_back(in.name());
  return names;
}

namespace {
// Loads `onnx<"file", "initializer">` references, keeping the last model
// read so that a graph with many references parses the file once.
class OnnxDataResolver : public DataResolver {
public:
  llvm::Expected<std::vector<uint8_t>>
  load(const DataOrigin &origin, const TensorType &expected) override {
    if (origin.kind != DataOrigin::Kind::OnnxInitializer)
      return readRawFileData(origin, expected);
    if (!model_ || path_ != origin.path) {
      auto m = readOnnxModel(origin.path);
      if (!m)
        return m.takeError();
      model_ = std::move(*m);
      path_ = origin.path;
    }
    for (const auto &t : model_->graph().initializer()) {
      if (t.name() != origin.key)
        continue;
      auto d = tensorFromOnnx(
          t, llvm::sys::path::parent_path(origin.path).str(), origin);
      if (!d)
        return d.takeError();
      if ((*d)->type() != expected)
        return importError(
            "initializer '{0}' in '{1}' is {2}, but the IR declares "
            "{3}",
            origin.key, origin.path, (*d)->type().str(), expected.str());
      llvm::ArrayRef<uint8_t> b = (*d)->bytes();
      return std::vector<uint8_t>(b.begin(), b.end());
    }
    return importError("'{0}' has no initializer named '{1}'", origin.path,
                       origin.key);
  }

private:
  std::unique_ptr<onnx::ModelProto> model_;
  std::string path_;
};
} // namespace

void installOnnxDataResolver() {
  static OnnxDataResolver resolver;
  setDataResolver(&resolver);
}

} // namespace cleave::frontend
