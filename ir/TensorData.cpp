#include "ir/TensorData.h"

#include "support/FileIO.h"

#include "llvm/Support/MemoryBuffer.h"

#include <cassert>
#include <cstring>

namespace cleave::ir {

llvm::Expected<std::vector<uint8_t>>
readRawFileData(const DataOrigin &origin, const TensorType &expected) {
    if (origin.kind != DataOrigin::Kind::RawFile)
      return llvm::createStringError(
          llvm::inconvertibleErrorCode(),
          "no reader for tensor data in '" + origin.path + "'");
    if (origin.offset < 0 || origin.length < 0)
      return llvm::createStringError(
          llvm::inconvertibleErrorCode(),
          "tensor data in '" + origin.path + "' has a negative offset or length");
    auto buf = support::readFileSlice(origin.path, uint64_t(origin.offset),
                                      uint64_t(origin.length), "data file");
    if (!buf)
      return llvm::createStringError(llvm::inconvertibleErrorCode(),
                                     "cannot read tensor data: " +
                                         llvm::toString(buf.takeError()));
    if (int64_t((*buf)->getBufferSize()) != expected.byteSize() ||
        origin.length != expected.byteSize())
      return llvm::createStringError(
          llvm::inconvertibleErrorCode(),
          "tensor data in '" + origin.path + "' has " +
              std::to_string((*buf)->getBufferSize()) + " bytes, expected " +
              std::to_string(expected.byteSize()) + " for " + expected.str());
    const char *p = (*buf)->getBufferStart();
    return std::vector<uint8_t>(p, p + (*buf)->getBufferSize());
}

namespace {
// Reads RawFile origins; anything else is an error until a richer resolver is
// installed.
class RawFileResolver : public DataResolver {
public:
  llvm::Expected<std::vector<uint8_t>>
  load(const DataOrigin &origin, const TensorType &expected) override {
    return readRawFileData(origin, expected);
  }
};
RawFileResolver rawFileResolver;
DataResolver *currentResolver = &rawFileResolver;
} // namespace

void setDataResolver(DataResolver *r) {
  currentResolver = r ? r : &rawFileResolver;
}
DataResolver &dataResolver() { return *currentResolver; }

TensorData::TensorData(TensorType type, const std::vector<uint8_t> &bytes,
                       DataOrigin origin)
    : type_(std::move(type)), bytes_(bytes.begin(), bytes.end()),
      origin_(std::move(origin)), loaded_(true) {
  assert(int64_t(bytes_.size()) == type_.byteSize() && "data size mismatch");
}

TensorData::TensorData(TensorType type, std::string bytes, DataOrigin origin)
    : type_(std::move(type)), bytes_(std::move(bytes)),
      origin_(std::move(origin)), loaded_(true) {
  assert(int64_t(bytes_.size()) == type_.byteSize() && "data size mismatch");
}

TensorData::TensorData(TensorType type, DataOrigin origin)
    : type_(std::move(type)), origin_(std::move(origin)) {}

std::shared_ptr<TensorData> TensorData::splat(TensorType type,
                                              llvm::ArrayRef<uint8_t> element) {
  assert(element.size() == dtypeSize(type.dtype) && "one element");
  auto d = std::make_shared<TensorData>(std::move(type), DataOrigin{});
  d->bytes_.assign(element.begin(), element.end());
  d->splat_ = true;
  if (d->type_.numElements() <= 1) { // nothing to spell out
    d->bytes_.resize(size_t(d->type_.byteSize()));
    d->loaded_ = true;
  }
  return d;
}

std::shared_ptr<TensorData> TensorData::splat(TensorType type, double value) {
  uint8_t element[8] = {};
  storeElement(type.dtype, element, 0, value);
  return splat(type, llvm::ArrayRef<uint8_t>(element, dtypeSize(type.dtype)));
}

llvm::Error TensorData::load() {
  if (loaded_)
    return llvm::Error::success();
  if (splat_) {
    std::string element = std::move(bytes_);
    bytes_.assign(size_t(type_.byteSize()), '\0');
    for (size_t at = 0; at < bytes_.size(); at += element.size())
      std::memcpy(bytes_.data() + at, element.data(), element.size());
    loaded_ = true;
    return llvm::Error::success();
  }
  auto bytes = dataResolver().load(origin_, type_);
  if (!bytes)
    return bytes.takeError();
  bytes_.assign(bytes->begin(), bytes->end());
  loaded_ = true;
  return llvm::Error::success();
}

llvm::ArrayRef<uint8_t> TensorData::bytes() const {
  assert(loaded_ && "tensor data used before load()");
  return llvm::ArrayRef<uint8_t>(
      reinterpret_cast<const uint8_t *>(bytes_.data()), bytes_.size());
}

uint8_t *TensorData::mutableBytes() {
  assert(loaded_ && "tensor data used before load()");
  return reinterpret_cast<uint8_t *>(bytes_.data());
}

double TensorData::getDouble(int64_t i) const {
  const uint8_t *p = bytes().data();
  switch (type_.dtype) {
  case DType::F32:
    return reinterpret_cast<const float *>(p)[i];
  case DType::F64:
    return reinterpret_cast<const double *>(p)[i];
  case DType::F16:
    return halfToFloat(reinterpret_cast<const uint16_t *>(p)[i]);
  case DType::BF16:
    return bf16ToFloat(reinterpret_cast<const uint16_t *>(p)[i]);
  default:
    return double(getInt(i));
  }
}

int64_t TensorData::getInt(int64_t i) const {
  const uint8_t *p = bytes().data();
  switch (type_.dtype) {
  case DType::I64:
    return reinterpret_cast<const int64_t *>(p)[i];
  case DType::I32:
    return reinterpret_cast<const int32_t *>(p)[i];
  case DType::I8:
    return reinterpret_cast<const int8_t *>(p)[i];
  case DType::U8:
    return p[i];
  case DType::Bool:
    return p[i] != 0;
  default:
    return int64_t(getDouble(i));
  }
}

bool TensorData::isSplat() const {
  if (!splatElement().empty())
    return true;
  size_t w = dtypeSize(type_.dtype);
  llvm::ArrayRef<uint8_t> b = bytes();
  for (size_t off = w; off < b.size(); off += w)
    if (std::memcmp(b.data(), b.data() + off, w) != 0)
      return false;
  return true;
}

void storeElement(DType dtype, uint8_t *base, int64_t i, double v) {
  switch (dtype) {
  case DType::F32:
    reinterpret_cast<float *>(base)[i] = float(v);
    return;
  case DType::F64:
    reinterpret_cast<double *>(base)[i] = v;
    return;
  case DType::F16:
    reinterpret_cast<uint16_t *>(base)[i] = floatToHalf(float(v));
    return;
  case DType::BF16:
    reinterpret_cast<uint16_t *>(base)[i] = floatToBf16(float(v));
    return;
  default:
    storeElementInt(dtype, base, i, int64_t(v));
  }
}

void storeElementInt(DType dtype, uint8_t *base, int64_t i, int64_t v) {
  switch (dtype) {
  case DType::I64:
    reinterpret_cast<int64_t *>(base)[i] = v;
    return;
  case DType::I32:
    reinterpret_cast<int32_t *>(base)[i] = int32_t(v);
    return;
  case DType::I8:
    reinterpret_cast<int8_t *>(base)[i] = int8_t(v);
    return;
  case DType::U8:
    base[i] = uint8_t(v);
    return;
  case DType::Bool:
    base[i] = v != 0;
    return;
  default:
    storeElement(dtype, base, i, double(v));
  }
}

std::shared_ptr<TensorData> TensorData::fromInts(DType dtype, Shape shape,
                                                 llvm::ArrayRef<int64_t> v) {
  TensorType t(dtype, std::move(shape));
  assert(t.numElements() == int64_t(v.size()));
  std::string bytes(t.byteSize(), '\0');
  for (size_t i = 0; i < v.size(); ++i)
    storeElementInt(dtype, reinterpret_cast<uint8_t *>(bytes.data()), i, v[i]);
  return std::make_shared<TensorData>(t, std::move(bytes));
}

std::shared_ptr<TensorData>
TensorData::fromDoubles(DType dtype, Shape shape, llvm::ArrayRef<double> v) {
  TensorType t(dtype, std::move(shape));
  assert(t.numElements() == int64_t(v.size()));
  std::string bytes(t.byteSize(), '\0');
  for (size_t i = 0; i < v.size(); ++i)
    storeElement(dtype, reinterpret_cast<uint8_t *>(bytes.data()), i, v[i]);
  return std::make_shared<TensorData>(t, std::move(bytes));
}

} // namespace cleave::ir
