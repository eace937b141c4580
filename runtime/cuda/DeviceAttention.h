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

#include <vector>

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
// --- where a row step reads its tile -----------------------------------------
//
// A row's work is a walk over tiles of kAttnTile positions of the other
// side: keys (K and V rows) for the forward and dQ, queries (Q and dO rows,
// with their L and Delta) for dK and dV. The tile step functions below read
// a tile through one of two views with the same interface: the operands in
// memory (the per-row functions, attentionForwardRow and the others) or a
// block's copy of the tile in T (the block steps: a block of kAttnBlockRows
// rows, one a thread, loads each tile once for all of its rows; shared
// memory on a GPU). Both give the same values, so a row's bits do not
// depend on which view it read.
//
// D is the head size when it is fixed at compile time (a GPU kernel for the
// common sizes, whose arrays then live in registers) and 0 for any size up
// to kMaxHeadDim (the host, and the GPU's fallback).

#if defined(__CUDA_ARCH__)
#define CLEAVE_UNROLL _Pragma("unroll")
#else
#define CLEAVE_UNROLL
#endif

constexpr int kAttnBlockRows = 64; // rows (threads) of a block step

template <int D> constexpr int attnArray() { return D > 0 ? D : kMaxHeadDim; }
template <int D> CLEAVE_HD int attnDim(const AttentionOperands &a) {
  return D > 0 ? D : int(a.headDim);
}

// Key rows j0 + t of K and V at (b, kv head).
template <class T> struct AttnKeysInMemory {
  const AttentionOperands *a;
  int64_t b, kvh, j0;
  // Whether query row i of head h sees key j0 + t (the boolean mask).
  CLEAVE_HD bool keeps(int64_t h, int64_t i, int t) const {
    return attentionKeeps(*a, b, h, i, j0 + t);
  }
  CLEAVE_HD T k(int t, int d) const {
    return attnRead<T>(a->k.data, a->k.elem, a->k.at(b, kvh, j0 + t, d));
  }
  CLEAVE_HD T v(int t, int d) const {
    return attnRead<T>(a->v.data, a->v.elem, a->v.at(b, kvh, j0 + t, d));
  }
};

// Query rows i0 + t of Q and dO at (b, query head), their L and Delta.
template <class T> struct AttnQueriesInMemory {
  const AttentionGradStep *s;
  int64_t b, h, i0, row0; // row0: the query row index of i0
  // Whether query i0 + t sees key j (the boolean mask).
  CLEAVE_HD bool keeps(int64_t j, int t) const {
    return attentionKeeps(s->in, b, h, i0 + t, j);
  }
  CLEAVE_HD T q(int t, int d) const {
    const AttnInput &x = s->in.q;
    return attnRead<T>(x.data, x.elem, x.at(b, h, i0 + t, d));
  }
  CLEAVE_HD T dout(int t, int d) const {
    const AttnInput &x = s->dOut;
    return attnRead<T>(x.data, x.elem, x.at(b, h, i0 + t, d));
  }
  CLEAVE_HD T lse(int t) const {
    return attnRead<T>(s->lse, s->lseElem, row0 + t);
  }
  CLEAVE_HD double delta(int t) const { return s->delta[row0 + t]; }
};

// A block's copies: rows of `dim` values, one after the other.
// keep: the block's mask tile, [kAttnBlockRows][kAttnTile] bytes (row of
// the block, key of the tile), or null where the attention has no boolean
// mask; row: this thread's row of the block.
template <class T> struct AttnKeysInTile {
  const T *kt, *vt;
  int dim;
  const unsigned char *keep;
  int row;
  CLEAVE_HD bool keeps(int64_t, int64_t, int t) const {
    return !keep || keep[row * kAttnTile + t] != 0;
  }
  CLEAVE_HD T k(int t, int d) const { return kt[t * dim + d]; }
  CLEAVE_HD T v(int t, int d) const { return vt[t * dim + d]; }
};

// keep: the block's mask tile, [kAttnBlockRows][kAttnTile] bytes (kv row
// of the block, query of the tile), or null; row: this thread's kv row.
template <class T> struct AttnQueriesInTile {
  const T *qt, *dot, *lset;
  const double *deltat;
  int dim;
  const unsigned char *keep;
  int row;
  CLEAVE_HD bool keeps(int64_t, int t) const {
    return !keep || keep[row * kAttnTile + t] != 0;
  }
  CLEAVE_HD T q(int t, int d) const { return qt[t * dim + d]; }
  CLEAVE_HD T dout(int t, int d) const { return dot[t * dim + d]; }
  CLEAVE_HD T lse(int t) const { return lset[t]; }
  CLEAVE_HD double delta(int t) const { return deltat[t]; }
};

