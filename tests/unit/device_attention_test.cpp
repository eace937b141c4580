// Fused attention's arithmetic, run by the per-row functions' host loops
// (runtime/cuda/DeviceAttention.h, the CUDA backend's) and by the CPU
// backend's blocked kernels (runtime/cpu/Attention.cpp), each against a
// naive reference written here in double: the scores
// materialised, softmax, the products, and the gradients by the textbook
// formulas (dP = dO V^T, dS = P * (dP - rowsum(P * dP)), dQ = scale dS K,
// dK = scale dS^T Q, dV = P^T dO, summed over each kv head's group). The
// reference's gradients are themselves checked against central finite
// differences. The inputs are rounded to the element type first and the
// reference reads those rounded values, so the comparison measures the
// fused arithmetic alone.
#include "runtime/FusedAttentionCall.h"
#include "runtime/cuda/DeviceAttention.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <random>
#include <thread>
#include <vector>

namespace unit_device_attention {

using namespace cleave::runtime::cuda;

namespace {

// A tensor's storage in one element type, written and read as doubles
// (rounded to the type on the way in).
struct Buffer {
  AttnElem elem = AttnElem::F32;
  std::vector<unsigned char> bytes;

  Buffer() = default;
  Buffer(AttnElem e, size_t n) : elem(e), bytes(n * width(e)) {}
  static size_t width(AttnElem e) {
    return e == AttnElem::F64 ? 8 : e == AttnElem::F32 ? 4 : 2;
  }
  size_t size() const { return bytes.size() / width(elem); }
  void set(size_t i, double v) {
    attnWrite<double>(bytes.data(), elem, int64_t(i), v);
  }
  double get(size_t i) const {
    return attnRead<double>(bytes.data(), elem, int64_t(i));
  }
  void *data() { return bytes.data(); }
  const void *data() const { return bytes.data(); }
};

// KeepLowerTriangle: the causal rule as a boolean mask ([Tq, Tk], true
// where j <= i: GPT-style models that keep a tril buffer), so whole tiles
// are hidden.
enum class Mask { None, BiasOverHeads, KeepWithMaskedRow, KeepLowerTriangle };

struct Config {
  int64_t batch = 1, queryHeads = 2, kvHeads = 2, queryLen = 5, keyLen = 5,
          headDim = 8;
  bool causal = false;
  CausalAlign align = CausalAlign::BottomRight;
  Mask mask = Mask::None;
  AttnElem elem = AttnElem::F32;    // Q, K, V, O, dO and the gradients
  AttnElem lseElem = AttnElem::F32;
  bool seqMajor = false; // [B, T, H, D] storage instead of [B, H, T, D]
  double spread = 1.0;   // Q and K are uniform in [-spread, spread]
  unsigned seed = 1;
};

// Strides of a [B, H, T, D] tensor stored as [B, H, T, D] or [B, T, H, D].
void layout(int64_t strides[4], int64_t heads, int64_t len, int64_t dim,
            bool seqMajor) {
  if (seqMajor) {
    strides[0] = len * heads * dim;
    strides[1] = dim;
    strides[2] = heads * dim;
  } else {
    strides[0] = heads * len * dim;
    strides[1] = len * dim;
    strides[2] = dim;
  }
  strides[3] = 1;
}

// The problem's data in doubles (already rounded to the element type) with
// accessors in logical [b, h, t, d] coordinates, and the masks as functions.
struct Problem {
  Config c;
  double scale = 0;
  Buffer q, k, v, dout, bias;
  std::vector<unsigned char> keep;
  int64_t qStrides[4], kvStrides[4], biasStrides[4] = {},
      keepStrides[4] = {};

