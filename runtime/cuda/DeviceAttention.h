// Device code of fused attention (a DeviceCode.h family): the arithmetic of
// scaled dot-product attention, forward and backward, one row at a time,
// without ever storing the Tq x Tk scores. It is written like the other
// device headers, CLEAVE_HD functions that nvcc compiles for one GPU thread
// a row and the host compiler compiles for the emulated backend's loops
// (runAttentionForwardOnHost / runAttentionBackwardOnHost below), so the
// formulas are tested on any machine; what only a GPU can test is the launch
// around them. The CUDA backend lowers FusedAttention and its gradient to
// these functions (runtime/cuda/Lowering.cpp, CudaKernels.cu); the CPU
// backend's blocked kernels share the masks, loads and stores here
// (runtime/cpu/Attention.cpp; docs/design/fused-attention.md).
//
// Semantics: PyTorch's scaled_dot_product_attention, as exporters emit it.
// Q [B, Hq, Tq, D], K and V [B, Hkv, Tk, D] with Hq a multiple of Hkv; query
// head h reads kv head h / (Hq / Hkv) (grouped-query: each kv head serves a
// group of consecutive query heads, as repeat_interleave gives them).
//   S_ij = scale * q_i . k_j + bias_ij, over the keys row i may see;
//   P_i  = softmax(S_i),  O_i = sum_j P_ij v_j,  L_i = logsumexp(S_i).
// A key is hidden from row i by the causal rule, by the boolean mask
// (false = hidden) or by a -inf in the additive mask. Causal: query i sees
// key j iff j <= i + offset, offset = Tk - Tq (BottomRight, the default:
// the last query sees every key, FlashAttention's and a KV cache's
// alignment) or 0 (TopLeft: torch.tril over [Tq, Tk]). The two agree when
// Tq == Tk; PyTorch's is_causal=True and ONNX's Attention without a past
// are TopLeft when they differ, so a lowering of those picks TopLeft.
// Both masks are read through strides over (b, h, i, j), a zero stride
// broadcasting; h is the query head.
//
// A row that sees no key (fully masked) gives O_i = 0 and L_i = -inf, and
// contributes nothing to any gradient. PyTorch since 2.5 does the same for
// O (SDPA's _safe_softmax zeroes rows whose scores are all -inf; softmax's
// gradient through a zero row is zero); earlier versions gave NaN there.
// A NaN among the inputs still gives NaN.
//
// Forward (attentionForwardRow): row (b, h, i) walks the keys it may see in
// tiles of kAttnTile, in increasing order, with an online softmax: the
// running maximum m, the running sum l of exp(S - m), and an accumulator of
// D values rescaled by exp(m_old - m_new) when a tile raises the maximum. It
// writes O_i and L_i = m + log(l), the only statistic the backward needs.
//
// Backward, every input gradient (attention has no weights), recomputing
// P_ij = exp(S_ij - L_i) from L instead of storing P:
//   Delta_i = sum_d dO_id O_id                    (attentionDeltaRow)
//   dS_ij   = P_ij (dO_i . v_j - Delta_i)
//   dQ_i    = scale sum_j dS_ij k_j               (attentionGradQRow)
//   dK_j    = scale sum_(h in group, i) dS_ij q_i (attentionGradKVRow)
//   dV_j    = sum_(h in group, i) P_ij dO_i       (attentionGradKVRow)
// Each output row is gathered by one call that walks its terms in a fixed
// order (keys increasing for dQ; the group's query heads increasing, then
// queries increasing, for dK and dV), so there are no atomics and the bits
// do not depend on how rows are spread over threads. The price is that the
// scores are recomputed twice (once for dQ, once for dK/dV) where a
// scattering kernel recomputes them once and adds dQ atomically.
//
// Precision. The shared Elem has no f64 (the CUDA backend does not carry
// f64 yet), so attention's operands name their type with AttnElem (f32,
// bf16, f64), whose f32 and bf16 loads and stores are the shared load/store
// (bf16 rounded as ir/DType.cpp rounds it). The compute type T is float when
// Q, K and V are f32 or bf16 and double when any is f64. In T: the dot
// products, the exponentials and the D-wide accumulators, as the GEMMs
// compute in f32 (CUBLAS_COMPUTE_32F, the CPU's f32 GEMM) and fused
// attention kernels do. In double: the softmax's running sum l and
// Delta_i, the row sums that the row ops (DeviceReductions.h) accumulate in
// double, and the final division O = acc / l. L is stored in lseElem, f32
// by default (what PyTorch's fused kernels keep); an f64 attention can keep
// it in f64 so that its backward stays f64 throughout. Delta is a double
// per row (scratch, as the row ops' statistics). The tile size fixes where
// the running maximum is rescaled, so it is part of the forward's bits.
//
// Limits (attentionSupported): 1 <= D <= kMaxHeadDim, since each row keeps
// fixed-size local arrays of D values; Hq a multiple of Hkv. V's head size
// equals Q's and K's; there is no dropout and no gradient for the additive
// mask (a lowering must leave attention whose mask needs a gradient, such
// as a learned relative-position bias, to the unfused ops).
#pragma once

