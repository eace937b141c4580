// Device code of the index ops (DeviceCode.h): one step type, IndexStep,
// whose op says what one thread does. Three geometries:
//
//   - lanes along an axis, the operand viewed as [outer, len, inner]:
//     CumSum and ArgMax/ArgMin (one thread a lane, in order along it),
//     TopK (one thread an element: its place in the lane's stable order)
//     and Trilu (one thread an element, len x inner the matrix);
//   - GatherElements and ScatterElements and their gradients: data and
//     indices of one rank, indices addressing data along `axis`. The ops
//     that write an index-shaped result take one thread a position of the
//     indices; those that write a data-shaped result one thread a data
//     element, which reads the positions of its lane of the indices in
//     order, so repeated indices resolve as the CPU's serial loop resolves
//     them (the last write wins, sums in index order) with no atomics;
//   - ScatterND: tuples of `width` indices, each addressing a slice of
//     `slice` elements. A first step per tuple writes its slice's offset
//     the next tuple with the same offset and whether an earlier one has
//     it into scratch (the links); then one thread an updated element walks
//     its chain from the first tuple, again in index order;
//   - DFT: complex lanes (a last dim of 2), the CPU's direct sums in
//     double over a twiddle table that a first step writes into scratch.
//
// Indices out of range (which cleave-run checks where it can before a
// kernel runs) address nothing: a gather reads 0, a scatter skips them.
#pragma once

#include "runtime/cuda/DeviceElements.h"