  double at(const Buffer &x, const int64_t *s, int64_t b, int64_t h,
            int64_t t, int64_t d) const {
    return x.get(size_t(b * s[0] + h * s[1] + t * s[2] + d * s[3]));
  }
  double Q(int64_t b, int64_t h, int64_t i, int64_t d) const {
    return at(q, qStrides, b, h, i, d);
  }
  double K(int64_t b, int64_t h, int64_t j, int64_t d) const {
    return at(k, kvStrides, b, h, j, d);
  }
  double V(int64_t b, int64_t h, int64_t j, int64_t d) const {
    return at(v, kvStrides, b, h, j, d);
  }
  double dO(int64_t b, int64_t h, int64_t i, int64_t d) const {
    return at(dout, qStrides, b, h, i, d);
  }
  // Whether row i may see key j before the additive mask.
  bool sees(int64_t b, int64_t h, int64_t i, int64_t j) const {
    int64_t offset =
        c.align == CausalAlign::BottomRight ? c.keyLen - c.queryLen : 0;
    if (c.causal && j > i + offset)
      return false;
    if (!keep.empty()) {
      const int64_t *s = keepStrides;
      return keep[size_t(b * s[0] + h * s[1] + i * s[2] + j * s[3])] != 0;
    }
    return true;
  }
  double biasAt(int64_t b, int64_t h, int64_t i, int64_t j) const {
    return bias.size() ? at(bias, biasStrides, b, h, i, j) : 0.0;
  }
};

Problem makeProblem(const Config &c) {
  Problem p;
  p.c = c;
  p.scale = defaultAttentionScale(c.headDim);
  std::mt19937 rng(c.seed);
  std::uniform_real_distribution<double> unit(-1.0, 1.0);
  auto fill = [&](Buffer &x, double spread) {
    for (size_t i = 0; i < x.size(); ++i)
      x.set(i, spread * unit(rng));
  };
  int64_t qSize = c.batch * c.queryHeads * c.queryLen * c.headDim,
          kvSize = c.batch * c.kvHeads * c.keyLen * c.headDim;
  p.q = Buffer(c.elem, size_t(qSize));
  p.k = Buffer(c.elem, size_t(kvSize));
  p.v = Buffer(c.elem, size_t(kvSize));
  p.dout = Buffer(c.elem, size_t(qSize));
  fill(p.q, c.spread);
  fill(p.k, c.spread);
  fill(p.v, 1.0);
  fill(p.dout, 1.0);
  layout(p.qStrides, c.queryHeads, c.queryLen, c.headDim, c.seqMajor);
  layout(p.kvStrides, c.kvHeads, c.keyLen, c.headDim, c.seqMajor);
  if (c.mask == Mask::BiasOverHeads) {
    // [B, 1, Tq, Tk] in f32, broadcast over the heads by a zero stride,
    // with a few -inf (hidden keys) but never a whole row of them.
    p.bias = Buffer(AttnElem::F32, size_t(c.batch * c.queryLen * c.keyLen));
    std::uniform_int_distribution<int> pick(0, 9);
    for (size_t n = 0; n < p.bias.size(); ++n)
      p.bias.set(n, n % size_t(c.keyLen) != 0 && pick(rng) == 0
                        ? -INFINITY
                        : 2.0 * unit(rng));
    p.biasStrides[0] = c.queryLen * c.keyLen;
    p.biasStrides[1] = 0;
    p.biasStrides[2] = c.keyLen;
    p.biasStrides[3] = 1;
  } else if (c.mask == Mask::KeepLowerTriangle) {
    p.keep.assign(size_t(c.queryLen * c.keyLen), 0);
    for (int64_t i = 0; i < c.queryLen; ++i)
      for (int64_t j = 0; j <= i && j < c.keyLen; ++j)
        p.keep[size_t(i * c.keyLen + j)] = 1;
    p.keepStrides[0] = 0;
    p.keepStrides[1] = 0;
    p.keepStrides[2] = c.keyLen;
    p.keepStrides[3] = 1;
  } else if (c.mask == Mask::KeepWithMaskedRow) {
    // [1, Hq, Tq, Tk], broadcast over the batch: a few keys hidden, and
    // row 2 of head 1 sees none.
    p.keep.assign(size_t(c.queryHeads * c.queryLen * c.keyLen), 1);
    std::uniform_int_distribution<int> pick(0, 4);
    for (auto &x : p.keep)
      x = pick(rng) != 0;
    for (int64_t j = 0; j < c.keyLen; ++j)
      p.keep[size_t((1 * c.queryLen + 2) * c.keyLen + j)] = 0;
    p.keepStrides[0] = 0;
    p.keepStrides[1] = c.queryLen * c.keyLen;
    p.keepStrides[2] = c.keyLen;
    p.keepStrides[3] = 1;
  }
  return p;
}

// --- the reference ----------------------------------------------------------

// Results in logical row-major order: O, dQ [B, Hq, Tq, D], L [B, Hq, Tq],
// dK, dV [B, Hkv, Tk, D].
struct Results {
  std::vector<double> o, lse, dq, dk, dv;
};

Results reference(const Problem &p) {
  const Config &c = p.c;
  const int64_t B = c.batch, Hq = c.queryHeads, Hkv = c.kvHeads,
                Tq = c.queryLen, Tk = c.keyLen, D = c.headDim,
                group = Hq / Hkv;
  Results r;
  r.o.assign(size_t(B * Hq * Tq * D), 0.0);
  r.dq.assign(r.o.size(), 0.0);
  r.lse.assign(size_t(B * Hq * Tq), -INFINITY);
  r.dk.assign(size_t(B * Hkv * Tk * D), 0.0);
  r.dv.assign(r.dk.size(), 0.0);
  std::vector<double> S(size_t(Tq * Tk)), P(S.size()), dP(S.size());
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < Hq; ++h) {
      const int64_t kvh = h / group;
      // Scores, softmax (a row with nothing visible stays 0), O and L.
      for (int64_t i = 0; i < Tq; ++i) {
        double mx = -INFINITY;
        for (int64_t j = 0; j < Tk; ++j) {
          double s = -INFINITY;
          if (p.sees(b, h, i, j)) {
            double dot = 0;
            for (int64_t d = 0; d < D; ++d)
              dot += p.Q(b, h, i, d) * p.K(b, kvh, j, d);
            s = p.scale * dot + p.biasAt(b, h, i, j);
          }
          S[size_t(i * Tk + j)] = s;
          mx = std::max(mx, s);
        }
        double sum = 0;
        for (int64_t j = 0; j < Tk; ++j) {
          double e = mx == -INFINITY ? 0.0 : std::exp(S[size_t(i * Tk + j)] - mx);
          P[size_t(i * Tk + j)] = e;
          sum += e;
        }
        for (int64_t j = 0; j < Tk; ++j)
          if (sum > 0)
            P[size_t(i * Tk + j)] /= sum;
        size_t row = size_t((b * Hq + h) * Tq + i);
        if (sum > 0)
          r.lse[row] = mx + std::log(sum);
        for (int64_t d = 0; d < D; ++d) {
          double o = 0;
          for (int64_t j = 0; j < Tk; ++j)
            o += P[size_t(i * Tk + j)] * p.V(b, kvh, j, d);
          r.o[row * size_t(D) + size_t(d)] = o;
        }
      }
      // dP = dO V^T; dS = P * (dP - rowsum(P * dP)).
      for (int64_t i = 0; i < Tq; ++i) {
        double rowsum = 0;
        for (int64_t j = 0; j < Tk; ++j) {
          double dp = 0;
          for (int64_t d = 0; d < D; ++d)
            dp += p.dO(b, h, i, d) * p.V(b, kvh, j, d);
          dP[size_t(i * Tk + j)] = dp;
          rowsum += P[size_t(i * Tk + j)] * dp;
        }
        for (int64_t j = 0; j < Tk; ++j)
          dP[size_t(i * Tk + j)] =
              P[size_t(i * Tk + j)] * (dP[size_t(i * Tk + j)] - rowsum);
      }
      const std::vector<double> &dS = dP;
      for (int64_t i = 0; i < Tq; ++i)
        for (int64_t j = 0; j < Tk; ++j) {
          double ds = dS[size_t(i * Tk + j)], pij = P[size_t(i * Tk + j)];
          size_t qrow = size_t((b * Hq + h) * Tq + i),
                 krow = size_t((b * Hkv + kvh) * Tk + j);
          for (int64_t d = 0; d < D; ++d) {
            r.dq[qrow * size_t(D) + size_t(d)] +=
                p.scale * ds * p.K(b, kvh, j, d);
            r.dk[krow * size_t(D) + size_t(d)] +=
                p.scale * ds * p.Q(b, h, i, d);
            r.dv[krow * size_t(D) + size_t(d)] += pij * p.dO(b, h, i, d);
          }
        }
    }
  return r;
}

// --- the fused arithmetic ----------------------------------------------------

// Buffers of the fused run, in the problem's storage layout.
struct Fused {
  Buffer o, lse, dq, dk, dv;
  std::vector<double> delta;
  AttentionStep fwd;
  AttentionGradStep bwd;
};

AttentionOperands operandsOf(const Problem &p) {
  const Config &c = p.c;
  AttentionOperands a;
  a.batch = c.batch;
  a.queryHeads = c.queryHeads;
  a.kvHeads = c.kvHeads;
  a.queryLen = c.queryLen;
  a.keyLen = c.keyLen;
  a.headDim = c.headDim;
  a.scale = p.scale;
  a.causal = c.causal;
  a.align = c.align;
  auto input = [](const Buffer &x, const int64_t *s) {
    AttnInput in;
    in.data = x.data();
    in.elem = x.elem;
    std::copy(s, s + 4, in.strides);
    return in;
  };
  a.q = input(p.q, p.qStrides);
  a.k = input(p.k, p.kvStrides);
  a.v = input(p.v, p.kvStrides);
  if (p.bias.size())
    a.bias = input(p.bias, p.biasStrides);
  if (!p.keep.empty()) {
    a.keep.data = p.keep.data();
    std::copy(p.keepStrides, p.keepStrides + 4, a.keep.strides);
  }
  return a;
}

// Allocates the outputs and fills the steps (nothing runs yet).
void prepare(const Problem &p, Fused &f) {
  const Config &c = p.c;
  size_t qSize = p.q.size(), kvSize = p.k.size(),
         rows = size_t(c.batch * c.queryHeads * c.queryLen);
  f.o = Buffer(c.elem, qSize);
  f.dq = Buffer(c.elem, qSize);
  f.dk = Buffer(c.elem, kvSize);
  f.dv = Buffer(c.elem, kvSize);
  f.lse = Buffer(c.lseElem, rows);
  f.delta.assign(rows, 0.0);
  auto output = [](Buffer &x, const int64_t *s) {
    AttnOutput out;
    out.data = x.data();
    out.elem = x.elem;
    std::copy(s, s + 4, out.strides);
    return out;
  };
  f.fwd.in = operandsOf(p);
  f.fwd.out = output(f.o, p.qStrides);
  f.fwd.lse = f.lse.data();
  f.fwd.lseElem = c.lseElem;
  f.bwd.in = f.fwd.in;
  f.bwd.out.data = f.o.data();
  f.bwd.out.elem = c.elem;
  std::copy(p.qStrides, p.qStrides + 4, f.bwd.out.strides);
  f.bwd.dOut = f.fwd.in.q;
  f.bwd.dOut.data = p.dout.data();
  f.bwd.lse = f.lse.data();
  f.bwd.lseElem = c.lseElem;
  f.bwd.delta = f.delta.data();
  f.bwd.dq = output(f.dq, p.qStrides);
  f.bwd.dk = output(f.dk, p.kvStrides);
  f.bwd.dv = output(f.dv, p.kvStrides);
}

// A fused result in logical row-major order, for comparison.
std::vector<double> logical(const Buffer &x, int64_t B, int64_t H, int64_t T,
                            int64_t D, const int64_t *s) {
  std::vector<double> out;
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < H; ++h)
      for (int64_t t = 0; t < T; ++t)
        for (int64_t d = 0; d < D; ++d)
          out.push_back(x.get(size_t(b * s[0] + h * s[1] + t * s[2] + d * s[3])));
  return out;
}

