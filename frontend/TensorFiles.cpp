#include "frontend/TensorFiles.h"

#include "frontend/OnnxTensor.h"
#include "support/FileIO.h"

#include "llvm/ADT/StringExtras.h"
#include "llvm/Support/CRC.h"
#include "llvm/Support/FileSystem.h"
#include "llvm/Support/MemoryBuffer.h"
#include "llvm/Support/raw_ostream.h"

#include <onnx/onnx_pb.h>

#include <algorithm>

namespace cleave::frontend {

using namespace cleave::ir;

static llvm::Error err(const llvm::Twine &msg) {
  return llvm::createStringError(llvm::inconvertibleErrorCode(), msg.str());
}

llvm::Expected<std::shared_ptr<TensorData>>
readTensorProtoFile(const std::string &path) {
  auto buf = support::readFile(path, "tensor file");
  if (!buf)
    return buf.takeError();
  onnx::TensorProto t;
  if ((*buf)->getBufferSize() > size_t(INT_MAX) ||
      !t.ParseFromArray((*buf)->getBufferStart(),
                        int((*buf)->getBufferSize())))
    return err("'" + path + "' is not an ONNX TensorProto file");
  auto data = tensorFromOnnx(t, "", {});
  if (!data)
    return err("'" + path + "': " + llvm::toString(data.takeError()));
  return *data;
}

static int onnxTypeOf(DType d) {
  switch (d) {
  case DType::F32:
    return onnx::TensorProto::FLOAT;
  case DType::F16:
    return onnx::TensorProto::FLOAT16;
  case DType::BF16:
    return onnx::TensorProto::BFLOAT16;
  case DType::F64:
    return onnx::TensorProto::DOUBLE;
  case DType::I64:
    return onnx::TensorProto::INT64;
  case DType::I32:
    return onnx::TensorProto::INT32;
  case DType::I8:
    return onnx::TensorProto::INT8;
  case DType::Bool:
    return onnx::TensorProto::BOOL;
  }
  return onnx::TensorProto::UNDEFINED;
}

llvm::Error writeTensorProtoFile(const std::string &path,
                                 const TensorData &d,
                                 const std::string &name) {
  onnx::TensorProto t;
  t.set_name(name);
  t.set_data_type(onnxTypeOf(d.type().dtype));
  for (int64_t dim : d.type().shape)
    t.add_dims(dim);
  llvm::ArrayRef<uint8_t> b = d.bytes();
  t.set_raw_data(std::string(b.begin(), b.end()));
  std::string out;
  if (!t.SerializeToString(&out))
    return err("cannot encode tensor '" + name + "'");
  return support::writeFileAtomically(path, out);
}

} // namespace cleave::frontend
