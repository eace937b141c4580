// CPU kernels of ScatterElements (the ONNX examples, repeated and negative
// indices, every reduction) and its two gradients, and CumSum (inclusive,
// exclusive, reversed, along inner and outer axes, integers and floats
// summed in double).
#include "CpuKernelTesting.h"
#include "runtime/Kernel.h"

#include <gtest/gtest.h>

#include <numeric>

namespace unit_cpu_scatter_scan {

using namespace cleave;
using namespace cleave::testsupport::untyped;

namespace {

using I = std::vector<int64_t>;
using F = std::vector<float>;

llvm::Error run(OpKind op, std::vector<const Host *> ins,
                std::vector<Host *> outs, const ir::AttrMap &attrs) {
  std::vector<TensorRef> in, out;
  for (const Host *h : ins)
    in.push_back(h->ref());
  for (Host *h : outs)
    out.push_back(h->ref());
  return backend().run(runtime::KernelCall{op, attrs, in, out});
}

Host eval(OpKind op, std::vector<const Host *> ins, I shape,
          const ir::AttrMap &attrs = {}) {
  Host out = empty(ins[0]->dtype, std::move(shape));
  llvm::Error e = run(op, ins, {&out}, attrs);
  EXPECT_FALSE(bool(e)) << llvm::toString(std::move(e));
  return out;
}

ir::AttrMap scatterAttrs(int64_t axis, const char *reduction = "none") {
  return {{"axis", axis}, {"reduction", std::string(reduction)}};
}

// --- ScatterElements ---------------------------------------------------------

TEST(CpuScatterElements, OnnxExamples) {
  // Axis 0 into zeros.
  Host data = make<float>(DType::F32, {3, 3}, F(9, 0.0f));
  Host idx = make<int64_t>(DType::I64, {2, 3}, {1, 0, 2, 0, 2, 1});
  Host upd = make<float>(DType::F32, {2, 3}, {1.0f, 1.1f, 1.2f, 2.0f, 2.1f, 2.2f});
  EXPECT_EQ(eval(OpKind::ScatterElements, {&data, &idx, &upd}, {3, 3},
                 scatterAttrs(0))
                .values<float>(),
            (F{2.0f, 1.1f, 0, 1.0f, 0, 2.2f, 0, 2.1f, 1.2f}));
  // Axis 1; a negative index; i32 indices.
  Host row = make<float>(DType::F32, {1, 5}, F{1, 2, 3, 4, 5});
  Host idx1 = make<int32_t>(DType::I32, {1, 2}, {1, 3});
  Host upd1 = make<float>(DType::F32, {1, 2}, F{1.1f, 2.1f});
  EXPECT_EQ(eval(OpKind::ScatterElements, {&row, &idx1, &upd1}, {1, 5},
                 scatterAttrs(1))
                .values<float>(),
            (F{1, 1.1f, 3, 2.1f, 5}));
  Host neg = make<int64_t>(DType::I64, {1, 2}, {1, -3});
  EXPECT_EQ(eval(OpKind::ScatterElements, {&row, &neg, &upd1}, {1, 5},
                 scatterAttrs(-1))
                .values<float>(),
            (F{1, 1.1f, 2.1f, 4, 5}));
}

TEST(CpuScatterElements, RepeatedIndicesApplyInOrder) {
  Host row = make<float>(DType::F32, {1, 5}, F{1, 2, 3, 4, 5});
  Host dup = make<int64_t>(DType::I64, {1, 2}, {1, 1});
  Host upd = make<float>(DType::F32, {1, 2}, F{1.1f, 2.1f});
  // none: the later update wins; add: both are added, in order.
  EXPECT_EQ(eval(OpKind::ScatterElements, {&row, &dup, &upd}, {1, 5},
                 scatterAttrs(1))
                .values<float>(),
            (F{1, 2.1f, 3, 4, 5}));
  EXPECT_EQ(eval(OpKind::ScatterElements, {&row, &dup, &upd}, {1, 5},
                 scatterAttrs(1, "add"))
                .values<float>(),
            (F{1, (2.0f + 1.1f) + 2.1f, 3, 4, 5}));
  // mul, max and min on i64, indices smaller than data off the axis.
  Host data = make<int64_t>(DType::I64, {2, 3}, {1, 2, 3, 4, 5, 6});
  Host idx = make<int64_t>(DType::I64, {1, 3}, {1, 1, 0});
  Host u = make<int64_t>(DType::I64, {1, 3}, {3, -2, 7});
  EXPECT_EQ(eval(OpKind::ScatterElements, {&data, &idx, &u}, {2, 3},
                 scatterAttrs(0, "mul"))
                .values<int64_t>(),
            (I{1, 2, 21, 12, -10, 6}));
  EXPECT_EQ(eval(OpKind::ScatterElements, {&data, &idx, &u}, {2, 3},
                 scatterAttrs(0, "max"))
                .values<int64_t>(),
            (I{1, 2, 7, 4, 5, 6}));
  EXPECT_EQ(eval(OpKind::ScatterElements, {&data, &idx, &u}, {2, 3},
                 scatterAttrs(0, "min"))
                .values<int64_t>(),
            (I{1, 2, 3, 3, -2, 6}));
  // Reduction none on bool moves bytes.
  using B = std::vector<uint8_t>;
  Host flags = make<uint8_t>(DType::Bool, {3}, B{0, 0, 0});
  Host fi = make<int64_t>(DType::I64, {1}, {2});
  Host fu = make<uint8_t>(DType::Bool, {1}, B{1});
  EXPECT_EQ(eval(OpKind::ScatterElements, {&flags, &fi, &fu}, {3},
                 scatterAttrs(0))
                .values<uint8_t>(),
            (B{0, 0, 1}));
}

TEST(CpuScatterElements, IndexOutOfRangeIsAnError) {
  Host row = make<float>(DType::F32, {1, 5}, F{1, 2, 3, 4, 5});
  Host bad = make<int64_t>(DType::I64, {1, 2}, {1, 5});
  Host upd = make<float>(DType::F32, {1, 2}, F{1, 2});
  Host out = empty(DType::F32, {1, 5});
  llvm::Error e = run(OpKind::ScatterElements, {&row, &bad, &upd}, {&out},
                      scatterAttrs(1));
  ASSERT_TRUE(bool(e));
  EXPECT_NE(llvm::toString(std::move(e)).find("out of range"),
            std::string::npos);
}

TEST(CpuScatterElements, Gradients) {
  Host dy = make<double>(DType::F64, {2, 3}, {10, 20, 30, 40, 50, 60});
  // Along axis 1: row 0 writes column 2 twice (-1 wraps to 2), row 1
  // writes columns 0 and 1.
  Host idx = make<int64_t>(DType::I64, {2, 2}, {2, -1, 0, 1});
  EXPECT_EQ(eval(OpKind::ScatterElementsGradData, {&dy, &idx}, {2, 3},
                 {{"axis", int64_t(1)}})
                .values<double>(),
            (std::vector<double>{10, 20, 0, 0, 0, 60}));
  Host du = empty(DType::F64, {2, 2});
  ASSERT_FALSE(bool(run(OpKind::ScatterElementsGradUpdates, {&dy, &idx},
                        {&du}, {{"axis", int64_t(1)}})));
  // The first write to (0, 2) was overwritten: its update gets nothing.
  EXPECT_EQ(du.values<double>(), (std::vector<double>{0, 30, 40, 50}));
}

// Which update wrote last, found per lane (at most 16 positions along the
// axis) or with a flag per element (more): both give each position dY at
// its element when no later position of its lane wrote there, else 0, as
// a brute-force search over all later positions does.
TEST(CpuScatterElements, GradientUpdatesFindTheLastWriterOnShortAndLongLanes) {
  for (int64_t along : {4, 40}) {
    SCOPED_TRACE("positions along the axis: " + std::to_string(along));
    const int64_t outer = 3, dim = 5, inner = 2;
    std::vector<double> dyv(size_t(outer * dim * inner));
    for (size_t i = 0; i < dyv.size(); ++i)
      dyv[i] = double(i + 1);
    std::vector<int64_t> iv(size_t(outer * along * inner));
    uint64_t state = 12345;
    for (int64_t &v : iv) {
      state = state * 6364136223846793005ULL + 1442695040888963407ULL;
      v = int64_t((state >> 33) % uint64_t(dim)) - (state >> 62 ? dim : 0);
    }
    Host dy = make<double>(DType::F64, {outer, dim, inner}, dyv);
    Host idx = make<int64_t>(DType::I64, {outer, along, inner}, iv);
    Host du = empty(DType::F64, {outer, along, inner});
    ASSERT_FALSE(bool(run(OpKind::ScatterElementsGradUpdates, {&dy, &idx},
                          {&du}, {{"axis", int64_t(1)}})));
    auto offsetOf = [&](int64_t p) {
      int64_t o = p / (along * inner), i = p % inner, v = iv[size_t(p)];
      return (o * dim + (v < 0 ? v + dim : v)) * inner + i;
    };
    std::vector<double> want(iv.size());
    for (int64_t p = 0; p < int64_t(iv.size()); ++p) {
      bool later = false;
      for (int64_t q = p + 1; q < int64_t(iv.size()); ++q)
        later = later || offsetOf(q) == offsetOf(p);
      want[size_t(p)] = later ? 0.0 : dyv[size_t(offsetOf(p))];
    }
    EXPECT_EQ(du.values<double>(), want);
  }
}

// --- CumSum --------------------------------------------------------------------

ir::AttrMap cumAttrs(int64_t axis, int64_t exclusive = 0, int64_t reverse = 0) {
  return {{"axis", axis}, {"exclusive", exclusive}, {"reverse", reverse}};
}

TEST(CpuCumSum, OnnxExamples) {
  Host x = make<double>(DType::F64, {5}, {1, 2, 3, 4, 5});
  using D = std::vector<double>;
  EXPECT_EQ(eval(OpKind::CumSum, {&x}, {5}, cumAttrs(0)).values<double>(),
            (D{1, 3, 6, 10, 15}));
  EXPECT_EQ(eval(OpKind::CumSum, {&x}, {5}, cumAttrs(0, 1)).values<double>(),
            (D{0, 1, 3, 6, 10}));
  EXPECT_EQ(eval(OpKind::CumSum, {&x}, {5}, cumAttrs(0, 0, 1)).values<double>(),
            (D{15, 14, 12, 9, 5}));
  EXPECT_EQ(eval(OpKind::CumSum, {&x}, {5}, cumAttrs(0, 1, 1)).values<double>(),
            (D{14, 12, 9, 5, 0}));
  Host m = make<float>(DType::F32, {2, 3}, F{1, 2, 3, 4, 5, 6});
  EXPECT_EQ(eval(OpKind::CumSum, {&m}, {2, 3}, cumAttrs(0)).values<float>(),
            (F{1, 2, 3, 5, 7, 9}));
  EXPECT_EQ(eval(OpKind::CumSum, {&m}, {2, 3}, cumAttrs(-1)).values<float>(),
            (F{1, 3, 6, 4, 9, 15}));
}

TEST(CpuCumSum, IntegersAndDoubleAccumulation) {
  Host i = make<int32_t>(DType::I32, {2, 2, 2}, {1, 2, 3, 4, 5, 6, 7, -8});
  EXPECT_EQ(eval(OpKind::CumSum, {&i}, {2, 2, 2}, cumAttrs(1, 0, 1))
                .values<int32_t>(),
            (std::vector<int32_t>{4, 6, 3, 4, 12, -2, 7, -8}));
  Host l = make<int64_t>(DType::I64, {3}, {INT64_MAX, 1, 1});
  EXPECT_EQ(eval(OpKind::CumSum, {&l}, {3}, cumAttrs(0)).values<int64_t>(),
            (I{INT64_MAX, INT64_MIN, INT64_MIN + 1})); // wraps
  // f32 sums run in double and round once per element, as PyTorch's:
  // 1e8 + 1 - 1e8 is 1, not 0.
  Host f = make<float>(DType::F32, {4}, F{1e8f, 1, -1e8f, 1});
  EXPECT_EQ(eval(OpKind::CumSum, {&f}, {4}, cumAttrs(0)).values<float>(),
            (F{1e8f, 1e8f, 1, 2}));
}

} // namespace

} // namespace unit_cpu_scatter_scan