// Every element within rel * |want| + floor * max|want| of the reference;
// infinities (L of a fully-masked row) must be equal.
void expectClose(const char *what, const std::vector<double> &got,
                 const std::vector<double> &want, double rel, double floor) {
  ASSERT_EQ(got.size(), want.size()) << what;
  double largest = 0;
  for (double w : want)
    if (std::isfinite(w))
      largest = std::max(largest, std::fabs(w));
  int failures = 0;
  for (size_t n = 0; n < want.size() && failures < 5; ++n) {
    if (!std::isfinite(want[n])) {
      EXPECT_EQ(got[n], want[n]) << what << "[" << n << "]";
      failures += got[n] != want[n];
      continue;
    }
    double tol = rel * std::fabs(want[n]) + floor * largest;
    double err = std::fabs(got[n] - want[n]);
    EXPECT_LE(err, tol) << what << "[" << n << "]: got " << got[n]
                        << ", want " << want[n];
    failures += !(err <= tol);
  }
}

struct Tolerance {
  double rel, floor;
};

Tolerance toleranceOf(AttnElem e) {
  switch (e) {
  // f64 and f32: sums of a few hundred terms in the compute type (the
  // largest errors seen are about a tenth of these).
  case AttnElem::F64: return {1e-13, 1e-13};
  case AttnElem::F32: return {5e-6, 5e-6};
  // bf16 keeps 8 significant bits: one rounding on store is a relative
  // error of at most 2^-9, and the gradients also read O rounded (through
  // Delta). Allowed: 2^-7 relative plus 2^-7 of the tensor's largest value
  // (a small result of a cancelling sum carries the inputs' rounding); the
  // largest errors seen are about a quarter of that.
  case AttnElem::BF16: return {0x1p-7, 0x1p-7};
  }
  return {0, 0};
}

