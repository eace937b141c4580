// Data movement kernels for the CPU backend: Concat, Expand, Flatten,
// Gather, GatherElements, Pad, Reshape, ScatterND, Slice, Split, Squeeze,
// Transpose, Trilu, Unsqueeze.
//
// None of these look at values, so every kernel copies elements as unsigned
// integers of their byte width and handles all dtypes alike. Reshape-like
// ops are one memcpy. Expand, Slice and Transpose are all "copy a strided
// view of the input into the dense output": the view's dims of size 1 are
// dropped and neighbours the source walks contiguously are merged, so that
// the inner loop is a memcpy whenever the innermost source stride is 1 (a
// slice along an outer axis, a transpose that keeps the last axis). A
// transpose that moves the last axis becomes a batched 2-D transpose done in
// cache-sized tiles.
#include "ir/PadIndex.h"
#include "runtime/cpu/CpuKernels.h"

#include "support/ShapeMath.h"

#include "llvm/ADT/SmallVector.h"

#include <algorithm>
#include <cmath>
#include <tuple>

namespace cleave::runtime::cpu {
namespace {

using ir::DType;
using ir::OpKind;

constexpr int64_t kGrainBytes = 1 << 16;  // bytes per thread

size_t elemSize(const TensorRef &t) { return ir::dtypeSize(t.dtype); }
size_t byteSize(const TensorRef &t) {
  return size_t(t.numElements()) * elemSize(t);
}

// Calls f(U{}) with the unsigned integer type as wide as one element.
template <typename F> void dispatchWidth(size_t bytes, F &&f) {
  switch (bytes) {
  case 1:
    return f(uint8_t{});
  case 2:
    return f(uint16_t{});
  case 4:
    return f(uint32_t{});
  default:
    return f(uint64_t{});
  }
}

llvm::Error copyAll(const KernelCall &c) {
  const TensorRef &in = c.inputs[0], &out = c.outputs[0];
  if (byteSize(in) && in.data != out.data)
    std::memcpy(out.data, in.data, byteSize(in));
  return llvm::Error::success();
}

// ---------------------------------------------------------------------------
// Strided views.

// Dense output dims and the source's element stride in each (0 for a
// broadcast dim, negative for a reversed slice).
struct View {
  llvm::SmallVector<int64_t, 6> dims;
  llvm::SmallVector<int64_t, 6> strides;
};

View collapse(llvm::ArrayRef<int64_t> dims, llvm::ArrayRef<int64_t> strides) {
  View v;
  for (size_t d = 0; d < dims.size(); ++d) {
    if (dims[d] == 1)
      continue;
    if (!v.dims.empty() && v.strides.back() == strides[d] * dims[d]) {
      v.dims.back() *= dims[d];
      v.strides.back() = strides[d];
    } else {
      v.dims.push_back(dims[d]);
      v.strides.push_back(strides[d]);
    }
  }
  return v;
}

// One step of the odometer idx over v's first `rank` dims (the last
// fastest), base following as the source offset.
void stepOuter(const View &v, int64_t rank, llvm::SmallVectorImpl<int64_t> &idx,
               int64_t &base) {
  for (int64_t d = rank - 1; d >= 0; --d) {
    base += v.strides[d];
    if (++idx[d] < v.dims[d])
      return;
    base -= v.strides[d] * v.dims[d];
    idx[d] = 0;
  }
}

// copyViewTyped for views of rank 2 or more: tasks of whole planes (the
// last two dims), an odometer over the dims before them.
template <typename U>
void copyViewPlanes(U *dst, const U *src, const View &v, int64_t total) {
  size_t r = v.dims.size();
  int64_t rows = v.dims[r - 2], rowStride = v.strides[r - 2];
  int64_t inner = v.dims[r - 1], step = v.strides[r - 1];
  int64_t plane = rows * inner, outerRank = int64_t(r) - 2;
  parallelFor(total / plane, std::max<int64_t>(1, kGrain / plane),
              [&](int64_t begin, int64_t end) {
                llvm::SmallVector<int64_t, 6> idx(static_cast<size_t>(outerRank));
                int64_t base = 0, rest = begin;
                for (int64_t d = outerRank - 1; d >= 0; --d) {
                  idx[d] = rest % v.dims[d];
                  rest /= v.dims[d];
                  base += idx[d] * v.strides[d];
                }
                for (int64_t p = begin; p < end; ++p) {
                  U *o = dst + p * plane;
                  const U *row = src + base;
                  for (int64_t i = 0; i < rows; ++i, row += rowStride)
                    for (int64_t j = 0; j < inner; ++j)
                      *o++ = row[j * step];
                  stepOuter(v, outerRank, idx, base);
                }
              });
}

// dst (dense, `total` elements) = the view of src. The flat output range is
// split across threads; an odometer walks the outer dims.
template <typename U>
void copyViewTyped(U *dst, const U *src, const View &v, int64_t total) {
  int64_t outerRank = int64_t(v.dims.size()) - 1;
  int64_t inner = v.dims.empty() ? 1 : v.dims.back();
  int64_t step = v.dims.empty() ? 0 : v.strides.back();
  if (outerRank >= 1 && inner < 16) {
    // Short rows (a box of kernel taps cut from a filter: rows of 1 to 3):
    // whole planes of the last two dims per step of the odometer, so a
    // row costs its copies, not a walk of the outer dims.
    copyViewPlanes(dst, src, v, total);
    return;
  }
  parallelFor(total, kGrain, [&](int64_t begin, int64_t end) {
    llvm::SmallVector<int64_t, 6> idx(std::max<int64_t>(outerRank, 0));
    int64_t base = 0, rowIdx = begin / inner;
    for (int64_t d = outerRank - 1; d >= 0; --d) {
      idx[d] = rowIdx % v.dims[d];
      rowIdx /= v.dims[d];
      base += idx[d] * v.strides[d];
    }
    int64_t col = begin % inner;
    for (int64_t i = begin; i < end;) {
      int64_t len = std::min(inner - col, end - i);
      const U *s = src + base + col * step;
      U *o = dst + i;
      if (step == 1)
        std::memcpy(o, s, len * sizeof(U));
      else if (step == 0)
        std::fill(o, o + len, *s);
      else
        for (int64_t j = 0; j < len; ++j)
          o[j] = s[j * step];
      i += len;
      col = 0;
      stepOuter(v, outerRank, idx, base);
    }
  });
}

// Copies into `out` the view of `in` that starts at element `start` and
// steps by `strides` along out's dims.
void copyView(const TensorRef &out, const TensorRef &in, int64_t start,
              llvm::ArrayRef<int64_t> strides) {
  int64_t total = out.numElements();
  if (total == 0)
    return;
  View v = collapse(out.shape, strides);
  dispatchWidth(elemSize(in), [&](auto tag) {
    using U = decltype(tag);
    copyViewTyped(out.as<U>(), in.as<U>() + start, v, total);
  });
}

// dst[b][c][r] = src[b][r][c] for src of shape [batch, rows, cols], in
// square tiles so that both sides stay in cache. Small tiles written a
// contiguous row at a time measured best: with power-of-two row lengths
// larger tiles' strided side maps onto too few cache sets.
template <typename U>
void transposeTiled(U *dst, const U *src, int64_t batch, int64_t rows,
                    int64_t cols) {
  constexpr int64_t kT = 16;
  int64_t tr = (rows + kT - 1) / kT, tc = (cols + kT - 1) / kT;
  parallelFor(batch * tr * tc, std::max<int64_t>(1, kGrain / (kT * kT)),
              [&](int64_t b, int64_t e) {
                for (int64_t item = b; item < e; ++item) {
                  int64_t bi = item / (tr * tc), t = item % (tr * tc);
                  int64_t r0 = t / tc * kT, c0 = t % tc * kT;
                  int64_t r1 = std::min(rows, r0 + kT);
                  int64_t c1 = std::min(cols, c0 + kT);
                  const U *s = src + bi * rows * cols;
                  U *d = dst + bi * rows * cols;
                  for (int64_t c = c0; c < c1; ++c)
                    for (int64_t r = r0; r < r1; ++r)
                      d[c * rows + r] = s[r * cols + c];
                }
              });
}

// ---------------------------------------------------------------------------
// Kernels.

llvm::Error transpose(const KernelCall &c) {
  const TensorRef &in = c.inputs[0], &out = c.outputs[0];
  const auto &perm = c.getInts("perm");
  std::vector<int64_t> inStrides = stridesOf(in.shape);
  llvm::SmallVector<int64_t, 6> strides;
  for (int64_t p : perm)
    strides.push_back(inStrides[p]);
  int64_t total = out.numElements();
  if (total == 0)
    return llvm::Error::success();
  // A batched 2-D transpose shows up after collapsing as output dims
  // [(B,) C, R] with source strides [(C*R,) 1, C].
  View v = collapse(out.shape, strides);
  size_t r = v.dims.size();
  if (r >= 2 && r <= 3 && v.strides[r - 2] == 1 &&
      v.strides[r - 1] == v.dims[r - 2] &&
      (r == 2 || v.strides[0] == v.dims[1] * v.dims[2])) {
    int64_t batch = r == 3 ? v.dims[0] : 1;
    dispatchWidth(elemSize(in), [&](auto tag) {
      using U = decltype(tag);
      transposeTiled(out.as<U>(), in.as<U>(), batch, v.dims[r - 1],
                     v.dims[r - 2]);
    });
    return llvm::Error::success();
  }
  dispatchWidth(elemSize(in), [&](auto tag) {
    using U = decltype(tag);
    copyViewTyped(out.as<U>(), in.as<U>(), v, total);
  });
  return llvm::Error::success();
}

llvm::Error expand(const KernelCall &c) {
  const TensorRef &in = c.inputs[0], &out = c.outputs[0];
  std::vector<int64_t> inStrides = stridesOf(in.shape);
  size_t lead = out.rank() - in.rank();
  llvm::SmallVector<int64_t, 6> strides(out.rank(), 0);
  for (size_t d = lead; d < out.rank(); ++d)
    if (in.shape[d - lead] != 1)
      strides[d] = inStrides[d - lead];
  copyView(out, in, 0, strides);
  return llvm::Error::success();
}

llvm::Error slice(const KernelCall &c) {
  const TensorRef &in = c.inputs[0], &out = c.outputs[0];
  auto view = sliceView(c, in.shape);
  if (!view)
    return view.takeError();
  copyView(out, in, view->start, view->strides);
  return llvm::Error::success();
}

// Outer rows (dims before `axis`) and bytes per unit of `axis`.
std::pair<int64_t, int64_t> aroundAxis(const TensorRef &t, int64_t axis) {
  int64_t outer = 1, inner = int64_t(elemSize(t));
  for (int64_t d = 0; d < int64_t(t.rank()); ++d)
    if (d < axis)
      outer *= t.shape[d];
    else if (d > axis)
      inner *= t.shape[d];
  return {outer, inner};
}

// Concat and Split: one pass over the outer rows, each row's parts copied
// together (the packed tensor read or written once, in order, and one
// dispatch to the threads where there was one per part).
void copyParts(char *packed, int64_t packedPitch,
               llvm::ArrayRef<char *> parts, llvm::ArrayRef<int64_t> partBytes,
               int64_t outer, bool toPacked) {
  if (outer == 0 || packedPitch == 0)
    return;
  parallelFor(outer, std::max<int64_t>(1, kGrainBytes / packedPitch),
              [&](int64_t b, int64_t e) {
                for (int64_t r = b; r < e; ++r) {
                  char *row = packed + r * packedPitch;
                  for (size_t p = 0; p < parts.size(); ++p) {
                    char *part = parts[p] + r * partBytes[p];
                    if (toPacked)
                      std::memcpy(row, part, size_t(partBytes[p]));
                    else
                      std::memcpy(part, row, size_t(partBytes[p]));
                    row += partBytes[p];
                  }
                }
              });
}

llvm::Error concat(const KernelCall &c) {
  const TensorRef &out = c.outputs[0];
  int64_t rank = out.rank(), axis = c.getInt("axis");
  if (axis < 0)
    axis += rank;
  auto [outer, unit] = aroundAxis(out, axis);
  llvm::SmallVector<char *, 4> parts;
  llvm::SmallVector<int64_t, 4> bytes;
  for (const TensorRef &in : c.inputs) {
    parts.push_back(in.as<char>());
    bytes.push_back(in.shape[axis] * unit);
  }
  copyParts(out.as<char>(), out.shape[axis] * unit, parts, bytes, outer,
            /*toPacked=*/true);
  return llvm::Error::success();
}

llvm::Error split(const KernelCall &c) {
  const TensorRef &in = c.inputs[0];
  int64_t rank = in.rank(), axis = c.getInt("axis");
  if (axis < 0)
    axis += rank;
  auto [outer, unit] = aroundAxis(in, axis);
  llvm::SmallVector<char *, 4> parts;
  llvm::SmallVector<int64_t, 4> bytes;
  for (const TensorRef &out : c.outputs) {
    parts.push_back(out.as<char>());
    bytes.push_back(out.shape[axis] * unit);
  }
  copyParts(in.as<char>(), in.shape[axis] * unit, parts,
            bytes, outer, /*toPacked=*/false);
  return llvm::Error::success();
}

llvm::Error gather(const KernelCall &c) {
  const TensorRef &data = c.inputs[0], &idx = c.inputs[1];
  const TensorRef &out = c.outputs[0];
  int64_t rank = data.rank(), axis = c.getInt("axis");
  if (axis < 0)
    axis += rank;
  int64_t dim = data.shape[axis];
  auto indexOr = gatherIndices(c, idx, dim);
  if (!indexOr)
    return indexOr.takeError();
  const std::vector<int64_t> &index = *indexOr;
  // Not a structured binding: the lambda below uses `unit`, and clang
  // before 16 cannot capture bindings (the CLEAVE_FUZZ build uses clang 14).
  int64_t outer, unit;
  std::tie(outer, unit) = aroundAxis(data, axis);
  int64_t n = index.size(), items = outer * n;
  if (items == 0 || unit == 0)
    return llvm::Error::success();
  const char *src = data.as<char>();
  char *dst = out.as<char>();
  parallelFor(items, std::max<int64_t>(1, kGrainBytes / unit),
              [&](int64_t b, int64_t e) {
                for (int64_t it = b; it < e; ++it) {
                  int64_t o = it / n, k = it % n;
                  std::memcpy(dst + it * unit,
                              src + (o * dim + index[k]) * unit, unit);
                }
              });
  return llvm::Error::success();
}

// GatherElements(data, indices): out[p] = data[offset[p]], element by
// element as bytes.
llvm::Error gatherElements(const KernelCall &c) {
  const TensorRef &data = c.inputs[0], &idx = c.inputs[1];
  int64_t rank = data.rank(), axis = c.getInt("axis");
  if (axis < -rank || axis >= rank)
    return kernelError(c, "axis {0} is out of range for data {1}", axis,
                       ir::shapeStr(data.shape));
  if (axis < 0)
    axis += rank;
  auto offsetsOr = gatherElementsOffsets(c, data.shape, idx, axis);
  if (!offsetsOr)
    return offsetsOr.takeError();
  const std::vector<int64_t> &offsets = *offsetsOr;
  size_t unit = elemSize(data);
  const char *src = data.as<char>();
  char *dst = c.outputs[0].as<char>();
  parallelFor(int64_t(offsets.size()), kGrain, [&](int64_t b, int64_t e) {
    for (int64_t p = b; p < e; ++p)
      std::memcpy(dst + p * unit, src + offsets[p] * unit, unit);
  });
  return llvm::Error::success();
}

// ScatterND(data, indices, updates): out = data, then for each index tuple
// t (the last dim of indices), in order, the slice out[t, ...] is replaced
// by (none) or combined with (add, mul, max, min) updates[t's position].
// Serial over the tuples, so repeated tuples resolve in index order.
template <typename T>
void scatterCombine(T *dst, const T *src, int64_t n, const std::string &red) {
  for (int64_t i = 0; i < n; ++i) {
    if (red == "add")
      dst[i] = T(dst[i] + src[i]);
    else if (red == "mul")
      dst[i] = T(dst[i] * src[i]);
    else if (red == "max")
      dst[i] = std::max(dst[i], src[i]);
    else
      dst[i] = std::min(dst[i], src[i]);
  }
}

llvm::Error scatterND(const KernelCall &c) {
  const TensorRef &data = c.inputs[0], &idx = c.inputs[1],
                  &upd = c.inputs[2], &out = c.outputs[0];
  if (idx.dtype != DType::I64 && idx.dtype != DType::I32)
    return kernelError(c, "indices must be i64 or i32, not {0}",
                       ir::dtypeName(idx.dtype));
  if (idx.rank() < 1 || idx.shape.back() < 1 ||
      idx.shape.back() > int64_t(data.rank()))
    return kernelError(c, "indices {0} do not address data {1}",
                       ir::shapeStr(idx.shape), ir::shapeStr(data.shape));
  int64_t k = idx.shape.back(), tuples = idx.numElements() / k;
  int64_t slice = elementCount(data.shape.drop_front(k));
  if (upd.numElements() != tuples * slice || upd.dtype != data.dtype)
    return kernelError(c, "updates {0} do not match indices {1} into data {2}",
                       ir::shapeStr(upd.shape), ir::shapeStr(idx.shape),
                       ir::shapeStr(data.shape));
  const std::string &red = c.getString("reduction");
  bool typed = red != "none";
  if (typed && red != "add" && red != "mul" && red != "max" && red != "min")
    return kernelError(c, "unknown reduction '{0}'", red);
  if (typed && (data.dtype == DType::F16 || data.dtype == DType::BF16 ||
                data.dtype == DType::Bool))
    return kernelError(c, "reduction '{0}' is not supported for {1}", red,
                       ir::dtypeName(data.dtype));
  auto offsetsOr = scatterNDOffsets(c, data.shape, idx);
  if (!offsetsOr)
    return offsetsOr.takeError();
  const std::vector<int64_t> &offsets = *offsetsOr;
  size_t unit = elemSize(data);
  if (out.data != data.data)
    std::memcpy(out.as<char>(), data.as<char>(), byteSize(data));
  for (int64_t t = 0; t < tuples; ++t) {
    if (!typed) {
      std::memcpy(out.as<char>() + offsets[t] * unit,
                  upd.as<char>() + t * slice * unit, slice * unit);
      continue;
    }
    dispatchType(data.dtype, [&](auto v) {
      using T = decltype(v);
      scatterCombine(out.as<T>() + offsets[t], upd.as<T>() + t * slice, slice,
                     red);
    });
  }
  return llvm::Error::success();
}

// Pad's constant as the bytes of one element of `dtype`.
uint64_t padValueBits(DType dtype, float v) {
  uint64_t bits = 0;
  auto put = [&](auto x) { std::memcpy(&bits, &x, sizeof(x)); };
  auto toInt = [&](auto lo, auto hi) {
    using T = decltype(lo);
    return std::isnan(v) ? T(0) : v <= float(lo) ? lo : v >= float(hi) ? hi
                                                                        : T(v);
  };
  switch (dtype) {
  case DType::F32:
    put(v);
    break;
  case DType::F64:
    put(double(v));
    break;
  case DType::F16:
    put(ir::floatToHalf(v));
    break;
  case DType::BF16:
    put(ir::floatToBf16(v));
    break;
  case DType::I64:
    put(toInt(INT64_MIN, INT64_MAX));
    break;
  case DType::I32:
    put(toInt(INT32_MIN, INT32_MAX));
    break;
  case DType::I8:
    put(toInt(int8_t(INT8_MIN), int8_t(INT8_MAX)));
    break;
  case DType::U8:
    put(toInt(uint8_t(0), uint8_t(255)));
    break;
  case DType::Bool:
    put(uint8_t(v != 0));
    break;
  }
  return bits;
}

// Output rows (all dims but the last) are copied through per-dim index maps
// (output index -> input index, -1 for the constant); the last dim's
// interior run is one memcpy.
template <typename U>
void padTyped(const TensorRef &in, const TensorRef &out,
              const std::vector<std::vector<int64_t>> &maps,
              int64_t padBegin, U value) {
  const U *src = in.as<U>();
  U *dst = out.as<U>();
  size_t r = out.rank();
  std::vector<int64_t> inStrides = stridesOf(in.shape);
  int64_t inner = out.shape[r - 1], inInner = in.shape[r - 1];
  int64_t lo = std::clamp<int64_t>(padBegin, 0, inner);
  int64_t hi = std::clamp<int64_t>(padBegin + inInner, lo, inner);
  const std::vector<int64_t> &last = maps[r - 1];
  int64_t rows = out.numElements() / inner;
  parallelFor(rows, std::max<int64_t>(1, kGrain / inner),
              [&](int64_t b, int64_t e) {
    for (int64_t row = b; row < e; ++row) {
      U *d = dst + row * inner;
      int64_t off = 0, rem = row;
      bool constantRow = false;
      for (int64_t k = int64_t(r) - 2; k >= 0; --k) {
        int64_t m = maps[k][rem % out.shape[k]];
        rem /= out.shape[k];
        if (m < 0)
          constantRow = true;
        off += m * inStrides[k];
      }
      if (constantRow) {
        std::fill(d, d + inner, value);
        continue;
      }
      const U *s = src + off;
      for (int64_t j = 0; j < lo; ++j)
        d[j] = last[j] < 0 ? value : s[last[j]];
      if (hi > lo)
        std::memcpy(d + lo, s + (lo - padBegin), (hi - lo) * sizeof(U));
      for (int64_t j = hi; j < inner; ++j)
        d[j] = last[j] < 0 ? value : s[last[j]];
    }
  });
}

llvm::Error pad(const KernelCall &c) {
  const TensorRef &in = c.inputs[0], &out = c.outputs[0];
  const auto &pads = c.getInts("pads");
  const std::string &mode = c.getString("mode");
  size_t r = in.rank();
  if (out.numElements() == 0)
    return llvm::Error::success();
  if (r == 0)
    return copyAll(c);
  std::vector<std::vector<int64_t>> maps(r);
  for (size_t d = 0; d < r; ++d) {
    int64_t n = in.shape[d];
    maps[d].resize(out.shape[d]);
    for (int64_t o = 0; o < out.shape[d]; ++o) {
      int64_t i = o - pads[d];
      if (n == 0 && mode != "constant")
        return kernelError(c, "{0} padding of axis {1} needs a non-empty "
                              "input axis",
                           mode, d);
      maps[d][o] = n == 0 ? -1 : ir::padSourceIndex(mode, i, n);
      if (maps[d][o] == -2)
        return kernelError(c, "unknown mode '{0}'", mode);
    }
  }
  uint64_t bits = padValueBits(in.dtype, c.getFloat("value"));
  dispatchWidth(elemSize(in), [&](auto tag) {
    using U = decltype(tag);
    U value;
    std::memcpy(&value, &bits, sizeof(U));
    padTyped<U>(in, out, maps, pads[r - 1], value);
  });
  return llvm::Error::success();
}

// Trilu: each [rows, cols] matrix of the last two dims keeps element (i, j)
// where j - i >= k (upper) or j - i <= k (lower) and is zero elsewhere;
// element by element in bytes, so it serves every type.
llvm::Error trilu(const KernelCall &c) {
  const TensorRef &x = c.inputs[0], &y = c.outputs[0];
  if (x.rank() < 2)
    return kernelError(c, "operand {0} has rank < 2", ir::shapeStr(x.shape));
  int64_t rows = x.shape[x.rank() - 2], cols = x.shape.back();
  int64_t matrices = elementCount(x.shape.drop_back(2));
  int64_t k = c.getInt("k");
  bool upper = c.getInt("upper") != 0;
  size_t width = ir::dtypeSize(x.dtype);
  const char *src = static_cast<const char *>(x.data);
  char *dst = static_cast<char *>(y.data);
  parallelFor(matrices * rows, std::max<int64_t>(1, 16384 / std::max<int64_t>(1, cols)),
              [&](int64_t r0, int64_t r1) {
                for (int64_t r = r0; r < r1; ++r) {
                  int64_t i = r % rows;
                  for (int64_t j = 0; j < cols; ++j) {
                    bool keep = upper ? j - i >= k : j - i <= k;
                    size_t at = size_t(r * cols + j) * width;
                    if (keep)
                      std::memcpy(dst + at, src + at, width);
                    else
                      std::memset(dst + at, 0, width);
                  }
                }
              });
  return llvm::Error::success();
}

} // namespace

// Shared with SliceGrad (CpuKernels.h).
llvm::Expected<SliceView> sliceView(const KernelCall &call,
                                    llvm::ArrayRef<int64_t> shape) {
  const auto &starts = call.getInts("starts"), &ends = call.getInts("ends"),
             &axes = call.getInts("axes"), &steps = call.getInts("steps");
  int64_t rank = shape.size();
  std::vector<int64_t> strides = stridesOf(shape);
  SliceView v{0, std::vector<int64_t>(shape.begin(), shape.end()), strides,
              std::vector<int64_t>(size_t(rank), 0),
              std::vector<int64_t>(size_t(rank), 1)};
  for (size_t i = 0; i < axes.size(); ++i) {
    int64_t a = axes[i] < 0 ? axes[i] + rank : axes[i];
    if (a < 0 || a >= rank || steps[i] == 0)
      return kernelError(call, "bad axis {0} or step {1}", axes[i], steps[i]);
    int64_t first = 0;
    v.lengths[a] =
        support::sliceLength(shape[a], starts[i], ends[i], steps[i], &first);
    v.start += first * strides[a];
    v.strides[a] = strides[a] * steps[i];
    v.first[a] = first;
    v.steps[a] = steps[i];
  }
  return v;
}

// Shared with GatherGrad (CpuKernels.h).
llvm::Expected<std::vector<int64_t>>
gatherIndices(const KernelCall &call, const TensorRef &idx, int64_t dim) {
  if (idx.dtype != DType::I64 && idx.dtype != DType::I32)
    return kernelError(call, "indices must be i64 or i32, not {0}",
                       ir::dtypeName(idx.dtype));
  std::vector<int64_t> index(idx.numElements());
  dispatchType(idx.dtype, [&](auto v) {
    const auto *p = idx.as<decltype(v)>();
    for (size_t i = 0; i < index.size(); ++i)
      index[i] = int64_t(p[i]);
  });
  for (size_t i = 0; i < index.size(); ++i) {
    int64_t v = index[i];
    if (v < -dim || v >= dim)
      return kernelError(call, "index {0} (at position {1}) is out of range "
                               "for an axis of size {2}",
                         v, i, dim);
    index[i] = v < 0 ? v + dim : v;
  }
  return index;
}

llvm::Expected<std::vector<int64_t>>
gatherElementsOffsets(const KernelCall &call, llvm::ArrayRef<int64_t> dataShape,
                      const TensorRef &idx, int64_t axis) {
  int64_t rank = dataShape.size();
  if (int64_t(idx.rank()) != rank)
    return kernelError(call, "indices {0} must have the rank of data {1}",
                       ir::shapeStr(idx.shape), ir::shapeStr(dataShape));
  for (int64_t d = 0; d < rank; ++d)
    if (d != axis && idx.shape[d] > dataShape[d])
      return kernelError(call, "indices {0} are larger than data {1}",
                         ir::shapeStr(idx.shape), ir::shapeStr(dataShape));
  auto index = gatherIndices(call, idx, dataShape[axis]);
  if (!index)
    return index.takeError();
  std::vector<int64_t> dstrides = stridesOf(dataShape);
  std::vector<int64_t> &off = *index;
  // Positions as [outer lanes, along the axis, inner]: the dims after the
  // axis are walked with an odometer only where the indices are narrower
  // than the data there (else a lane's inner positions are consecutive in
  // the data too); outer lanes split over the threads. A position's
  // offset: its coordinates' offset with the axis's coordinate the index.
  const int64_t along = idx.shape[axis];
  const int64_t inner = elementCount(idx.shape.drop_front(axis + 1));
  const int64_t outer =
      along > 0 && inner > 0 ? int64_t(off.size()) / (along * inner) : 0;
  bool innerWhole = true;
  for (int64_t d = axis + 1; d < rank; ++d)
    innerWhole = innerWhole && idx.shape[d] == dataShape[d];
  const int64_t axisStride = dstrides[axis];
  parallelFor(outer, std::max<int64_t>(1, kGrain / std::max<int64_t>(1, along * inner)),
              [&](int64_t o0, int64_t o1) {
    llvm::SmallVector<int64_t, 8> coord(rank, 0);
    for (int64_t o = o0; o < o1; ++o) {
      int64_t base = 0; // the data offset of lane o's first coordinates
      for (int64_t d = axis, rest = o; d-- > 0;) {
        base += rest % idx.shape[d] * dstrides[d];
        rest /= idx.shape[d];
      }
      for (int64_t k = 0; k < along; ++k) {
        int64_t *row = off.data() + (o * along + k) * inner;
        if (innerWhole) {
          for (int64_t i = 0; i < inner; ++i)
            row[i] = base + row[i] * axisStride + i;
          continue;
        }
        std::fill(coord.begin(), coord.end(), 0);
        int64_t in = 0; // the offset of the inner coordinates
        for (int64_t i = 0; i < inner; ++i) {
          row[i] = base + row[i] * axisStride + in;
          for (int64_t d = rank; d-- > axis + 1;) {
            in += dstrides[d];
            if (++coord[d] < idx.shape[d])
              break;
            in -= coord[d] * dstrides[d];
            coord[d] = 0;
          }
        }
      }
    }
  });
  return std::move(*index);
}

llvm::Expected<std::vector<int64_t>>
scatterNDOffsets(const KernelCall &call, llvm::ArrayRef<int64_t> dataShape,
                 const TensorRef &idx) {
  if (idx.dtype != DType::I64 && idx.dtype != DType::I32)
    return kernelError(call, "indices must be i64 or i32, not {0}",
                       ir::dtypeName(idx.dtype));
  if (idx.rank() < 1 || idx.shape.back() < 1 ||
      idx.shape.back() > int64_t(dataShape.size()))
    return kernelError(call, "indices {0} do not address data {1}",
                       ir::shapeStr(idx.shape), ir::shapeStr(dataShape));
  int64_t k = idx.shape.back(), tuples = idx.numElements() / k;
  std::vector<int64_t> tuple(idx.numElements());
  dispatchType(idx.dtype, [&](auto v) {
    const auto *p = idx.as<decltype(v)>();
    for (size_t i = 0; i < tuple.size(); ++i)
      tuple[i] = int64_t(p[i]);
  });
  std::vector<int64_t> strides = stridesOf(dataShape);
  std::vector<int64_t> offsets(tuples);
  for (int64_t t = 0; t < tuples; ++t) {
    int64_t off = 0;
    for (int64_t d = 0; d < k; ++d) {
      int64_t v = tuple[t * k + d], dim = dataShape[d];
      if (v < -dim || v >= dim)
        return kernelError(call, "index {0} (tuple {1}, dim {2}) is out of "
                                 "range for a dim of size {3}",
                           v, t, d, dim);
      off += (v < 0 ? v + dim : v) * strides[d];
    }
    offsets[t] = off;
  }
  return offsets;
}

void registerDataMovementKernels(KernelTable &t) {
  for (OpKind op : {OpKind::Reshape, OpKind::Flatten, OpKind::Squeeze,
                    OpKind::Unsqueeze})
    t.add(op, copyAll, kAllTypes);
  t.add(OpKind::Concat, concat, kAllTypes);
  t.add(OpKind::Expand, expand, kAllTypes);
  t.add(OpKind::Gather, gather, kAllTypes);
  t.add(OpKind::GatherElements, gatherElements, kAllTypes);
  t.add(OpKind::ScatterND, scatterND, kAllTypes);
  t.add(OpKind::Pad, pad, kAllTypes);
  t.add(OpKind::Slice, slice, kAllTypes);
  t.add(OpKind::Split, split, kAllTypes);
  t.add(OpKind::Transpose, transpose, kAllTypes);
  t.add(OpKind::Trilu, trilu, kAllTypes);
}

} // namespace cleave::runtime::cpu
