// Element type names, sizes and 16-bit float conversions.
#include "ir/DType.h"

#include <cstring>

namespace cleave::ir {

std::string_view dtypeName(DType t) {
  switch (t) {
#define X(E, S, N, F)                                                          \
  case DType::E:                                                               \
    return S;
    CLEAVE_DTYPES(X)
#undef X
  }
  return "?";
}

std::optional<DType> parseDType(std::string_view s) {
  // u8 lives only in import-time folding: IR text, plans and flags never
  // name it, so no graph a kernel runs can hold it.
#define X(E, S, N, F)                                                          \
  if (s == S && DType::E != DType::U8)                                         \
    return DType::E;
  CLEAVE_DTYPES(X)
#undef X
  return std::nullopt;
}

size_t dtypeSize(DType t) {
  switch (t) {
#define X(E, S, N, F)                                                          \
  case DType::E:                                                               \
    return N;
    CLEAVE_DTYPES(X)
#undef X
  }
  return 0;
}

bool isFloat(DType t) {
  switch (t) {
#define X(E, S, N, F)                                                          \
  case DType::E:                                                               \
    return F;
    CLEAVE_DTYPES(X)
#undef X
  }
  return false;
}

static uint32_t bitsOf(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}
static float floatOf(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

float halfToFloat(uint16_t h) {
  uint32_t sign = uint32_t(h & 0x8000) << 16;
  uint32_t exp = (h >> 10) & 0x1f;
  uint32_t mant = h & 0x3ff;
  if (exp == 0) {
    if (mant == 0)
      return floatOf(sign);
    // Subnormal half: value = mant * 2^-24.
    float v = float(mant) * 5.9604644775390625e-08f;
    return sign ? -v : v;
  }
  if (exp == 31)
    return floatOf(sign | 0x7f800000u | (mant << 13));
  return floatOf(sign | ((exp + 112) << 23) | (mant << 13));
}

uint16_t floatToHalf(float f) {
  uint32_t u = bitsOf(f);
  uint16_t sign = (u >> 16) & 0x8000;
  uint32_t absu = u & 0x7fffffff;
  if (absu >= 0x7f800000u) // inf or nan
    return sign | 0x7c00 | (absu > 0x7f800000u ? 0x200 : 0);
  if (absu >= 0x477ff000u) // rounds to >= 65520: overflow to inf
    return sign | 0x7c00;
  if (absu < 0x38800000u) { // below smallest normal half: subnormal or zero
    float a = floatOf(absu);
    // Adding 0.5 (2^-1) aligns the half subnormal grid to float's ulp at 0.5,
    // so the hardware does round-to-nearest-even for us.
    float r = a + 0.5f;
    return sign | uint16_t(bitsOf(r) - bitsOf(0.5f));
  }
  uint32_t mantOdd = (absu >> 13) & 1;
  absu += 0xc8000fffu + mantOdd; // rebias exponent (-112 << 23) and round
  return sign | uint16_t(absu >> 13);
}

float bf16ToFloat(uint16_t h) { return floatOf(uint32_t(h) << 16); }

uint16_t floatToBf16(float f) {
  uint32_t u = bitsOf(f);
  if ((u & 0x7fffffff) > 0x7f800000u)
    return uint16_t((u >> 16) | 0x40); // quiet nan
  u += 0x7fff + ((u >> 16) & 1);
  return uint16_t(u >> 16);
}

} // namespace cleave::ir