// Runs the fused forward and backward on the host and compares O, L and
// all three gradients with the reference.
// Which implementation runs the steps: the per-row functions' host loops
// (the CUDA backend's arithmetic) or the CPU backend's blocked kernels.
enum class Runner { Rows, CpuBlocks };

Results checkOne(const Config &c, const Problem &p, const Results &want,
                 Runner runner) {
  SCOPED_TRACE(runner == Runner::Rows ? "rows" : "CPU blocks");
  Fused f;
  prepare(p, f);
  EXPECT_TRUE(attentionSupported(f.fwd.in));
  if (runner == Runner::Rows) {
    runAttentionForwardOnHost(f.fwd);
    runAttentionBackwardOnHost(f.bwd);
  } else {
    cleave::runtime::runAttentionForwardOnCpu(f.fwd);
    cleave::runtime::runAttentionBackwardOnCpu(f.bwd);
  }
  Results got;
  got.o = logical(f.o, c.batch, c.queryHeads, c.queryLen, c.headDim,
                  p.qStrides);
  got.dq = logical(f.dq, c.batch, c.queryHeads, c.queryLen, c.headDim,
                   p.qStrides);
  got.dk =
      logical(f.dk, c.batch, c.kvHeads, c.keyLen, c.headDim, p.kvStrides);
  got.dv =
      logical(f.dv, c.batch, c.kvHeads, c.keyLen, c.headDim, p.kvStrides);
  for (size_t n = 0; n < f.lse.size(); ++n)
    got.lse.push_back(f.lse.get(n));
  Tolerance t = toleranceOf(c.elem);
  // L is kept in lseElem; in f32 it is rounded relative to its own size.
  Tolerance tl = c.lseElem == AttnElem::F64 ? t : Tolerance{2e-6, 2e-6};
  if (c.elem == AttnElem::BF16)
    tl = {1e-5, 1e-5}; // from the bf16 inputs, computed in float
  expectClose("O", got.o, want.o, t.rel, t.floor);
  expectClose("L", got.lse, want.lse, tl.rel, tl.floor);
  expectClose("dQ", got.dq, want.dq, t.rel, t.floor);
  expectClose("dK", got.dk, want.dk, t.rel, t.floor);
  expectClose("dV", got.dv, want.dv, t.rel, t.floor);
  return got;
}

