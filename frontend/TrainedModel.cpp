// writeTrainedOnnx: copies an ONNX model with new initializer data (see
// TrainedModel.h). The source's external data is read into the proto, the
// named initializers get their new bytes as raw_data, and the model is
// written through temporary files renamed into place; models too large for
// one protobuf message keep their tensor data in `<outPath>.data`.
#include "frontend/TrainedModel.h"

#include "frontend/OnnxTensor.h"
#include "ir/TypeRules.h"
#include "support/Errors.h"
#include "support/FileIO.h"

#include "llvm/ADT/StringMap.h"
#include "llvm/Support/FileSystem.h"
#include "llvm/Support/MemoryBuffer.h"
#include "llvm/Support/Path.h"
#include "llvm/Support/Process.h"
#include "llvm/Support/raw_ostream.h"

#include <google/protobuf/io/coded_stream.h>
#include <google/protobuf/io/zero_copy_stream_impl.h>
#include <onnx/onnx_pb.h>

#include <climits>
#include <set>
#include <vector>

namespace cleave::frontend {

using namespace cleave::ir;

namespace {

// Tensors of at least this many bytes go to the side file of a large model
// (the threshold onnx.external_data_helper uses).
constexpr size_t kExternalThreshold = 1024;

llvm::Expected<std::unique_ptr<onnx::ModelProto>>
readModelFile(const std::string &path) {
  auto buf = support::readFile(path, "ONNX file");
  if (!buf)
    return buf.takeError();
  size_t size = (*buf)->getBufferSize();
  if (size == 0)
    return fail("'" + path + "' is empty, not an ONNX model");
  if (size > size_t(INT_MAX))
    return fail("'" + path +
                "' is larger than 2 GiB; save the model with its "
                "weights as external data");
  auto model = std::make_unique<onnx::ModelProto>();
  google::protobuf::io::CodedInputStream in(
      reinterpret_cast<const uint8_t *>((*buf)->getBufferStart()), int(size));
  in.SetTotalBytesLimit(INT_MAX);
  if (!model->ParseFromCodedStream(&in) || !in.ConsumedEntireMessage() ||
      !model->has_graph())
    return fail("'" + path +
                "' is not a valid ONNX model (truncated or not "
                "an ONNX protobuf file)");
  return model;
}

// Every tensor of a graph that can carry external data: initializers,
// sparse initializers and node attributes, subgraphs included.
void collectTensors(onnx::GraphProto &g, std::vector<onnx::TensorProto *> &out) {
  for (auto &t : *g.mutable_initializer())
    out.push_back(&t);
  for (auto &s : *g.mutable_sparse_initializer()) {
    out.push_back(s.mutable_values());
    out.push_back(s.mutable_indices());
  }
  for (auto &n : *g.mutable_node())
    for (auto &a : *n.mutable_attribute()) {
      if (a.has_t())
        out.push_back(a.mutable_t());
      for (auto &t : *a.mutable_tensors())
        out.push_back(&t);
      if (a.has_sparse_tensor()) {
        out.push_back(a.mutable_sparse_tensor()->mutable_values());
        out.push_back(a.mutable_sparse_tensor()->mutable_indices());
      }
      if (a.has_g())
        collectTensors(*a.mutable_g(), out);
      for (auto &sub : *a.mutable_graphs())
        collectTensors(sub, out);
    }
}

// Stores `bytes` as the tensor's only data, inline.
void setInline(onnx::TensorProto &t, std::string bytes) {
  t.clear_float_data();
  t.clear_int32_data();
  t.clear_string_data();
  t.clear_int64_data();
  t.clear_double_data();
  t.clear_uint64_data();
  t.clear_external_data();
  t.set_data_location(onnx::TensorProto::DEFAULT);
  t.set_raw_data(std::move(bytes));
}

// Reads an external tensor's bytes into raw_data. The location must stay
// inside `modelDir` (as the importer requires); a missing length means "to
// the end of the file", as in ONNX.
llvm::Error internalize(onnx::TensorProto &t, const std::string &modelDir,
                        const std::string &modelPath) {
  const std::string what =
      "'" + modelPath + "': tensor '" + t.name() + "'";
  auto ext = externalDataOf(t, modelDir);
  if (!ext)
    return fail("'" + modelPath + "': " + llvm::toString(ext.takeError()));
  const std::string &location = ext->location, &real = ext->path;
  int64_t offset = ext->offset, length = ext->length;
  uint64_t fileSize = 0;
  if (llvm::sys::fs::file_size(real, fileSize) || uint64_t(offset) > fileSize)
    return fail(what + ": external data file '" + location + "' is too short");
  if (length < 0)
    length = int64_t(fileSize - offset);
  if (uint64_t(offset) + uint64_t(length) > fileSize)
    return fail(what + ": external data file '" + location +
                "' is too short (" + std::to_string(fileSize) +
                " bytes; needs " + std::to_string(length) + " at offset " +
                std::to_string(offset) + ")");
  std::string bytes;
  if (length > 0) {
    auto buf = support::readFileSlice(real, uint64_t(offset),
                                      uint64_t(length), "data file");
    if (!buf)
      return fail(what + ": cannot read external data file '" + location +
                  "': " + llvm::toString(buf.takeError()));
    bytes = (*buf)->getBuffer().str();
  }
  setInline(t, std::move(bytes));
  return llvm::Error::success();
}

// The type an initializer declares, for messages and checks.
std::string describe(const onnx::TensorProto &t) {
  std::string s = onnxTypeName(t.data_type());
  auto dt = dtypeFromOnnx(t.data_type());
  if (!dt) {
    llvm::consumeError(dt.takeError());
    return s + shapeStr(Shape(t.dims().begin(), t.dims().end()));
  }
  return TensorType(*dt, Shape(t.dims().begin(), t.dims().end())).str();
}

// Files being written, removed unless committed.
struct TempFiles {
  std::vector<std::string> paths;
  ~TempFiles() {
    for (const std::string &p : paths)
      llvm::sys::fs::remove(p);
  }
};

// Moves the initializers of `kExternalThreshold` bytes or more into the file
// `dataTmp`, referenced as `location`.
llvm::Error externalize(onnx::ModelProto &model, const std::string &dataTmp,
                        const std::string &location,
                        const std::string &outPath) {
  std::error_code ec;
  llvm::raw_fd_ostream os(dataTmp, ec);
  if (ec)
    return fail("cannot write '" + outPath + ".data': " + ec.message());
  uint64_t offset = 0;
  for (auto &t : *model.mutable_graph()->mutable_initializer()) {
    if (!t.has_raw_data() || t.raw_data().size() < kExternalThreshold)
      continue;
    os << t.raw_data();
    uint64_t length = t.raw_data().size();
    t.clear_raw_data();
    t.clear_external_data();
    t.set_data_location(onnx::TensorProto::EXTERNAL);
    auto add = [&](const char *key, const std::string &value) {
      auto *kv = t.add_external_data();
      kv->set_key(key);
      kv->set_value(value);
    };
    add("location", location);
    add("offset", std::to_string(offset));
    add("length", std::to_string(length));
    offset += length;
  }
  os.close();
  if (os.has_error()) {
    std::string msg = os.error().message();
    os.clear_error();
    return fail("cannot write '" + outPath + ".data': " + msg);
  }
  return llvm::Error::success();
}

} // namespace

llvm::Error writeTrainedOnnx(
    const std::string &sourceModel,
    const std::map<std::string, std::shared_ptr<TensorData>> &values,
    const std::string &outPath, uint64_t maxInlineBytes) {
  // The files are streamed (no second copy of a large model in memory), so
  // support::writeFileAtomically is not used; its rule on targets is.
  for (const std::string &target : {outPath, outPath + ".data"})
    if (auto e = support::checkOutputFile(target))
      return e;
  auto modelOr = readModelFile(sourceModel);
  if (!modelOr)
    return modelOr.takeError();
  onnx::ModelProto &model = **modelOr;
  const std::string src = "'" + sourceModel + "'";

  // Check the new values before any heavy lifting.
  llvm::StringMap<onnx::TensorProto *> inits;
  for (auto &t : *model.mutable_graph()->mutable_initializer())
    inits[t.name()] = &t;
  for (const auto &[name, data] : values) {
    auto it = inits.find(name);
    if (it == inits.end())
      return fail(src + " has no initializer named '" + name + "'");
    if (!data)
      return fail("no data given for initializer '" + name + "'");
    const onnx::TensorProto &t = *it->second;
    auto dt = dtypeFromOnnx(t.data_type());
    Shape shape(t.dims().begin(), t.dims().end());
    if (!dt) {
      llvm::consumeError(dt.takeError());
      return fail("initializer '" + name + "' in " + src + " is " +
                  describe(t) + ", which cleave cannot write");
    }
    if (data->type() != TensorType(*dt, shape))
      return fail("initializer '" + name + "' in " + src + " is " +
                  describe(t) + ", but its new value is " + data->type().str());
    if (auto e = data->load())
      return fail("initializer '" + name +
                  "': " + llvm::toString(std::move(e)));
  }

  // External data of the source becomes inline data.
  llvm::SmallString<256> dir(sourceModel);
  llvm::sys::fs::make_absolute(dir);
  llvm::sys::path::remove_filename(dir);
  std::vector<onnx::TensorProto *> tensors;
  collectTensors(*model.mutable_graph(), tensors);
  std::set<const onnx::TensorProto *> replaced;
  for (const auto &kv : values)
    replaced.insert(inits[kv.first]);
  for (onnx::TensorProto *t : tensors)
    if (t->data_location() == onnx::TensorProto::EXTERNAL &&
        !replaced.count(t))
      if (auto e = internalize(*t, std::string(dir), sourceModel))
        return e;

  for (const auto &[name, data] : values) {
    llvm::ArrayRef<uint8_t> b = data->bytes();
    setInline(*inits[name], std::string(b.begin(), b.end()));
  }

  TempFiles temps;
  const std::string pid = std::to_string(llvm::sys::Process::getProcessId());
  const std::string modelTmp = outPath + ".tmp-" + pid;
  const std::string dataPath = outPath + ".data";
  std::string dataTmp;
  if (model.ByteSizeLong() > maxInlineBytes) {
    dataTmp = dataPath + ".tmp-" + pid;
    temps.paths.push_back(dataTmp);
    if (auto e = externalize(model, dataTmp,
                             llvm::sys::path::filename(dataPath).str(),
                             outPath))
      return e;
    if (model.ByteSizeLong() > kMaxInlineOnnxBytes)
      return fail("cannot write '" + outPath +
                  "': the model is larger than "
                  "2 GiB even with its tensor data in a separate file");
  }

  // Write the model through protobuf's file stream (no second copy in
  // memory), then rename the files into place.
  int fd = -1;
  if (std::error_code ec = llvm::sys::fs::openFileForWrite(
          modelTmp, fd, llvm::sys::fs::CD_CreateAlways))
    return fail("cannot write '" + outPath + "': " + ec.message());
  temps.paths.push_back(modelTmp);
  {
    google::protobuf::io::FileOutputStream os(fd);
    bool ok = model.SerializeToZeroCopyStream(&os);
    ok &= os.Close();
    if (!ok) {
      int e = os.GetErrno();
      return fail(
          "cannot write '" + outPath + "'" +
          (e ? ": " + std::error_code(e, std::generic_category()).message()
             : std::string()));
    }
  }
  if (!dataTmp.empty()) {
    if (std::error_code ec = llvm::sys::fs::rename(dataTmp, dataPath))
      return fail("cannot write '" + dataPath + "': " + ec.message());
    temps.paths[0] = dataPath; // committed only with the model
  }
  if (std::error_code ec = llvm::sys::fs::rename(modelTmp, outPath))
    return fail("cannot write '" + outPath + "': " + ec.message());
  temps.paths.clear();
  return llvm::Error::success();
}

} // namespace cleave::frontend
