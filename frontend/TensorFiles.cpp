#include "frontend/TensorFiles.h"

#include "frontend/OnnxTensor.h"
#include "ir/TypeRules.h"

#include "llvm/ADT/StringExtras.h"
#include "llvm/Support/FileSystem.h"
#include "llvm/Support/MemoryBuffer.h"
#include "llvm/Support/raw_ostream.h"

#include <onnx/onnx_pb.h>

namespace cleave::frontend {

using namespace cleave::ir;

static llvm::Error err(const llvm::Twine &msg) {
  return llvm::createStringError(llvm::inconvertibleErrorCode(), msg.str());
}

static llvm::Expected<std::unique_ptr<llvm::MemoryBuffer>>
readFile(const std::string &path) {
  if (llvm::sys::fs::is_directory(path))
    return err("'" + path + "' is a directory, not a tensor file");
  auto buf = llvm::MemoryBuffer::getFile(path, false, false);
  if (!buf)
    return err("cannot open '" + path + "': " + buf.getError().message());
  return std::move(*buf);
}

// Writes through a temporary file renamed into place, so a failure leaves
// no partial file.
static llvm::Error writeFile(const std::string &path, llvm::StringRef data) {
  std::string tmp = path + ".tmp";
  std::error_code ec;
  {
    llvm::raw_fd_ostream os(tmp, ec);
    if (ec)
      return err("cannot write '" + path + "': " + ec.message());
    os << data;
    os.close();
    if (os.has_error()) {
      os.clear_error();
      llvm::sys::fs::remove(tmp);
      return err("cannot write '" + path + "'");
    }
  }
  if ((ec = llvm::sys::fs::rename(tmp, path))) {
    llvm::sys::fs::remove(tmp);
    return err("cannot write '" + path + "': " + ec.message());
  }
  return llvm::Error::success();
}

llvm::Expected<std::shared_ptr<TensorData>>
readTensorProtoFile(const std::string &path) {
  auto buf = readFile(path);
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
  return writeFile(path, out);
}

// NumPy .npy, version 1.0-3.0: magic, header length, a Python dict literal
// {'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }, raw data.
static const char *npyDescr(DType d) {
  switch (d) {
  case DType::F32:
    return "<f4";
  case DType::F16:
    return "<f2";
  case DType::F64:
    return "<f8";
  case DType::I64:
    return "<i8";
  case DType::I32:
    return "<i4";
  case DType::I8:
    return "|i1";
  case DType::Bool:
    return "|b1";
  case DType::BF16:
    return nullptr;
  }
  return nullptr;
}

llvm::Expected<std::shared_ptr<TensorData>>
readNpyFile(const std::string &path) {
  auto buf = readFile(path);
  if (!buf)
    return buf.takeError();
  llvm::StringRef all = (*buf)->getBuffer();
  if (!all.startswith("\x93NUMPY") || all.size() < 10)
    return err("'" + path + "' is not a NumPy .npy file");
  uint8_t major = all[6];
  size_t headerLen, start;
  if (major == 1) {
    headerLen = uint8_t(all[8]) | (uint8_t(all[9]) << 8);
    start = 10;
  } else {
    if (all.size() < 12)
      return err("'" + path + "' is a truncated .npy file");
    headerLen = uint32_t(uint8_t(all[8])) | (uint32_t(uint8_t(all[9])) << 8) |
                (uint32_t(uint8_t(all[10])) << 16) |
                (uint32_t(uint8_t(all[11])) << 24);
    start = 12;
  }
  if (start + headerLen > all.size())
    return err("'" + path + "' is a truncated .npy file");
  llvm::StringRef header = all.substr(start, headerLen);
  auto field = [&](llvm::StringRef key) -> llvm::StringRef {
    size_t k = header.find("'" + key.str() + "'");
    if (k == llvm::StringRef::npos)
      return "";
    llvm::StringRef rest = header.substr(k + key.size() + 2).ltrim();
    if (!rest.consume_front(":"))
      return "";
    return rest.ltrim();
  };
  llvm::StringRef descr = field("descr");
  if (!descr.consume_front("'"))
    return err("'" + path + "': .npy header has no 'descr'");
  descr = descr.take_until([](char c) { return c == '\''; });
  std::optional<DType> dt;
  for (DType d : {DType::F32, DType::F16, DType::F64, DType::I64, DType::I32,
                  DType::I8, DType::Bool})
    if (descr == npyDescr(d) ||
        (descr.size() == 3 && descr.drop_front() ==
                                  llvm::StringRef(npyDescr(d)).drop_front() &&
         (descr[0] == '=' || descr[0] == '|' || descr[0] == '<')))
      dt = d;
  if (!dt)
    return err("'" + path + "': NumPy dtype '" + descr +
               "' is not supported (use float32, float64, float16, int64, "
               "int32, int8 or bool, little-endian)");
  if (field("fortran_order").startswith("True"))
    return err("'" + path + "': Fortran-ordered arrays are not supported");
  llvm::StringRef shapeText = field("shape");
  if (!shapeText.consume_front("("))
    return err("'" + path + "': .npy header has no 'shape'");
  shapeText = shapeText.take_until([](char c) { return c == ')'; });
  Shape shape;
  llvm::SmallVector<llvm::StringRef, 4> parts;
  shapeText.split(parts, ',', -1, false);
  for (llvm::StringRef p : parts) {
    p = p.trim();
    if (p.empty())
      continue;
    int64_t d;
    if (p.getAsInteger(10, d) || d < 0)
      return err("'" + path + "': bad shape in .npy header");
    shape.push_back(d);
  }
  if (auto e = checkShape(shape))
    return err("'" + path + "': " + llvm::toString(std::move(e)));
  TensorType type(*dt, shape);
  size_t dataStart = start + headerLen;
  if (all.size() - dataStart != size_t(type.byteSize()))
    return err("'" + path + "' holds " +
               std::to_string(all.size() - dataStart) + " data bytes but " +
               type.str() + " needs " + std::to_string(type.byteSize()));
  return std::make_shared<TensorData>(type,
                                      all.substr(dataStart).str());
}

llvm::Error writeNpyFile(const std::string &path, const TensorData &d) {
  const char *descr = npyDescr(d.type().dtype);
  if (!descr)
    return err("cannot write " + d.type().str() + " as .npy (no NumPy type)");
  std::string shape = "(";
  for (int64_t dim : d.type().shape)
    shape += std::to_string(dim) + ", ";
  if (d.type().rank() == 1)
    shape.resize(shape.size() - 1); // "(3,)"
  else if (d.type().rank() > 1)
    shape.resize(shape.size() - 2);
  shape += ")";
  std::string header = std::string("{'descr': '") + descr +
                       "', 'fortran_order': False, 'shape': " + shape + ", }";
  // Pad with spaces so the data starts at a multiple of 64, ending in '\n'.
  size_t total = 10 + header.size() + 1;
  header.append((64 - total % 64) % 64, ' ');
  header += '\n';
  std::string out = "\x93NUMPY";
  out += char(1);
  out += char(0);
  out += char(header.size() & 0xff);
  out += char(header.size() >> 8);
  out += header;
  llvm::ArrayRef<uint8_t> b = d.bytes();
  out.append(b.begin(), b.end());
  return writeFile(path, out);
}

} // namespace cleave::frontend
