#include "frontend/OnnxTensor.h"

#include "ir/TypeRules.h"
#include "support/Errors.h"

#include "llvm/Support/FileSystem.h"
#include "llvm/Support/FormatVariadic.h"
#include "llvm/Support/MemoryBuffer.h"
#include "llvm/Support/Path.h"

#include <onnx/onnx_pb.h>

#include <cstring>

namespace cleave::frontend {

using namespace cleave::ir;

const char *onnxTypeName(int t) {
  switch (t) {
  case onnx::TensorProto::FLOAT:
    return "float";
  case onnx::TensorProto::UINT8:
    return "uint8";
  case onnx::TensorProto::INT8:
    return "int8";
  case onnx::TensorProto::UINT16:
    return "uint16";
  case onnx::TensorProto::INT16:
    return "int16";
  case onnx::TensorProto::INT32:
    return "int32";
  case onnx::TensorProto::INT64:
    return "int64";
  case onnx::TensorProto::STRING:
    return "string";
  case onnx::TensorProto::BOOL:
    return "bool";
  case onnx::TensorProto::FLOAT16:
    return "float16";
  case onnx::TensorProto::DOUBLE:
    return "double";
  case onnx::TensorProto::UINT32:
    return "uint32";
  case onnx::TensorProto::UINT64:
    return "uint64";
  case onnx::TensorProto::COMPLEX64:
    return "complex64";
  case onnx::TensorProto::COMPLEX128:
    return "complex128";
  case onnx::TensorProto::BFLOAT16:
    return "bfloat16";
  default:
    return "undefined";
  }
}

int dtypeToOnnx(DType d) {
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
  case DType::U8:
    return onnx::TensorProto::UINT8;
  }
  return onnx::TensorProto::UNDEFINED;
}

llvm::Expected<DType> dtypeFromOnnx(int t) {
  switch (t) {
  case onnx::TensorProto::FLOAT:
    return DType::F32;
  case onnx::TensorProto::FLOAT16:
    return DType::F16;
  case onnx::TensorProto::BFLOAT16:
    return DType::BF16;
  case onnx::TensorProto::DOUBLE:
    return DType::F64;
  case onnx::TensorProto::INT64:
    return DType::I64;
  case onnx::TensorProto::INT32:
    return DType::I32;
  case onnx::TensorProto::INT8:
    return DType::I8;
  case onnx::TensorProto::BOOL:
    return DType::Bool;
  case onnx::TensorProto::UINT8: // folded at import only (ImportContext)
    return DType::U8;
  default:
    return failf("element type {0} is not supported (cleave supports float, "
                 "float16, bfloat16, double, int64, int32, int8, bool)",
                 onnxTypeName(t));
  }
}

// Resolves an external data location inside `modelDir`, refusing absolute
// paths and anything that leaves the folder (also through symlinks).
static llvm::Expected<std::string> confinedPath(const std::string &modelDir,
                                                const std::string &location,
                                                const std::string &tensor) {
  if (location.empty() || llvm::sys::path::is_absolute(location))
    return failf("tensor '{0}': external data location '{1}' must be a "
                 "relative path inside the model's folder",
                 tensor, location);
  llvm::SmallString<256> full(modelDir);
  llvm::sys::path::append(full, location);
  llvm::SmallString<256> real, realDir;
  if (llvm::sys::fs::real_path(full, real))
    return failf("tensor '{0}': external data file '{1}' not found next to "
                 "the model",
                 tensor, location);
  if (llvm::sys::fs::real_path(modelDir.empty() ? "." : modelDir, realDir))
    return failf("tensor '{0}': cannot resolve the model's folder", tensor);
  llvm::StringRef r = real, d = realDir;
  if (!r.startswith(d) || r.size() <= d.size() ||
      !llvm::sys::path::is_separator(r[d.size()]))
    return failf("tensor '{0}': external data location '{1}' points outside "
                 "the model's folder",
                 tensor, location);
  return std::string(real);
}

llvm::Expected<ExternalData> externalDataOf(const onnx::TensorProto &t,
                                            const std::string &modelDir) {
  ExternalData ext;
  for (const auto &kv : t.external_data()) {
    long long v = 0;
    if (kv.key() == "location")
      ext.location = kv.value();
    else if ((kv.key() == "offset" || kv.key() == "length") &&
             (llvm::StringRef(kv.value()).getAsInteger(10, v) || v < 0))
      return failf("tensor '{0}': external data {1} '{2}' is not a number",
                   t.name(), kv.key(), kv.value());
    if (kv.key() == "offset")
      ext.offset = v;
    if (kv.key() == "length")
      ext.length = v;
  }
  auto path = confinedPath(modelDir, ext.location, t.name());
  if (!path)
    return path.takeError();
  ext.path = std::move(*path);
  return ext;
}

