// FusedAttention and its gradient for the CPU backend.
//
// The algorithm is the fused attention's (docs/design/fused-attention.md,
// runtime/cuda/DeviceAttention.h, whose helpers for masks, loads and
// stores this file shares): an online softmax over key tiles, the Tq x Tk
// scores never stored, the backward recomputing each tile's scores from the
// forward's logsumexp. The GPU's arithmetic goes one row a thread; here a
// forward task takes a block of query rows (128, or 64: TileMap) and a
// backward task one kv head with its query heads, and each tile's work is
// GEMMs, the form that keeps the CPU's vector units busy. The sums are in
// another order than the per-row functions', so the two backends agree to
// rounding, not bits.
#include "ir/TypeRules.h"
#include "runtime/FusedAttentionCall.h"
#include "runtime/cpu/Blas.h"
#include "runtime/cpu/CpuKernels.h"
#include "runtime/cpu/VectorMath.h"

#include <algorithm>
#include <functional>
#include <cstring>
#include <cmath>
#include <memory>
#include <type_traits>
#include <vector>

namespace cleave::runtime {
namespace {

namespace dev = cleave::runtime::cuda;
using cpu::kernelError;
using cpu::cpuHasAvx512F;
using cpu::loadDouble8W;
using cpu::sumLanes16;
using cpu::parallelFor;
using cpu::parallelTasks;
using cpu::expShifted;
using cpu::expShiftedSum;

dev::AttnElem attnElem(ir::DType t) {
  return t == ir::DType::F64    ? dev::AttnElem::F64
         : t == ir::DType::BF16 ? dev::AttnElem::BF16
                                : dev::AttnElem::F32;
}

// Row-major strides of a rank-4 tensor; a lower-rank mask is aligned to the
// right of [B, Hq, Tq, Tk] and its size-1 dims broadcast (stride 0).
template <class Strided>
void fillStrides(Strided &s, llvm::ArrayRef<int64_t> shape) {
  int64_t stride = 1;
  for (int d = 3, k = int(shape.size()) - 1; d >= 0; --d, --k) {
    int64_t size = k >= 0 ? shape[k] : 1;
    s.strides[d] = size == 1 ? 0 : stride;
    stride *= size;
  }
}

using Layout = ir::AttentionLayout;

// A tensor as an operand (AttnInput) or result (AttnOutput) of the steps,
// read as [B, H, T, D] whatever its layout (ir::AttentionLayout): its
// strides taken from the axes where the layout keeps B, H and T.
template <class Operand>
Operand operandOf(const TensorRef &t, Layout layout) {
  Operand x;
  x.data = t.data;
  x.elem = attnElem(t.dtype);
  fillStrides(x, t.shape);
  const ir::AttentionAxes a = ir::attentionAxes(layout);
  const int64_t stored[4] = {x.strides[0], x.strides[1], x.strides[2],
                             x.strides[3]};
  x.strides[0] = stored[a.batch];
  x.strides[1] = stored[a.heads];
  x.strides[2] = stored[a.time];
  return x;
}

dev::AttnInput input(const TensorRef &t, Layout layout = Layout::Heads) {
  return operandOf<dev::AttnInput>(t, layout);
}

dev::AttnOutput output(const TensorRef &t, Layout layout = Layout::Heads) {
  return operandOf<dev::AttnOutput>(t, layout);
}

// `x` from its `first` head on: a packed operand's Q, K or V (its heads
// axis holding Q's, K's and V's heads in turn).
template <class Operand> Operand fromHead(Operand x, int64_t first) {
  const size_t bytes = x.elem == dev::AttnElem::F64    ? 8
                       : x.elem == dev::AttnElem::BF16 ? 2
                                                       : 4;
  x.data = static_cast<char *>(const_cast<void *>(x.data)) +
           first * x.strides[1] * int64_t(bytes);
  return x;
}

// Q, K, V and the optional mask at `first` in the call's inputs.
llvm::Expected<dev::AttentionOperands> operands(const KernelCall &c,
                                                size_t first, size_t mask) {
  const TensorRef &q = c.inputs[first], &k = c.inputs[first + 1];
  if (q.rank() != 4 || k.rank() != 4 || c.inputs[first + 2].rank() != 4)
    return kernelError(c, "Q, K and V must have rank 4");
  const Layout layout = ir::attentionLayout(c);
  const int64_t packed = ir::attentionPackedKvHeads(c);
  const ir::AttentionDims d =
      ir::attentionDims(q.shape, k.shape, layout, packed);
  if (packed < 0 || d.queryHeads < 1 ||
      (packed > 0 && (k.shape != q.shape || c.inputs[first + 2].shape != q.shape)))
    return kernelError(c, "packed Q, K and V must be one tensor of more "
                          "than 2 x {0} heads",
                       packed);
  dev::AttentionOperands a;
  a.batch = d.batch;
  a.queryHeads = d.queryHeads;
  a.queryLen = d.queryLen;
  a.headDim = d.headDim;
  a.kvHeads = d.kvHeads;
  a.keyLen = d.keyLen;
  a.scale = c.getFloat("scale");
  a.causal = c.getInt("causal") != 0;
  a.align = dev::CausalAlign::TopLeft;
  a.q = input(q, layout);
  a.k = input(k, layout);
  a.v = input(c.inputs[first + 2], layout);
  if (packed > 0) { // K's heads after Q's, V's after K's
    a.k = fromHead(a.k, d.queryHeads);
    a.v = fromHead(a.v, d.queryHeads + d.kvHeads);
  }
  if (c.inputs.size() > mask && c.inputs[mask].data) {
    const TensorRef &m = c.inputs[mask];
    if (m.dtype == ir::DType::Bool) { // true: the key is seen
      a.keep.data = m.data;
      fillStrides(a.keep, m.shape);
    } else {
      a.bias = input(m);
    }
  }
  if (!dev::attentionSupported(a))
    return kernelError(c, "head size {0} (at most {1}) with {2} query heads "
                       "over {3} key/value heads is not supported",
                       a.headDim, dev::kMaxHeadDim, a.queryHeads, a.kvHeads);
  return a;
}

} // namespace

llvm::Expected<dev::AttentionStep> attentionStep(const KernelCall &c) {
  auto a = operands(c, 0, 3);
  if (!a)
    return a.takeError();
  const Layout layout = ir::attentionLayout(c);
  dev::AttentionStep s;
  s.in = *a;
  s.out = output(c.outputs[0], layout);
  s.lse = c.outputs[1].data;
  s.lseElem = attnElem(c.outputs[1].dtype);
  return s;
}

int64_t attentionGradRows(const KernelCall &c) {
  const TensorRef &q = c.inputs[1], &k = c.inputs[2];
  if (q.rank() != 4 || k.rank() != 4)
    return 0;
  const ir::AttentionDims d = ir::attentionDims(
      q.shape, k.shape, ir::attentionLayout(c), ir::attentionPackedKvHeads(c));
  return std::max<int64_t>(0, d.batch * d.queryHeads * d.queryLen);
}

// Inputs: dO, Q, K, V, O, L[, mask]; outputs dQ, dK, dV.
llvm::Expected<dev::AttentionGradStep> attentionGradStep(const KernelCall &c,
                                                         double *delta) {
  auto a = operands(c, 1, 6);
  if (!a)
    return a.takeError();
  const Layout layout = ir::attentionLayout(c);
  dev::AttentionGradStep s;
  s.in = *a;
  s.dOut = input(c.inputs[0], layout);
  s.out = input(c.inputs[4], layout);
  s.lse = c.inputs[5].data;
  s.lseElem = attnElem(c.inputs[5].dtype);
  s.delta = delta;
  s.dq = output(c.outputs[0], layout);
  if (ir::attentionPackedKvHeads(c) > 0) { // dQ, dK and dV in one tensor
    s.dk = fromHead(s.dq, s.in.queryHeads);
    s.dv = fromHead(s.dq, s.in.queryHeads + s.in.kvHeads);
  } else {
    s.dk = output(c.outputs[1], layout);
    s.dv = output(c.outputs[2], layout);
  }
  return s;
}

namespace {

// --- the blocked kernels -----------------------------------------------------
//
// Flash-style: a task owns one block of output rows and walks the other
// side's tiles in increasing order, so the bits do not depend on the thread
// count or on which thread ran which task. Each tile's products are GEMMs
// on the calling thread (Blas.h's gemm: its bits depend on the shapes and
// the library alone), in the compute type T (float for f32 and bf16,
// double for f64), on the operands in place when they are already T with
// contiguous rows, else on converted copies.

constexpr int64_t kRows = 128; // query rows of a block, at most (TileMap)
constexpr int64_t kKeys = 128; // keys of a tile

// Rows [t0, t0 + n) of a [B, H, T, D] operand at (b, h) as an n x D
// row-major matrix in T, and its leading dimension: the operand's own
// memory when it is already T with contiguous rows, else converted into
// `scratch`.
template <class T>
const T *rowsOf(const dev::AttnInput &x, int64_t b, int64_t h, int64_t t0,
                int64_t n, int64_t dim, T *scratch, int64_t &ld) {
  const dev::AttnElem native =
      std::is_same_v<T, double> ? dev::AttnElem::F64 : dev::AttnElem::F32;
  // Rows a page or more apart are copied: read in place, each row of the
  // tile is a TLB entry of its own and, at a multiple of 4 KB, in the same
  // cache sets as the others (nn.MultiheadAttention's [T, B, E] layout at
  // batch 16 and E 256: rows 16 KB apart; in the corpus ViT's step on 2
  // threads the forward took 0.62 ms in place and 0.51 ms copied, the
  // gradient 1.35 and 1.03 ms). Closer
  // rows ([B, T, H, D] at H * D 256, 1 KB apart) are faster in place.
  const bool spread = n > 1 && x.strides[2] * int64_t(sizeof(T)) >= 4096;
  if (x.elem == native && x.strides[3] == 1 && !spread) {
    // A length-1 axis has stride 0 (fillStrides): a lone row's leading
    // dimension only has to be legal for the GEMM.
    ld = n == 1 ? dim : x.strides[2];
    return static_cast<const T *>(x.data) + x.at(b, h, t0, 0);
  }
  if (x.elem == native && x.strides[3] == 1) {
    for (int64_t t = 0; t < n; ++t)
      std::memcpy(scratch + t * dim,
                  static_cast<const T *>(x.data) + x.at(b, h, t0 + t, 0),
                  size_t(dim) * sizeof(T));
  } else {
    for (int64_t t = 0; t < n; ++t)
      for (int64_t d = 0; d < dim; ++d)
        scratch[t * dim + d] =
            dev::attnRead<T>(x.data, x.elem, x.at(b, h, t0 + t, d));
  }
  ld = dim;
  return scratch;
}

// Row (b, h, t) of an output, value(d) for d in [0, n): stored straight
// into the row when it is f32 or f64 with unit stride (the same rounding
// as attnWrite's), else element by element through attnWrite.
template <class F>
void writeRow(const dev::AttnOutput &o, int64_t b, int64_t h, int64_t t,
              int64_t n, F value) {
  const int64_t base = o.at(b, h, t, 0);
  if (o.strides[3] == 1 && o.elem == dev::AttnElem::F32) {
    float *p = static_cast<float *>(o.data) + base;
    for (int64_t d = 0; d < n; ++d)
      p[d] = float(value(d));
  } else if (o.strides[3] == 1 && o.elem == dev::AttnElem::F64) {
    double *p = static_cast<double *>(o.data) + base;
    for (int64_t d = 0; d < n; ++d)
      p[d] = double(value(d));
  } else {
    for (int64_t d = 0; d < n; ++d)
      dev::attnWrite(o.data, o.elem, base + d * o.strides[3], value(d));
  }
}

// A task's buffers: converted operand tiles (when they are not read in
// place), the tile's scores and score gradients, the accumulators. They
// live in the thread's own store, made once and kept (a task runs to its
// end on one thread and calls no parallel work), so a task neither
// allocates nor clears them: every buffer is written before it is read
// (the products with beta 0, the accumulators' fills, the tiles copied
// in). Allocated and zeroed per task, they were about 320 KB each at D 64,
// a fresh mapping every time: at T 128 the backward spent more in memset
// and page faults than in its exps.
template <class T> struct Tiles {
  struct Buffer {
    T *p = nullptr;
    T *data() const { return p; }
  };
  Buffer q, dout, k, v, s, dp, acc, acc2;
  explicit Tiles(int64_t dim) {
    const int64_t sizes[8] = {kRows * dim,  kRows * dim,  kKeys * dim,
                              kKeys * dim,  kRows * kKeys, kRows * kKeys,
                              std::max(kRows, kKeys) * dim, kKeys * dim};
    int64_t total = 0;
    for (int64_t n : sizes)
      total += n;
    static thread_local std::unique_ptr<T[]> store;
    static thread_local int64_t capacity = 0;
    if (capacity < total) {
      store.reset(new T[size_t(total)]); // default-initialized: not cleared
      capacity = total;
    }
    Buffer *parts[8] = {&q, &dout, &k, &v, &s, &dp, &acc, &acc2};
    T *at = store.get();
    for (int i = 0; i < 8; ++i) {
      parts[i]->p = at;
      at += sizes[i];
    }
  }
};

// x[t] = exp(x[t] - shift) for t < n (hidden keys' -inf become 0) and the
// sum of the results in double, with the vectorized exp (VectorMath.h).
double expAndSum(float *x, int64_t n, float shift) {
  return expShiftedSum(x, n, double(shift), x);
}

double expAndSum(double *x, int64_t n, double shift) {
  expShifted(x, n, shift, 1.0, x);
  double sum = 0;
  for (int64_t t = 0; t < n; ++t)
    sum += x[t];
  return sum;
}

// What the masks leave of the tile of rows [i0, i0 + nr) and keys
// [j0, j0 + nc): nothing (Hidden: the causal rule, the boolean mask or a
// -inf mask hides all of it, as a causal mask exported as an additive bias
// does; such a tile adds nothing forward or backward, and is skipped), or
// every key the causal rule lets each row see (Open: a boolean mask true
// on all of them, as a causal-and-padding mask is below the diagonal
// wherever there is no padding; its scores need no select), or a mix.
enum class TileView : uint8_t { Mixed, Hidden, Open };

// A tile's view and `keys`: its rows see keys [j0, j0 + keys) at most (0
// when Hidden): past the last key the rule and the masks let any of them
// see, the tile's products stop (a triangle's diagonal tile, keys a whole
// batch pads).
struct TileSeen {
  TileView view = TileView::Mixed;
  int64_t keys = 0;
};

// How many of the keys [j0, j0 + nc) the causal rule lets query row i
// see (all of them without the rule): they are [j0, j0 + that).
int64_t ruleKeys(const dev::AttentionOperands &a, int64_t i, int64_t j0,
                 int64_t nc) {
  return std::clamp<int64_t>(dev::attentionKeyEnd(a, i) - j0, 0, nc);
}

// The last key + 1 of x[0, n) that `seen` accepts, 0 for none: from the
// end, so a row that sees its last keys (padding masks, the lower
// triangle's rows) stops at once.
template <class Seen> int64_t lastSeen(int64_t n, Seen seen) {
  for (int64_t t = n; t > 0; --t)
    if (seen(t - 1))
      return t;
  return 0;
}

TileSeen tileSeen(const dev::AttentionOperands &a, int64_t b, int64_t h,
                  int64_t i0, int64_t nr, int64_t j0, int64_t nc) {
  // Keys [j0, j0 + rule) pass the causal rule for the tile's last row.
  const int64_t rule = ruleKeys(a, i0 + nr - 1, j0, nc);
  if (rule == 0)
    return {TileView::Hidden, 0};
  if (!a.bias.data && !a.keep.data)
    return {TileView::Mixed, rule};
  // Row i's visible keys: [j0, j0 + visible(i)).
  auto visible = [&](int64_t i) { return ruleKeys(a, i, j0, nc); };
  int64_t keys = 0;
  if (!a.bias.data && a.keep.strides[3] == 1) {
    // A boolean mask contiguous along the keys: a row hides the tile when
    // its visible part holds no true (non-zero) byte, and leaves it open
    // when that part holds no false one.
    bool allKept = true;
    for (int64_t r = 0; r < nr; ++r) {
      const int64_t i = i0 + r, n = visible(i);
      const auto *row =
          static_cast<const uint8_t *>(a.keep.data) + a.keep.at(b, h, i, j0);
      // A minimum in vector lanes, no early exit.
      uint8_t least = 1;
      for (int64_t t = 0; t < n; ++t)
        least = std::min(least, row[t]);
      allKept &= least != 0;
      keys = std::max(keys, lastSeen(n, [&](int64_t t) { return row[t]; }));
    }
    return {keys == 0 ? TileView::Hidden
                      : allKept ? TileView::Open : TileView::Mixed,
            keys};
  }
  if (!a.keep.data && a.bias.elem == dev::AttnElem::F32 &&
      a.bias.strides[3] == 1) {
    // An f32 mask contiguous along the keys: each row's last key that is
    // not -inf.
    for (int64_t r = 0; r < nr && keys < rule; ++r) {
      const int64_t i = i0 + r;
      const float *row = static_cast<const float *>(a.bias.data) +
                         a.bias.at(b, h, i, j0);
      keys = std::max(keys, lastSeen(visible(i), [&](int64_t t) {
                        return row[t] != -INFINITY;
                      }));
    }
    return {keys == 0 ? TileView::Hidden : TileView::Mixed, keys};
  }
  for (int64_t r = 0; r < nr && keys < rule; ++r) {
    const int64_t i = i0 + r;
    keys = std::max(keys, lastSeen(visible(i), [&](int64_t t) {
                      const int64_t j = j0 + t;
                      return dev::attentionKeeps(a, b, h, i, j) &&
                             (!a.bias.data ||
                              dev::attnRead<double>(a.bias.data, a.bias.elem,
                                                    a.bias.at(b, h, i, j)) !=
                                  -INFINITY);
                    }));
  }
  return {keys == 0 ? TileView::Hidden : TileView::Mixed, keys};
}

// tileSeen of every (query block, key tile) pair, worked out once per call
// (a mask broadcast over the heads once for all of them), and the query
// rows of a block: 128, or 64 where that leaves at least 15% of the
// products out. Each pair is looked at in blocks of 64 rows; a 128-row
// block sees what either half sees. Under the causal rule at T 128, two
// 64-row blocks compute 64 x 64 and 64 x 128 scores where one 128-row block
// computes 128 x 128, 3/4 of the products and exps forward and backward
// (at T 256 5/6; at T 512 9/10, where 64-row blocks measured no faster);
// without anything hidden, 64-row blocks ran 5 to 25% slower. The shapes
// and the masks decide, never the threads; a triangle given as the rule
// and as a mask gives the same blocks, so the same bits.
class TileMap {
public:
  TileMap(const dev::AttentionOperands &a, bool spread)
      : kTiles_((a.keyLen + kKeys - 1) / kKeys) {
    perHead_ = (a.bias.data && a.bias.strides[1] != 0) ||
               (a.keep.data && a.keep.strides[1] != 0);
    heads_ = perHead_ ? a.queryHeads : 1;
    constexpr int64_t half = kRows / 2;
    const int64_t halves = (a.queryLen + half - 1) / half;
    std::vector<TileSeen> fine(size_t(a.batch * heads_ * halves * kTiles_));
    const int64_t count = int64_t(fine.size());
    parallelFor(count, spread ? 1 : count, [&](int64_t first, int64_t end) {
      for (int64_t n = first; n < end; ++n) {
        const int64_t kt = n % kTiles_, qb = n / kTiles_ % halves,
                      h = n / (kTiles_ * halves) % heads_,
                      bb = n / (kTiles_ * halves * heads_);
        const int64_t i0 = qb * half, j0 = kt * kKeys;
        fine[size_t(n)] =
            tileSeen(a, bb, h, i0, std::min(half, a.queryLen - i0), j0,
                     std::min(kKeys, a.keyLen - j0));
      }
    });
    // The products' multiply-adds per head dimension in each blocking.
    const int64_t blocks = (a.queryLen + kRows - 1) / kRows;
    std::vector<TileSeen> coarse(size_t(a.batch * heads_ * blocks * kTiles_));
    double fineWork = 0, coarseWork = 0;
    for (int64_t bh = 0; bh < a.batch * heads_; ++bh)
      for (int64_t qb = 0; qb < blocks; ++qb)
        for (int64_t kt = 0; kt < kTiles_; ++kt) {
          TileSeen &c = coarse[size_t((bh * blocks + qb) * kTiles_ + kt)];
          const int64_t nr = std::min(kRows, a.queryLen - qb * kRows);
          bool first = true;
          for (int64_t q = 2 * qb; q < std::min(2 * qb + 2, halves); ++q) {
            const TileSeen &f = fine[size_t((bh * halves + q) * kTiles_ + kt)];
            fineWork += double(f.keys) *
                        double(std::min(half, a.queryLen - q * half));
            c.view = first ? f.view : c.view == f.view ? c.view
                                                       : TileView::Mixed;
            c.keys = std::max(c.keys, f.keys);
            first = false;
          }
          coarseWork += double(c.keys) * double(nr);
        }
    if (fineWork <= 0.85 * coarseWork) {
      rows_ = half;
      seen_ = std::move(fine);
    } else {
      rows_ = kRows;
      seen_ = std::move(coarse);
    }
    qBlocks_ = (a.queryLen + rows_ - 1) / rows_;
  }
  int64_t rows() const { return rows_; }
  // The pair of rows from i0 (a multiple of rows()), keys from j0 (of
  // kKeys).
  const TileSeen &operator()(int64_t b, int64_t h, int64_t i0,
                             int64_t j0) const {
    const int64_t n =
        ((b * heads_ + (perHead_ ? h : 0)) * qBlocks_ + i0 / rows_) * kTiles_ +
        j0 / kKeys;
    return seen_[size_t(n)];
  }

private:
  int64_t kTiles_, heads_ = 1, rows_ = kRows, qBlocks_ = 0;
  bool perHead_ = false;
  std::vector<TileSeen> seen_;
};

// The scores of rows [i0, i0 + nr) against keys [j0, j0 + nc) from the
// scaled product in `s` (ld kKeys): the mask added, hidden keys -inf (the
// causal rule, the boolean mask, which an Open tile need not read); with
// `rowMax`, each row's largest score (NaN wins).
template <class T>
void finishScores(const dev::AttentionOperands &a, int64_t b, int64_t h,
                  int64_t i0, int64_t nr, int64_t j0, int64_t nc, T *s,
                  T *rowMax, TileView view) {
  const dev::AttnElem native =
      std::is_same_v<T, double> ? dev::AttnElem::F64 : dev::AttnElem::F32;
  // A mask row already in T and contiguous along the keys is added in one
  // vectorizable loop; any other mask is read element by element.
  const bool directBias = a.bias.data && a.bias.elem == native &&
                          (a.bias.strides[3] == 1 || nc == 1);
  for (int64_t r = 0; r < nr; ++r) {
    const int64_t i = i0 + r;
    // Keys [j0, j0 + seen) pass the causal rule.
    const int64_t seen = ruleKeys(a, i, j0, nc);
    T *row = s + r * kKeys;
    if (directBias) {
      const T *bias = static_cast<const T *>(a.bias.data) +
                      a.bias.at(b, h, i, j0);
      for (int64_t t = 0; t < seen; ++t)
        row[t] += bias[t];
    } else if (a.bias.data) {
      for (int64_t t = 0; t < seen; ++t)
        row[t] += dev::attnRead<T>(a.bias.data, a.bias.elem,
                                   a.bias.at(b, h, i, j0 + t));
    }
    if (view == TileView::Open) {
      // Every key the causal rule lets the row see is kept.
    } else if (a.keep.data && a.keep.strides[3] == 1) {
      // Contiguous bytes along the keys: a select in vector lanes.
      const auto *keep =
          static_cast<const uint8_t *>(a.keep.data) + a.keep.at(b, h, i, j0);
      for (int64_t t = 0; t < seen; ++t)
        row[t] = keep[t] ? row[t] : T(-INFINITY);
    } else if (a.keep.data) {
      for (int64_t t = 0; t < seen; ++t)
        if (!dev::attentionKeeps(a, b, h, i, j0 + t))
          row[t] = T(-INFINITY);
    }
    std::fill(row + seen, row + nc, T(-INFINITY));
    if (rowMax) {
      if constexpr (std::is_same_v<T, float>) {
        rowMax[r] = cpu::rowMax(row, seen);
      } else {
        T m = T(-INFINITY);
        for (int64_t t = 0; t < seen; ++t)
          m = dev::attnMax(row[t], m);
        rowMax[r] = m;
      }
    }
  }
}

// Row-major C = alpha A op(B) (+ C): the tiles' products on the calling
// thread.
template <class T>
void product(bool transA, bool transB, int64_t m, int64_t n, int64_t k,
             const T *a, int64_t lda, const T *b, int64_t ldb, bool accumulate,
             T *c, int64_t ldc, T alpha = T(1)) {
  cpu::gemm<T>(transA, transB, m, n, k, alpha, a, lda, b, ldb,
               accumulate ? T(1) : T(0), c, ldc);
}

template <class T>
void forwardBlock(const dev::AttentionStep &st, int64_t task, Tiles<T> &w,
                  const TileMap &tiles) {
  const dev::AttentionOperands &a = st.in;
  const int64_t dim = a.headDim, rows = tiles.rows(),
                blocks = (a.queryLen + rows - 1) / rows;
  const int64_t qb = task % blocks, h = task / blocks % a.queryHeads,
                b = task / (blocks * a.queryHeads),
                kvh = h / (a.queryHeads / a.kvHeads);
  const int64_t i0 = qb * rows, nr = std::min(rows, a.queryLen - i0);
  int64_t ldq, ldk, ldv;
  const T *q = rowsOf(a.q, b, h, i0, nr, dim, w.q.data(), ldq);
  std::fill_n(w.acc.data(), nr * dim, T(0));
  T m[kRows];
  double l[kRows];
  std::fill_n(m, nr, T(-INFINITY));
  std::fill_n(l, nr, 0.0);
  const int64_t end = dev::attentionKeyEnd(a, i0 + nr - 1);
  for (int64_t j0 = 0; j0 < end; j0 += kKeys) {
    // The keys up to the last one a row of the block sees.
    const auto [view, nc] = tiles(b, h, i0, j0);
    if (view == TileView::Hidden)
      continue;
    const T *k = rowsOf(a.k, b, kvh, j0, nc, dim, w.k.data(), ldk);
    product(false, true, nr, nc, dim, q, ldq, k, ldk, false, w.s.data(),
            kKeys, T(a.scale));
    T rowMax[kRows];
    finishScores(a, b, h, i0, nr, j0, nc, w.s.data(), rowMax, view);
    // Each row's online softmax: the tile's maximum, the rescaling of the
    // running sum and accumulator, the tile's probabilities (in s).
    for (int64_t r = 0; r < nr; ++r) {
      T *row = w.s.data() + r * kKeys;
      const T tileMax = rowMax[r];
      if (tileMax == T(-INFINITY)) {
        std::fill_n(row, nc, T(0));
        continue;
      }
      const T mNew = dev::attnMax(tileMax, m[r]);
      if (mNew != m[r]) {
        const T rescale = dev::attnExp(m[r] - mNew);
        l[r] *= double(rescale);
        T *acc = w.acc.data() + r * dim;
        for (int64_t d = 0; d < dim; ++d)
          acc[d] *= rescale;
        m[r] = mNew;
      }
      // The keys past the causal rule's end are -inf: their exps are 0 and
      // add 0 to the sum, so the sum of the others is the same.
      const int64_t seen = ruleKeys(a, i0 + r, j0, nc);
      l[r] += expAndSum(row, seen, mNew);
      std::fill(row + seen, row + nc, T(0));
    }
    const T *v = rowsOf(a.v, b, kvh, j0, nc, dim, w.v.data(), ldv);
    product(false, false, nr, dim, nc, w.s.data(), kKeys, v, ldv, true,
            w.acc.data(), dim);
  }
  for (int64_t r = 0; r < nr; ++r) {
    const int64_t i = i0 + r, row = (b * a.queryHeads + h) * a.queryLen + i;
    const T *acc = w.acc.data() + r * dim;
    const double lr = l[r];
    writeRow(st.out, b, h, i, dim, [&](int64_t d) {
      return lr == 0 ? T(0) : T(double(acc[d]) / lr);
    });
    dev::attnWrite(st.lse, st.lseElem, row,
                   l[r] == 0 ? double(-INFINITY) : double(m[r]) + std::log(l[r]));
  }
}

// The operands of one (query tile, key tile) pair of the backward.
template <class T> struct GradTile {
  const T *q, *dout, *k, *v;
  int64_t ldq, ldo, ldk, ldv;
};

// ds[t] = attnScoreGrad(p[t], ds[t], delta), in the CPU's widest lanes
// (the expression's conversions and roundings element by element, so the
// same bits at any width; GCC built it for SSE2 alone).
CLEAVE_VECTOR_CLONES void scoreGradRow(const float *p, float *ds, int64_t n,
                                       double delta) {
  for (int64_t t = 0; t < n; ++t)
    ds[t] = p[t] * float(double(ds[t]) - delta);
}
void scoreGradRow(const double *p, double *ds, int64_t n, double delta) {
  for (int64_t t = 0; t < n; ++t)
    ds[t] = dev::attnScoreGrad(p[t], ds[t], delta);
}

// P (in s) and dS (in dp) of rows [i0, i0 + nr) at (b, h) against keys
// [j0, j0 + nc): the scores recomputed, P = exp(S - L), dP = dO V^T,
// dS = P (dP - Delta).
template <class T>
void scoreGradTile(const dev::AttentionGradStep &st, int64_t b, int64_t h,
                   int64_t i0, int64_t nr, int64_t j0, int64_t nc,
                   const GradTile<T> &x, Tiles<T> &w, TileView view) {
  const dev::AttentionOperands &a = st.in;
  const int64_t dim = a.headDim;
  product(false, true, nr, nc, dim, x.q, x.ldq, x.k, x.ldk, false, w.s.data(),
          kKeys, T(a.scale));
  finishScores(a, b, h, i0, nr, j0, nc, w.s.data(), static_cast<T *>(nullptr),
               view);
  product(false, true, nr, nc, dim, x.dout, x.ldo, x.v, x.ldv, false,
          w.dp.data(), kKeys);
  for (int64_t r = 0; r < nr; ++r) {
    const int64_t row = (b * a.queryHeads + h) * a.queryLen + i0 + r;
    const T lse = dev::attnRead<T>(st.lse, st.lseElem, row);
    const double delta = st.delta[row];
    T *p = w.s.data() + r * kKeys, *ds = w.dp.data() + r * kKeys;
    if (lse == T(-INFINITY)) { // a row that sees no key
      std::fill_n(p, nc, T(0));
      std::fill_n(ds, nc, T(0));
      continue;
    }
    // The exps of the keys the causal rule lets the row see; the others'
    // -inf give 0.
    const int64_t seen = ruleKeys(a, i0 + r, j0, nc);
    expShifted(p, seen, double(lse), 1.0, p);
    std::fill(p + seen, p + nc, T(0));
    scoreGradRow(p, ds, nc, delta);
  }
}

void deltaRows(const dev::AttentionGradStep &s, int64_t first, int64_t end);

// The gradients of one kv head and its group of query heads, (b, kvh):
// for each block of keys in order, over the group's query heads in order
// and their query tiles in order, the tile's P and dS (the scores
// recomputed once), then dV += P^T dO, dK += dS^T Q (for the block) and
// dQ += dS K (for the tile's rows, kept for the whole group until the
// end). Five products a tile, no atomics: each sum has one order, so the
// bits do not depend on threads. dK and dQ are scaled at the end.
template <class T>
void gradHeadGroup(const dev::AttentionGradStep &st, int64_t task,
                   Tiles<T> &w, std::vector<T> &dq, const TileMap &tiles) {
  const dev::AttentionOperands &a = st.in;
  const int64_t dim = a.headDim, kvh = task % a.kvHeads,
                b = task / a.kvHeads, group = a.queryHeads / a.kvHeads,
                rows = tiles.rows();
  const T scale = T(a.scale);
  // The group's Delta rows first, each read of dO and O right before the
  // tiles read dO again (a pass of its own over every row read both from
  // memory: ViT's attention gradient at T 65, 16 x 4 heads, 0.98 ms a
  // layer in a step, 0.65 hot).
  for (int64_t g = 0; g < group; ++g) {
    const int64_t first = (b * a.queryHeads + kvh * group + g) * a.queryLen;
    deltaRows(st, first, first + a.queryLen);
  }
  dq.assign(size_t(group * a.queryLen * dim), T(0));
  for (int64_t j0 = 0; j0 < a.keyLen; j0 += kKeys) {
    const int64_t nc = std::min(kKeys, a.keyLen - j0);
    GradTile<T> x;
    x.k = rowsOf(a.k, b, kvh, j0, nc, dim, w.k.data(), x.ldk);
    x.v = rowsOf(a.v, b, kvh, j0, nc, dim, w.v.data(), x.ldv);
    T *accK = w.acc.data(), *accV = w.acc2.data();
    std::fill_n(accK, nc * dim, T(0));
    std::fill_n(accV, nc * dim, T(0));
    const int64_t begin = dev::attentionQueryBegin(a, j0);
    for (int64_t g = 0; g < group; ++g) {
      const int64_t h = kvh * group + g;
      for (int64_t i0 = begin - begin % rows; i0 < a.queryLen; i0 += rows) {
        const int64_t nr = std::min(rows, a.queryLen - i0);
        // The tile's rows see keys [j0, j0 + seen) at most: the products
        // leave out the keys none of them sees.
        const auto [view, seen] = tiles(b, h, i0, j0);
        if (view == TileView::Hidden)
          continue;
        x.q = rowsOf(a.q, b, h, i0, nr, dim, w.q.data(), x.ldq);
        x.dout = rowsOf(st.dOut, b, h, i0, nr, dim, w.dout.data(), x.ldo);
        scoreGradTile(st, b, h, i0, nr, j0, seen, x, w, view);
        product(true, false, seen, dim, nr, w.s.data(), kKeys, x.dout, x.ldo,
                true, accV, dim);
        product(true, false, seen, dim, nr, w.dp.data(), kKeys, x.q, x.ldq,
                true, accK, dim);
        product(false, false, nr, dim, seen, w.dp.data(), kKeys, x.k, x.ldk,
                true, dq.data() + (g * a.queryLen + i0) * dim, dim);
      }
    }
    for (int64_t t = 0; t < nc; ++t) {
      const T *rowK = accK + t * dim, *rowV = accV + t * dim;
      writeRow(st.dk, b, kvh, j0 + t, dim,
               [&](int64_t d) { return rowK[d] * scale; });
      writeRow(st.dv, b, kvh, j0 + t, dim, [&](int64_t d) { return rowV[d]; });
    }
  }
  for (int64_t g = 0; g < group; ++g)
    for (int64_t i = 0; i < a.queryLen; ++i) {
      const T *row = dq.data() + (g * a.queryLen + i) * dim;
      writeRow(st.dq, b, kvh * group + g, i, dim,
               [&](int64_t d) { return row[d] * scale; });
    }
}

int64_t queryTasks(const dev::AttentionOperands &a, int64_t rows) {
  return a.batch * a.queryHeads * ((a.queryLen + rows - 1) / rows);
}

// Whether a call is worth the pool: below 2^21 FLOPs in the forward's two
// products it runs on the calling thread alone. Waking the pool's sleeping
// workers costs 10 us and more (a virtual machine's idle core halts), more
// than such a call's whole work: the corpus's tiny GPT-2 (T 16, head size
// 16) measured its first attention of a step at 14.5 us on 2 threads and
// the next, the workers still awake, at 4.7. The tasks are the same either
// way, and so are the bits.
bool worthSpreading(const dev::AttentionOperands &a) {
  return 4.0 * double(a.batch * a.queryHeads) * double(a.queryLen) *
             double(a.keyLen) * double(a.headDim) >=
         double(1 << 21);
}

// Runs task(t) for t in [0, n) over the pool when `spread`, else in order
// on this thread.
void runTasks(bool spread, int64_t n,
              const std::function<void(int64_t)> &task) {
  if (spread) {
    parallelTasks(n, task);
    return;
  }
  for (int64_t t = 0; t < n; ++t)
    task(t);
}

// Each task a block (its own buffers), taken by whichever thread is free:
// under the causal rule later blocks have more keys to see.
template <class T> void forward(const dev::AttentionStep &s) {
  const bool spread = worthSpreading(s.in);
  const TileMap tiles(s.in, spread);
  runTasks(spread, queryTasks(s.in, tiles.rows()), [&](int64_t t) {
    Tiles<T> w(s.in.headDim);
    forwardBlock(s, t, w, tiles);
  });
}

// Delta_i = dO_i . O_i in double (each f32 product exact), in sumLanes16's
// order: eight lanes a vector where the device code (attentionDeltaRow)
// adds in sequence, so the two agree to rounding.
template <bool Wide>
[[gnu::always_inline]] inline double dotInDoubleOf(const float *a,
                                                   const float *b, int64_t n) {
  return sumLanes16(
      n,
      [&](int64_t i) {
        return loadDouble8W<Wide>(a + i) * loadDouble8W<Wide>(b + i);
      },
      [&](int64_t i) { return double(a[i]) * double(b[i]); });
}
CLEAVE_WIDE_TARGET double dotInDoubleWide(const float *a, const float *b,
                                          int64_t n) {
  return dotInDoubleOf<true>(a, b, n);
}
CLEAVE_VECTOR_CLONES double dotInDoubleNarrow(const float *a, const float *b,
                                              int64_t n) {
  return dotInDoubleOf<false>(a, b, n);
}
double dotInDouble(const float *a, const float *b, int64_t n) {
  return cpuHasAvx512F() ? dotInDoubleWide(a, b, n)
                         : dotInDoubleNarrow(a, b, n);
}

void deltaRows(const dev::AttentionGradStep &s, int64_t first, int64_t end) {
  const dev::AttentionOperands &a = s.in;
  const bool rows32 = s.dOut.elem == dev::AttnElem::F32 &&
                      s.out.elem == dev::AttnElem::F32 &&
                      (a.headDim == 1 || (s.dOut.strides[3] == 1 &&
                                          s.out.strides[3] == 1));
  for (int64_t row = first; row < end; ++row) {
    if (!rows32) {
      dev::attentionDeltaRow(s, row);
      continue;
    }
    const int64_t i = row % a.queryLen, h = row / a.queryLen % a.queryHeads,
                  b = row / (a.queryLen * a.queryHeads);
    s.delta[row] = dotInDouble(
        static_cast<const float *>(s.dOut.data) + s.dOut.at(b, h, i, 0),
        static_cast<const float *>(s.out.data) + s.out.at(b, h, i, 0),
        a.headDim);
  }
}

template <class T> void backward(const dev::AttentionGradStep &s) {
  const bool spread = worthSpreading(s.in);
  const TileMap tiles(s.in, spread);
  runTasks(spread, s.in.batch * s.in.kvHeads, [&](int64_t t) {
    Tiles<T> w(s.in.headDim);
    static thread_local std::vector<T> dq; // its capacity kept (as Tiles)
    gradHeadGroup(s, t, w, dq, tiles);
  });
}

} // namespace

void runAttentionForwardOnCpu(const dev::AttentionStep &s) {
  if (dev::attentionWide(s.in))
    forward<double>(s);
  else
    forward<float>(s);
}

void runAttentionBackwardOnCpu(const dev::AttentionGradStep &s) {
  if (dev::attentionWide(s.in))
    backward<double>(s);
  else
    backward<float>(s);
}

namespace {

llvm::Error attention(const KernelCall &c) {
  auto s = attentionStep(c);
  if (!s)
    return s.takeError();
  runAttentionForwardOnCpu(*s);
  return llvm::Error::success();
}

llvm::Error attentionGrad(const KernelCall &c) {
  std::vector<double> delta(size_t(attentionGradRows(c)));
  auto s = attentionGradStep(c, delta.data());
  if (!s)
    return s.takeError();
  runAttentionBackwardOnCpu(*s);
  return llvm::Error::success();
}

} // namespace

namespace cpu {

void registerAttentionKernels(KernelTable &t) {
  const std::vector<ir::DType> types = {ir::DType::F32, ir::DType::F64,
                                        ir::DType::BF16};
  t.add(ir::OpKind::FusedAttention, attention, types);
  t.add(ir::OpKind::FusedAttentionGrad, attentionGrad, types);
}

} // namespace cpu
} // namespace cleave::runtime
