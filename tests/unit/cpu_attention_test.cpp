// FusedAttention and FusedAttentionGrad through the CPU backend's kernel
// calls (the values are checked against a double reference, through the
// same blocked kernels, in device_attention_test.cpp): the bits do not
// depend on the thread count, and the kernels refuse what they cannot do.
#include "CpuKernelTesting.h"
#include "ir/OpInfo.h"
#include "runtime/Kernel.h"

#include <gtest/gtest.h>

#include <array>
#include <cmath>
#include <cstring>
#include <random>

namespace unit_cpu_attention {

using namespace cleave;
using runtime::TensorRef;
using namespace cleave::testsupport::typed;

namespace {

// O, L, dQ, dK, dV of a causal, masked, grouped-query attention.
template <typename T> struct Outputs {
  Host<T> o, dq, dk, dv;
  Host<T> lse;
};

template <typename T> Outputs<T> runOn(int threads) {
  const int64_t B = 2, Hq = 4, Hkv = 2, Tq = 100, Tk = 100, D = 32;
  Host<T> q = randomHost<T>({B, Hq, Tq, D}, 1, -2, 2),
          k = randomHost<T>({B, Hkv, Tk, D}, 2, -2, 2),
          v = randomHost<T>({B, Hkv, Tk, D}, 3),
          mask = randomHost<T>({B, 1, Tq, Tk}, 4),
          dout = randomHost<T>({B, Hq, Tq, D}, 5);
  Outputs<T> r{Host<T>({B, Hq, Tq, D}), Host<T>({B, Hq, Tq, D}),
               Host<T>({B, Hkv, Tk, D}), Host<T>({B, Hkv, Tk, D}),
               Host<T>({B, Hq, Tq})};
  ir::AttrMap attrs{{"scale", 0.2f}, {"causal", int64_t(1)}};
  auto backend = runtime::createCpuBackend(threads);
  std::vector<TensorRef> fin{q.ref(), k.ref(), v.ref(), mask.ref()},
      fout{r.o.ref(), r.lse.ref()};
  EXPECT_FALSE(bool(backend->run(
      runtime::KernelCall{ir::OpKind::FusedAttention, attrs, fin, fout})));
  std::vector<TensorRef> bin{dout.ref(), q.ref(),     k.ref(),   v.ref(),
                             r.o.ref(),  r.lse.ref(), mask.ref()},
      bout{r.dq.ref(), r.dk.ref(), r.dv.ref()};
  EXPECT_FALSE(bool(backend->run(
      runtime::KernelCall{ir::OpKind::FusedAttentionGrad, attrs, bin, bout})));
  return r;
}

template <typename T> bool same(const Host<T> &a, const Host<T> &b) {
  return a.data.size() == b.data.size() &&
         std::memcmp(a.data.data(), b.data.data(),
                     a.data.size() * sizeof(T)) == 0;
}

// O, L, dQ, dK and dV bit for bit.
template <typename T>
void expectSameOutputs(const Outputs<T> &a, const Outputs<T> &b) {
  EXPECT_TRUE(same(a.o, b.o));
  EXPECT_TRUE(same(a.lse, b.lse));
  EXPECT_TRUE(same(a.dq, b.dq));
  EXPECT_TRUE(same(a.dk, b.dk));
  EXPECT_TRUE(same(a.dv, b.dv));
}

// FusedAttention then FusedAttentionGrad on a backend of `threads` threads:
// O, L (`lse` shaped [B, Hq, Tq]), dQ, dK, dV.
Outputs<float> forwardAndBackward(Host<float> &q, Host<float> &k,
                                  Host<float> &v, Host<float> &dout,
                                  TensorRef mask, Ints lse,
                                  const ir::AttrMap &attrs, int threads) {
  Outputs<float> r{Host<float>(q.shape), Host<float>(q.shape),
                   Host<float>(k.shape), Host<float>(k.shape),
                   Host<float>(std::move(lse))};
  auto backend = runtime::createCpuBackend(threads);
  EXPECT_FALSE(bool(backend->run(
      runtime::KernelCall{ir::OpKind::FusedAttention, attrs,
                          {q.ref(), k.ref(), v.ref(), mask},
                          {r.o.ref(), r.lse.ref()}})));
  EXPECT_FALSE(bool(backend->run(runtime::KernelCall{
      ir::OpKind::FusedAttentionGrad, attrs,
      {dout.ref(), q.ref(), k.ref(), v.ref(), r.o.ref(), r.lse.ref(), mask},
      {r.dq.ref(), r.dk.ref(), r.dv.ref()}})));
  return r;
}

template <typename T> void expectSameOnThreads() {
  testsupport::cpu(); // created first, so it does not reset the pools below
  Outputs<T> one = runOn<T>(1);
  for (int threads : {2, 3}) {
    SCOPED_TRACE(threads);
    expectSameOutputs(one, runOn<T>(threads));
  }
}

TEST(CpuAttention, SameBitsOnOneTwoAndThreeThreadsF32) {
  expectSameOnThreads<float>();
}

TEST(CpuAttention, SameBitsOnOneTwoAndThreeThreadsF64) {
  expectSameOnThreads<double>();
}

// One query row (and one key): a length-1 axis has stride 0 in the
// kernels' views, and the products still get legal leading dimensions.
TEST(CpuAttention, OneQueryRowAndOneKey) {
  for (int64_t tk : {1, 3}) {
    SCOPED_TRACE(tk);
    const int64_t D = 4;
    Host<float> q = randomHost<float>({1, 1, 1, D}, 1),
                k = randomHost<float>({1, 1, tk, D}, 2),
                v = randomHost<float>({1, 1, tk, D}, 3), o({1, 1, 1, D}),
                lse({1, 1, 1});
    ir::AttrMap attrs{{"scale", 0.5f}};
    ASSERT_FALSE(bool(run(ir::OpKind::FusedAttention, attrs,
                          {q.ref(), k.ref(), v.ref()}, {o.ref(), lse.ref()})));
    std::vector<double> p(static_cast<size_t>(tk)),
        want(static_cast<size_t>(D), 0.0);
    double sum = 0;
    for (int64_t j = 0; j < tk; ++j) {
      double dot = 0;
      for (int64_t d = 0; d < D; ++d)
        dot += double(q.data[d]) * k.data[size_t(j * D + d)];
      p[size_t(j)] = std::exp(0.5 * dot);
      sum += p[size_t(j)];
    }
    for (int64_t j = 0; j < tk; ++j)
      for (int64_t d = 0; d < D; ++d)
        want[size_t(d)] += p[size_t(j)] / sum * v.data[size_t(j * D + d)];
    expectClose(o.data, want, 1e-5);
    EXPECT_NEAR(lse.data[0], std::log(sum), 1e-5);
  }
}

// Q, K, V and dO of the mask tests (2 samples, 2 query heads on 1 kv head,
// T 300 so the tiles of 128 end short, D 16), from four seeds.
constexpr int64_t B = 2, Hq = 2, Hkv = 1, T = 300, D = 16;
struct MaskedCase {
  Host<float> q, k, v, dout;
  explicit MaskedCase(std::array<unsigned, 4> seeds)
      : q(randomHost<float>({B, Hq, T, D}, seeds[0], -2, 2)),
        k(randomHost<float>({B, Hkv, T, D}, seeds[1], -2, 2)),
        v(randomHost<float>({B, Hkv, T, D}, seeds[2])),
        dout(randomHost<float>({B, Hq, T, D}, seeds[3])) {}
};

// A boolean mask (true: the key is seen, what recognize-attention passes
// for masked_fill with -inf and for an additive Where(c, 0, -inf)) gives
// the bits of the additive mask with 0 and -inf, forward and backward, on
// 1 and 2 threads: rows that see a few keys, rows that see none, a whole
// 128 x 128 tile hidden, keys hidden at random.
TEST(CpuAttention, BooleanMaskGivesTheBitsOfTheInfinityMask) {
  testsupport::cpu();
  MaskedCase c({1, 2, 3, 5});
  auto &[q, k, v, dout] = c;
  Host<float> bias({B, 1, T, T});
  Host<uint8_t> keep({B, 1, T, T});
  std::mt19937 rng(7);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t i = 0; i < T; ++i)
      for (int64_t j = 0; j < T; ++j) {
        bool seen = j <= i && rng() % 5 != 0; // causal, a fifth hidden
        if (i >= 128 && i < 256 && j >= 128 && j < 256)
          seen = false; // a whole tile
        if (i % 97 == 5)
          seen = false; // rows that see no key
        size_t at = size_t(((b * T) + i) * T + j);
        keep.data[at] = seen ? 1 : 0;
        bias.data[at] = seen ? 0.0f : -INFINITY;
      }
  ir::AttrMap attrs{{"scale", 0.25f}};
  auto runWith = [&](TensorRef mask, int threads) {
    return forwardAndBackward(q, k, v, dout, mask, {B, Hq, T}, attrs,
                              threads);
  };
  Outputs<float> added = runWith(bias.ref(), 1);
  for (int threads : {1, 2}) {
    SCOPED_TRACE(threads);
    expectSameOutputs(added, runWith(keep.ref(), threads));
  }
  // A row that sees no key: O 0, L -inf.
  EXPECT_EQ(added.o.data[size_t(5 * D)], 0.0f);
  EXPECT_EQ(added.lse.data[5], -INFINITY);
}

// A causal-and-padding boolean mask the kernels get as a runtime value
// (causal 0: a triangle recognize-attention cannot prove, such as
// nanoGPT's buffer tested through Equal): the tiles below the diagonal
// where no key is padding are all true, and the kernels skip their select
// (an Open tile; so do a padding mask's tiles under causal 1). The bits are those of the additive 0 / -inf mask (never
// skipped) and, without padding, of the causal rule with no mask at all;
// forward and backward, on 1 and 2 threads, with tiles of every kind.
TEST(CpuAttention, OpenTilesOfACausalMaskGiveTheBitsOfTheMaskedOnes) {
  testsupport::cpu();
  MaskedCase c({11, 12, 13, 15});
  auto &[q, k, v, dout] = c;
  Host<float> bias({B, 1, T, T});
  Host<uint8_t> keep({B, 1, T, T}), tril({B, 1, T, T});
  for (int64_t b = 0; b < B; ++b)
    for (int64_t i = 0; i < T; ++i)
      for (int64_t j = 0; j < T; ++j) {
        // The second sample's last 20 keys are padding.
        bool seen = j <= i && !(b == 1 && j >= T - 20);
        size_t at = size_t(((b * T) + i) * T + j);
        keep.data[at] = seen ? 1 : 0;
        tril.data[at] = j <= i ? 1 : 0;
        bias.data[at] = seen ? 0.0f : -INFINITY;
      }
  ir::AttrMap attrs{{"scale", 0.25f}};
  auto runWith = [&](TensorRef mask, const ir::AttrMap &a, int threads) {
    return forwardAndBackward(q, k, v, dout, mask, {B, Hq, T}, a, threads);
  };
  Outputs<float> added = runWith(bias.ref(), attrs, 1);
  ir::AttrMap causal{{"scale", 0.25f}, {"causal", int64_t(1)}};
  Outputs<float> rule = runWith(TensorRef(), causal, 1);
  for (int threads : {1, 2}) {
    SCOPED_TRACE(threads);
    expectSameOutputs(added, runWith(keep.ref(), attrs, threads));
    // Without padding every tile is open or hidden: the causal rule's bits.
    expectSameOutputs(rule, runWith(tril.ref(), attrs, threads));
  }
}

// A lower triangle as the causal rule, as an additive 0 / -inf mask and as
// a boolean mask (nanoGPT's buffer through Equal, which recognize-attention
// cannot prove) gives the same bits: at these lengths each leaves out the
// same scores in blocks of 64 query rows (the kernels' TileMap), at 100
// ending a block early, at 256 filling four; and the rule's output is the
// reference's to float rounding, on 1 and 2 threads the same bits.
TEST(CpuAttention, ATriangleAsRuleOrMaskGivesTheSameBits) {
  testsupport::cpu();
  for (int64_t len : {100, 256}) {
    SCOPED_TRACE(len);
    const int64_t b = 2, hq = 2, hkv = 1, d = 16;
    Host<float> q = randomHost<float>({b, hq, len, d}, 21, -2, 2),
                k = randomHost<float>({b, hkv, len, d}, 22, -2, 2),
                v = randomHost<float>({b, hkv, len, d}, 23),
                dout = randomHost<float>({b, hq, len, d}, 24);
    Host<float> tril({1, 1, len, len});
    Host<uint8_t> keep({1, 1, len, len});
    for (int64_t i = 0; i < len; ++i)
      for (int64_t j = 0; j < len; ++j) {
        tril.data[size_t(i * len + j)] = j <= i ? 0.0f : -INFINITY;
        keep.data[size_t(i * len + j)] = j <= i ? 1 : 0;
      }
    ir::AttrMap masked{{"scale", 0.25f}};
    ir::AttrMap causal{{"scale", 0.25f}, {"causal", int64_t(1)}};
    auto run = [&](TensorRef mask, const ir::AttrMap &attrs, int threads) {
      return forwardAndBackward(q, k, v, dout, mask, {b, hq, len}, attrs,
                                threads);
    };
    Outputs<float> rule = run(TensorRef(), causal, 1);
    expectSameOutputs(rule, run(tril.ref(), masked, 1));
    expectSameOutputs(rule, run(keep.ref(), masked, 1));
    expectSameOutputs(rule, run(TensorRef(), causal, 2));
    // O against softmax(scale Q K^T, causal) V in double.
    for (int64_t bh = 0; bh < b * hq; ++bh)
      for (int64_t i = 0; i < len; i += 7) {
        const int64_t kv = (bh / hq) * hkv; // one kv head per batch
        std::vector<double> p(size_t(i + 1));
        double top = -INFINITY, sum = 0;
        for (int64_t j = 0; j <= i; ++j) {
          double dot = 0;
          for (int64_t x = 0; x < d; ++x)
            dot += double(q.data[size_t((bh * len + i) * d + x)]) *
                   double(k.data[size_t((kv * len + j) * d + x)]);
          p[size_t(j)] = 0.25 * dot;
          top = std::max(top, p[size_t(j)]);
        }
        for (double &x : p)
          sum += (x = std::exp(x - top));
        for (int64_t x = 0; x < d; ++x) {
          double o = 0;
          for (int64_t j = 0; j <= i; ++j)
            o += p[size_t(j)] / sum *
                 double(v.data[size_t((kv * len + j) * d + x)]);
          ASSERT_NEAR(rule.o.data[size_t((bh * len + i) * d + x)], o, 1e-5)
              << "row " << i;
        }
      }
  }
}

// Keys a boolean padding mask hides from every query ([1, 1, 1, Tk], as a
// batch of one pads) are left out of the products, not computed and
// masked: the call gives the bits of the same attention over the unpadded
// keys alone, with the padded keys' dK and dV 0 (300 keys, 170 seen: the
// second key tile stops at its 42nd key).
TEST(CpuAttention, PaddedKeysGiveTheBitsOfTheShorterKeys) {
  testsupport::cpu();
  const int64_t hq = 2, hkv = 1, tq = 150, tk = 300, seen = 170, d = 16;
  Host<float> q = randomHost<float>({1, hq, tq, d}, 31, -2, 2),
              k = randomHost<float>({1, hkv, tk, d}, 32, -2, 2),
              v = randomHost<float>({1, hkv, tk, d}, 33),
              dout = randomHost<float>({1, hq, tq, d}, 34);
  Host<uint8_t> keep({1, 1, 1, tk});
  for (int64_t j = 0; j < tk; ++j)
    keep.data[size_t(j)] = j < seen ? 1 : 0;
  // K and V cut to their first `seen` keys (one kv head: rows in order).
  Host<float> kCut({1, hkv, seen, d},
                   std::vector<float>(k.data.begin(),
                                      k.data.begin() + seen * d)),
      vCut({1, hkv, seen, d},
           std::vector<float>(v.data.begin(), v.data.begin() + seen * d));
  ir::AttrMap attrs{{"scale", 0.25f}};
  for (int threads : {1, 2}) {
    SCOPED_TRACE(threads);
    Outputs<float> padded = forwardAndBackward(q, k, v, dout, keep.ref(),
                                               {1, hq, tq}, attrs, threads);
    Outputs<float> cut = forwardAndBackward(q, kCut, vCut, dout, TensorRef(),
                                            {1, hq, tq}, attrs, threads);
    EXPECT_TRUE(same(padded.o, cut.o));
    EXPECT_TRUE(same(padded.lse, cut.lse));
    EXPECT_TRUE(same(padded.dq, cut.dq));
    for (int64_t i = 0; i < tk * d; ++i) {
      const float wantK = i < seen * d ? cut.dk.data[size_t(i)] : 0.0f,
                  wantV = i < seen * d ? cut.dv.data[size_t(i)] : 0.0f;
      ASSERT_EQ(padded.dk.data[size_t(i)], wantK) << "at " << i;
      ASSERT_EQ(padded.dv.data[size_t(i)], wantV) << "at " << i;
    }
  }
}

// An operand's shape with h heads: [B, T, h, D] (seq_major) or
// [T, B, h, D] (time_major).
std::vector<int64_t> layoutShape(bool timeMajor, int64_t b, int64_t t,
                                 int64_t h, int64_t d) {
  return timeMajor ? std::vector<int64_t>{t, b, h, d}
                   : std::vector<int64_t>{b, t, h, d};
}

// seq_major and time_major: Q, K, V, O and the gradients as [B, T, H, D]
// or [T, B, H, D], read and written in place, give the bits of the
// [B, H, T, D] op on transposed copies (grouped-query heads, a mask, the
// causal rule; 1 and 2 threads; rows 1 KB (seq_major) and 4 KB
// (time_major) apart: time_major's Q and dO rows, a page apart, are copied
// into the tiles, its K and V rows, 2 KB apart, read in place).
TEST(CpuAttention, SeqAndTimeMajorGiveTheBitsOfTheTransposedOperands) {
  testsupport::cpu();
  const int64_t B = 4, Hq = 8, Hkv = 4, T = 150, D = 32;
  for (const char *layout : {"seq_major", "time_major"}) {
    SCOPED_TRACE(layout);
    const bool time = std::string(layout) == "time_major";
    auto stored = [&](int64_t h) { return layoutShape(time, B, T, h, D); };
    Host<float> q = randomHost<float>(stored(Hq), 1, -2, 2),
                k = randomHost<float>(stored(Hkv), 2, -2, 2),
                v = randomHost<float>(stored(Hkv), 3),
                dout = randomHost<float>(stored(Hq), 5),
                mask = randomHost<float>({B, 1, T, T}, 4);
    // The layout's storage read as [B, H, T, D].
    auto heads = [&](const Host<float> &x) {
      const int64_t h = x.shape[2];
      Host<float> y({B, h, T, D});
      for (int64_t b = 0; b < B; ++b)
        for (int64_t t = 0; t < T; ++t)
          for (int64_t i = 0; i < h; ++i)
            for (int64_t d = 0; d < D; ++d) {
              int64_t row = time ? t * B + b : b * T + t;
              y.data[size_t(((b * h + i) * T + t) * D + d)] =
                  x.data[size_t((row * h + i) * D + d)];
            }
      return y;
    };
    auto runWith = [&](Host<float> &qq, Host<float> &kk, Host<float> &vv,
                       Host<float> &dd, bool inLayout, int threads) {
      ir::AttrMap attrs{{"scale", 0.25f}, {"causal", int64_t(1)}};
      if (inLayout)
        attrs.emplace(layout, int64_t(1));
      return forwardAndBackward(qq, kk, vv, dd, mask.ref(), {B, Hq, T}, attrs,
                                threads);
    };
    Host<float> qh = heads(q), kh = heads(k), vh = heads(v), dh = heads(dout);
    Outputs<float> want = runWith(qh, kh, vh, dh, false, 1);
    for (int threads : {1, 2}) {
      SCOPED_TRACE(threads);
      Outputs<float> got = runWith(q, k, v, dout, true, threads);
      EXPECT_TRUE(same(want.o, heads(got.o)));
      EXPECT_TRUE(same(want.lse, got.lse));
      EXPECT_TRUE(same(want.dq, heads(got.dq)));
      EXPECT_TRUE(same(want.dk, heads(got.dk)));
      EXPECT_TRUE(same(want.dv, heads(got.dv)));
    }
  }
}

// Packed (pack-attention): Q, K and V one tensor whose heads axis holds
// Q's, K's and V's heads in turn, read in place, and one gradient written
// the same way, give the bits of the op on the three parts as separate
// tensors (grouped-query heads, a mask, the causal rule; seq_major rows
// 1.5 KB apart, read in place; time_major's 4.5 KB apart, copied; 1 and 2
// threads).
TEST(CpuAttention, PackedOperandsGiveTheBitsOfSeparateOnes) {
  testsupport::cpu();
  const int64_t B = 3, Hq = 4, Hkv = 2, H = Hq + 2 * Hkv, T = 140, D = 48;
  for (const char *layout : {"seq_major", "time_major"}) {
    SCOPED_TRACE(layout);
    const bool time = std::string(layout) == "time_major";
    auto stored = [&](int64_t h) { return layoutShape(time, B, T, h, D); };
    Host<float> packed = randomHost<float>(stored(H), 1, -2, 2),
                dout = randomHost<float>(stored(Hq), 5),
                mask = randomHost<float>({B, 1, T, T}, 4);
    // Heads [h0, h0 + n) of a packed tensor (or of its gradient).
    auto heads = [&](const Host<float> &x, int64_t h0, int64_t n) {
      Host<float> y(stored(n));
      for (int64_t row = 0; row < B * T; ++row)
        for (int64_t i = 0; i < n; ++i)
          for (int64_t d = 0; d < D; ++d)
            y.data[size_t((row * n + i) * D + d)] =
                x.data[size_t((row * H + h0 + i) * D + d)];
      return y;
    };
    Host<float> q = heads(packed, 0, Hq), k = heads(packed, Hq, Hkv),
                v = heads(packed, Hq + Hkv, Hkv);
    ir::AttrMap attrs{{"scale", 0.25f}, {"causal", int64_t(1)},
                      {layout, int64_t(1)}};
    Outputs<float> want =
        forwardAndBackward(q, k, v, dout, mask.ref(), {B, Hq, T}, attrs, 1);
    attrs.emplace("packed_kv_heads", Hkv);
    for (int threads : {1, 2}) {
      SCOPED_TRACE(threads);
      Host<float> o(stored(Hq)), lse({B, Hq, T}), dp(stored(H));
      auto backend = runtime::createCpuBackend(threads);
      ASSERT_FALSE(bool(backend->run(runtime::KernelCall{
          ir::OpKind::FusedAttention, attrs,
          {packed.ref(), packed.ref(), packed.ref(), mask.ref()},
          {o.ref(), lse.ref()}})));
      ASSERT_FALSE(bool(backend->run(runtime::KernelCall{
          ir::OpKind::FusedAttentionGrad, attrs,
          {dout.ref(), packed.ref(), packed.ref(), packed.ref(), o.ref(),
           lse.ref(), mask.ref()},
          {dp.ref()}})));
      EXPECT_TRUE(same(want.o, o));
      EXPECT_TRUE(same(want.lse, lse));
      EXPECT_TRUE(same(want.dq, heads(dp, 0, Hq)));
      EXPECT_TRUE(same(want.dk, heads(dp, Hq, Hkv)));
      EXPECT_TRUE(same(want.dv, heads(dp, Hq + Hkv, Hkv)));
    }
  }
}

TEST(CpuAttention, RefusesAHeadSizeAboveTheBound) {
  Host<float> q({1, 1, 2, 300}), k({1, 1, 2, 300}), v({1, 1, 2, 300}),
      o({1, 1, 2, 300}), lse({1, 1, 2});
  ir::AttrMap attrs{{"scale", 1.0f}};
  llvm::Error e = run(ir::OpKind::FusedAttention, attrs,
                      {q.ref(), k.ref(), v.ref()}, {o.ref(), lse.ref()});
  ASSERT_TRUE(bool(e));
  EXPECT_NE(llvm::toString(std::move(e)).find("head size 300"),
            std::string::npos);
}

} // namespace

} // namespace unit_cpu_attention