#include "runtime/cuda/DeviceElements.h"

namespace cleave::runtime::cuda {

constexpr int kAttnTile = 64;     // keys per online-softmax step
constexpr int kMaxHeadDim = 256;  // D bound of the per-row local arrays

// The element types of attention's floating-point operands.
enum class AttnElem : uint8_t { F32, BF16, F64 };

CLEAVE_HD Elem attnSharedElem(AttnElem e) {
  return e == AttnElem::BF16 ? Elem::BF16 : Elem::F32;
}

// Element `off` of `p` as T. f32 and bf16 go through the shared load, which
// widens exactly; f64 narrowed to float rounds once.
template <class T>
CLEAVE_HD T attnRead(const void *p, AttnElem e, int64_t off) {
  if (e == AttnElem::F64)
    return T(static_cast<const double *>(p)[off]);
  return T(load(p, attnSharedElem(e), off));
}

// Writes v as element `off` of `p`: one rounding to the element type when T
// is float (bf16 through the shared store); from double, f32 rounds once and
// bf16 twice (to float, then to bf16), which only a double computation over
// bf16 storage could see.
template <class T>
CLEAVE_HD void attnWrite(void *p, AttnElem e, int64_t off, T v) {
  if (e == AttnElem::F64) {
    static_cast<double *>(p)[off] = double(v);
    return;
  }
  store(p, attnSharedElem(e), off, float(v));
}

CLEAVE_HD float attnExp(float x) { return expf(x); }
CLEAVE_HD double attnExp(double x) { return exp(x); }

// A [batch, heads, positions, features] operand and where its elements are:
// offsets are sums of coordinate * stride (in elements), so a [B, T, H, D]
// layout (the projections' output before a transpose) is read in place. For
// the masks the four coordinates are (b, query head, query i, key j), and a
// zero stride broadcasts.
struct AttnInput {
  const void *data = nullptr; // null: absent (the optional additive mask)
  AttnElem elem = AttnElem::F32;
  int64_t strides[4] = {};

  CLEAVE_HD int64_t at(int64_t b, int64_t h, int64_t t, int64_t d) const {
    return b * strides[0] + h * strides[1] + t * strides[2] + d * strides[3];
  }
};

struct AttnOutput {
  void *data = nullptr;
  AttnElem elem = AttnElem::F32;
  int64_t strides[4] = {};

  CLEAVE_HD int64_t at(int64_t b, int64_t h, int64_t t, int64_t d) const {
    return b * strides[0] + h * strides[1] + t * strides[2] + d * strides[3];
  }
};

// The boolean mask, one byte an element (Elem::Bool), true = the key is seen.
struct AttnKeep {
  const void *data = nullptr; // null: absent
  int64_t strides[4] = {};