Results checkAgainstReference(const Config &c) {
  SCOPED_TRACE(::testing::Message()
               << "B " << c.batch << " Hq " << c.queryHeads << " Hkv "
               << c.kvHeads << " Tq " << c.queryLen << " Tk " << c.keyLen
               << " D " << c.headDim << (c.causal ? " causal" : ""));
  Problem p = makeProblem(c);
  Results want = reference(p);
  checkOne(c, p, want, Runner::CpuBlocks);
  return checkOne(c, p, want, Runner::Rows);
}

} // namespace

// The reference's gradients against central differences of
// f(Q, K, V) = sum(O * dO), in f64, on a case with every feature: grouped
// heads, bottom-right causal with Tq < Tk, an additive mask and a boolean
// mask with a fully-masked row.
TEST(DeviceAttention, ReferenceGradientsMatchFiniteDifferences) {
  for (Mask mask : {Mask::BiasOverHeads, Mask::KeepWithMaskedRow}) {
    Config c;
    c.queryHeads = 2;
    c.kvHeads = 1;
    c.queryLen = 3;
    c.keyLen = 4;
    c.headDim = 3;
    c.causal = true;
    c.mask = mask;
    c.elem = AttnElem::F64;
    c.spread = 2.0;
    Problem p = makeProblem(c);
    Results r = reference(p);
    auto loss = [&](const Problem &x) {
      Results y = reference(x);
      double f = 0;
      for (int64_t b = 0; b < c.batch; ++b)
        for (int64_t h = 0; h < c.queryHeads; ++h)
          for (int64_t i = 0; i < c.queryLen; ++i)
            for (int64_t d = 0; d < c.headDim; ++d)
              f += y.o[size_t(((b * c.queryHeads + h) * c.queryLen + i) *
                                  c.headDim +
                              d)] *
                   x.dO(b, h, i, d);
      return f;
    };
    const double step = 1e-5;
    auto check = [&](Buffer Problem::*field, const std::vector<double> &grad,
                     const char *what) {
      for (size_t n = 0; n < grad.size(); ++n) {
        Problem up = p, down = p;
        (up.*field).set(n, (p.*field).get(n) + step);
        (down.*field).set(n, (p.*field).get(n) - step);
        double fd = (loss(up) - loss(down)) / (2 * step);
        EXPECT_NEAR(grad[n], fd, 1e-7) << what << "[" << n << "]";
      }
    };
    // The problem's storage is row-major [B, H, T, D], the reference's
    // order, so buffer element n is gradient element n.
    check(&Problem::q, r.dq, "dQ");
    check(&Problem::k, r.dk, "dK");
    check(&Problem::v, r.dv, "dV");
  }
}

TEST(DeviceAttention, F32NoMaskOverSeveralTiles) {
  Config c;
  c.batch = 2;
  c.queryLen = c.keyLen = 150; // two full tiles and a partial one
  c.headDim = 64;
  c.spread = 2.0;
  checkAgainstReference(c);
}

