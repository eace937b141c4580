// Lowering of kernel calls to device steps (Lowering.h): which ops lower
// (lowers) and the dispatch to each family's lowering (lowerCall; the
// families are in LowerElementwise.cpp, LowerProducts.cpp and
// LowerReductions.cpp), the combined gradient ops, the host runner of the
// steps, and the emulated backend built on the two.
#include "runtime/cuda/LoweringSupport.h"

#include "llvm/Support/FormatVariadic.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <optional>

namespace cleave::runtime::cuda {

using ir::DType;
using ir::OpKind;

namespace {

// A combined gradient op that split-backward leaves whole only where it is
// not split (MatMulGrad, ...): its two parts, and which of its inputs each
// takes (as the CPU backend's addSplitGradient).
struct GradientParts {
  OpKind first, second;
  std::vector<int> firstInputs, secondInputs;
};

std::optional<GradientParts> combinedParts(OpKind k) {
  switch (k) {
  case OpKind::MatMulGrad:
    return GradientParts{OpKind::MatMulGradA, OpKind::MatMulGradB, {0, 2}, {1, 0}};
  case OpKind::GemmGrad:
    return GradientParts{OpKind::GemmGradA, OpKind::GemmGradB, {0, 2}, {1, 0}};
  case OpKind::ConvGrad:
    return GradientParts{OpKind::ConvGradData, OpKind::ConvGradFilter, {0, 2},
                         {1, 0}};
  case OpKind::LayerNormalizationGrad:
    return GradientParts{OpKind::LayerNormalizationGradData,
                         OpKind::LayerNormalizationGradParams, {0, 1, 2},
                         {0, 1}};
  case OpKind::BatchNormalizationGrad:
    return GradientParts{OpKind::BatchNormalizationGradData,
                         OpKind::BatchNormalizationGradParams, {0, 1, 2, 3, 4},
                         {0, 1, 3, 4}};
  default:
    return std::nullopt;
  }
}

// The combined op as its two parts, each lowered on its inputs and output.
// Both parts' scratch comes from one block: the parts are lowered once to
// learn their requests, then again with pieces of the block.
llvm::Expected<Steps> lowerCombined(const KernelCall &call,
                                    const GradientParts &parts,
                                    const Scratch &scratch) {
  std::vector<TensorRef> ins[2];
  for (int i : parts.firstInputs)
    ins[0].push_back(call.inputs[i]);
  for (int i : parts.secondInputs)
    ins[1].push_back(call.inputs[i]);
  KernelCall sub[2] = {
      {parts.first, call.attrs, ins[0], call.outputs.slice(0, 1), call.seed},
      {parts.second, call.attrs, ins[1], call.outputs.slice(1, 1), call.seed}};
  auto aligned = [](size_t b) { return (b + 255) / 256 * 256; };
  size_t need[2] = {0, 0};
  for (int k = 0; k < 2; ++k) {
    auto measured = lowerCall(sub[k], [&, k](size_t bytes) {
      need[k] += aligned(bytes);
      return reinterpret_cast<void *>(uintptr_t(256)); // never read
    });
    if (!measured)
      return measured.takeError();
  }
  char *block = nullptr;
  if (need[0] + need[1]) {
    block = static_cast<char *>(scratch(need[0] + need[1]));
    if (!block)
      return fail(call, "no scratch memory");
  }
  Steps steps;
  size_t used = 0;
  for (int k = 0; k < 2; ++k) {
    auto part = lowerCall(sub[k], [&](size_t bytes) {
      void *p = block + used;
      used += aligned(bytes);
      return p;
    });
    if (!part)
      return part.takeError();
    steps.insert(steps.end(), part->begin(), part->end());
  }
  return steps;
}

} // namespace

CublasGemm cublasArgs(const GemmStep &s) {
  // Row-major C = op(A) op(B) is column-major C^T = op(B)^T op(A)^T, and a
  // row-major matrix read column-major is its transpose: cuBLAS multiplies
  // the step's B by its A, with the same transposes.
  return CublasGemm{s.transB,  s.transA,  s.n,       s.m,       s.k,
                    s.B,       s.A,       s.ldb,     s.lda,     s.ldc,
                    s.strideB, s.strideA, s.strideC};
}

bool lowers(OpKind op, DType dtype) {
  if (!elemOf(dtype))
    return false;
  if (isReshapeLike(op) || op == OpKind::Transpose || op == OpKind::Slice ||
      op == OpKind::Concat || op == OpKind::Split || op == OpKind::Expand ||
      op == OpKind::Cast || op == OpKind::Equal || op == OpKind::Gather ||
      op == OpKind::Pad)
    return true;
  if (op == OpKind::Where || op == OpKind::Not || op == OpKind::And ||
      op == OpKind::Or)
    return dtype == DType::Bool;
  // Integer arithmetic (intMap); integer products, divisions (the CPU
  // fails a whole Div on a zero divisor), powers and reductions are not
  // lowered.
  if (dtype == DType::I64 || dtype == DType::I32)
    return op == OpKind::Add || op == OpKind::Sub || op == OpKind::Mul ||
           op == OpKind::Neg || op == OpKind::Abs || op == OpKind::Relu ||
           op == OpKind::Max || op == OpKind::Min || op == OpKind::Clip ||
           op == OpKind::Less || op == OpKind::Greater;
  if (!isFloatElem(dtype))
    return false;
  if (op == OpKind::Clip || op == OpKind::LeakyRelu || op == OpKind::Max ||
      op == OpKind::Min || op == OpKind::Dropout || op == OpKind::DropoutGrad ||
      op == OpKind::LogSoftmax || op == OpKind::LogSoftmaxGrad ||
      combinedParts(op))
    return true;
  return unaryMap(op) || binaryMap(op) || op == OpKind::UnaryGrad ||
         op == OpKind::SliceGrad || op == OpKind::SumTo ||
         op == OpKind::MatMul || op == OpKind::MatMulGradA ||
         op == OpKind::MatMulGradB || op == OpKind::Gemm ||
         op == OpKind::GemmGradA || op == OpKind::GemmGradB || isRowOp(op) ||
         op == OpKind::GatherGrad || op == OpKind::SGD ||
         op == OpKind::AdamW || op == OpKind::ReduceSum ||
         op == OpKind::ReduceMean || op == OpKind::ReduceMax ||
         op == OpKind::Conv || op == OpKind::ConvGradData ||
         op == OpKind::ConvGradFilter || isPool(op) || isBatchNorm(op);
}

llvm::Expected<Steps> lowerCall(const KernelCall &call,
                                const Scratch &scratch) {
  DType dt = call.inputs.empty() ? DType::F32 : call.inputs[0].dtype;
  if (!lowers(call.op, dt))
    return fail(call, llvm::formatv("no CUDA kernel for {0} inputs",
                                    ir::dtypeName(dt)));
  for (const TensorRef &t : call.inputs)
    if (!elemOf(t.dtype) || t.rank() > size_t(kMaxRank))
      return fail(call, "an operand " + std::string(ir::dtypeName(t.dtype)) +
                            ir::shapeStr(t.shape) +
                            " (the CUDA kernels take rank <= 8 and f32, bf16, "
                            "i64, i32 or bool)");
  for (const TensorRef &t : call.outputs)
    if (!elemOf(t.dtype) || t.rank() > size_t(kMaxRank))
      return fail(call, "a result " + std::string(ir::dtypeName(t.dtype)) +
                            ir::shapeStr(t.shape) +
                            " (the CUDA kernels take rank <= 8 and f32, bf16, "
                            "i64, i32 or bool)");
  if (auto parts = combinedParts(call.op))
    return lowerCombined(call, *parts, scratch);
  if (isRowOp(call.op))
    return lowerRows(call, scratch);
  const TensorRef &y = call.outputs[0];
  switch (call.op) {
  case OpKind::Clip:
  case OpKind::LeakyRelu: {
    bool clip = call.op == OpKind::Clip;
    MapArgs m = mapOver(clip ? MapOp::Clip : MapOp::LeakyRelu, y,
                        {&call.inputs[0]});
    if (clip) {
      // Integer bounds saturate to the type's range, as the CPU's do.
      auto bound = [&](float v) {
        if (isFloatElem(y.dtype))
          return v;
        double lim = y.dtype == DType::I32 ? 2147483647.0 : 9.2e18;
        return float(std::max(-lim, std::min(lim, double(v))));
      };
      m.p0 = bound(call.getFloat("min"));
      m.p1 = bound(call.getFloat("max"));
    } else {
      m.p0 = call.getFloat("alpha");
    }
    return Steps{m};
  }
  case OpKind::Not:
    return Steps{mapOver(MapOp::Not, y, {&call.inputs[0]})};
  case OpKind::Max:
  case OpKind::Min: { // pairwise, left to right, into the output
    MapOp op = call.op == OpKind::Max ? MapOp::Max : MapOp::Min;
    if (call.inputs.size() == 1)
      return Steps{copy(call.inputs[0], contiguous(call.inputs[0].shape),
                        y.data, contiguous(y.shape), y.numElements())};
    Steps steps{mapOver(op, y, {&call.inputs[0], &call.inputs[1]})};
    for (size_t i = 2; i < call.inputs.size(); ++i)
      steps.push_back(mapOver(op, y, {&y, &call.inputs[i]}));
    return steps;
  }
  case OpKind::Dropout: {
    const TensorRef &x = call.inputs[0];
    double ratio = call.getFloat("ratio");
    bool mask = call.outputs.size() > 1 && call.outputs[1].data;
    if (!call.getInt("training_mode") || ratio == 0.0) {
      Steps steps{copy(x, contiguous(x.shape), y.data, contiguous(y.shape),
                       y.numElements())};
      if (mask) { // every element kept
        MapArgs ones = zero(call.outputs[1]);
        ones.op = MapOp::Fill;
        ones.p0 = 1.0f;
        steps.push_back(ones);
      }
      return steps;
    }
    MapArgs m = mapOver(MapOp::Dropout, y, {&x});
    m.key = splitmix64(call.seed);
    m.ratio = ratio;
    m.p0 = float(1.0 / (1.0 - ratio));
    Steps steps{m};
    if (mask) {
      MapArgs k = mapOver(MapOp::DropoutMask, call.outputs[1], {&x});
      k.key = m.key;
      k.ratio = ratio;
      steps.push_back(k);
    }
    return steps;
  }
  case OpKind::DropoutGrad: {
    const TensorRef &mask = call.inputs[1];
    if (mask.dtype != DType::Bool || mask.shape != call.inputs[0].shape)
      return fail(call, "the mask must be bool and shaped like the gradient");
    MapArgs m = mapOver(MapOp::DropoutGrad, y, {&call.inputs[0], &mask});
    m.p0 = float(1.0 / (1.0 - double(call.getFloat("ratio"))));
    return Steps{m};
  }
  case OpKind::Pad:
    return lowerPad(call);
  default:
    break;
  }
  if (auto u = unaryMap(call.op))
    return Steps{mapOver(*u, y, {&call.inputs[0]})};
  if (auto b = binaryMap(call.op))
    return Steps{mapOver(*b, y, {&call.inputs[0], &call.inputs[1]})};
  switch (call.op) {
  case OpKind::Cast:
    return Steps{mapOver(call.inputs[0].dtype == y.dtype ? MapOp::Copy
                                                         : MapOp::Cast,
                         y, {&call.inputs[0]})};
  case OpKind::Where:
    return Steps{mapOver(MapOp::Where, y,
                         {&call.inputs[0], &call.inputs[1], &call.inputs[2]})};
  case OpKind::UnaryGrad: {
    const std::string &fn = call.getString("fn");
    auto op = unaryGradMap(fn);
    if (!op)
      return fail(call, "unknown fn '" + fn + "'");
    MapArgs m = mapOver(*op, y, {&call.inputs[0], &call.inputs[1]});
    if (fn == "clip") {
      m.p0 = call.getFloat("min");
      m.p1 = call.getFloat("max");
    } else if (fn == "leaky_relu") {
      m.p0 = call.getFloat("alpha");
    }
    return Steps{m};
  }
  case OpKind::SumTo:
    return lowerSumTo(call);
  case OpKind::ReduceSum:
  case OpKind::ReduceMean:
  case OpKind::ReduceMax:
    return lowerReduce(call);
  case OpKind::Gather:
  case OpKind::GatherGrad:
    return lowerGather(call);
  case OpKind::SGD:
  case OpKind::AdamW:
    return lowerOptimizer(call);
  case OpKind::MatMul:
  case OpKind::MatMulGradA:
  case OpKind::MatMulGradB:
    return lowerMatMul(call);
  case OpKind::Gemm:
  case OpKind::GemmGradA:
  case OpKind::GemmGradB:
    return lowerGemm(call);
  case OpKind::Conv:
  case OpKind::ConvGradData:
  case OpKind::ConvGradFilter:
    return lowerConv(call, scratch);
  case OpKind::MaxPool:
  case OpKind::MaxPoolGrad:
  case OpKind::AveragePool:
  case OpKind::AveragePoolGrad:
  case OpKind::GlobalAveragePool:
    return lowerPool(call);
  case OpKind::BatchNormalization:
  case OpKind::BatchNormalizationGradData:
  case OpKind::BatchNormalizationGradParams:
    return lowerBatchNorm(call, scratch);
  default:
    return lowerDataMovement(call);
  }
}

// --- the host runner ---------------------------------------------------------

namespace {

void runGemm(const GemmStep &s) {
  for (int64_t b = 0; b < s.batch; ++b)
    for (int64_t i = 0; i < s.m; ++i)
      for (int64_t j = 0; j < s.n; ++j) {
        float acc = 0;
        for (int64_t p = 0; p < s.k; ++p) {
          int64_t ia = s.transA ? p * s.lda + i : i * s.lda + p;
          int64_t ib = s.transB ? j * s.ldb + p : p * s.ldb + j;
          acc += load(s.A, s.ab, b * s.strideA + ia) *
                 load(s.B, s.ab, b * s.strideB + ib);
        }
        int64_t ic = b * s.strideC + i * s.ldc + j;
        float c = s.beta != 0.0f ? s.beta * load(s.C, s.c, ic) : 0.0f;
        store(s.C, s.c, ic, s.alpha * acc + c);
      }
}

void runReduce(const ReduceStep &r) {
  for (int64_t o = 0; o < r.outputs; ++o)
    reduceElement(r.kind, r.in, r.inElem, r.base(o), r.reduced, r.count,
                  r.out, r.outElem, o);
}

} // namespace

void runStepsOnHost(const std::vector<DeviceStep> &steps) {
  for (const DeviceStep &step : steps) {
    if (auto *m = std::get_if<MapArgs>(&step)) {
      for (int64_t i = 0; i < m->n; ++i)
        mapElement(*m, i);
    } else if (auto *g = std::get_if<GemmStep>(&step)) {
      runGemm(*g);
    } else if (auto *r = std::get_if<ReduceStep>(&step)) {
      runReduce(*r);
    } else if (auto *row = std::get_if<RowStep>(&step)) {
      for (int64_t i = 0; i < row->rows; ++i)
        rowElement(HostLanes{}, *row, i);
    } else if (auto *c = std::get_if<ColumnStep>(&step)) {
      for (int64_t j = 0; j < c->len; ++j)
        columnElement(*c, j);
    } else if (auto *l = std::get_if<LossStep>(&step)) {
      lossStep(*l);
    } else if (auto *g = std::get_if<GatherStep>(&step)) {
      if (g->grad)
        for (int64_t col = 0; col < g->outer * g->inner; ++col)
          gatherGradColumn(*g, col);
      else
        for (int64_t i = 0; i < g->outer * g->n * g->inner; ++i)
          gatherElement(*g, i);
    } else if (auto *o = std::get_if<OptimizerStep>(&step)) {
      for (int64_t i = 0; i < o->n; ++i)
        optimizerElement(*o, i);
    } else if (auto *pad = std::get_if<PadStep>(&step)) {
      for (int64_t i = 0; i < pad->n; ++i)
        padElement(*pad, i);
    } else if (auto *cols = std::get_if<Im2colStep>(&step)) {
      for (int64_t i = 0; i < im2colCount(*cols); ++i)
        im2colElement(*cols, i);
    } else if (auto *pool = std::get_if<PoolStep>(&step)) {
      for (int64_t i = 0; i < poolCount(*pool); ++i)
        poolElement(*pool, i);
    } else if (auto *ch = std::get_if<ChannelStep>(&step)) {
      for (int64_t i = 0; i < ch->channels; ++i)
        channelElement(HostLanes{}, *ch, i);
    } else if (auto *cm = std::get_if<ChannelMapStep>(&step)) {
      for (int64_t i = 0; i < cm->elements; ++i)
        channelMapElement(*cm, i);
    }
  }
}

// --- the emulated backend ------------------------------------------------------

namespace {

class EmulatedBackend final : public Backend {
public:
  std::string_view name() const override { return "cuda-emulated"; }
  void *allocate(size_t bytes) override {
    return std::aligned_alloc(64, (std::max<size_t>(bytes, 1) + 63) / 64 * 64);
  }
  void release(void *p) override { std::free(p); }
  void copyToDevice(void *dst, const void *src, size_t n) override {
    if (n)
      std::memcpy(dst, src, n);
  }
  void copyToHost(void *dst, const void *src, size_t n) override {
    if (n)
      std::memcpy(dst, src, n);
  }
  bool supports(OpKind op, DType dtype) const override {
    return lowers(op, dtype);
  }
  llvm::Error run(const KernelCall &call) override {
    auto steps = lowerCall(call, [this](size_t bytes) {
      if (scratch_.size() < bytes)
        scratch_.resize(bytes);
      return static_cast<void *>(scratch_.data());
    });
    if (!steps)
      return steps.takeError();
    runStepsOnHost(*steps);
    return llvm::Error::success();
  }

private:
  std::vector<uint8_t> scratch_;
};

} // namespace

std::unique_ptr<Backend> createCudaEmulatedBackend() {
  return std::make_unique<EmulatedBackend>();
}

} // namespace cleave::runtime::cuda
