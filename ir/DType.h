// Element types of cleave IR tensors.
//
// The set is closed and small on purpose: these are the types the frontend
// accepts from ONNX and the backends know how to store. Each type has one
// short text spelling ("f32", "i64", ...) used by the printer and parser, and
// a byte width used for memory accounting and raw tensor data.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string_view>

namespace cleave::ir {

// X-macro: enumerator, text spelling, byte size, is floating point. U8
// exists for shape arithmetic the importer folds (XLNet builds its masks
// from arange(dtype=uint8)); the importer refuses it in the graph (no kernel
// takes it), so it comes last and the others keep their numbers.
#define CLEAVE_DTYPES(X)                                                       \
  X(F32, "f32", 4, true)                                                       \
  X(F16, "f16", 2, true)                                                       \
  X(BF16, "bf16", 2, true)                                                     \
  X(F64, "f64", 8, true)                                                       \
  X(I64, "i64", 8, false)                                                      \
  X(I32, "i32", 4, false)                                                      \
  X(I8, "i8", 1, false)                                                        \
  X(Bool, "bool", 1, false)                                                    \
  X(U8, "u8", 1, false)

enum class DType : uint8_t {
#define X(E, S, N, F) E,
  CLEAVE_DTYPES(X)
#undef X
};

std::string_view dtypeName(DType t);
std::optional<DType> parseDType(std::string_view s);
size_t dtypeSize(DType t);
bool isFloat(DType t);
inline bool isInteger(DType t) { return !isFloat(t) && t != DType::Bool; }

// Conversions between f32 and the 16-bit float formats (round to nearest
// even), used for inline constants and by kernels later.
float halfToFloat(uint16_t h);
uint16_t floatToHalf(float f);
float bf16ToFloat(uint16_t h);
uint16_t floatToBf16(float f);

} // namespace cleave::ir
