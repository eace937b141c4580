// Lowering of kernel calls to device steps (Lowering.h): the table of
// lowered ops (kLowerings: each op's element types and its lowering, read by
// both lowers() and lowerCall(); the families are in LowerElementwise.cpp,
// LowerProducts.cpp and LowerReductions.cpp), the combined gradient ops (as
// their parts, from the op records), the host runner of the steps, and the
// emulated backend built on the two.
#include "runtime/FusedAttentionCall.h"
#include "runtime/cuda/LoweringSupport.h"

#include "llvm/Support/FormatVariadic.h"

#include <algorithm>
#include <cassert>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <optional>

namespace cleave::runtime::cuda {

using ir::DType;
using ir::OpKind;

namespace {

// The combined op as its two parts, each lowered on its inputs and output.
// Both parts' scratch comes from one block: the parts are lowered once to
// learn their requests, then again with pieces of the block.
// The parts and the inputs each takes are the op record's split (ir/Ops.def),
// as for the CPU backend's combined kernels.
llvm::Expected<Steps> lowerCombined(const KernelCall &call,
                                    const ir::GradientSplit &split,
                                    const Scratch &scratch) {
  std::vector<TensorRef> ins[2];
  for (unsigned k = 0; k < 2; ++k)
    for (unsigned i : split.part(k).operands)
      ins[k].push_back(call.inputs[i]);
  KernelCall sub[2] = {{split.data.kind, call.attrs, ins[0],
                        call.outputs.slice(0, 1), call.seed},
                       {split.weight.kind, call.attrs, ins[1],
                        call.outputs.slice(1, 1), call.seed}};
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

// --- the lowered ops ----------------------------------------------------------

namespace {

// The element types (of input 0) a lowering takes, among those the kernels
// have (elemOf).
enum class Types {
  All,      // any: data movement, comparisons for equality
  Bool,     // masks and logic
  BoolInt,  // bool, and integers (intMap): logic, bitwise
  IntFloat, // integer arithmetic (intMap) and f32 / bf16
  Float,    // f32 and bf16
};

using Lowerer = llvm::Expected<Steps> (*)(const KernelCall &, const Scratch &);

// Adapts a family's entry point that takes no scratch.
template <llvm::Expected<Steps> (*F)(const KernelCall &)>
llvm::Expected<Steps> noScratch(const KernelCall &call, const Scratch &) {
  return F(call);
}

// A reduction whose few outputs each reduce many inputs (a bias gradient)
// in chunks (reduceChunk), their partial results in the call's scratch
// (ReduceStep): enough threads for a GPU, in a fixed order.
template <llvm::Expected<Steps> (*F)(const KernelCall &)>
llvm::Expected<Steps> chunkedReduction(const KernelCall &call,
                                       const Scratch &scratch) {
  auto steps = F(call);
  if (!steps || steps->size() != 1)
    return steps;
  if (auto *r = std::get_if<ReduceStep>(&steps->front()))
    if (int64_t chunk =
            isInt(r->inElem) ? 0 : reduceChunk(r->outputs, r->count)) {
      r->chunk = chunk;
      void *p = scratch(size_t(r->outputs * r->chunks()) * sizeof(double));
      if (!p)
        return fail(call, "no scratch memory");
      r->partial = static_cast<double *>(p);
    }
  return steps;
}

llvm::Expected<Steps> lowerClipOrLeakyRelu(const KernelCall &call,
                                           const Scratch &) {
  const TensorRef &y = call.outputs[0];
  bool clip = call.op == OpKind::Clip;
  MapArgs m =
      mapOver(clip ? MapOp::Clip : MapOp::LeakyRelu, y, {&call.inputs[0]});
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

llvm::Expected<Steps> lowerNot(const KernelCall &call, const Scratch &) {
  return Steps{mapOver(MapOp::Not, call.outputs[0], {&call.inputs[0]})};
}

// Pairwise, left to right, into the output.
llvm::Expected<Steps> lowerMaxMin(const KernelCall &call, const Scratch &) {
  const TensorRef &y = call.outputs[0];
  MapOp op = call.op == OpKind::Max ? MapOp::Max : MapOp::Min;
  if (call.inputs.size() == 1)
    return Steps{copy(call.inputs[0], contiguous(call.inputs[0].shape),
                      y.data, contiguous(y.shape), y.numElements())};
  Steps steps{mapOver(op, y, {&call.inputs[0], &call.inputs[1]})};
  for (size_t i = 2; i < call.inputs.size(); ++i)
    steps.push_back(mapOver(op, y, {&y, &call.inputs[i]}));
  return steps;
}

llvm::Expected<Steps> lowerDropout(const KernelCall &call, const Scratch &) {
  const TensorRef &x = call.inputs[0], &y = call.outputs[0];
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

llvm::Expected<Steps> lowerDropoutGrad(const KernelCall &call,
                                       const Scratch &) {
  const TensorRef &mask = call.inputs[1];
  if (mask.dtype != DType::Bool || mask.shape != call.inputs[0].shape)
    return fail(call, "the mask must be bool and shaped like the gradient");
  MapArgs m =
      mapOver(MapOp::DropoutGrad, call.outputs[0], {&call.inputs[0], &mask});
  m.p0 = float(1.0 / (1.0 - double(call.getFloat("ratio"))));
  return Steps{m};
}

llvm::Expected<Steps> lowerUnary(const KernelCall &call, const Scratch &) {
  return Steps{mapOver(*unaryMap(call.op), call.outputs[0], {&call.inputs[0]})};
}

llvm::Expected<Steps> lowerBinary(const KernelCall &call, const Scratch &) {
  return Steps{mapOver(*binaryMap(call.op), call.outputs[0],
                       {&call.inputs[0], &call.inputs[1]})};
}

// Mod of floats is C's fmod; fmod 0 (Python's %) takes integers only,
// which the CPU does and the CUDA backend does not lower (a zero divisor
// fails the CPU's call, which a kernel cannot report).
llvm::Expected<Steps> lowerMod(const KernelCall &call, const Scratch &) {
  if (call.getInt("fmod") != 1)
    return fail(call, "float operands need fmod = 1");
  return Steps{mapOver(MapOp::Mod, call.outputs[0],
                       {&call.inputs[0], &call.inputs[1]})};
}

llvm::Expected<Steps> lowerCast(const KernelCall &call, const Scratch &) {
  const TensorRef &y = call.outputs[0];
  return Steps{mapOver(call.inputs[0].dtype == y.dtype ? MapOp::Copy
                                                       : MapOp::Cast,
                       y, {&call.inputs[0]})};
}

llvm::Expected<Steps> lowerWhere(const KernelCall &call, const Scratch &) {
  return Steps{mapOver(MapOp::Where, call.outputs[0],
                       {&call.inputs[0], &call.inputs[1], &call.inputs[2]})};
}

llvm::Expected<Steps> lowerUnaryGrad(const KernelCall &call,
                                     const Scratch &) {
  const std::string &fn = call.getString("fn");
  auto op = unaryGradMap(fn);
  if (!op)
    return fail(call, "unknown fn '" + fn + "'");
  MapArgs m =
      mapOver(*op, call.outputs[0], {&call.inputs[0], &call.inputs[1]});
  if (fn == "clip") {
    m.p0 = call.getFloat("min");
    m.p1 = call.getFloat("max");
  } else if (fn == "leaky_relu") {
    m.p0 = call.getFloat("alpha");
  } else if (fn == "gelu_tanh") {
    m.p0 = 1.0f;
  } else if (fn == "hard_sigmoid") {
    m.p0 = call.getFloat("alpha");
    m.p1 = call.getFloat("beta");
    // PyTorch's constants: PyTorch's test on x, as the CPU.
    if (m.p0 == 1.0f / 6.0f && m.p1 == 0.5f)
      m.op = MapOp::HardSigmoidTorchGrad;
  }
  return Steps{m};
}

// IsInf's directions and HardSigmoid's line (PyTorch's constants: its own
// formula, as the CPU).
llvm::Expected<Steps> lowerParameterized(const KernelCall &call,
                                         const Scratch &) {
  MapOp op = call.op == OpKind::IsInf ? MapOp::IsInf : MapOp::HardSigmoid;
  MapArgs m = mapOver(op, call.outputs[0], {&call.inputs[0]});
  if (call.op == OpKind::IsInf) {
    m.p0 = float(call.getInt("detect_negative"));
    m.p1 = float(call.getInt("detect_positive"));
  } else {
    m.p0 = call.getFloat("alpha");
    m.p1 = call.getFloat("beta");
    if (m.p0 == 1.0f / 6.0f && m.p1 == 0.5f)
      m.op = MapOp::HardSigmoidTorch;
  }
  return Steps{m};
}

llvm::Expected<Steps> lowerGelu(const KernelCall &call, const Scratch &) {
  const std::string &form = call.getString("approximate");
  if (form != "none" && form != "tanh")
    return fail(call, "approximate must be \"none\" or \"tanh\", not \"" +
                          form + "\"");
  MapArgs m = mapOver(MapOp::Gelu, call.outputs[0], {&call.inputs[0]});
  m.p0 = form == "tanh" ? 1.0f : 0.0f;
  return Steps{m};
}

// Fused attention: the call read as the CPU backend reads it
// (runtime/FusedAttentionCall.h); the backward's Delta (a double per query
// row) in the call's scratch.
llvm::Expected<Steps> lowerAttention(const KernelCall &call,
                                     const Scratch &scratch) {
  if (call.op == OpKind::FusedAttention) {
    auto s = attentionStep(call);
    if (!s)
      return s.takeError();
    return Steps{*s};
  }
  auto delta = scratchBlock(call, scratch,
                            size_t(attentionGradRows(call)) * sizeof(double));
  if (!delta)
    return delta.takeError();
  auto s = attentionGradStep(call, reinterpret_cast<double *>(*delta));
  if (!s)
    return s.takeError();
  return Steps{*s};
}

struct LoweringRule {
  OpKind op;
  Types types;
  Lowerer lower;
};

// Every op the CUDA backend lowers, with the element types it takes and its
// lowering: the one place that says what the backend covers (lowers() and
// lowerCall() read it). Combined gradient ops are not listed: they lower as
// their two parts (the op records' splits, ir/Ops.def) wherever both parts
// do. Integer products, divisions (the CPU fails a whole Div on a zero
// divisor), powers and reductions are not lowered.
const LoweringRule kLowerings[] = {
    // Elementwise unary.
    {OpKind::Abs, Types::IntFloat, lowerUnary},
    {OpKind::Erf, Types::Float, lowerUnary},
    {OpKind::Exp, Types::Float, lowerUnary},
    {OpKind::Gelu, Types::Float, lowerGelu},
    {OpKind::Identity, Types::All, noScratch<lowerDataMovement>},
    {OpKind::StopGradient, Types::All, noScratch<lowerDataMovement>},
    {OpKind::LeakyRelu, Types::Float, lowerClipOrLeakyRelu},
    {OpKind::Log, Types::Float, lowerUnary},
    {OpKind::Neg, Types::IntFloat, lowerUnary},
    {OpKind::Not, Types::BoolInt, lowerNot},
    {OpKind::Reciprocal, Types::Float, lowerUnary},
    {OpKind::Relu, Types::IntFloat, lowerUnary},
    {OpKind::Sigmoid, Types::Float, lowerUnary},
    {OpKind::Silu, Types::Float, lowerUnary},
    {OpKind::Sqrt, Types::Float, lowerUnary},
    {OpKind::Tanh, Types::Float, lowerUnary},
    {OpKind::Sin, Types::Float, lowerUnary},
    {OpKind::Tan, Types::Float, lowerUnary},
    {OpKind::Asin, Types::Float, lowerUnary},
    {OpKind::Acos, Types::Float, lowerUnary},
    {OpKind::Atan, Types::Float, lowerUnary},
    {OpKind::Sinh, Types::Float, lowerUnary},
    {OpKind::Cosh, Types::Float, lowerUnary},
    {OpKind::Asinh, Types::Float, lowerUnary},
    {OpKind::Acosh, Types::Float, lowerUnary},
    {OpKind::Atanh, Types::Float, lowerUnary},
    {OpKind::Cos, Types::Float, lowerUnary},
    {OpKind::Floor, Types::Float, lowerUnary},
    {OpKind::Ceil, Types::Float, lowerUnary},
    {OpKind::Round, Types::Float, lowerUnary},
    {OpKind::Sign, Types::IntFloat, lowerUnary},
    {OpKind::IsNaN, Types::Float, lowerUnary},
    {OpKind::IsInf, Types::Float, lowerParameterized},
    {OpKind::HardSigmoid, Types::Float, lowerParameterized},
    {OpKind::HardSwish, Types::Float, lowerUnary},
    {OpKind::Clip, Types::IntFloat, lowerClipOrLeakyRelu},
    {OpKind::Cast, Types::All, lowerCast},
    // Elementwise binary / variadic.
    {OpKind::Add, Types::IntFloat, lowerBinary},
    {OpKind::Sub, Types::IntFloat, lowerBinary},
    {OpKind::Mul, Types::IntFloat, lowerBinary},
    {OpKind::Div, Types::Float, lowerBinary},
    {OpKind::Pow, Types::Float, lowerBinary},
    {OpKind::Mod, Types::Float, lowerMod},
    {OpKind::DFT, Types::Float, lowerIndex},
    {OpKind::Max, Types::IntFloat, lowerMaxMin},
    {OpKind::Min, Types::IntFloat, lowerMaxMin},
    {OpKind::Equal, Types::All, lowerBinary},
    {OpKind::Greater, Types::IntFloat, lowerBinary},
    {OpKind::Less, Types::IntFloat, lowerBinary},
    {OpKind::GreaterOrEqual, Types::IntFloat, lowerBinary},
    {OpKind::LessOrEqual, Types::IntFloat, lowerBinary},
    {OpKind::And, Types::BoolInt, lowerBinary},
    {OpKind::Or, Types::BoolInt, lowerBinary},
    {OpKind::Xor, Types::BoolInt, lowerBinary},
    {OpKind::Where, Types::Bool, lowerWhere},
    // Linear algebra.
    {OpKind::MatMul, Types::Float, noScratch<lowerMatMul>},
    {OpKind::Gemm, Types::Float, noScratch<lowerGemm>},
    // Normalization, softmax, loss.
    {OpKind::BatchNormalization, Types::Float, lowerBatchNorm},
    {OpKind::LayerNormalization, Types::Float, lowerRows},
    {OpKind::RMSNormalization, Types::Float, lowerRows},
    {OpKind::Softmax, Types::Float, lowerRows},
    {OpKind::FusedAttention, Types::Float, lowerAttention},
    {OpKind::LogSoftmax, Types::Float, lowerRows},
    {OpKind::SoftmaxCrossEntropyLoss, Types::Float, lowerRows},
    {OpKind::Dropout, Types::Float, lowerDropout},
    // Reductions.
    {OpKind::ReduceMax, Types::IntFloat, chunkedReduction<lowerReduce>},
    {OpKind::ReduceMean, Types::IntFloat, chunkedReduction<lowerReduce>},
    {OpKind::ReduceSum, Types::IntFloat, chunkedReduction<lowerReduce>},
    {OpKind::ArgMax, Types::IntFloat, lowerIndex},
    {OpKind::ArgMin, Types::IntFloat, lowerIndex},
    {OpKind::TopKIndices, Types::IntFloat, lowerIndex},
    {OpKind::CumSum, Types::IntFloat, lowerIndex},
    // Data movement.
    {OpKind::Concat, Types::All, noScratch<lowerDataMovement>},
    {OpKind::Expand, Types::All, noScratch<lowerDataMovement>},
    {OpKind::Pad, Types::All, noScratch<lowerPad>},
    {OpKind::Flatten, Types::All, noScratch<lowerDataMovement>},
    {OpKind::Gather, Types::All, noScratch<lowerGather>},
    {OpKind::GatherElements, Types::All, lowerIndex},
    {OpKind::ScatterElements, Types::All, lowerIndex},
    {OpKind::ScatterND, Types::All, lowerIndex},
    {OpKind::Tile, Types::All, noScratch<lowerTile>},
    {OpKind::Trilu, Types::All, lowerIndex},
    {OpKind::Reshape, Types::All, noScratch<lowerDataMovement>},
    {OpKind::Slice, Types::All, noScratch<lowerDataMovement>},
    {OpKind::Split, Types::All, noScratch<lowerDataMovement>},
    {OpKind::Squeeze, Types::All, noScratch<lowerDataMovement>},
    {OpKind::Transpose, Types::All, noScratch<lowerDataMovement>},
    {OpKind::Unsqueeze, Types::All, noScratch<lowerDataMovement>},
    // Convolution and pooling.
    {OpKind::Conv, Types::Float, lowerConv},
    {OpKind::MaxPool, Types::Float, noScratch<lowerPool>},
    {OpKind::AveragePool, Types::Float, noScratch<lowerPool>},
    {OpKind::GlobalAveragePool, Types::Float, noScratch<lowerPool>},
    {OpKind::Resize, Types::All, noScratch<lowerResize>},
    {OpKind::GridSample, Types::Float, noScratch<lowerGridSample>},
    // Gradients.
    {OpKind::UnaryGrad, Types::Float, lowerUnaryGrad},
    {OpKind::SumTo, Types::Float, chunkedReduction<lowerSumTo>},
    {OpKind::MatMulGradA, Types::Float, noScratch<lowerMatMul>},
    {OpKind::MatMulGradB, Types::Float, noScratch<lowerMatMul>},
    {OpKind::GemmGradA, Types::Float, noScratch<lowerGemm>},
    {OpKind::GemmGradB, Types::Float, noScratch<lowerGemm>},
    {OpKind::ConvGradData, Types::Float, lowerConv},
    {OpKind::ConvGradFilter, Types::Float, lowerConv},
    {OpKind::LayerNormalizationGradData, Types::Float, lowerRows},
    {OpKind::LayerNormalizationGradParams, Types::Float, lowerRows},
    {OpKind::RMSNormalizationGradData, Types::Float, lowerRows},
    {OpKind::RMSNormalizationGradParams, Types::Float, lowerRows},
    {OpKind::BatchNormalizationGradData, Types::Float, lowerBatchNorm},
    {OpKind::BatchNormalizationGradParams, Types::Float, lowerBatchNorm},
    {OpKind::SoftmaxGrad, Types::Float, lowerRows},
    {OpKind::FusedAttentionGrad, Types::Float, lowerAttention},
    {OpKind::LogSoftmaxGrad, Types::Float, lowerRows},
    {OpKind::SoftmaxCrossEntropyLossGrad, Types::Float, lowerRows},
    {OpKind::DropoutGrad, Types::Float, lowerDropoutGrad},
    {OpKind::GatherGrad, Types::Float, noScratch<lowerGather>},
    {OpKind::GatherElementsGrad, Types::Float, lowerIndex},
    {OpKind::ScatterElementsGradData, Types::Float, lowerIndex},
    {OpKind::ScatterElementsGradUpdates, Types::Float, lowerIndex},
    {OpKind::ScatterNDGradData, Types::Float, lowerIndex},
    {OpKind::ScatterNDGradUpdates, Types::Float, lowerIndex},
    {OpKind::SliceGrad, Types::Float, noScratch<lowerDataMovement>},
    {OpKind::MaxPoolGrad, Types::Float, noScratch<lowerPool>},
    {OpKind::AveragePoolGrad, Types::Float, noScratch<lowerPool>},
    {OpKind::ResizeGrad, Types::Float, noScratch<lowerResize>},
    {OpKind::GridSampleGradData, Types::Float, noScratch<lowerGridSample>},
    {OpKind::GridSampleGradGrid, Types::Float, noScratch<lowerGridSample>},
    // Optimizers.
    {OpKind::SGD, Types::Float, noScratch<lowerOptimizer>},
    {OpKind::AdamW, Types::Float, noScratch<lowerOptimizer>},
};

// kLowerings indexed by op kind.
const LoweringRule *findLowering(OpKind op) {
  static const std::vector<const LoweringRule *> byKind = [] {
    std::vector<const LoweringRule *> v(ir::allOps().size(), nullptr);
    for (const LoweringRule &r : kLowerings) {
      assert(!v[size_t(r.op)] && "an op listed twice in kLowerings");
      v[size_t(r.op)] = &r;
    }
    return v;
  }();
  return byKind[size_t(op)];
}

bool takes(Types types, DType dtype) {
  switch (types) {
  case Types::All:
    return true;
  case Types::Bool:
    return dtype == DType::Bool;
  case Types::BoolInt:
    return dtype == DType::Bool || dtype == DType::I64 || dtype == DType::I32;
  case Types::IntFloat:
    return dtype == DType::I64 || dtype == DType::I32 || isFloatElem(dtype);
  case Types::Float:
    return isFloatElem(dtype);
  }
  return false;
}

} // namespace

bool lowers(OpKind op, DType dtype) {
  if (!elemOf(dtype))
    return false;
  if (op == OpKind::ConvTranspose) // ConvGradData's arithmetic, forward
    op = OpKind::ConvGradData;
  if (const ir::GradientSplit *split = ir::gradientSplit(op))
    return lowers(split->data.kind, dtype) && lowers(split->weight.kind, dtype);
  const LoweringRule *rule = findLowering(op);
  return rule && takes(rule->types, dtype);
}

llvm::Expected<Steps> lowerCall(const KernelCall &call,
                                const Scratch &scratch) {
  if (call.op == OpKind::ConvTranspose)
    return lowerCall(KernelCall{OpKind::ConvGradData, call.attrs, call.inputs,
                                call.outputs, call.seed},
                     scratch);
  // A Gemm with the Gelu epilogue (Backend::fusesGemmGelu): the Gemm's
  // steps into output 0, then the tanh Gelu's from it into output 1.
  if (call.op == OpKind::Gemm && call.outputs.size() == 2 &&
      call.hasAttr(kGeluEpilogueAttr)) {
    auto steps = lowerCall(KernelCall{OpKind::Gemm, call.attrs, call.inputs,
                                      call.outputs.slice(0, 1), call.seed},
                           scratch);
    if (!steps)
      return steps.takeError();
    static const ir::AttrMap tanh{
        {"approximate", ir::Attribute(std::string("tanh"))}};
    // The Gelu's output in the product's shape: the same elements in the
    // same order (a reshape may have come between them).
    TensorRef y{call.outputs[1].dtype, call.outputs[0].shape,
                call.outputs[1].data};
    auto gelu = lowerCall(KernelCall{OpKind::Gelu, tanh,
                                     call.outputs.slice(0, 1), y, call.seed},
                          scratch);
    if (!gelu)
      return gelu.takeError();
    steps->insert(steps->end(), gelu->begin(), gelu->end());
    return steps;
  }
  DType dt = call.inputs.empty() ? DType::F32 : call.inputs[0].dtype;
  if (!lowers(call.op, dt))
    return fail(call, llvm::formatv("no CUDA kernel for {0} inputs",
                                    ir::dtypeName(dt)));
  // Reductions merge their dims (lowerReduce) and check what is left;
  // reshapes copy contiguous memory (one dim).
  bool merges = call.op == OpKind::ReduceSum || call.op == OpKind::ReduceMean ||
                call.op == OpKind::ReduceMax || isReshapeLike(call.op);
  for (const TensorRef &t : call.inputs)
    if (!elemOf(t.dtype) || (t.rank() > size_t(kMaxRank) && !merges))
      return fail(call, "an operand " + std::string(ir::dtypeName(t.dtype)) +
                            ir::shapeStr(t.shape) +
                            " (the CUDA kernels take rank <= 8 and f32, bf16, "
                            "i64, i32 or bool)");
  for (const TensorRef &t : call.outputs)
    if (!elemOf(t.dtype) || (t.rank() > size_t(kMaxRank) && !merges))
      return fail(call, "a result " + std::string(ir::dtypeName(t.dtype)) +
                            ir::shapeStr(t.shape) +
                            " (the CUDA kernels take rank <= 8 and f32, bf16, "
                            "i64, i32 or bool)");
  if (const ir::GradientSplit *split = ir::gradientSplit(call.op))
    return lowerCombined(call, *split, scratch);
  return findLowering(call.op)->lower(call, scratch);
}

// --- the host runner ---------------------------------------------------------

namespace {

// Each C element is the f32 sum of its k products in order of p. The
// operands are read once into row-major f32 copies and the products added
// a row of C at a time (the same adds in the same order as a loop over p
// per element, without its strided reads: whole models run through this).
void runGemm(const GemmStep &s) {
  std::vector<float> a(size_t(s.m * s.k)), bm(size_t(s.k * s.n)),
      acc(size_t(s.n));
  for (int64_t b = 0; b < s.batch; ++b) {
    for (int64_t i = 0; i < s.m; ++i)
      for (int64_t p = 0; p < s.k; ++p)
        a[i * s.k + p] = load(s.A, s.ab, b * s.strideA +
                                             (s.transA ? p * s.lda + i
                                                       : i * s.lda + p));
    for (int64_t p = 0; p < s.k; ++p)
      for (int64_t j = 0; j < s.n; ++j)
        bm[p * s.n + j] = load(s.B, s.ab, b * s.strideB +
                                              (s.transB ? j * s.ldb + p
                                                        : p * s.ldb + j));
    for (int64_t i = 0; i < s.m; ++i) {
      std::fill(acc.begin(), acc.end(), 0.0f);
      float *__restrict sum = acc.data();
      for (int64_t p = 0; p < s.k; ++p) {
        float x = a[i * s.k + p];
        const float *__restrict row = bm.data() + p * s.n;
        for (int64_t j = 0; j < s.n; ++j)
          sum[j] += x * row[j];
      }
      for (int64_t j = 0; j < s.n; ++j) {
        int64_t ic = b * s.strideC + i * s.ldc + j;
        float c = s.beta != 0.0f ? s.beta * load(s.C, s.c, ic) : 0.0f;
        store(s.C, s.c, ic, s.alpha * acc[j] + c);
      }
    }
  }
}

void runReduce(const ReduceStep &r) {
  if (r.chunk == 0) {
    for (int64_t o = 0; o < r.outputs; ++o)
      reduceElement(r, o);
    return;
  }
  for (int64_t i = 0; i < r.outputs * r.chunks(); ++i)
    reducePartial(r, i);
  for (int64_t o = 0; o < r.outputs; ++o)
    reduceChunks(r, o);
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
      if (c->chunk == 0) {
        for (int64_t j = 0; j < c->len; ++j)
          columnElement(*c, j);
      } else {
        for (int64_t i = 0, n = c->len * c->chunks(); i < n; ++i)
          columnPartial(*c, i);
        for (int64_t j = 0; j < c->len; ++j)
          columnChunks(*c, j);
      }
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
    } else if (auto *a = std::get_if<AttentionStep>(&step)) {
      runAttentionForwardOnHost(*a);
    } else if (auto *ag = std::get_if<AttentionGradStep>(&step)) {
      runAttentionBackwardOnHost(*ag);
    } else if (auto *pad = std::get_if<PadStep>(&step)) {
      for (int64_t i = 0; i < pad->n; ++i)
        padElement(*pad, i);
    } else if (auto *cols = std::get_if<Im2colStep>(&step)) {
      for (int64_t i = 0; i < im2colCount(*cols); ++i)
        im2colElement(*cols, i);
    } else if (auto *pool = std::get_if<PoolStep>(&step)) {
      for (int64_t i = 0; i < poolCount(*pool); ++i)
        poolElement(*pool, i);
    } else if (auto *ix = std::get_if<IndexStep>(&step)) {
      for (int64_t i = 0; i < ix->threads; ++i)
        indexElement(*ix, i);
    } else if (auto *rs = std::get_if<ResizeStep>(&step)) {
      for (int64_t i = 0; i < rs->threads; ++i)
        rs->grad ? resizeGradElement(*rs, i) : resizeElement(*rs, i);
    } else if (auto *gs = std::get_if<GridSampleStep>(&step)) {
      for (int64_t i = 0; i < gs->threads; ++i)
        gridSampleElement(*gs, i);
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
  // Its memory stands for the device's, so offloaded copies go to a
  // separate host arena, by memcpy, done when the call returns.
  bool offloads() const override { return true; }
  // Gemm + Gelu as the CUDA backend lowers them where cuBLASLt does not
  // take them: the two ops' steps one after the other (the same bits).
  bool fusesGemmGelu() const override { return true; }
  // Parcels as the CUDA backend's, done when the call returns: a pool of
  // buffers the receiver hands back.
  bool parcels() const override { return true; }
  llvm::Expected<Parcel> pack(const void *src, size_t bytes) override {
    std::vector<uint8_t> *buf = nullptr;
    {
      std::lock_guard<std::mutex> lock(parcelMutex_);
      for (auto it = freeParcels_.begin(); it != freeParcels_.end(); ++it)
        if ((*it)->size() == bytes) {
          buf = *it;
          freeParcels_.erase(it);
          break;
        }
      if (!buf) {
        parcels_.push_back(std::make_unique<std::vector<uint8_t>>(bytes));
        buf = parcels_.back().get();
      }
    }
    if (bytes)
      std::memcpy(buf->data(), src, bytes);
    return Parcel{this, buf->data(), bytes, buf};
  }
  llvm::Error unpack(void *dst, const Parcel &p) override {
    if (p.bytes)
      std::memcpy(dst, p.data, p.bytes);
    p.owner->takeBack(p.token, nullptr);
    return llvm::Error::success();
  }
  void takeBack(void *token, void *) override {
    std::lock_guard<std::mutex> lock(parcelMutex_);
    freeParcels_.push_back(static_cast<std::vector<uint8_t> *>(token));
  }
  // Graphs as the CUDA backend's: while recording, calls are kept, not
  // run; a launch runs them in order.
  bool graphs() const override { return true; }
  void beginGraph() override {
    recording_ = true;
    recorded_.clear();
  }
  bool endGraph(uint64_t id) override {
    recording_ = false;
    graphs_[id] = std::move(recorded_);
    recorded_.clear();
    return true;
  }
  llvm::Expected<bool> launchGraph(uint64_t id) override {
    auto it = graphs_.find(id);
    if (it == graphs_.end())
      return false;
    for (const Recorded &r : it->second)
      if (auto e = runNow(KernelCall{r.op, *r.attrs, r.ins, r.outs, r.seed}))
        return std::move(e);
    return true;
  }

  llvm::Error run(const KernelCall &call) override {
    if (!recording_)
      return runNow(call);
    recorded_.push_back(Recorded{call.op, &call.attrs,
                                 {call.inputs.begin(), call.inputs.end()},
                                 {call.outputs.begin(), call.outputs.end()},
                                 call.seed});
    return llvm::Error::success();
  }

private:
  // The tensors' shapes and the attributes are the plan's, which outlive
  // the graphs (the executor's).
  struct Recorded {
    OpKind op;
    const ir::AttrMap *attrs;
    std::vector<TensorRef> ins, outs;
    uint64_t seed;
  };
  bool recording_ = false;
  std::vector<Recorded> recorded_;
  std::map<uint64_t, std::vector<Recorded>> graphs_;

  llvm::Error runNow(const KernelCall &call) {
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
  std::mutex parcelMutex_; // takeBack comes from the receiving stage's thread
  std::vector<std::unique_ptr<std::vector<uint8_t>>> parcels_;
  std::vector<std::vector<uint8_t> *> freeParcels_;
};

} // namespace

std::unique_ptr<Backend> createCudaEmulatedBackend() {
  return std::make_unique<EmulatedBackend>();
}

} // namespace cleave::runtime::cuda