  CLEAVE_HD int64_t at(int64_t b, int64_t h, int64_t t, int64_t d) const {
    return b * strides[0] + h * strides[1] + t * strides[2] + d * strides[3];
  }
};

enum class CausalAlign : uint8_t { BottomRight, TopLeft };

// What the forward and the backward share: shapes, scale, flags, Q, K, V
// and the masks.
struct AttentionOperands {
  int64_t batch = 0, queryHeads = 0, kvHeads = 0, queryLen = 0, keyLen = 0,
          headDim = 0;
  double scale = 0; // defaultAttentionScale(headDim) when the op gives none
  bool causal = false;
  CausalAlign align = CausalAlign::BottomRight;
  AttnInput q, k, v;
  AttnInput bias; // additive mask, optional
  AttnKeep keep;  // boolean mask, optional
};

// Forward: one call a query row, rows = B * Hq * Tq, row-major over
// (b, h, i). O as `out`; L (logsumexp) at lse[row] in lseElem.
struct AttentionStep {
  AttentionOperands in;
  AttnOutput out;
  void *lse = nullptr;
  AttnElem lseElem = AttnElem::F32;
};

// Backward: `out` and `lse` are the forward's results, dOut the output
// gradient. Three passes, each needing the one before to have finished
// (three launches on a GPU): attentionDeltaRow for every query row (into
// `delta`, B * Hq * Tq doubles of scratch), then attentionGradQRow for every
// query row and attentionGradKVRow for every kv row (B * Hkv * Tk; these two
// are independent of each other).
struct AttentionGradStep {
  AttentionOperands in;
  AttnInput out, dOut;
  const void *lse = nullptr;
  AttnElem lseElem = AttnElem::F32;
  double *delta = nullptr;
  AttnOutput dq, dk, dv;
};

CLEAVE_HD double defaultAttentionScale(int64_t headDim) {
  return 1.0 / sqrt(double(headDim));
}

// Whether the functions below can compute this attention: the head size fits
// the local arrays, the query heads split evenly over the kv heads, and the
// inputs are there.
CLEAVE_HD bool attentionSupported(const AttentionOperands &a) {
  return a.headDim >= 1 && a.headDim <= kMaxHeadDim && a.kvHeads >= 1 &&
         a.queryHeads >= a.kvHeads && a.queryHeads % a.kvHeads == 0 &&
         a.batch >= 0 && a.queryLen >= 0 && a.keyLen >= 0 && a.q.data &&
         a.k.data && a.v.data;
}

CLEAVE_HD int64_t attentionRows(const AttentionOperands &a) {
  return a.batch * a.queryHeads * a.queryLen;
}
CLEAVE_HD int64_t attentionKvRows(const AttentionOperands &a) {
  return a.batch * a.kvHeads * a.keyLen;
}

// Query i sees key j iff j <= i + attentionCausalOffset (when causal).
CLEAVE_HD int64_t attentionCausalOffset(const AttentionOperands &a) {
  return a.align == CausalAlign::BottomRight ? a.keyLen - a.queryLen : 0;
}

// The keys row i may see are a prefix [0, end) before the masks.
CLEAVE_HD int64_t attentionKeyEnd(const AttentionOperands &a, int64_t i) {
  if (!a.causal)
    return a.keyLen;
  int64_t end = i + attentionCausalOffset(a) + 1;
  return end < 0 ? 0 : end > a.keyLen ? a.keyLen : end;
}

// The queries that may see key j are a suffix [begin, Tq).
CLEAVE_HD int64_t attentionQueryBegin(const AttentionOperands &a, int64_t j) {
  if (!a.causal)
    return 0;
  int64_t begin = j - attentionCausalOffset(a);
  return begin < 0 ? 0 : begin > a.queryLen ? a.queryLen : begin;
}

CLEAVE_HD bool attentionKeeps(const AttentionOperands &a, int64_t b, int64_t h,
                              int64_t i, int64_t j) {
  if (!a.keep.data)
    return true;
  return loadInt(a.keep.data, Elem::Bool, a.keep.at(b, h, i, j)) != 0;
}

// sum_d local[d] * x[b, h, t, d], in increasing d. The score q_i . k_j is
// this with either vector local, and the products commute exactly, so the
// forward, dQ and dK/dV all compute the same score bits.
template <class T>
CLEAVE_HD T attnDot(const T *local, const AttnInput &x, int64_t b, int64_t h,
                    int64_t t, int64_t dim) {
  T acc = 0;
  for (int64_t d = 0; d < dim; ++d)
    acc += local[d] * attnRead<T>(x.data, x.elem, x.at(b, h, t, d));
  return acc;
}

// S_ij from the dot product q_i . k_j: scaled, plus the additive mask.
template <class T>
CLEAVE_HD T attnScore(const AttentionOperands &a, T dot, int64_t b, int64_t h,
                      int64_t i, int64_t j) {
  T s = dot * T(a.scale);
  if (a.bias.data)
    s += attnRead<T>(a.bias.data, a.bias.elem, a.bias.at(b, h, i, j));
  return s;
}

// The maximum of a and b where a NaN wins, so that a NaN score poisons the
// row instead of being skipped.
template <class T> CLEAVE_HD T attnMax(T a, T b) {
  return a > b || a != a ? a : b;
}

// --- forward ---------------------------------------------------------------

template <class T>
CLEAVE_HD void attentionForwardRowAs(const AttentionStep &s, int64_t row) {
  const AttentionOperands &a = s.in;
  const int64_t dim = a.headDim, i = row % a.queryLen,
                h = row / a.queryLen % a.queryHeads,
                b = row / (a.queryLen * a.queryHeads),
                kvh = h / (a.queryHeads / a.kvHeads);
  T q[kMaxHeadDim], acc[kMaxHeadDim];
  for (int64_t d = 0; d < dim; ++d) {
    q[d] = attnRead<T>(a.q.data, a.q.elem, a.q.at(b, h, i, d));
    acc[d] = 0;
  }
  T m = T(-INFINITY); // running maximum of the scores seen
  double l = 0;       // running sum of exp(S - m)
  const int64_t end = attentionKeyEnd(a, i);
  for (int64_t j0 = 0; j0 < end; j0 += kAttnTile) {
    const int n = end - j0 < kAttnTile ? int(end - j0) : kAttnTile;
    // The tile's scores first, so the maximum moves once a tile.
    T score[kAttnTile];
    T tileMax = T(-INFINITY);
    for (int t = 0; t < n; ++t) {
      const int64_t j = j0 + t;
      score[t] = attentionKeeps(a, b, h, i, j)
                     ? attnScore(a, attnDot(q, a.k, b, kvh, j, dim), b, h, i, j)
                     : T(-INFINITY);
      tileMax = attnMax(score[t], tileMax);
    }
    if (tileMax == T(-INFINITY))
      continue; // every key of the tile hidden: nothing changes
    const T mNew = attnMax(tileMax, m);
    if (mNew != m) {
      // exp(-inf) = 0 on the first visible tile, where acc and l are 0.
      const T rescale = attnExp(m - mNew);
      l *= double(rescale);
      for (int64_t d = 0; d < dim; ++d)
        acc[d] *= rescale;
      m = mNew;
    }
    for (int t = 0; t < n; ++t) {
      if (score[t] == T(-INFINITY))
        continue; // hidden: its V is not read (a masked pad may hold NaN)
      const int64_t j = j0 + t;
      const T p = attnExp(score[t] - m);
      l += double(p);
      for (int64_t d = 0; d < dim; ++d)
        acc[d] += p * attnRead<T>(a.v.data, a.v.elem, a.v.at(b, kvh, j, d));
    }
  }
  if (l == 0) { // no key seen: the fully-masked rule
    for (int64_t d = 0; d < dim; ++d)
      attnWrite(s.out.data, s.out.elem, s.out.at(b, h, i, d), T(0));
    attnWrite(s.lse, s.lseElem, row, double(-INFINITY));
    return;
  }
  for (int64_t d = 0; d < dim; ++d)
    attnWrite(s.out.data, s.out.elem, s.out.at(b, h, i, d),
              T(double(acc[d]) / l));
  attnWrite(s.lse, s.lseElem, row, double(m) + log(l));
}

CLEAVE_HD bool attentionWide(const AttentionOperands &a) {
  return a.q.elem == AttnElem::F64 || a.k.elem == AttnElem::F64 ||
         a.v.elem == AttnElem::F64;
}

// O and L of query row `row` (row-major over b, h, i).
CLEAVE_HD void attentionForwardRow(const AttentionStep &s, int64_t row) {
  if (attentionWide(s.in))
    attentionForwardRowAs<double>(s, row);
  else
    attentionForwardRowAs<float>(s, row);
}

// --- backward ----------------------------------------------------------------

// Delta_i = dO_i . O_i (equal to sum_j P_ij (dO_i . v_j), the softmax
// gradient's row term, without visiting the keys), in double.
CLEAVE_HD void attentionDeltaRow(const AttentionGradStep &s, int64_t row) {
  const AttentionOperands &a = s.in;
  const int64_t i = row % a.queryLen, h = row / a.queryLen % a.queryHeads,
                b = row / (a.queryLen * a.queryHeads);
  double sum = 0;
  for (int64_t d = 0; d < a.headDim; ++d)
    sum += attnRead<double>(s.dOut.data, s.dOut.elem, s.dOut.at(b, h, i, d)) *
           attnRead<double>(s.out.data, s.out.elem, s.out.at(b, h, i, d));
  s.delta[row] = sum;
}

// dS_ij from the score, L_i, dO_i . v_j and Delta_i. P_ij = exp(S - L) is
// at most 1 (L is the logsumexp of the row's scores).
template <class T>
CLEAVE_HD T attnScoreGrad(T p, T dpv, double delta) {
  return p * T(double(dpv) - delta);
}

template <class T>
CLEAVE_HD void attentionGradQRowAs(const AttentionGradStep &s, int64_t row) {
  const AttentionOperands &a = s.in;
  const int64_t dim = a.headDim, i = row % a.queryLen,
                h = row / a.queryLen % a.queryHeads,
                b = row / (a.queryLen * a.queryHeads),
                kvh = h / (a.queryHeads / a.kvHeads);
  const T lse = attnRead<T>(s.lse, s.lseElem, row);
  T q[kMaxHeadDim], dout[kMaxHeadDim], acc[kMaxHeadDim];
  for (int64_t d = 0; d < dim; ++d) {
    q[d] = attnRead<T>(a.q.data, a.q.elem, a.q.at(b, h, i, d));
    dout[d] = attnRead<T>(s.dOut.data, s.dOut.elem, s.dOut.at(b, h, i, d));
    acc[d] = 0;
  }
  const double delta = s.delta[row];
  // A fully-masked row (L = -inf) sees no key, so the loop adds nothing.
  const int64_t end = lse == T(-INFINITY) ? 0 : attentionKeyEnd(a, i);
  for (int64_t j = 0; j < end; ++j) {
    if (!attentionKeeps(a, b, h, i, j))
      continue;
    const T sc = attnScore(a, attnDot(q, a.k, b, kvh, j, dim), b, h, i, j);
    if (sc == T(-INFINITY))
      continue;
    const T ds = attnScoreGrad(attnExp(sc - lse),
                               attnDot(dout, a.v, b, kvh, j, dim), delta);
    for (int64_t d = 0; d < dim; ++d)
      acc[d] += ds * attnRead<T>(a.k.data, a.k.elem, a.k.at(b, kvh, j, d));
  }
  for (int64_t d = 0; d < dim; ++d)
    attnWrite(s.dq.data, s.dq.elem, s.dq.at(b, h, i, d), acc[d] * T(a.scale));
}

template <class T>
CLEAVE_HD void attentionGradKVRowAs(const AttentionGradStep &s, int64_t row) {
  const AttentionOperands &a = s.in;
  const int64_t dim = a.headDim, j = row % a.keyLen,
                kvh = row / a.keyLen % a.kvHeads,
                b = row / (a.keyLen * a.kvHeads),
                group = a.queryHeads / a.kvHeads;
  T k[kMaxHeadDim], v[kMaxHeadDim], accK[kMaxHeadDim], accV[kMaxHeadDim];
  for (int64_t d = 0; d < dim; ++d) {
    k[d] = attnRead<T>(a.k.data, a.k.elem, a.k.at(b, kvh, j, d));
    v[d] = attnRead<T>(a.v.data, a.v.elem, a.v.at(b, kvh, j, d));
    accK[d] = accV[d] = 0;
  }
  const int64_t begin = attentionQueryBegin(a, j);
  for (int64_t g = 0; g < group; ++g) {
    const int64_t h = kvh * group + g;
    for (int64_t i = begin; i < a.queryLen; ++i) {
      if (!attentionKeeps(a, b, h, i, j))
        continue;
      const int64_t qrow = (b * a.queryHeads + h) * a.queryLen + i;
      const T lse = attnRead<T>(s.lse, s.lseElem, qrow);
      if (lse == T(-INFINITY))
        continue; // a fully-masked row
      const T sc = attnScore(a, attnDot(k, a.q, b, h, i, dim), b, h, i, j);
      if (sc == T(-INFINITY))
        continue;
      const T p = attnExp(sc - lse);
      const T ds = attnScoreGrad(p, attnDot(v, s.dOut, b, h, i, dim),
                                 s.delta[qrow]);
      for (int64_t d = 0; d < dim; ++d) {
        accV[d] += p * attnRead<T>(s.dOut.data, s.dOut.elem,
                                   s.dOut.at(b, h, i, d));
        accK[d] += ds * attnRead<T>(a.q.data, a.q.elem, a.q.at(b, h, i, d));
      }
    }
  }
  for (int64_t d = 0; d < dim; ++d) {
    attnWrite(s.dk.data, s.dk.elem, s.dk.at(b, kvh, j, d),
              accK[d] * T(a.scale));
    attnWrite(s.dv.data, s.dv.elem, s.dv.at(b, kvh, j, d), accV[d]);
  }
}

// dQ of query row `row` (row-major over b, h, i); needs every Delta.
CLEAVE_HD void attentionGradQRow(const AttentionGradStep &s, int64_t row) {
  if (attentionWide(s.in))
    attentionGradQRowAs<double>(s, row);
  else
    attentionGradQRowAs<float>(s, row);
}

// dK and dV of kv row `row` (row-major over b, kv head, j); needs every
// Delta.
CLEAVE_HD void attentionGradKVRow(const AttentionGradStep &s, int64_t row) {
  if (attentionWide(s.in))
    attentionGradKVRowAs<double>(s, row);
  else
    attentionGradKVRowAs<float>(s, row);
}

// --- host drivers -----------------------------------------------------------
//
// The emulated backend's loops (host only): every row in increasing order.
// Any other order, or any split over threads, gives the same bits, since a
// row's result depends on the inputs alone.

inline void runAttentionForwardOnHost(const AttentionStep &s) {
  for (int64_t r = 0, rows = attentionRows(s.in); r < rows; ++r)
    attentionForwardRow(s, r);
}

inline void runAttentionBackwardOnHost(const AttentionGradStep &s) {
  const int64_t rows = attentionRows(s.in), kvRows = attentionKvRows(s.in);
  for (int64_t r = 0; r < rows; ++r)
    attentionDeltaRow(s, r);
  for (int64_t r = 0; r < rows; ++r)
    attentionGradQRow(s, r);
  for (int64_t r = 0; r < kvRows; ++r)
    attentionGradKVRow(s, r);
}

} // namespace cleave::runtime::cuda