namespace cleave::runtime::cuda {

enum class IndexOp : uint8_t {
  // lanes: x [outer, len, inner]
  CumSum,  // out as x; exclusive, reverse; floats summed in double
  ArgMax,  // out i64 [outer, inner]; a NaN wins; ties: the first (or last)
  ArgMin,
  TopK,    // out i64 [outer, k, inner]; NaN first when largest
  Trilu,   // x and out [outer, len, inner]; keeps j - i >= k (upper) / <= k
  // elements: data shape `dims`, indices shape `idxDims`, along `axis`
  GatherElements,             // out [idxDims] = x[...]
  GatherElementsGrad,         // out [dims] = the sum of dY (x) gathered there
  ScatterElements,            // out [dims] = x with upd scattered in
  ScatterElementsGradData,    // out [dims] = dY (x), 0 where written
  ScatterElementsGradUpdates, // out [idxDims] = dY where the last write
  // ScatterND: `tuples` tuples of `width` indices into `dims`
  ScatterNDLinks,      // links: each tuple's offset, next and first flag
  ScatterND,           // out (holding x already) with upd's slices
  ScatterNDGradData,   // out (holding dY already): 0 in written slices
  ScatterNDGradUpdates, // out [tuples, slice] = dY's slice where last write
  // DFT of complex lanes x [outer, len, inner, 2]: a twiddle table of 2 len
  // doubles (cos, then -+sin) in scratch, then one thread an output point
  DftTwiddles,
  Dft
};

// How ScatterElements and ScatterND combine an update with the element.
enum class ScatterReduce : uint8_t { None, Add, Mul, Max, Min };

struct IndexStep {
  IndexOp op = IndexOp::CumSum;
  int64_t threads = 0;
  const void *x = nullptr; // the operand, data or dY
  Elem xElem = Elem::F32;
  const void *idx = nullptr;
  Elem idxElem = Elem::I64;
  const void *upd = nullptr; // updates (of xElem)
  void *out = nullptr;
  Elem outElem = Elem::F32;
  // Lanes.
  int64_t outer = 1, len = 0, inner = 1;
  int64_t k = 0; // TopK's count; Trilu's diagonal
  bool exclusive = false, reverse = false; // CumSum
  bool largest = true;                     // TopK
  bool last = false;                       // ArgMax/ArgMin: select_last_index
  bool upper = true;                       // Trilu
  // Elements and ScatterND: data's dims and row-major strides.
  int rank = 0, axis = 0;
  int64_t dims[kMaxRank] = {}, strides[kMaxRank] = {};
  int64_t idxDims[kMaxRank] = {}, idxStrides[kMaxRank] = {};
  ScatterReduce reduce = ScatterReduce::None;
  // ScatterND.
  int64_t tuples = 0, width = 0, slice = 0;
  int64_t *links = nullptr; // 3 * tuples, scratch
  // DFT.
  bool inverse = false;
  double scale = 1.0;       // 1 / len where normalized
  double *table = nullptr;  // 2 * len, scratch
};

// --- helpers ----------------------------------------------------------------------

// A value as the CPU's index kernels compare it: in double.
CLEAVE_HD double loadDouble(const void *p, Elem e, int64_t off) {
  return isInt(e) ? double(loadInt(p, e, off)) : double(load(p, e, off));
}

CLEAVE_HD void zeroElement(void *p, int size, int64_t off) {
  switch (size) {
  case 1: static_cast<uint8_t *>(p)[off] = 0; return;
  case 2: static_cast<uint16_t *>(p)[off] = 0; return;
  case 4: static_cast<uint32_t *>(p)[off] = 0; return;
  default: static_cast<uint64_t *>(p)[off] = 0; return;
  }
}

// An index along a dim of `dim` elements, negative counting from the end;
// -1 when out of range.
CLEAVE_HD int64_t indexAt(const IndexStep &s, int64_t pos, int64_t dim) {
  int64_t v = loadInt(s.idx, s.idxElem, pos);
  if (v < 0)
    v += dim;
  return v < 0 || v >= dim ? -1 : v;
}

// `acc` combined with `u`, as the CPU's typed loops combine them: floats
// in f32 (ScatterElements takes no reduction for bf16), integers wrapping.
CLEAVE_HD void scatterCombine(ScatterReduce r, Elem e, void *out, int64_t o,
                              const void *upd, int64_t u) {
  if (isInt(e)) {
    int64_t a = loadInt(out, e, o), b = loadInt(upd, e, u), v = a;
    switch (r) {
    case ScatterReduce::Add: v = int64_t(uint64_t(a) + uint64_t(b)); break;
    case ScatterReduce::Mul: v = int64_t(uint64_t(a) * uint64_t(b)); break;
    case ScatterReduce::Max: v = a < b ? b : a; break;
    case ScatterReduce::Min: v = b < a ? b : a; break;
    case ScatterReduce::None: v = b; break;
    }
    if (e == Elem::I64)
      static_cast<int64_t *>(out)[o] = v;
    else if (e == Elem::I32)
      static_cast<int32_t *>(out)[o] = int32_t(uint32_t(uint64_t(v)));
    else
      static_cast<uint8_t *>(out)[o] = v != 0;
    return;
  }
  float a = load(out, e, o), b = load(upd, e, u), v = a;
  switch (r) {
  case ScatterReduce::Add: v = a + b; break;
  case ScatterReduce::Mul: v = a * b; break;
  case ScatterReduce::Max: v = a < b ? b : a; break; // std::max
  case ScatterReduce::Min: v = b < a ? b : a; break; // std::min
  case ScatterReduce::None: v = b; break;
  }
  store(out, e, o, v);
}

// --- lanes ------------------------------------------------------------------------

CLEAVE_HD void cumSumLane(const IndexStep &s, int64_t lane) {
  int64_t base = (lane / s.inner) * s.len * s.inner + lane % s.inner;
  bool ints = isInt(s.xElem);
  double acc = 0.0;
  uint64_t iacc = 0;
  for (int64_t k = 0; k < s.len; ++k) {
    int64_t j = base + (s.reverse ? s.len - 1 - k : k) * s.inner;
    if (ints) {
      uint64_t v = uint64_t(loadInt(s.x, s.xElem, j));
      if (!s.exclusive)
        iacc += v;
      if (s.outElem == Elem::I64)
        static_cast<int64_t *>(s.out)[j] = int64_t(iacc);
      else
        static_cast<int32_t *>(s.out)[j] = int32_t(uint32_t(iacc));
      if (s.exclusive)
        iacc += v;
    } else {
      double v = load(s.x, s.xElem, j);
      if (!s.exclusive)
        acc += v;
      store(s.out, s.outElem, j, float(acc));
      if (s.exclusive)
        acc += v;
    }
  }
}

CLEAVE_HD void argLane(const IndexStep &s, int64_t lane) {
  int64_t o = lane / s.inner, i = lane % s.inner, best = 0;
  bool max = s.op == IndexOp::ArgMax;
  double bv = loadDouble(s.x, s.xElem, o * s.len * s.inner + i);
  for (int64_t k = 1; k < s.len && bv == bv; ++k) {
    double v = loadDouble(s.x, s.xElem, (o * s.len + k) * s.inner + i);
    if (v != v || (max ? v > bv : v < bv) || (s.last && v == bv)) {
      best = k;
      bv = v;
    }
  }
  static_cast<int64_t *>(s.out)[lane] = best;
}

// Whether a comes before b in TopK's order (NaN first when largest, last
// when not); neither for equal values, which keep their index order.
CLEAVE_HD bool topKBefore(bool largest, double a, double b) {
  bool na = a != a, nb = b != b;
  if (na || nb)
    return largest ? na && !nb : nb && !na;
  return largest ? a > b : a < b;
}

// Element j of a lane: its place in the lane's stable order, written as
// the answer's entry if it is among the first k.
CLEAVE_HD void topKElement(const IndexStep &s, int64_t e) {
  int64_t i = e % s.inner, j = (e / s.inner) % s.len,
          o = e / (s.inner * s.len);
  int64_t base = o * s.len * s.inner + i;
  double v = loadDouble(s.x, s.xElem, base + j * s.inner);
  int64_t place = 0;
  for (int64_t q = 0; q < s.len && place < s.k; ++q) {
    if (q == j)
      continue;
    double w = loadDouble(s.x, s.xElem, base + q * s.inner);
    if (topKBefore(s.largest, w, v) ||
        (q < j && !topKBefore(s.largest, v, w)))
      ++place;
  }
  if (place < s.k)
    static_cast<int64_t *>(s.out)[(o * s.k + place) * s.inner + i] = j;
}

CLEAVE_HD void triluElement(const IndexStep &s, int64_t e) {
  int64_t col = e % s.inner, row = (e / s.inner) % s.len;
  bool keep = s.upper ? col - row >= s.k : col - row <= s.k;
  if (keep)
    mapCopyElement(s.x, e, s.out, e, elemSize(s.xElem));
  else
    zeroElement(s.out, elemSize(s.outElem), e);
}

// --- GatherElements and ScatterElements -------------------------------------------

// Position p of the indices: the data offset of its coordinates but the
// axis's (which the index gives), and its coordinate along the axis.
CLEAVE_HD int64_t elementsBase(const IndexStep &s, int64_t p, int64_t *along) {
  int64_t off = 0;
  for (int d = s.rank - 1; d >= 0; --d) {
    int64_t c = p % s.idxDims[d];
    p /= s.idxDims[d];
    if (d == s.axis)
      *along = c;
    else
      off += c * s.strides[d];
  }
  return off;
}

// Data element q: its coordinate along the axis and the position of its
// lane's first index (-1 where the indices do not reach its coordinates).
CLEAVE_HD int64_t elementsLane(const IndexStep &s, int64_t q, int64_t *along) {
  int64_t pos = 0;
  for (int d = s.rank - 1; d >= 0; --d) {
    int64_t c = q % s.dims[d];
    q /= s.dims[d];
    if (d == s.axis)
      *along = c;
    else if (c >= s.idxDims[d])
      return -1;
    else
      pos += c * s.idxStrides[d];
  }
  return pos;
}

CLEAVE_HD void elementsThread(const IndexStep &s, int64_t t) {
  int64_t dim = s.dims[s.axis], n = s.idxDims[s.axis],
          step = s.idxStrides[s.axis];
  int size = elemSize(s.outElem);
  switch (s.op) {
  case IndexOp::GatherElements: {
    int64_t along = 0, base = elementsBase(s, t, &along);
    int64_t v = indexAt(s, t, dim);
    if (v < 0)
      zeroElement(s.out, size, t);
    else
      mapCopyElement(s.x, base + v * s.strides[s.axis], s.out, t, size);
    return;
  }
  case IndexOp::ScatterElementsGradUpdates: {
    int64_t along = 0, base = elementsBase(s, t, &along);
    int64_t v = indexAt(s, t, dim);
    bool later = v < 0;
    for (int64_t m = along + 1; m < n && !later; ++m)
      later = indexAt(s, t + (m - along) * step, dim) == v;
    if (later)
      zeroElement(s.out, size, t);
    else
      mapCopyElement(s.x, base + v * s.strides[s.axis], s.out, t, size);
    return;
  }
  default:
    break;
  }
  // One thread a data element, over its lane of the indices in order.
  int64_t along = 0, pos = elementsLane(s, t, &along);
  switch (s.op) {
  case IndexOp::GatherElementsGrad: {
    float acc = 0.0f;
    for (int64_t m = 0; pos >= 0 && m < n; ++m)
      if (indexAt(s, pos + m * step, dim) == along)
        acc += load(s.x, s.xElem, pos + m * step);
    store(s.out, s.outElem, t, acc);
    return;
  }
  case IndexOp::ScatterElements:
    mapCopyElement(s.x, t, s.out, t, size);
    for (int64_t m = 0; pos >= 0 && m < n; ++m)
      if (indexAt(s, pos + m * step, dim) == along) {
        if (s.reduce == ScatterReduce::None)
          mapCopyElement(s.upd, pos + m * step, s.out, t, size);
        else
          scatterCombine(s.reduce, s.outElem, s.out, t, s.upd, pos + m * step);
      }
    return;
  case IndexOp::ScatterElementsGradData: {
    bool written = false;
    for (int64_t m = 0; pos >= 0 && m < n && !written; ++m)
      written = indexAt(s, pos + m * step, dim) == along;
    if (written)
      zeroElement(s.out, size, t);
    else
      mapCopyElement(s.x, t, s.out, t, size);
    return;
  }
  default:
    return;
  }
}

// --- ScatterND ----------------------------------------------------------------------

// Tuple t's slice offset into data, -1 if an index is out of range.
CLEAVE_HD int64_t tupleOffset(const IndexStep &s, int64_t t) {
  int64_t off = 0;
  for (int64_t d = 0; d < s.width; ++d) {
    int64_t v = indexAt(s, t * s.width + d, s.dims[d]);
    if (v < 0)
      return -1;
    off += v * s.strides[d];
  }
  return off;
}

// links[t] = tuple t's offset; links[tuples + t] = the next tuple with that
// offset, -1 for none (and for a tuple out of range); links[2 tuples + t]
// = 1 where an earlier tuple has it.
CLEAVE_HD void scatterNDLink(const IndexStep &s, int64_t t) {
  int64_t off = tupleOffset(s, t), next = -1, earlier = 0;
  for (int64_t u = t + 1; off >= 0 && u < s.tuples && next < 0; ++u)
    if (tupleOffset(s, u) == off)
      next = u;
  for (int64_t u = 0; off >= 0 && u < t && !earlier; ++u)
    earlier = tupleOffset(s, u) == off;
  s.links[t] = off;
  s.links[s.tuples + t] = next;
  s.links[2 * s.tuples + t] = earlier;
}

// Element r of tuple t's slice.
CLEAVE_HD void scatterNDThread(const IndexStep &s, int64_t e) {
  int64_t t = e / s.slice, r = e % s.slice, off = s.links[t];
  int size = elemSize(s.outElem);
  if (s.op == IndexOp::ScatterNDGradUpdates) {
    if (off >= 0 && s.links[s.tuples + t] < 0)
      mapCopyElement(s.x, off + r, s.out, e, size);
    else
      zeroElement(s.out, size, e);
    return;
  }
  if (off < 0)
    return;
  if (s.op == IndexOp::ScatterNDGradData) {
    zeroElement(s.out, size, off + r);
    return;
  }
  // ScatterND: the chain's first tuple applies them all, in order.
  if (s.links[2 * s.tuples + t])
    return;
  for (int64_t u = t; u >= 0; u = s.links[s.tuples + u]) {
    if (s.reduce == ScatterReduce::None)
      mapCopyElement(s.upd, u * s.slice + r, s.out, off + r, size);
    else
      scatterCombine(s.reduce, s.outElem, s.out, off + r, s.upd,
                     u * s.slice + r);
  }
}

// --- DFT ------------------------------------------------------------------------------

// The CPU's table: cos(2 pi j / n) and -sin (sin for the inverse).
CLEAVE_HD void dftTwiddle(const IndexStep &s, int64_t j) {
  double a = 2.0 * 3.14159265358979323846 * double(j) / double(s.len);
  s.table[j] = cos(a);
  s.table[s.len + j] = s.inverse ? sin(a) : -sin(a);
}

// Output point k of a lane: its sum over the lane's points in order, in
// double, the twiddle of (k m mod n) from the table.
CLEAVE_HD void dftPoint(const IndexStep &s, int64_t t) {
  int64_t i = t % s.inner, k = (t / s.inner) % s.len,
          o = t / (s.inner * s.len);
  double sr = 0.0, si = 0.0;
  for (int64_t m = 0, j = 0; m < s.len; ++m, j = (j + k) % s.len) {
    int64_t at = ((o * s.len + m) * s.inner + i) * 2;
    double re = load(s.x, s.xElem, at), im = load(s.x, s.xElem, at + 1);
    double c = s.table[j], sn = s.table[s.len + j];
    sr += re * c - im * sn;
    si += re * sn + im * c;
  }
  store(s.out, s.outElem, 2 * t, float(sr * s.scale));
  store(s.out, s.outElem, 2 * t + 1, float(si * s.scale));
}

// --- the step -----------------------------------------------------------------------

CLEAVE_HD void indexElement(const IndexStep &s, int64_t i) {
  switch (s.op) {
  case IndexOp::CumSum: cumSumLane(s, i); return;
  case IndexOp::ArgMax:
  case IndexOp::ArgMin: argLane(s, i); return;
  case IndexOp::TopK: topKElement(s, i); return;
  case IndexOp::Trilu: triluElement(s, i); return;
  case IndexOp::ScatterNDLinks: scatterNDLink(s, i); return;
  case IndexOp::ScatterND:
  case IndexOp::ScatterNDGradData:
  case IndexOp::ScatterNDGradUpdates: scatterNDThread(s, i); return;
  case IndexOp::DftTwiddles: dftTwiddle(s, i); return;
  case IndexOp::Dft: dftPoint(s, i); return;
  default: elementsThread(s, i); return;
  }
}

} // namespace cleave::runtime::cuda
