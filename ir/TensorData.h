// TensorData: the bytes behind a parameter, buffer or constant, and where
// they came from.
//
// Data is held as little-endian bytes in the IR's element layout (row-major).
// A tensor may also remember its origin (an initializer inside an .onnx file,
// or a byte range of a raw file), so that the text printer can refer to large
// tensors instead of spelling them out, and the parser can load them back
// lazily through a DataResolver. The IR library itself knows nothing of ONNX:
// the frontend registers the resolver that understands `onnx<...>` origins.
#pragma once

#include "ir/Type.h"

#include "llvm/ADT/ArrayRef.h"
#include "llvm/Support/Error.h"

#include <memory>
#include <string>
#include <vector>

namespace cleave::ir {

// Where tensor bytes can be read from again.
struct DataOrigin {
  enum class Kind { None, OnnxInitializer, RawFile };
  Kind kind = Kind::None;
  std::string path; // file path as written in the text form
  std::string key;  // initializer name (OnnxInitializer)
  int64_t offset = 0, length = 0; // byte range (RawFile)
};

class DataResolver {
public:
  virtual ~DataResolver() = default;
  // Returns exactly `expected.byteSize()` bytes for `origin`, or an error.
  virtual llvm::Expected<std::vector<uint8_t>>
  load(const DataOrigin &origin, const TensorType &expected) = 0;
};

// The process-wide resolver used for data that was parsed by reference.
// Defaults to one that reads RawFile origins; tools install the frontend's.
void setDataResolver(DataResolver *resolver);
// Reads a RawFile origin (what the default resolver does).
llvm::Expected<std::vector<uint8_t>>
readRawFileData(const DataOrigin &origin, const TensorType &expected);
DataResolver &dataResolver();

class TensorData {
public:
  TensorData(TensorType type, const std::vector<uint8_t> &bytes,
             DataOrigin origin = {});
  // Adopts `bytes` without copying (ONNX raw_data arrives as a string).
  TensorData(TensorType type, std::string bytes, DataOrigin origin = {});
  // Data known only by reference; loaded on first access.
  TensorData(TensorType type, DataOrigin origin);
  // Every element equal to `element` (dtypeSize bytes): held as that one
  // element until load() spells it out (optimizer state of a 7B model is
  // tens of GB of zeros that nothing but the device needs to hold).
  static std::shared_ptr<TensorData> splat(TensorType type,
                                           llvm::ArrayRef<uint8_t> element);
  static std::shared_ptr<TensorData> splat(TensorType type, double value);

  const TensorType &type() const { return type_; }
  const DataOrigin &origin() const { return origin_; }
  bool isLoaded() const { return loaded_; }
  // The repeated element of a splat not yet spelled out, else empty.
  llvm::ArrayRef<uint8_t> splatElement() const {
    return loaded_ || !splat_ ? llvm::ArrayRef<uint8_t>()
                              : llvm::ArrayRef<uint8_t>(
                                    reinterpret_cast<const uint8_t *>(
                                        bytes_.data()),
                                    bytes_.size());
  }

  // Loads the bytes if needed; the error names the origin.
  llvm::Error load();
  // Bytes; the data must be loaded (see load()).
  llvm::ArrayRef<uint8_t> bytes() const;
  // Writable bytes, for code filling in a tensor it just created.
  uint8_t *mutableBytes();
  template <typename T> const T *as() const {
    return reinterpret_cast<const T *>(bytes().data());
  }

  // Element i converted to double / int64 (any dtype). Data must be loaded.
  double getDouble(int64_t i) const;
  int64_t getInt(int64_t i) const;
  // True if every element equals element 0.
  bool isSplat() const;

  // Builders for small constants.
  static std::shared_ptr<TensorData> fromInts(DType dtype, Shape shape,
                                              llvm::ArrayRef<int64_t> values);
  static std::shared_ptr<TensorData>
  fromDoubles(DType dtype, Shape shape, llvm::ArrayRef<double> values);

private:
  TensorType type_;
  std::string bytes_;
  DataOrigin origin_;
  bool loaded_ = false;
  bool splat_ = false; // unloaded: bytes_ holds the one repeated element
};

// Stores `v` as element `i` of a raw buffer of type `dtype`.
void storeElement(DType dtype, uint8_t *base, int64_t i, double v);
void storeElementInt(DType dtype, uint8_t *base, int64_t i, int64_t v);

} // namespace cleave::ir