TEST(DeviceAttention, F32Causal) {
  for (int64_t dim : {8, 64, 80}) {
    Config c;
    c.queryLen = c.keyLen = 130;
    c.headDim = dim;
    c.causal = true;
    c.spread = 2.0;
    checkAgainstReference(c);
  }
}

// Tq != Tk: bottom-right, where with Tq > Tk the first Tq - Tk rows see no
// key (output 0, L = -inf), and top-left (PyTorch's is_causal).
TEST(DeviceAttention, CausalWithDifferentLengths) {
  for (CausalAlign align : {CausalAlign::BottomRight, CausalAlign::TopLeft})
    for (auto [tq, tk] : {std::pair<int64_t, int64_t>{37, 150}, {90, 70}}) {
      Config c;
      c.queryLen = tq;
      c.keyLen = tk;
      c.causal = true;
      c.align = align;
      Results got = checkAgainstReference(c);
      if (align == CausalAlign::BottomRight && tq > tk) {
        EXPECT_EQ(got.lse[0], -INFINITY);
        EXPECT_EQ(got.lse[size_t(tq - tk - 1)], -INFINITY);
        EXPECT_TRUE(std::isfinite(got.lse[size_t(tq - tk)]));
      }
    }
}

TEST(DeviceAttention, GroupedQueryHeads) {
  for (int64_t kvHeads : {2, 1})
    for (bool causal : {false, true}) {
      Config c;
      c.batch = 2;
      c.queryHeads = 4;
      c.kvHeads = kvHeads;
      c.queryLen = 40;
      c.keyLen = 70;
      c.causal = causal;
      checkAgainstReference(c);
    }
}

TEST(DeviceAttention, AdditiveMaskBroadcastOverHeads) {
  Config c;
  c.batch = 2;
  c.queryHeads = 4;
  c.kvHeads = 2;
  c.queryLen = c.keyLen = 100;
  c.headDim = 80;
  c.mask = Mask::BiasOverHeads;
  checkAgainstReference(c);
}

// Row 2 of head 1 sees no key: PyTorch (>= 2.5) gives 0 there, and nothing
// flows back through it.
TEST(DeviceAttention, BooleanMaskWithFullyMaskedRow) {
  Config c;
  c.batch = 2;
  c.queryHeads = 2;
  c.kvHeads = 1;
  c.queryLen = 9;
  c.keyLen = 70;
  c.mask = Mask::KeepWithMaskedRow;
  Results got = checkAgainstReference(c);
  for (int64_t b = 0; b < c.batch; ++b) {
    size_t row = size_t((b * c.queryHeads + 1) * c.queryLen + 2);
    EXPECT_EQ(got.lse[row], -INFINITY);
    for (int64_t d = 0; d < c.headDim; ++d) {
      EXPECT_EQ(got.o[row * size_t(c.headDim) + size_t(d)], 0.0);
      EXPECT_EQ(got.dq[row * size_t(c.headDim) + size_t(d)], 0.0);
    }
  }
}

// Masks and causality together, in f64 with L kept in f64: the fused
// arithmetic is then exact to a few ulps of double.
TEST(DeviceAttention, F64) {
  for (Mask mask : {Mask::None, Mask::BiasOverHeads, Mask::KeepWithMaskedRow})
    for (int64_t dim : {8, 80}) {
      Config c;
      c.queryHeads = 4;
      c.kvHeads = 2;
      c.queryLen = 70;
      c.keyLen = 130;
      c.headDim = dim;
      c.causal = mask != Mask::None;
      c.mask = mask;
      c.elem = c.lseElem = AttnElem::F64;
      c.spread = 2.0;
      checkAgainstReference(c);
    }
}

// bf16 storage, float arithmetic: within the bf16 bound of toleranceOf.
TEST(DeviceAttention, Bf16) {
  for (bool causal : {false, true}) {
    Config c;
    c.queryHeads = 4;
    c.kvHeads = 1;
    c.queryLen = c.keyLen = 100;
    c.headDim = 64;
    c.causal = causal;
    c.mask = causal ? Mask::None : Mask::BiasOverHeads;
    c.elem = AttnElem::BF16;
    checkAgainstReference(c);
  }
}

// Q, K, V, O and the gradients stored [B, T, H, D] and read through strides.
TEST(DeviceAttention, SequenceMajorLayout) {
  Config c;
  c.batch = 2;
  c.queryHeads = 4;
  c.kvHeads = 2;
  c.queryLen = c.keyLen = 70;
  c.causal = true;
  c.seqMajor = true;
  checkAgainstReference(c);
}

