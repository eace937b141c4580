// FusedAttention and its gradient for the CPU backend.
//
// The arithmetic is the fused attention's one definition, the per-row
// functions of runtime/cuda/DeviceAttention.h (written once for the GPU's
// threads and the host's loops): an online softmax over key tiles, the
// Tq x Tk scores never stored; the backward recomputes each row's scores
// from the forward's logsumexp. Here the rows are spread over the thread
// pool. Each output row is computed by one call from the inputs alone, so
// the bits do not depend on the thread count or on which thread ran what
// (docs/design/fused-attention.md).
#include "runtime/FusedAttentionCall.h"
#include "runtime/cpu/CpuKernels.h"

#include <vector>

namespace cleave::runtime {
namespace {

namespace dev = cleave::runtime::cuda;
using cpu::kernelError;
using cpu::parallelFor;

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

dev::AttnInput input(const TensorRef &t) {
  dev::AttnInput in;
  in.data = t.data;
  in.elem = attnElem(t.dtype);
  fillStrides(in, t.shape);
  return in;
}

dev::AttnOutput output(const TensorRef &t) {
  dev::AttnOutput out;
  out.data = t.data;
  out.elem = attnElem(t.dtype);
  fillStrides(out, t.shape);
  return out;
}

// Q, K, V and the optional mask at `first` in the call's inputs.
llvm::Expected<dev::AttentionOperands> operands(const KernelCall &c,
                                                size_t first, size_t mask) {
  const TensorRef &q = c.inputs[first], &k = c.inputs[first + 1];
  if (q.rank() != 4 || k.rank() != 4 || c.inputs[first + 2].rank() != 4)
    return kernelError(c, "Q, K and V must have rank 4");
  dev::AttentionOperands a;
  a.batch = q.shape[0];
  a.queryHeads = q.shape[1];
  a.queryLen = q.shape[2];
  a.headDim = q.shape[3];
  a.kvHeads = k.shape[1];
  a.keyLen = k.shape[2];
  a.scale = c.getFloat("scale");
  a.causal = c.getInt("causal") != 0;
  a.align = dev::CausalAlign::TopLeft;
  a.q = input(q);
  a.k = input(k);
  a.v = input(c.inputs[first + 2]);
  if (c.inputs.size() > mask && c.inputs[mask].data)
    a.bias = input(c.inputs[mask]);
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
  dev::AttentionStep s;
  s.in = *a;
  s.out = output(c.outputs[0]);
  s.lse = c.outputs[1].data;
  s.lseElem = attnElem(c.outputs[1].dtype);
  return s;
}

// Inputs: dO, Q, K, V, O, L[, mask]; outputs dQ, dK, dV.
llvm::Expected<dev::AttentionGradStep> attentionGradStep(const KernelCall &c,
                                                         double *delta) {
  auto a = operands(c, 1, 6);
  if (!a)
    return a.takeError();
  dev::AttentionGradStep s;
  s.in = *a;
  s.dOut = input(c.inputs[0]);
  s.out = input(c.inputs[4]);
  s.lse = c.inputs[5].data;
  s.lseElem = attnElem(c.inputs[5].dtype);
  s.delta = delta;
  s.dq = output(c.outputs[0]);
  s.dk = output(c.outputs[1]);
  s.dv = output(c.outputs[2]);
  return s;
}

namespace {

// Rows a task: enough to pay for the task, more when the rows are short.
int64_t rowGrain(const dev::AttentionOperands &a) {
  int64_t perRow = std::max<int64_t>(1, a.keyLen * a.headDim);
  return std::max<int64_t>(1, (1 << 16) / perRow);
}

llvm::Error attention(const KernelCall &c) {
  auto s = attentionStep(c);
  if (!s)
    return s.takeError();
  parallelFor(dev::attentionRows(s->in), rowGrain(s->in),
              [&](int64_t b, int64_t e) {
                for (int64_t r = b; r < e; ++r)
                  dev::attentionForwardRow(*s, r);
              });
  return llvm::Error::success();
}

llvm::Error attentionGrad(const KernelCall &c) {
  std::vector<double> delta(
      size_t(c.inputs[1].numElements() / std::max<int64_t>(1, c.inputs[1].shape.back())));
  auto s = attentionGradStep(c, delta.data());
  if (!s)
    return s.takeError();
  const int64_t rows = dev::attentionRows(s->in);
  const int64_t kvRows = dev::attentionKvRows(s->in);
  parallelFor(rows, std::max<int64_t>(1, (1 << 14) / s->in.headDim),
              [&](int64_t b, int64_t e) {
                for (int64_t r = b; r < e; ++r)
                  dev::attentionDeltaRow(*s, r);
              });
  // dQ rows and dK/dV rows are independent of each other: one range.
  parallelFor(rows + kvRows, rowGrain(s->in), [&](int64_t b, int64_t e) {
    for (int64_t r = b; r < e; ++r) {
      if (r < rows)
        dev::attentionGradQRow(*s, r);
      else
        dev::attentionGradKVRow(*s, r - rows);
    }
  });
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