llvm::Expected<std::shared_ptr<TensorData>>
tensorFromOnnx(const onnx::TensorProto &t, const std::string &modelDir,
               DataOrigin origin, std::string *adoptRaw, bool loadExternal) {
  const std::string &name = t.name();
  auto dt = dtypeFromOnnx(t.data_type());
  if (!dt)
    return failf("tensor '{0}': {1}", name, llvm::toString(dt.takeError()));
  Shape shape(t.dims().begin(), t.dims().end());
  if (auto e = checkShape(shape))
    return failf("tensor '{0}' has a bad shape: {1}", name,
                 llvm::toString(std::move(e)));
  TensorType type(*dt, shape);
  int64_t n = type.numElements(), bytes = type.byteSize();

  if (t.data_location() == onnx::TensorProto::EXTERNAL) {
    // The bytes must have one source: which one was meant is unknown.
    if (t.has_raw_data() || t.float_data_size() || t.int32_data_size() ||
        t.int64_data_size() || t.double_data_size() ||
        t.uint64_data_size() || t.string_data_size())
      return failf("tensor '{0}' has both external data and values in the "
                   "model; one of them must go",
                   name);
    auto ext = externalDataOf(t, modelDir);
    if (!ext)
      return ext.takeError();
    const std::string &location = ext->location, *path = &ext->path;
    int64_t offset = ext->offset, length = ext->length;
    if (length < 0)
      length = bytes;
    if (length != bytes || offset < 0)
      return failf("tensor '{0}': external data length {1} does not match "
                   "{2} ({3} bytes)",
                   name, length, type.str(), bytes);
    uint64_t fileSize = 0;
    if (llvm::sys::fs::file_size(*path, fileSize) ||
        uint64_t(offset) + uint64_t(length) > fileSize)
      return failf("tensor '{0}': external data file '{1}' is too short "
                   "({2} bytes; needs {3} at offset {4})",
                   name, location, fileSize, length, offset);
    DataOrigin raw{DataOrigin::Kind::RawFile, *path, "", offset, length};
    auto data = std::make_shared<TensorData>(type, raw);
    if (loadExternal)
      if (auto e = data->load())
        return std::move(e);
    return data;
  }

  if (t.has_raw_data() && adoptRaw && int64_t(adoptRaw->size()) == bytes)
    return std::make_shared<TensorData>(type, std::move(*adoptRaw),
                                        std::move(origin));
  // Check that the data present fills the declared shape before allocating
  // for it: a small model may declare a huge shape over little or no data.
  if (t.has_raw_data()) {
    if (int64_t(t.raw_data().size()) != bytes)
      return failf("tensor '{0}' holds {1} bytes but {2} needs {3}", name,
                   t.raw_data().size(), type.str(), bytes);
  } else {
    int64_t have = *dt == DType::F32   ? t.float_data_size()
                   : *dt == DType::F64 ? t.double_data_size()
                   : *dt == DType::I64 ? t.int64_data_size()
                                       : t.int32_data_size();
    if (have != n)
      return failf("tensor '{0}' holds {1} values but its shape {2} needs {3}",
                   name, have, shapeStr(shape), n);
  }
  std::string storage(bytes, '\0');
  uint8_t *buf = reinterpret_cast<uint8_t *>(storage.data());
  if (t.has_raw_data()) {
    if (bytes)
      std::memcpy(buf, t.raw_data().data(), bytes);
  } else {
    switch (*dt) {
    case DType::F32:
      if (bytes)
        std::memcpy(buf, t.float_data().data(), bytes);
      break;
    case DType::F64:
      if (bytes)
        std::memcpy(buf, t.double_data().data(), bytes);
      break;
    case DType::I64:
      if (bytes)
        std::memcpy(buf, t.int64_data().data(), bytes);
      break;
    case DType::F16:
    case DType::BF16:
      for (int64_t i = 0; i < n; ++i)
        reinterpret_cast<uint16_t *>(buf)[i] =
            uint16_t(t.int32_data(i));
      break;
    default: // I32, I8, U8, Bool live in int32_data
      for (int64_t i = 0; i < n; ++i)
        storeElementInt(*dt, buf, i, t.int32_data(i));
      break;
    }
  }
  return std::make_shared<TensorData>(type, std::move(storage),
                                      std::move(origin));
}

} // namespace cleave::frontend