// sum_d local[d] * x(d) in kAttnDotLanes interleaved partial sums (lane
// d % kAttnDotLanes, each in increasing d), then the lanes pairwise: a GPU
// thread's additions are independent chains of D / kAttnDotLanes instead
// of one chain of D (one chain of 64 dependent adds per key was what held
// the first tiled kernels back). The order is fixed by D alone, the same
// for every D template argument and on the host. The score q_i . k_j is
// this with either vector local, and the products commute exactly, so the
// forward, dQ and dK/dV all compute the same score bits.
constexpr int kAttnDotLanes = 8;

template <int D, class T, class Local, class Row>
CLEAVE_HD T attnDotOf(const Local &local, const Row &x, int dim) {
  T part[kAttnDotLanes] = {};
  CLEAVE_UNROLL
  for (int d = 0; d < (D > 0 ? D : dim); ++d)
    part[d % kAttnDotLanes] += local(d) * x(d);
  return ((part[0] + part[1]) + (part[2] + part[3])) +
         ((part[4] + part[5]) + (part[6] + part[7]));
}

template <int D, class T, class Row>
CLEAVE_HD T attnDot(const T *local, const Row &x, int dim) {
  return attnDotOf<D, T>([&](int d) { return local[d]; }, x, dim);
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

CLEAVE_HD bool attentionWide(const AttentionOperands &a) {
  return a.q.elem == AttnElem::F64 || a.k.elem == AttnElem::F64 ||
         a.v.elem == AttnElem::F64;
}

// --- forward ---------------------------------------------------------------

// A query row's state between tiles.
template <class T, int D> struct AttnForwardRow {
  int64_t row, b, h, i, kvh, end; // end: the keys [0, end) it may see
  T q[attnArray<D>()], acc[attnArray<D>()];
  T m;      // running maximum of the scores seen
  double l; // running sum of exp(S - m)
};

template <class T, int D>
CLEAVE_HD void attnForwardBegin(const AttentionStep &s, int64_t row,
                                AttnForwardRow<T, D> &r) {
  const AttentionOperands &a = s.in;
  const int dim = attnDim<D>(a);
  r.row = row;
  r.i = row % a.queryLen;
  r.h = row / a.queryLen % a.queryHeads;
  r.b = row / (a.queryLen * a.queryHeads);
  r.kvh = r.h / (a.queryHeads / a.kvHeads);
  r.end = attentionKeyEnd(a, r.i);
  CLEAVE_UNROLL
  for (int d = 0; d < (D > 0 ? D : dim); ++d) {
    r.q[d] = attnRead<T>(a.q.data, a.q.elem, a.q.at(r.b, r.h, r.i, d));
    r.acc[d] = 0;
  }
  r.m = T(-INFINITY);
  r.l = 0;
}

// Keys j0 .. j0 + n - 1 (n <= kAttnTile, j0 a multiple of kAttnTile): the
// tile's scores first (into score[t * scoreStride]), so the maximum moves
// once a tile, then the values.
template <class T, int D, class Keys>
CLEAVE_HD void attnForwardTile(const AttentionOperands &a,
                               AttnForwardRow<T, D> &r, int64_t j0, int n,
                               const Keys &keys, T *score, int scoreStride) {
  const int dim = attnDim<D>(a);
  T tileMax = T(-INFINITY);
  for (int t = 0; t < n; ++t) {
    const int64_t j = j0 + t;
    T sc = T(-INFINITY);
    if (keys.keeps(r.h, r.i, t))
      sc = attnScore(
          a, attnDot<D>(r.q, [&](int d) { return keys.k(t, d); }, dim), r.b,
          r.h, r.i, j);
    score[t * scoreStride] = sc;
    tileMax = attnMax(sc, tileMax);
  }
  if (tileMax == T(-INFINITY))
    return; // every key of the tile hidden: nothing changes
  const T mNew = attnMax(tileMax, r.m);
  if (mNew != r.m) {
    // exp(-inf) = 0 on the first visible tile, where acc and l are 0.
    const T rescale = attnExp(r.m - mNew);
    r.l *= double(rescale);
    CLEAVE_UNROLL
    for (int d = 0; d < (D > 0 ? D : dim); ++d)
      r.acc[d] *= rescale;
    r.m = mNew;
  }
  for (int t = 0; t < n; ++t) {
    const T sc = score[t * scoreStride];
    if (sc == T(-INFINITY))
      continue; // hidden: its V is not read (a masked pad may hold NaN)
    const T p = attnExp(sc - r.m);
    r.l += double(p);
    CLEAVE_UNROLL
    for (int d = 0; d < (D > 0 ? D : dim); ++d)
      r.acc[d] += p * keys.v(t, d);
  }
}

template <class T, int D>
CLEAVE_HD void attnForwardEnd(const AttentionStep &s,
                              const AttnForwardRow<T, D> &r) {
  const int dim = attnDim<D>(s.in);
  if (r.l == 0) { // no key seen: the fully-masked rule
    for (int d = 0; d < dim; ++d)
      attnWrite(s.out.data, s.out.elem, s.out.at(r.b, r.h, r.i, d), T(0));
    attnWrite(s.lse, s.lseElem, r.row, double(-INFINITY));
    return;
  }
  CLEAVE_UNROLL
  for (int d = 0; d < (D > 0 ? D : dim); ++d)
    attnWrite(s.out.data, s.out.elem, s.out.at(r.b, r.h, r.i, d),
              T(double(r.acc[d]) / r.l));
  attnWrite(s.lse, s.lseElem, r.row, double(r.m) + log(r.l));
}

template <class T>
CLEAVE_HD void attentionForwardRowAs(const AttentionStep &s, int64_t row) {
  AttnForwardRow<T, 0> r;
  attnForwardBegin(s, row, r);
  T score[kAttnTile];
  for (int64_t j0 = 0; j0 < r.end; j0 += kAttnTile) {
    const int n = r.end - j0 < kAttnTile ? int(r.end - j0) : kAttnTile;
    attnForwardTile(s.in, r, j0, n, AttnKeysInMemory<T>{&s.in, r.b, r.kvh, j0},
                    score, 1);
  }
  attnForwardEnd(s, r);
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

// dQ: a query row's state between key tiles.
template <class T, int D> struct AttnGradQRow {
  int64_t row, b, h, i, kvh, end; // end 0 for a fully-masked row
  T q[attnArray<D>()], dout[attnArray<D>()], acc[attnArray<D>()];
  T lse;
  double delta;
};

template <class T, int D>
CLEAVE_HD void attnGradQBegin(const AttentionGradStep &s, int64_t row,
                              AttnGradQRow<T, D> &r) {
  const AttentionOperands &a = s.in;
  const int dim = attnDim<D>(a);
  r.row = row;
  r.i = row % a.queryLen;
  r.h = row / a.queryLen % a.queryHeads;
  r.b = row / (a.queryLen * a.queryHeads);
  r.kvh = r.h / (a.queryHeads / a.kvHeads);
  r.lse = attnRead<T>(s.lse, s.lseElem, row);
  r.delta = s.delta[row];
  // A fully-masked row (L = -inf) sees no key, so it adds nothing.
  r.end = r.lse == T(-INFINITY) ? 0 : attentionKeyEnd(a, r.i);
  CLEAVE_UNROLL
  for (int d = 0; d < (D > 0 ? D : dim); ++d) {
    r.q[d] = attnRead<T>(a.q.data, a.q.elem, a.q.at(r.b, r.h, r.i, d));
    r.dout[d] =
        attnRead<T>(s.dOut.data, s.dOut.elem, s.dOut.at(r.b, r.h, r.i, d));
    r.acc[d] = 0;
  }
}

// Keys j0 .. j0 + n - 1, in increasing order.
template <class T, int D, class Keys>
CLEAVE_HD void attnGradQTile(const AttentionOperands &a, AttnGradQRow<T, D> &r,
                             int64_t j0, int n, const Keys &keys) {
  const int dim = attnDim<D>(a);
  for (int t = 0; t < n; ++t) {
    const int64_t j = j0 + t;
    if (!keys.keeps(r.h, r.i, t))
      continue;
    const T sc = attnScore(
        a, attnDot<D>(r.q, [&](int d) { return keys.k(t, d); }, dim), r.b, r.h,
        r.i, j);
    if (sc == T(-INFINITY))
      continue;
    const T ds = attnScoreGrad(
        attnExp(sc - r.lse),
        attnDot<D>(r.dout, [&](int d) { return keys.v(t, d); }, dim), r.delta);
    CLEAVE_UNROLL
    for (int d = 0; d < (D > 0 ? D : dim); ++d)
      r.acc[d] += ds * keys.k(t, d);
  }
}

template <class T, int D>
CLEAVE_HD void attnGradQEnd(const AttentionGradStep &s,
                            const AttnGradQRow<T, D> &r) {
  const int dim = attnDim<D>(s.in);
  CLEAVE_UNROLL
  for (int d = 0; d < (D > 0 ? D : dim); ++d)
    attnWrite(s.dq.data, s.dq.elem, s.dq.at(r.b, r.h, r.i, d),
              r.acc[d] * T(s.in.scale));
}

// dK and dV: a kv row's state between query tiles. With SharedV, v_j is
// not in the state but in the block's shared memory, `vs[d *
// kAttnBlockRows]` (a GPU thread's four D-wide arrays do not fit its
// registers: ptxas spilled 1.4 KiB a thread at D 64).
template <class T, int D, bool SharedV = false> struct AttnGradKVRow {
  int64_t row, b, kvh, j, begin; // begin: the first query that may see j
  T k[attnArray<D>()], accK[attnArray<D>()], accV[attnArray<D>()];
  T v[SharedV ? 1 : attnArray<D>()];
  T *vs = nullptr; // SharedV: this row's column of the block's v

  CLEAVE_HD T vAt(int d) const {
    if constexpr (SharedV)
      return vs[d * kAttnBlockRows];
    else
      return v[d];
  }
  CLEAVE_HD void setV(int d, T x) {
    if constexpr (SharedV)
      vs[d * kAttnBlockRows] = x;
    else
      v[d] = x;
  }
};

template <class T, int D, bool SharedV>
CLEAVE_HD void attnGradKVBegin(const AttentionGradStep &s, int64_t row,
                               AttnGradKVRow<T, D, SharedV> &r) {
  const AttentionOperands &a = s.in;
  const int dim = attnDim<D>(a);
  r.row = row;
  r.j = row % a.keyLen;
  r.kvh = row / a.keyLen % a.kvHeads;
  r.b = row / (a.keyLen * a.kvHeads);
  r.begin = attentionQueryBegin(a, r.j);
  CLEAVE_UNROLL
  for (int d = 0; d < (D > 0 ? D : dim); ++d) {
    r.k[d] = attnRead<T>(a.k.data, a.k.elem, a.k.at(r.b, r.kvh, r.j, d));
    r.setV(d, attnRead<T>(a.v.data, a.v.elem, a.v.at(r.b, r.kvh, r.j, d)));
    r.accK[d] = r.accV[d] = 0;
  }
}

// Queries i0 .. i0 + n - 1 of query head h, in increasing order.
template <class T, int D, bool SharedV, class Queries>
CLEAVE_HD void attnGradKVTile(const AttentionOperands &a,
                              AttnGradKVRow<T, D, SharedV> &r, int64_t h,
                              int64_t i0, int n, const Queries &qs) {
  const int dim = attnDim<D>(a);
  for (int t = 0; t < n; ++t) {
    const int64_t i = i0 + t;
    if (i < r.begin || !qs.keeps(r.j, t))
      continue;
    const T lse = qs.lse(t);
    if (lse == T(-INFINITY))
      continue; // a fully-masked row
    const T sc = attnScore(
        a, attnDot<D>(r.k, [&](int d) { return qs.q(t, d); }, dim), r.b, h, i,
        r.j);
    if (sc == T(-INFINITY))
      continue;
    const T p = attnExp(sc - lse);
    const T ds = attnScoreGrad(
        p,
        attnDotOf<D, T>([&](int d) { return r.vAt(d); },
                        [&](int d) { return qs.dout(t, d); }, dim),
        qs.delta(t));
    CLEAVE_UNROLL
    for (int d = 0; d < (D > 0 ? D : dim); ++d) {
      r.accV[d] += p * qs.dout(t, d);
      r.accK[d] += ds * qs.q(t, d);
    }
  }
}

template <class T, int D, bool SharedV>
CLEAVE_HD void attnGradKVEnd(const AttentionGradStep &s,
                             const AttnGradKVRow<T, D, SharedV> &r) {
  const int dim = attnDim<D>(s.in);
  CLEAVE_UNROLL
  for (int d = 0; d < (D > 0 ? D : dim); ++d) {
    attnWrite(s.dk.data, s.dk.elem, s.dk.at(r.b, r.kvh, r.j, d),
              r.accK[d] * T(s.in.scale));
    attnWrite(s.dv.data, s.dv.elem, s.dv.at(r.b, r.kvh, r.j, d), r.accV[d]);
  }
}

template <class T>
CLEAVE_HD void attentionGradQRowAs(const AttentionGradStep &s, int64_t row) {
  AttnGradQRow<T, 0> r;
  attnGradQBegin(s, row, r);
  for (int64_t j0 = 0; j0 < r.end; j0 += kAttnTile) {
    const int n = r.end - j0 < kAttnTile ? int(r.end - j0) : kAttnTile;
    attnGradQTile(s.in, r, j0, n, AttnKeysInMemory<T>{&s.in, r.b, r.kvh, j0});
  }
  attnGradQEnd(s, r);
}

template <class T>
CLEAVE_HD void attentionGradKVRowAs(const AttentionGradStep &s, int64_t row) {
  const AttentionOperands &a = s.in;
  AttnGradKVRow<T, 0> r;
  attnGradKVBegin(s, row, r);
  const int64_t group = a.queryHeads / a.kvHeads;
  for (int64_t g = 0; g < group; ++g) {
    const int64_t h = r.kvh * group + g;
    const int64_t row0 = (r.b * a.queryHeads + h) * a.queryLen;
    for (int64_t i0 = r.begin; i0 < a.queryLen; i0 += kAttnTile) {
      const int n =
          a.queryLen - i0 < kAttnTile ? int(a.queryLen - i0) : kAttnTile;
      attnGradKVTile(a, r, h, i0, n,
                     AttnQueriesInMemory<T>{&s, r.b, h, i0, row0 + i0});
    }
  }
  attnGradKVEnd(s, r);
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

// --- block steps -------------------------------------------------------------
//
// A block takes kAttnBlockRows consecutive rows of one (batch, head): query
// rows for the forward and dQ, kv rows for dK and dV. Its threads, one a
// row, load each tile of the other side once into the block's tiles (in T,
// `dim` values a row), then each walks the tile as its row function would.
// The tiles are visited in the row functions' order and a row reads the
// same values from them, so a block's rows have the per-row functions' bits
// (DeviceAttention tests: blocks against rows). The loops around these
// functions are the GPU kernels (CudaKernels.cu, a __syncthreads() between
// loading a tile and reading it, and before the next load) and the host
// drivers below (each phase for every thread of the block in turn).

// Rows [first, first + count) of one (b, head) of a block.
struct AttnBlock {
  int64_t b, head, first, count;
};

CLEAVE_HD int64_t attnBlockCount(int64_t batch, int64_t heads, int64_t len) {
  return batch * heads * ((len + kAttnBlockRows - 1) / kAttnBlockRows);
}

CLEAVE_HD AttnBlock attnBlockAt(int64_t block, int64_t heads, int64_t len) {
  const int64_t tiles = (len + kAttnBlockRows - 1) / kAttnBlockRows;
  const int64_t bh = block / tiles;
  AttnBlock k;
  k.b = bh / heads;
  k.head = bh % heads;
  k.first = block % tiles * kAttnBlockRows;
  k.count = len - k.first < kAttnBlockRows ? len - k.first : kAttnBlockRows;
  return k;
}

// Copies rows [p0, p0 + n) of x at (b, head) into tile ([n][dim] in T);
// thread `tid` of `threads` takes every threads-th value, so consecutive
// threads read consecutive features.
template <class T, int D>
CLEAVE_HD void attnLoadTile(const AttnInput &x, int64_t b, int64_t head,
                            int64_t p0, int n, int dim, T *tile, int tid,
                            int threads) {
  const int count = n * (D > 0 ? D : dim);
  for (int e = tid; e < count; e += threads) {
    const int t = e / (D > 0 ? D : dim), d = e % (D > 0 ? D : dim);
    tile[e] = attnRead<T>(x.data, x.elem, x.at(b, head, p0 + t, d));
  }
}

// The boolean mask's tile of a block, [kAttnBlockRows][kAttnTile] bytes:
// keep[r * kAttnTile + t] for row r of the block and position t of the
// tile, 0 past either end. `rowIsQuery`: the block's rows are queries
// (first + r) and the tile's positions keys (p0 + t), else the other way
// round; consecutive threads read consecutive keys either way (the mask's
// last axis). Returns whether any element this thread loaded is kept; a
// tile no row of the block sees is skipped whole, which changes no bits
// (the row functions skip every hidden key).
CLEAVE_HD bool attnLoadKeep(const AttentionOperands &a, int64_t b,
                            int64_t h, int64_t first, int count, int64_t p0,
                            int n, bool rowIsQuery, unsigned char *keep,
                            int tid, int threads) {
  bool any = false;
  for (int e = tid; e < kAttnBlockRows * kAttnTile; e += threads) {
    // The fast index walks the keys.
    const int r = rowIsQuery ? e / kAttnTile : e % kAttnBlockRows,
              t = rowIsQuery ? e % kAttnTile : e / kAttnBlockRows;
    bool kept = false;
    if (r < count && t < n)
      kept = rowIsQuery ? attentionKeeps(a, b, h, first + r, p0 + t)
                        : attentionKeeps(a, b, h, p0 + t, first + r);
    keep[r * kAttnTile + t] = kept ? 1 : 0;
    any |= kept;
  }
  return any;
}

constexpr size_t kAttnKeepBytes = size_t(kAttnBlockRows) * kAttnTile;

// Forward: a block of query rows over tiles of keys. Shared: K and V tiles,
// the scores of the block's rows ([kAttnTile][kAttnBlockRows]), then the
// mask's tile.
template <class T>
CLEAVE_HD size_t attnForwardShared(int64_t dim) {
  return size_t(2 * kAttnTile * dim + kAttnTile * kAttnBlockRows) * sizeof(T) +
         kAttnKeepBytes;
}

struct AttnForwardBlock {
  AttnBlock rows;
  int64_t kvh, keyEnd; // keyEnd: the keys any row of the block may see
};

CLEAVE_HD AttnForwardBlock attnForwardBlockAt(const AttentionOperands &a,
                                              int64_t block) {
  AttnForwardBlock k;
  k.rows = attnBlockAt(block, a.queryHeads, a.queryLen);
  k.kvh = k.rows.head / (a.queryHeads / a.kvHeads);
  // The last row sees the most keys (the causal end grows with i).
  k.keyEnd = attentionKeyEnd(a, k.rows.first + k.rows.count - 1);
  return k;
}

CLEAVE_HD int64_t attnBlockRow(const AttentionOperands &a, const AttnBlock &k,
                               int tid) {
  return (k.b * a.queryHeads + k.head) * a.queryLen + k.first + tid;
}

// Loads the key tile at j0 (K and V into kv, [2][kAttnTile][dim]) and,
// where there is a boolean mask, its tile for the block's rows into keep.
// Returns what attnLoadKeep returns (true without a mask).
template <class T, int D>
CLEAVE_HD bool attnKeyTileLoad(const AttentionOperands &a,
                               const AttnForwardBlock &k, int64_t j0, T *kv,
                               unsigned char *keep, int tid,
                               int threads = kAttnBlockRows) {
  const int dim = attnDim<D>(a);
  const int n = k.keyEnd - j0 < kAttnTile ? int(k.keyEnd - j0) : kAttnTile;
  attnLoadTile<T, D>(a.k, k.rows.b, k.kvh, j0, n, dim, kv, tid, threads);
  attnLoadTile<T, D>(a.v, k.rows.b, k.kvh, j0, n, dim, kv + kAttnTile * dim,
                     tid, threads);
  if (!a.keep.data)
    return true;
  return attnLoadKeep(a, k.rows.b, k.rows.head, k.rows.first,
                      int(k.rows.count), j0, n, true, keep, tid, threads);
}

template <class T> CLEAVE_HD unsigned char *attnForwardKeep(T *shared,
                                                            int dim) {
  return reinterpret_cast<unsigned char *>(shared + 2 * kAttnTile * dim +
                                           kAttnTile * kAttnBlockRows);
}

// dQ: a block of query rows over tiles of keys. Shared: K and V tiles, then
// the mask's tile.
template <class T>
CLEAVE_HD size_t attnGradQShared(int64_t dim) {
  return size_t(2 * kAttnTile * dim) * sizeof(T) + kAttnKeepBytes;
}

template <class T> CLEAVE_HD unsigned char *attnGradQKeep(T *shared, int dim) {
  return reinterpret_cast<unsigned char *>(shared + 2 * kAttnTile * dim);
}

// How many keys of the tile at j0 a row whose keys end at `end` walks (0:
// none).
CLEAVE_HD int attnRowTile(int64_t end, int64_t j0) {
  return j0 >= end ? 0 : end - j0 < kAttnTile ? int(end - j0) : kAttnTile;
}

// The key tile at the start of `shared` as thread tid's row reads it.
template <class T>
CLEAVE_HD AttnKeysInTile<T> attnKeyTileView(const AttentionOperands &a,
                                            const T *shared,
                                            const unsigned char *keep, int dim,
                                            int tid) {
  return {shared, shared + kAttnTile * dim, dim, a.keep.data ? keep : nullptr,
          tid};
}

// The forward and dQ as the same walk of a block of query rows over key
// tiles (attnKeyTileWalk on the host, attentionKeyTilesKernel on a GPU):
// what each does at a row's start, a tile's load, a tile and a row's end.
template <class T, int D> struct AttnForwardSteps {
  using Step = AttentionStep;
  using Row = AttnForwardRow<T, D>;
  static CLEAVE_HD size_t shared(int64_t dim) {
    return attnForwardShared<T>(dim);
  }
  static CLEAVE_HD void begin(const Step &s, int64_t row, Row &r) {
    attnForwardBegin(s, row, r);
  }
  static CLEAVE_HD bool load(const Step &s, const AttnForwardBlock &k,
                             int64_t j0, T *shared, int tid) {
    return attnKeyTileLoad<T, D>(
        s.in, k, j0, shared, attnForwardKeep(shared, attnDim<D>(s.in)), tid);
  }
  // The scores go after the K and V tiles, [kAttnTile][kAttnBlockRows].
  static CLEAVE_HD void tile(const Step &s, Row &r, int64_t j0, T *shared,
                             int tid) {
    const int dim = attnDim<D>(s.in);
    if (int n = attnRowTile(r.end, j0))
      attnForwardTile(s.in, r, j0, n,
                      attnKeyTileView(s.in, shared,
                                      attnForwardKeep(shared, dim), dim, tid),
                      shared + 2 * kAttnTile * dim + tid, kAttnBlockRows);
  }
  static CLEAVE_HD void end(const Step &s, const Row &r) {
    attnForwardEnd(s, r);
  }
};

template <class T, int D> struct AttnGradQSteps {
  using Step = AttentionGradStep;
  using Row = AttnGradQRow<T, D>;
  static CLEAVE_HD size_t shared(int64_t dim) {
    return attnGradQShared<T>(dim);
  }
  static CLEAVE_HD void begin(const Step &s, int64_t row, Row &r) {
    attnGradQBegin(s, row, r);
  }
  static CLEAVE_HD bool load(const Step &s, const AttnForwardBlock &k,
                             int64_t j0, T *shared, int tid) {
    return attnKeyTileLoad<T, D>(
        s.in, k, j0, shared, attnGradQKeep(shared, attnDim<D>(s.in)), tid);
  }
  static CLEAVE_HD void tile(const Step &s, Row &r, int64_t j0, T *shared,
                             int tid) {
    const int dim = attnDim<D>(s.in);
    if (int n = attnRowTile(r.end, j0))
      attnGradQTile(s.in, r, j0, n,
                    attnKeyTileView(s.in, shared, attnGradQKeep(shared, dim),
                                    dim, tid));
  }
  static CLEAVE_HD void end(const Step &s, const Row &r) {
    attnGradQEnd(s, r);
  }
};

// dK and dV: a block of kv rows over tiles of queries, for each query head
// of the kv head's group. Shared: Q and dO tiles, then L in T and Delta.
template <class T>
CLEAVE_HD size_t attnGradKVShared(int64_t dim, bool sharedV) {
  return size_t(2 * kAttnTile * dim) * sizeof(T) +
         size_t(kAttnTile) * (sizeof(T) + sizeof(double)) + kAttnKeepBytes +
         (sharedV ? size_t(kAttnBlockRows * dim) * sizeof(T) : 0);
}

struct AttnGradKVBlock {
  AttnBlock rows;
  int64_t queryBegin; // the first query any row of the block may be seen by
};

CLEAVE_HD AttnGradKVBlock attnGradKVBlockAt(const AttentionOperands &a,
                                            int64_t block) {
  AttnGradKVBlock k;
  k.rows = attnBlockAt(block, a.kvHeads, a.keyLen);
  k.queryBegin = attentionQueryBegin(a, k.rows.first);
  return k;
}

CLEAVE_HD int64_t attnBlockKvRow(const AttentionOperands &a,
                                 const AttnBlock &k, int tid) {
  return (k.b * a.kvHeads + k.head) * a.keyLen + k.first + tid;
}

// Where the tiles of a dK/dV block are in its shared memory.
template <class T> struct AttnKVShared {
  T *q, *dout, *lse;
  double *delta;
  unsigned char *keep; // the mask's tile
  T *v; // the rows' v, [dim][kAttnBlockRows], where the rows keep it here
  CLEAVE_HD AttnKVShared(void *shared, int dim) {
    // Delta first: doubles need 8-byte alignment, which T's arrays after
    // them keep (the mask's tile is a multiple of 8 bytes).
    delta = static_cast<double *>(shared);
    q = reinterpret_cast<T *>(delta + kAttnTile);
    dout = q + kAttnTile * dim;
    lse = dout + kAttnTile * dim;
    keep = reinterpret_cast<unsigned char *>(lse + kAttnTile);
    v = reinterpret_cast<T *>(keep + kAttnKeepBytes);
  }
};

template <class T, int D>
CLEAVE_HD bool attnGradKVBlockLoad(const AttentionGradStep &s,
                                   const AttnGradKVBlock &k, int64_t h,
                                   int64_t i0, void *shared, int tid,
                                   int threads = kAttnBlockRows) {
  const AttentionOperands &a = s.in;
  const int dim = attnDim<D>(a);
  const int n = a.queryLen - i0 < kAttnTile ? int(a.queryLen - i0) : kAttnTile;
  AttnKVShared<T> sh(shared, dim);
  attnLoadTile<T, D>(a.q, k.rows.b, h, i0, n, dim, sh.q, tid, threads);
  attnLoadTile<T, D>(s.dOut, k.rows.b, h, i0, n, dim, sh.dout, tid, threads);
  const int64_t row0 = (k.rows.b * a.queryHeads + h) * a.queryLen + i0;
  for (int t = tid; t < n; t += threads) {
    sh.lse[t] = attnRead<T>(s.lse, s.lseElem, row0 + t);
    sh.delta[t] = s.delta[row0 + t];
  }
  if (!a.keep.data)
    return true;
  return attnLoadKeep(a, k.rows.b, h, k.rows.first, int(k.rows.count), i0, n,
                      false, sh.keep, tid, threads);
}

// Where row `tid` of a block keeps v_j (SharedV).
template <class T>
CLEAVE_HD T *attnKVSharedV(void *shared, int dim, int tid) {
  return AttnKVShared<T>(shared, dim).v + tid;
}

template <class T, int D, bool SharedV>
CLEAVE_HD void attnGradKVBlockTile(const AttentionOperands &a,
                                   AttnGradKVRow<T, D, SharedV> &r, int64_t h,
                                   int64_t i0, void *shared, int tid) {
  const int dim = attnDim<D>(a);
  const int n = a.queryLen - i0 < kAttnTile ? int(a.queryLen - i0) : kAttnTile;
  AttnKVShared<T> sh(shared, dim);
  attnGradKVTile(a, r, h, i0, n,
                 AttnQueriesInTile<T>{sh.q, sh.dout, sh.lse, sh.delta, dim,
                                      a.keep.data ? sh.keep : nullptr, tid});
}

// --- host drivers -----------------------------------------------------------
//
// The emulated backend's loops (host only): the block steps of the GPU
// kernels, every block in increasing order and within a block each phase
// for every thread in turn. Any other order, or any split over threads,
// gives the same bits, since a row's result depends on the inputs alone.

// Every block of query rows over its key tiles (the forward, dQ), each
// phase for every thread of the block in turn.
template <class Steps, class T>
void attnKeyTileWalk(const typename Steps::Step &s) {
  const AttentionOperands &a = s.in;
  std::vector<unsigned char> shared(Steps::shared(a.headDim));
  T *tiles = reinterpret_cast<T *>(shared.data());
  std::vector<typename Steps::Row> rows(kAttnBlockRows);
  for (int64_t blk = 0, n = attnBlockCount(a.batch, a.queryHeads, a.queryLen);
       blk < n; ++blk) {
    const AttnForwardBlock k = attnForwardBlockAt(a, blk);
    for (int t = 0; t < k.rows.count; ++t)
      Steps::begin(s, attnBlockRow(a, k.rows, t), rows[t]);
    for (int64_t j0 = 0; j0 < k.keyEnd; j0 += kAttnTile) {
      bool any = false;
      for (int t = 0; t < kAttnBlockRows; ++t)
        any |= Steps::load(s, k, j0, tiles, t);
      if (!any)
        continue; // no row of the block sees a key of the tile
      for (int t = 0; t < k.rows.count; ++t)
        Steps::tile(s, rows[t], j0, tiles, t);
    }
    for (int t = 0; t < k.rows.count; ++t)
      Steps::end(s, rows[t]);
  }
}

template <class T, int D = 0>
void runAttentionForwardBlocksOnHost(const AttentionStep &s) {
  attnKeyTileWalk<AttnForwardSteps<T, D>, T>(s);
}

template <class T, int D = 0, bool SharedV = false>
void runAttentionGradBlocksOnHost(const AttentionGradStep &s) {
  const AttentionOperands &a = s.in;
  attnKeyTileWalk<AttnGradQSteps<T, D>, T>(s);
  std::vector<double> sharedKV(attnGradKVShared<T>(a.headDim, SharedV) /
                                   sizeof(double) +
                               1);
  std::vector<AttnGradKVRow<T, D, SharedV>> kvrows(kAttnBlockRows);
  const int64_t group = a.queryHeads / a.kvHeads;
  for (int64_t blk = 0, n = attnBlockCount(a.batch, a.kvHeads, a.keyLen);
       blk < n; ++blk) {
    const AttnGradKVBlock k = attnGradKVBlockAt(a, blk);
    for (int t = 0; t < k.rows.count; ++t) {
      kvrows[t].vs = attnKVSharedV<T>(sharedKV.data(), int(a.headDim), t);
      attnGradKVBegin(s, attnBlockKvRow(a, k.rows, t), kvrows[t]);
    }
    for (int64_t g = 0; g < group; ++g) {
      const int64_t h = k.rows.head * group + g;
      for (int64_t i0 = k.queryBegin; i0 < a.queryLen; i0 += kAttnTile) {
        bool any = false;
        for (int t = 0; t < kAttnBlockRows; ++t)
          any |= attnGradKVBlockLoad<T, D>(s, k, h, i0, sharedKV.data(), t);
        if (!any)
          continue;
        for (int t = 0; t < k.rows.count; ++t)
          attnGradKVBlockTile<T, D>(a, kvrows[t], h, i0, sharedKV.data(), t);
      }
    }
    for (int t = 0; t < k.rows.count; ++t)
      attnGradKVEnd(s, kvrows[t]);
  }
}

inline void runAttentionForwardOnHost(const AttentionStep &s) {
  if (attentionWide(s.in))
    runAttentionForwardBlocksOnHost<double>(s);
  else
    runAttentionForwardBlocksOnHost<float>(s);
}

inline void runAttentionBackwardOnHost(const AttentionGradStep &s) {
  for (int64_t r = 0, rows = attentionRows(s.in); r < rows; ++r)
    attentionDeltaRow(s, r);
  if (attentionWide(s.in))
    runAttentionGradBlocksOnHost<double>(s);
  else
    runAttentionGradBlocksOnHost<float>(s);
}

// The per-row functions alone, every row in increasing order (the blocks'
// reference in the tests).
inline void runAttentionForwardRowsOnHost(const AttentionStep &s) {
  for (int64_t r = 0, rows = attentionRows(s.in); r < rows; ++r)
    attentionForwardRow(s, r);
}

inline void runAttentionBackwardRowsOnHost(const AttentionGradStep &s) {
  const int64_t rows = attentionRows(s.in), kvRows = attentionKvRows(s.in);
  for (int64_t r = 0; r < rows; ++r)
    attentionDeltaRow(s, r);
  for (int64_t r = 0; r < rows; ++r)
    attentionGradQRow(s, r);
  for (int64_t r = 0; r < kvRows; ++r)
    attentionGradKVRow(s, r);
}

} // namespace cleave::runtime::cuda