TEST(DeviceAttention, SupportedShapes) {
  Problem p = makeProblem(Config{});
  AttentionOperands a = operandsOf(p);
  EXPECT_TRUE(attentionSupported(a));
  a.headDim = kMaxHeadDim;
  EXPECT_TRUE(attentionSupported(a));
  a.headDim = kMaxHeadDim + 1;
  EXPECT_FALSE(attentionSupported(a)); // the local arrays' bound
  a.headDim = 8;
  a.queryHeads = 3;
  EXPECT_FALSE(attentionSupported(a)); // 3 query heads over 2 kv heads
  a.queryHeads = 2;
  a.kvHeads = 4;
  EXPECT_FALSE(attentionSupported(a));
}

// The determinism promise: a row's bits depend on the inputs alone, so
// running the rows in reverse, or spread over threads, changes nothing.
TEST(DeviceAttention, RowOrderAndThreadsGiveIdenticalBits) {
  Config c;
  c.batch = 2;
  c.queryHeads = 4;
  c.kvHeads = 2;
  c.queryLen = 70;
  c.keyLen = 130;
  c.headDim = 64;
  c.causal = true;
  c.mask = Mask::BiasOverHeads;
  Problem p = makeProblem(c);
  Fused inOrder;
  prepare(p, inOrder);
  runAttentionForwardOnHost(inOrder.fwd);
  runAttentionBackwardOnHost(inOrder.bwd);

  const int64_t rows = attentionRows(inOrder.fwd.in),
                kvRows = attentionKvRows(inOrder.fwd.in);
  auto same = [](const Buffer &x, const Buffer &y) {
    return x.bytes.size() == y.bytes.size() &&
           std::memcmp(x.bytes.data(), y.bytes.data(), x.bytes.size()) == 0;
  };
  auto expectSame = [&](const Fused &f) {
    EXPECT_TRUE(same(f.o, inOrder.o));
    EXPECT_TRUE(same(f.lse, inOrder.lse));
    EXPECT_TRUE(same(f.dq, inOrder.dq));
    EXPECT_TRUE(same(f.dk, inOrder.dk));
    EXPECT_TRUE(same(f.dv, inOrder.dv));
  };

  Fused reversed;
  prepare(p, reversed);
  for (int64_t r = rows; r-- > 0;)
    attentionForwardRow(reversed.fwd, r);
  for (int64_t r = rows; r-- > 0;)
    attentionDeltaRow(reversed.bwd, r);
  for (int64_t r = kvRows; r-- > 0;)
    attentionGradKVRow(reversed.bwd, r);
  for (int64_t r = rows; r-- > 0;)
    attentionGradQRow(reversed.bwd, r);
  expectSame(reversed);

  // Four threads, rows dealt round-robin; each pass joins before the next.
  Fused threaded;
  prepare(p, threaded);
  auto parallel = [](int64_t count, const std::function<void(int64_t)> &fn) {
    std::vector<std::thread> pool;
    for (int t = 0; t < 4; ++t)
      pool.emplace_back([&, t] {
        for (int64_t r = t; r < count; r += 4)
          fn(r);
      });
    for (auto &th : pool)
      th.join();
  };
  parallel(rows, [&](int64_t r) { attentionForwardRow(threaded.fwd, r); });
  parallel(rows, [&](int64_t r) { attentionDeltaRow(threaded.bwd, r); });
  parallel(rows, [&](int64_t r) { attentionGradQRow(threaded.bwd, r); });
  parallel(kvRows, [&](int64_t r) { attentionGradKVRow(threaded.bwd, r); });
  expectSame(threaded);
}

