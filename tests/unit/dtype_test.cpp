// Element types: names, sizes, parsing, and the f16 / bf16 conversions that
// inline constants and kernels rely on (round to nearest even, inf and nan,
// subnormals, overflow to inf).
#include "ir/DType.h"

#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstring>
#include <limits>

namespace unit_dtype {

using namespace cleave::ir;

namespace {

float floatOf(uint32_t u) { return std::bit_cast<float>(u); }

bool isHalfNan(uint16_t h) { return (h & 0x7c00) == 0x7c00 && (h & 0x3ff); }
bool isBf16Nan(uint16_t h) { return (h & 0x7f80) == 0x7f80 && (h & 0x7f); }

} // namespace

TEST(DType, NamesSizesAndParsingAgree) {
  struct Row {
    DType type;
    const char *name;
    size_t size;
    bool isFloat;
  };
  const Row rows[] = {
      {DType::F32, "f32", 4, true},   {DType::F16, "f16", 2, true},
      {DType::BF16, "bf16", 2, true}, {DType::F64, "f64", 8, true},
      {DType::I64, "i64", 8, false},  {DType::I32, "i32", 4, false},
      {DType::I8, "i8", 1, false},    {DType::Bool, "bool", 1, false},
  };
  for (const Row &r : rows) {
    EXPECT_EQ(dtypeName(r.type), r.name);
    EXPECT_EQ(dtypeSize(r.type), r.size) << r.name;
    EXPECT_EQ(isFloat(r.type), r.isFloat) << r.name;
    EXPECT_EQ(parseDType(r.name), r.type) << r.name;
  }
  EXPECT_TRUE(isInteger(DType::I8));
  EXPECT_FALSE(isInteger(DType::Bool));
  EXPECT_FALSE(isInteger(DType::F16));
}

// "u8" names DType::U8, which exists for the importer's folding only: the
// IR text, plans and flags do not take it.
TEST(DType, ParseRejectsUnknownSpellings) {
  for (const char *bad : {"", "F32", "float", "f33", "i16", "u8", "f32 "})
    EXPECT_FALSE(parseDType(bad).has_value()) << "'" << bad << "'";
}

// --- f16 --------------------------------------------------------------------

TEST(Half, ExactValuesHaveTheirIeeeBits) {
  EXPECT_EQ(floatToHalf(0.0f), 0x0000);
  EXPECT_EQ(floatToHalf(-0.0f), 0x8000);
  EXPECT_EQ(floatToHalf(1.0f), 0x3c00);
  EXPECT_EQ(floatToHalf(-2.0f), 0xc000);
  EXPECT_EQ(floatToHalf(0.5f), 0x3800);
  EXPECT_EQ(floatToHalf(65504.0f), 0x7bff);              // largest finite
  EXPECT_EQ(floatToHalf(std::ldexp(1.0f, -14)), 0x0400); // smallest normal
  EXPECT_EQ(floatToHalf(std::ldexp(1.0f, -24)), 0x0001); // smallest subnormal
  EXPECT_EQ(halfToFloat(0x3c00), 1.0f);
  EXPECT_EQ(halfToFloat(0x7bff), 65504.0f);
  EXPECT_EQ(halfToFloat(0x0001), std::ldexp(1.0f, -24));
  EXPECT_EQ(halfToFloat(0x8001), -std::ldexp(1.0f, -24));
  EXPECT_EQ(halfToFloat(0x03ff), std::ldexp(1023.0f, -24)); // largest subnormal
  EXPECT_TRUE(std::signbit(halfToFloat(0x8000)));
}

TEST(Half, EveryHalfRoundTripsThroughFloat) {
  for (uint32_t h = 0; h <= 0xffff; ++h) {
    if (isHalfNan(uint16_t(h))) {
      EXPECT_TRUE(std::isnan(halfToFloat(uint16_t(h))));
      continue;
    }
    ASSERT_EQ(floatToHalf(halfToFloat(uint16_t(h))), h)
        << std::hex << "half 0x" << h;
  }
}

TEST(Half, RoundsToNearestEven) {
  // Between 1.0 (0x3c00) and the next half (1 + 2^-10) the tie goes to the
  // even mantissa; just above the tie goes up.
  EXPECT_EQ(floatToHalf(1.0f + std::ldexp(1.0f, -11)), 0x3c00);
  EXPECT_EQ(floatToHalf(1.0f + 3 * std::ldexp(1.0f, -11)), 0x3c02);
  EXPECT_EQ(floatToHalf(1.0f + std::ldexp(1.0f, -11) + std::ldexp(1.0f, -20)),
            0x3c01);
  EXPECT_EQ(floatToHalf(1.0f + std::ldexp(1.0f, -11) - std::ldexp(1.0f, -20)),
            0x3c00);
  // A tie that carries into the exponent: 2 - 2^-11 is halfway between
  // 0x3bff (odd) and 2.0.
  EXPECT_EQ(floatToHalf(2.0f - std::ldexp(1.0f, -11)), 0x4000);
}

TEST(Half, SubnormalsRoundToNearestEven) {
  const float tiny = std::ldexp(1.0f, -24);     // one half subnormal ulp
  EXPECT_EQ(floatToHalf(tiny / 2), 0x0000);     // tie -> even (zero)
  EXPECT_EQ(floatToHalf(tiny * 0.51f), 0x0001); // above the tie
  EXPECT_EQ(floatToHalf(tiny * 1.5f), 0x0002);  // tie between 1 and 2
  EXPECT_EQ(floatToHalf(tiny * 2.5f), 0x0002);  // tie between 2 and 3
  EXPECT_EQ(floatToHalf(-tiny * 3.0f), 0x8003);
  EXPECT_EQ(floatToHalf(std::ldexp(1.0f, -30)), 0x0000); // underflow
  EXPECT_EQ(floatToHalf(-std::ldexp(1.0f, -30)), 0x8000);
  // Halfway between the largest subnormal and the smallest normal.
  EXPECT_EQ(floatToHalf(std::ldexp(2047.0f, -25)), 0x0400);
}

TEST(Half, OverflowGoesToInfinity) {
  EXPECT_EQ(floatToHalf(65519.0f), 0x7bff); // below the tie: largest finite
  EXPECT_EQ(floatToHalf(65520.0f), 0x7c00); // the tie rounds to even: inf
  EXPECT_EQ(floatToHalf(1e6f), 0x7c00);
  EXPECT_EQ(floatToHalf(-1e6f), 0xfc00);
  EXPECT_EQ(floatToHalf(std::numeric_limits<float>::max()), 0x7c00);
}

TEST(Half, InfinityAndNan) {
  const float inf = std::numeric_limits<float>::infinity();
  EXPECT_EQ(floatToHalf(inf), 0x7c00);
  EXPECT_EQ(floatToHalf(-inf), 0xfc00);
  EXPECT_EQ(halfToFloat(0x7c00), inf);
  EXPECT_EQ(halfToFloat(0xfc00), -inf);
  EXPECT_TRUE(isHalfNan(floatToHalf(std::nanf(""))));
  // A nan whose payload lives only in the low float bits must not turn into
  // infinity when those bits are dropped.
  EXPECT_TRUE(isHalfNan(floatToHalf(floatOf(0x7f800001u))));
  EXPECT_TRUE(isHalfNan(floatToHalf(floatOf(0xff800001u))));
  EXPECT_TRUE(std::isnan(halfToFloat(0x7e00)));
  EXPECT_TRUE(std::isnan(halfToFloat(0xfc01)));
}

#if defined(__FLT16_MAX__)
// The compiler's own _Float16 conversion is an independent reference.
TEST(Half, AgreesWithTheCompilersFloat16OnASweepOfFloats) {
  for (uint64_t u = 0; u <= 0xffffffffull; u += 4099) {
    float f = floatOf(uint32_t(u));
    if (std::isnan(f))
      continue;
    _Float16 ref = _Float16(f);
    uint16_t refBits;
    std::memcpy(&refBits, &ref, 2);
    ASSERT_EQ(floatToHalf(f), refBits)
        << std::hex << "float bits 0x" << uint32_t(u);
  }
}
#endif

// --- bf16 -------------------------------------------------------------------

TEST(BFloat16, ExactValuesAndRoundTrip) {
  EXPECT_EQ(floatToBf16(1.0f), 0x3f80);
  EXPECT_EQ(floatToBf16(-2.0f), 0xc000);
  EXPECT_EQ(floatToBf16(-0.0f), 0x8000);
  EXPECT_EQ(bf16ToFloat(0x3f80), 1.0f);
  EXPECT_EQ(bf16ToFloat(0x0001), floatOf(0x00010000u)); // subnormal
  for (uint32_t h = 0; h <= 0xffff; ++h) {
    if (isBf16Nan(uint16_t(h)))
      continue;
    ASSERT_EQ(floatToBf16(bf16ToFloat(uint16_t(h))), h)
        << std::hex << "bf16 0x" << h;
  }
}

TEST(BFloat16, RoundsToNearestEven) {
  EXPECT_EQ(floatToBf16(floatOf(0x3f808000u)), 0x3f80); // tie, even below
  EXPECT_EQ(floatToBf16(floatOf(0x3f818000u)), 0x3f82); // tie, even above
  EXPECT_EQ(floatToBf16(floatOf(0x3f808001u)), 0x3f81); // above the tie
  EXPECT_EQ(floatToBf16(floatOf(0x3f807fffu)), 0x3f80); // below the tie
  EXPECT_EQ(floatToBf16(floatOf(0x00008000u)), 0x0000); // subnormal tie
  EXPECT_EQ(floatToBf16(floatOf(0x00018000u)), 0x0002);
}

TEST(BFloat16, OverflowInfinityAndNan) {
  const float inf = std::numeric_limits<float>::infinity();
  EXPECT_EQ(floatToBf16(std::numeric_limits<float>::max()), 0x7f80);
  EXPECT_EQ(floatToBf16(-std::numeric_limits<float>::max()), 0xff80);
  EXPECT_EQ(floatToBf16(floatOf(0x7f7f7fffu)), 0x7f7f); // largest finite
  EXPECT_EQ(floatToBf16(inf), 0x7f80);
  EXPECT_EQ(floatToBf16(-inf), 0xff80);
  EXPECT_EQ(bf16ToFloat(0x7f80), inf);
  EXPECT_TRUE(isBf16Nan(floatToBf16(std::nanf(""))));
  // Payload only in the dropped bits: still nan, and the sign is kept.
  EXPECT_TRUE(isBf16Nan(floatToBf16(floatOf(0x7f800001u))));
  uint16_t negNan = floatToBf16(floatOf(0xff800001u));
  EXPECT_TRUE(isBf16Nan(negNan));
  EXPECT_TRUE(negNan & 0x8000);
  EXPECT_TRUE(std::isnan(bf16ToFloat(0x7fc0)));
}

} // namespace unit_dtype