// The block steps (what the GPU kernels run: a block of rows loads each tile
// once, and the head size fixed at compile time where it is 64 or 128) give
// the per-row functions' bits, over the shapes where a block's rows see
// different key ranges: causal both ways with Tq != Tk, lengths that are not
// a multiple of a block, masks (a fully-masked row), grouped-query heads,
// the sequence-major layout, bf16.
TEST(DeviceAttention, BlocksGiveTheRowsBits) {
  auto same = [](const Buffer &x, const Buffer &y) {
    return x.bytes.size() == y.bytes.size() &&
           std::memcmp(x.bytes.data(), y.bytes.data(), x.bytes.size()) == 0;
  };
  struct Case {
    const char *name;
    Config c;
  };
  // One batch and two query heads over one kv head: enough blocks and
  // tiles, small enough for the sanitizer builds (this test took 74 s under
  // ASan with four heads over two, two batches and D 128 everywhere).
  std::vector<Case> cases;
  for (int64_t dim : {64, 40})
    for (CausalAlign align : {CausalAlign::BottomRight, CausalAlign::TopLeft})
      for (auto [tq, tk] :
           {std::pair<int64_t, int64_t>{130, 130}, {70, 150}, {150, 70}}) {
        Config c;
        c.queryHeads = 2;
        c.kvHeads = 1;
        c.queryLen = tq;
        c.keyLen = tk;
        c.headDim = dim;
        c.causal = true;
        c.align = align;
        cases.push_back({"causal", c});
      }
  {
    Config c;
    c.queryHeads = 2;
    c.kvHeads = 1;
    c.queryLen = 70;
    c.keyLen = 150;
    c.headDim = 128;
    c.causal = true;
    cases.push_back({"causal D 128", c});
  }
  for (Mask mask : {Mask::BiasOverHeads, Mask::KeepWithMaskedRow,
                    Mask::KeepLowerTriangle}) {
    Config c;
    c.queryHeads = 2;
    c.queryLen = 190; // lower triangle: the tiles above it skipped whole
    c.keyLen = 200;
    c.headDim = 64;
    c.mask = mask;
    cases.push_back({"masked", c});
  }
  {
    Config c;
    c.queryHeads = 4;
    c.kvHeads = 1;
    c.queryLen = c.keyLen = 129;
    c.headDim = 64;
    c.causal = true;
    c.seqMajor = true;
    c.elem = AttnElem::BF16;
    cases.push_back({"bf16 seq-major grouped", c});
  }
  {
    Config c;
    c.queryLen = c.keyLen = 70;
    c.headDim = 64;
    c.causal = true;
    c.elem = AttnElem::F64;
    cases.push_back({"f64", c});
  }
  for (const Case &k : cases) {
    const Config &c = k.c;
    SCOPED_TRACE(testing::Message()
                 << k.name << " D " << c.headDim << " Tq " << c.queryLen
                 << " Tk " << c.keyLen << " align " << int(c.align));
    Problem p = makeProblem(c);
    Fused rows, blocks, fixed;
    prepare(p, rows);
    prepare(p, blocks);
    prepare(p, fixed);
    runAttentionForwardRowsOnHost(rows.fwd);
    runAttentionBackwardRowsOnHost(rows.bwd);
    runAttentionForwardOnHost(blocks.fwd);
    runAttentionBackwardOnHost(blocks.bwd);
    auto check = [&](const Fused &f, const char *what) {
      SCOPED_TRACE(what);
      EXPECT_TRUE(same(f.o, rows.o));
      EXPECT_TRUE(same(f.lse, rows.lse));
      EXPECT_TRUE(same(f.dq, rows.dq));
      EXPECT_TRUE(same(f.dk, rows.dk));
      EXPECT_TRUE(same(f.dv, rows.dv));
    };
    check(blocks, "blocks");
    if (c.elem == AttnElem::F64 || (c.headDim != 64 && c.headDim != 128))
      continue;
    // The GPU's kernels for D 64 and 128: the same steps with the head size
    // a compile-time constant, v_j in the block's shared memory.
    if (c.headDim == 64)
      runAttentionForwardBlocksOnHost<float, 64>(fixed.fwd);
    else
      runAttentionForwardBlocksOnHost<float, 128>(fixed.fwd);
    for (int64_t r = 0, n = attentionRows(fixed.bwd.in); r < n; ++r)
      attentionDeltaRow(fixed.bwd, r);
    if (c.headDim == 64)
      runAttentionGradBlocksOnHost<float, 64, true>(fixed.bwd);
    else
      runAttentionGradBlocksOnHost<float, 128, true>(fixed.bwd);
    check(fixed, "fixed head size");
  }
}

// The causal rule spelled as a boolean mask (a tril buffer): the block steps
// skip the tiles no row of a block sees, and the results are the
// reference's, as with the causal flag.
TEST(DeviceAttention, LowerTriangleMaskAsTheCausalRule) {
  Config c;
  c.queryHeads = 2;
  c.queryLen = c.keyLen = 150;
  c.headDim = 64;
  c.mask = Mask::KeepLowerTriangle;
  Results masked = checkAgainstReference(c);
  c.mask = Mask::None;
  c.causal = true;
  c.align = CausalAlign::TopLeft;
  Results flagged = checkAgainstReference(c);
  EXPECT_EQ(masked.o, flagged.o);
  EXPECT_EQ(masked.dq, flagged.dq);
  EXPECT_EQ(masked.dk, flagged.dk);
  EXPECT_EQ(masked.dv, flagged.dv);
}

} // namespace unit_device_attention
