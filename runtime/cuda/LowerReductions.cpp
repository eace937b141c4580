// Lowering of the reductions: SumTo and ReduceSum/Mean/Max, the row ops
// (softmax, log-softmax, layer norm, cross-entropy and their gradients),
// gathers, the optimizers, pooling and batch normalization.
#include "runtime/cuda/LoweringSupport.h"

#include "llvm/Support/FormatVariadic.h"

#include <algorithm>

namespace cleave::runtime::cuda {

using ir::DType;
using ir::OpKind;

// --- reductions -------------------------------------------------------------

namespace {

// One thread per output element of Y: the kept dims (Y's elements, in
// order) at their strides in X, summing (or taking the maximum of) the
// reduced dims.
ReduceStep reduction(ReduceKind kind, const TensorRef &X, const TensorRef &Y,
                     llvm::ArrayRef<int64_t> keptDims,
                     llvm::ArrayRef<int64_t> keptStrides,
                     llvm::ArrayRef<int64_t> redDims,
                     llvm::ArrayRef<int64_t> redStrides) {
  ReduceStep r;
  r.kind = kind;
  r.in = X.data;
  r.inElem = *elemOf(X.dtype);
  r.out = Y.data;
  r.outElem = *elemOf(Y.dtype);
  r.outputs = Y.numElements();
  r.base = indexer(keptDims, keptStrides);
  r.reduced = indexer(redDims, redStrides);
  r.count = 1;
  for (int64_t d : redDims)
    r.count *= d;
  return r;
}

} // namespace

llvm::Expected<Steps> lowerSumTo(const KernelCall &call) {
  const TensorRef &X = call.inputs[0], &Y = call.outputs[0];
  if (X.rank() < Y.rank())
    return fail(call, llvm::formatv("shape {0} has more dims than {1}",
                                    ir::shapeStr(Y.shape),
                                    ir::shapeStr(X.shape)));
  size_t lead = X.rank() - Y.rank();
  std::vector<int64_t> xs = stridesOf(X.shape);
  // Output coordinates (Y's shape aligned to X's) and the reduced dims.
  std::vector<int64_t> keptDims, keptStrides, redDims, redStrides;
  for (size_t d = 0; d < X.rank(); ++d) {
    int64_t yd = d >= lead ? Y.shape[d - lead] : 1;
    if (yd != X.shape[d] && yd != 1)
      return fail(call, llvm::formatv("shape {0} does not broadcast to {1}",
                                      ir::shapeStr(Y.shape),
                                      ir::shapeStr(X.shape)));
    if (d >= lead) {
      keptDims.push_back(yd);
      keptStrides.push_back(yd == 1 ? 0 : xs[d]);
    }
    if (yd == 1 && X.shape[d] != 1) {
      redDims.push_back(X.shape[d]);
      redStrides.push_back(xs[d]);
    }
  }
  return Steps{reduction(ReduceKind::Sum, X, Y, keptDims, keptStrides,
                         redDims, redStrides)};
}

namespace {

// --- rows, columns, gathers, optimizers -----------------------------------

RowStep rowsAlong(RowOp op, const TensorRef &x, int64_t axis) {
  RowStep r;
  r.op = op;
  r.len = x.shape[axis];
  r.inner = 1;
  for (size_t d = axis + 1; d < x.rank(); ++d)
    r.inner *= x.shape[d];
  r.rows = r.len ? x.numElements() / r.len : 0;
  r.x = x.data;
  r.xElem = *elemOf(x.dtype);
  return r;
}

void setOut(RowStep &r, const TensorRef &t) {
  r.out = t.data;
  r.outElem = *elemOf(t.dtype);
}

// LayerNorm's rows: everything from `axis` on, one row per leading index.
llvm::Expected<RowStep> layerNormRows(const KernelCall &call, RowOp op,
                                      const TensorRef &x) {
  auto axis = axisOf(call, call.getInt("axis"), x.rank());
  if (!axis)
    return axis.takeError();
  RowStep r;
  r.op = op;
  r.len = 1;
  for (size_t d = *axis; d < x.rank(); ++d)
    r.len *= x.shape[d];
  r.rows = r.len ? x.numElements() / r.len : 0;
  r.x = x.data;
  r.xElem = *elemOf(x.dtype);
  r.epsilon = call.getFloat("epsilon");
  return r;
}

// A LayerNorm scale or bias: broadcast to the row, which the kernels read
// as index j % numel: its shape must be the row's trailing dims.
llvm::Error rowOperand(const KernelCall &call, const TensorRef &t,
                       const TensorRef &x, const void *&data, Elem &elem,
                       int64_t &len) {
  for (size_t d = 0; d < t.rank(); ++d)
    if (t.rank() > x.rank() ||
        (t.shape[d] != x.shape[x.rank() - t.rank() + d] &&
         !(t.numElements() == 1)))
      return fail(call, "a scale or bias of shape " + ir::shapeStr(t.shape) +
                            " that is not the normalized dims'");
  data = t.data;
  elem = *elemOf(t.dtype);
  len = std::max<int64_t>(t.numElements(), 1);
  return llvm::Error::success();
}

void setLabels(RowStep &r, const KernelCall &call, const TensorRef &labels,
               const TensorRef *weights) {
  r.labels = labels.data;
  r.labelElem = *elemOf(labels.dtype);
  if (weights) {
    r.weights = weights->data;
    r.weightElem = *elemOf(weights->dtype);
  }
  r.hasIgnore = call.hasAttr("ignore_index");
  if (r.hasIgnore)
    r.ignoreIndex = call.getInt("ignore_index");
}

} // namespace

llvm::Expected<Steps> lowerRows(const KernelCall &call,
                                const Scratch &scratch) {
  const TensorRef &x = call.inputs[0];
  switch (call.op) {
  case OpKind::Softmax:
  case OpKind::LogSoftmax:
  case OpKind::SoftmaxGrad:
  case OpKind::LogSoftmaxGrad: {
    auto axis = axisOf(call, call.getInt("axis"), x.rank());
    if (!axis)
      return axis.takeError();
    if (call.op == OpKind::Softmax || call.op == OpKind::LogSoftmax) {
      RowStep r = rowsAlong(call.op == OpKind::Softmax ? RowOp::Softmax
                                                       : RowOp::LogSoftmax,
                            x, *axis);
      setOut(r, call.outputs[0]);
      return Steps{r};
    }
    RowStep r = rowsAlong(call.op == OpKind::SoftmaxGrad ? RowOp::SoftmaxGrad
                                                         : RowOp::LogSoftmaxGrad,
                          x, *axis); // x: dY
    r.aux = call.inputs[1].data;     // Y
    r.auxElem = *elemOf(call.inputs[1].dtype);
    setOut(r, call.outputs[0]);
    return Steps{r};
  }
  case OpKind::LayerNormalization: {
    auto r = layerNormRows(call, RowOp::LayerNorm, x);
    if (!r)
      return r.takeError();
    if (auto e = rowOperand(call, call.inputs[1], x, r->scale, r->scaleElem,
                            r->scaleLen))
      return std::move(e);
    if (call.inputs.size() > 2 && call.inputs[2].data)
      if (auto e = rowOperand(call, call.inputs[2], x, r->bias, r->biasElem,
                              r->biasLen))
        return std::move(e);
    setOut(*r, call.outputs[0]);
    for (size_t k = 1; k < call.outputs.size(); ++k) {
      if (call.outputs[k].dtype != DType::F32)
        return fail(call, "Mean and InvStdDev must be f32");
      (k == 1 ? r->mean : r->invStd) = call.outputs[k].as<float>();
    }
    return Steps{*r};
  }
  case OpKind::RMSNormalization: { // X, scale
    auto r = layerNormRows(call, RowOp::LayerNorm, x);
    if (!r)
      return r.takeError();
    r->rms = true;
    if (auto e = rowOperand(call, call.inputs[1], x, r->scale, r->scaleElem,
                            r->scaleLen))
      return std::move(e);
    setOut(*r, call.outputs[0]);
    return Steps{*r};
  }
  case OpKind::LayerNormalizationGradData:   // dY, X, Scale
  case OpKind::RMSNormalizationGradData: {
    auto r = layerNormRows(call, RowOp::LayerNormGradData, call.inputs[1]);
    if (r)
      r->rms = call.op == OpKind::RMSNormalizationGradData;
    if (!r)
      return r.takeError();
    r->aux = x.data;
    r->auxElem = *elemOf(x.dtype);
    if (auto e = rowOperand(call, call.inputs[2], call.inputs[1], r->scale,
                            r->scaleElem, r->scaleLen))
      return std::move(e);
    setOut(*r, call.outputs[0]);
    return Steps{*r};
  }
  case OpKind::LayerNormalizationGradParams: // dY, X -> dScale
  case OpKind::RMSNormalizationGradParams: {
    auto r = layerNormRows(call, RowOp::LayerNormStats, call.inputs[1]);
    if (!r)
      return r.takeError();
    r->rms = call.op == OpKind::RMSNormalizationGradParams;
    if (call.outputs[0].numElements() != r->len)
      return fail(call, "dScale must have the normalized dims' size");
    ColumnStep c;
    c.rows = r->rows;
    c.len = r->len;
    // The call's one scratch block (a second request would reuse it): the
    // rows' statistics, then the columns' partial sums where chunked.
    c.chunk = reduceChunk(c.len, c.rows);
    r->stats = doubles(scratch, 2 * r->rows + (c.chunk ? c.len * c.chunks() : 0));
    if (c.chunk && r->stats)
      c.partial = r->stats + 2 * r->rows;
    c.dy = x.data;
    c.dyElem = *elemOf(x.dtype);
    c.x = call.inputs[1].data;
    c.xElem = *elemOf(call.inputs[1].dtype);
    c.stats = r->stats;
    c.out = call.outputs[0].data;
    c.outElem = *elemOf(call.outputs[0].dtype);
    return Steps{*r, c};
  }
  case OpKind::SoftmaxCrossEntropyLoss: { // scores, labels[, weights]
    if (x.rank() < 2)
      return fail(call, "scores must have rank >= 2");
    RowStep r = rowsAlong(RowOp::CrossEntropy, x, 1);
    setLabels(r, call, call.inputs[1],
              call.inputs.size() > 2 && call.inputs[2].data ? &call.inputs[2]
                                                            : nullptr);
    r.stats = doubles(scratch, 2 * r.rows + 1);
    if (call.outputs.size() > 1)
      setOut(r, call.outputs[1]);
    LossStep l;
    const std::string &red = call.getString("reduction");
    l.kind = red == "none" ? LossKind::PerRow : LossKind::Total;
    l.mean = red == "mean";
    l.rows = r.rows;
    l.stats = r.stats;
    l.out = call.outputs[0].data;
    l.outElem = *elemOf(call.outputs[0].dtype);
    return Steps{r, l};
  }
  case OpKind::SoftmaxCrossEntropyLossGrad: { // dL, scores, labels[, weights]
    const TensorRef &scores = call.inputs[1];
    if (scores.rank() < 2)
      return fail(call, "scores must have rank >= 2");
    RowStep r = rowsAlong(RowOp::CrossEntropyGrad, scores, 1);
    setLabels(r, call, call.inputs[2],
              call.inputs.size() > 3 && call.inputs[3].data ? &call.inputs[3]
                                                            : nullptr);
    r.aux = x.data;
    r.auxElem = *elemOf(x.dtype);
    const std::string &red = call.getString("reduction");
    r.perRowGrad = red == "none";
    r.stats = doubles(scratch, 1);
    setOut(r, call.outputs[0]);
    LossStep l;
    l.kind = LossKind::Divisor;
    l.mean = red == "mean";
    l.rows = r.rows;
    l.stats = r.stats;
    l.labels = r.labels;
    l.labelElem = r.labelElem;
    l.weights = r.weights;
    l.weightElem = r.weightElem;
    l.hasIgnore = r.hasIgnore;
    l.ignoreIndex = r.ignoreIndex;
    l.classes = r.len;
    return Steps{l, r};
  }
  default:
    return fail(call, "not a row op");
  }
}

llvm::Expected<Steps> lowerGather(const KernelCall &call) {
  bool grad = call.op == OpKind::GatherGrad;
  const TensorRef &src = call.inputs[0], &idx = call.inputs[1],
                  &out = call.outputs[0];
  if (idx.dtype != DType::I64 && idx.dtype != DType::I32)
    return fail(call, "indices must be i64 or i32");
  const TensorRef &table = grad ? out : src; // the gathered-from shape
  auto axis = axisOf(call, call.getInt("axis"), table.rank());
  if (!axis)
    return axis.takeError();
  GatherStep g;
  g.data = src.data;
  g.elem = *elemOf(src.dtype);
  g.idx = idx.data;
  g.idxElem = *elemOf(idx.dtype);
  g.out = out.data;
  g.n = idx.numElements();
  g.dim = table.shape[*axis];
  for (int64_t d = 0; d < *axis; ++d)
    g.outer *= table.shape[d];
  for (size_t d = *axis + 1; d < table.rank(); ++d)
    g.inner *= table.shape[d];
  g.grad = grad;
  if (grad) {
    g.padding = call.getInt("padding_idx");
    // Rows add into dX: zeros, or the sum operand (Ops.def), which may be
    // dX's own bytes.
    if (call.inputs.size() < 3)
      return Steps{zero(out), g};
    const TensorRef &acc = call.inputs[2];
    if (acc.data == out.data)
      return Steps{g};
    return Steps{copy(acc, contiguous(acc.shape), out.data,
                      contiguous(out.shape), out.numElements()),
                 g};
  }
  return Steps{g};
}

llvm::Expected<Steps> lowerOptimizer(const KernelCall &call) {
  OptimizerStep o;
  o.adamw = call.op == OpKind::AdamW;
  const TensorRef &param = call.inputs[0], &lr = call.inputs[2];
  if (lr.numElements() != 1)
    return fail(call, "the learning rate must be one element");
  o.n = param.numElements();
  o.param = param.data;
  o.grad = call.inputs[1].data;
  o.elem = *elemOf(param.dtype);
  o.lr = lr.data;
  o.lrElem = *elemOf(lr.dtype);
  o.paramOut = call.outputs[0].data;
  o.gradScale = call.getFloat("grad_scale");
  o.weightDecay = call.getFloat("weight_decay");
  if (!o.adamw) {
    o.momentum = call.getFloat("momentum");
    o.nesterov = call.getInt("nesterov");
    if (call.inputs.size() > 3 && call.inputs[3].data) {
      o.m = call.inputs[3].data;
      o.mElem = *elemOf(call.inputs[3].dtype);
      if (call.outputs.size() < 2)
        return fail(call, "a velocity operand needs a velocity result");
      o.mOut = call.outputs[1].data;
    } else if (o.momentum != 0) {
      return fail(call, "momentum needs a velocity operand");
    }
    return Steps{o};
  }
  const TensorRef &step = call.inputs[3];
  if (step.numElements() != 1)
    return fail(call, "the step count must be one element");
  o.step = step.data;
  o.stepElem = *elemOf(step.dtype);
  o.m = call.inputs[4].data;
  o.mElem = *elemOf(call.inputs[4].dtype);
  o.v = call.inputs[5].data;
  o.vElem = *elemOf(call.inputs[5].dtype);
  o.mOut = call.outputs[1].data;
  o.vOut = call.outputs[2].data;
  o.beta1 = call.getFloat("beta1");
  o.beta2 = call.getFloat("beta2");
  o.epsilon = call.getFloat("epsilon");
  return Steps{o};
}

bool isRowOp(OpKind k) {
  return k == OpKind::Softmax || k == OpKind::SoftmaxGrad ||
         k == OpKind::LogSoftmax || k == OpKind::LogSoftmaxGrad ||
         k == OpKind::LayerNormalization ||
         k == OpKind::LayerNormalizationGradData ||
         k == OpKind::LayerNormalizationGradParams ||
         k == OpKind::RMSNormalization ||
         k == OpKind::RMSNormalizationGradData ||
         k == OpKind::RMSNormalizationGradParams ||
         k == OpKind::SoftmaxCrossEntropyLoss ||
         k == OpKind::SoftmaxCrossEntropyLossGrad;
}

// ReduceSum / ReduceMean / ReduceMax over `axes` (empty: all), keepdims
// or not: the output's elements are the kept dims in order either way.
llvm::Expected<Steps> lowerReduce(const KernelCall &call) {
  const TensorRef &X = call.inputs[0], &Y = call.outputs[0];
  std::vector<bool> reduced(X.rank(), call.getInts("axes").empty());
  for (int64_t a : call.getInts("axes")) {
    auto axis = axisOf(call, a, X.rank());
    if (!axis)
      return axis.takeError();
    reduced[*axis] = true;
  }
  // Dims of one element dropped and neighbours of the same role merged
  // (the input is contiguous), so a reduction of any rank whose groups
  // fit the indexers lowers: a Tile's gradient sums a view of twice its
  // rank ([r0, d0, r1, d1, ...]).
  std::vector<int64_t> xs = stridesOf(X.shape), keptDims, keptStrides,
                       redDims, redStrides;
  int last = -1; // the role of the previous dim kept: 0 kept, 1 reduced
  for (size_t d = 0; d < X.rank(); ++d) {
    if (X.shape[d] == 1)
      continue;
    auto &dims = reduced[d] ? redDims : keptDims;
    auto &strides = reduced[d] ? redStrides : keptStrides;
    if (last == int(reduced[d])) {
      dims.back() *= X.shape[d];
      strides.back() = xs[d];
    } else {
      dims.push_back(X.shape[d]);
      strides.push_back(xs[d]);
    }
    last = int(reduced[d]);
  }
  if (keptDims.size() > size_t(kMaxRank) || redDims.size() > size_t(kMaxRank))
    return fail(call, "the kept or the reduced dims of " +
                          ir::shapeStr(X.shape) +
                          " do not merge into 8 (the CUDA reduction's rank)");
  ReduceKind kind = call.op == OpKind::ReduceMax    ? ReduceKind::Max
                    : call.op == OpKind::ReduceMean ? ReduceKind::Mean
                                                    : ReduceKind::Sum;
  return Steps{reduction(kind, X, Y, keptDims, keptStrides, redDims,
                         redStrides)};
}

bool isPool(OpKind k) {
  return k == OpKind::MaxPool || k == OpKind::AveragePool ||
         k == OpKind::MaxPoolGrad || k == OpKind::AveragePoolGrad ||
         k == OpKind::GlobalAveragePool;
}

// Pools and their gradients as pool steps (DeviceCode.h); GlobalAveragePool
// as a mean over each plane.
llvm::Expected<Steps> lowerPool(const KernelCall &call) {
  const TensorRef &out = call.outputs[0];
  if (call.op == OpKind::GlobalAveragePool) {
    const TensorRef &X = call.inputs[0];
    if (X.rank() < 2 || out.numElements() != X.shape[0] * X.shape[1])
      return fail(call, llvm::formatv("input {0} does not pool to {1}",
                                      ir::shapeStr(X.shape),
                                      ir::shapeStr(out.shape)));
    int64_t planes = X.shape[0] * X.shape[1], size = 1;
    for (size_t d = 2; d < X.rank(); ++d)
      size *= X.shape[d];
    if (size == 0) // as the CPU: the mean of nothing is 0
      return Steps{zero(out)};
    ReduceStep r;
    r.kind = ReduceKind::Mean;
    r.in = X.data;
    r.inElem = *elemOf(X.dtype);
    r.out = out.data;
    r.outElem = *elemOf(out.dtype);
    r.outputs = planes;
    r.base = indexer({planes}, {size});
    r.reduced = indexer({size}, {1});
    r.count = size;
    return Steps{r};
  }
  bool max = call.op == OpKind::MaxPool || call.op == OpKind::MaxPoolGrad;
  bool grad = call.op == OpKind::MaxPoolGrad ||
              call.op == OpKind::AveragePoolGrad;
  // The forward input (X; AveragePoolGrad has only its shape, dX's) and
  // the pooled tensor (Y or dY).
  const TensorRef &x = call.op == OpKind::MaxPoolGrad       ? call.inputs[1]
                       : call.op == OpKind::AveragePoolGrad ? out
                                                            : call.inputs[0];
  const TensorRef &pooled = grad ? call.inputs[0] : out;
  auto w = windowOf(call, x.shape, pooled.shape, call.getInts("kernel_shape"),
                    /*hasDilations=*/max);
  if (!w)
    return w.takeError();
  if (pooled.shape[1] != x.shape[1] || (grad && out.shape != x.shape))
    return fail(call, llvm::formatv("input {0}, pooled {1} and result {2} do "
                                    "not fit together",
                                    ir::shapeStr(x.shape),
                                    ir::shapeStr(pooled.shape),
                                    ir::shapeStr(out.shape)));
  PoolStep p;
  p.kind = call.op == OpKind::MaxPool       ? PoolKind::Max
           : call.op == OpKind::AveragePool ? PoolKind::Average
           : max                            ? PoolKind::MaxGrad
                                            : PoolKind::AverageGrad;
  p.w = *w;
  p.planes = x.shape[0] * x.shape[1];
  if (call.op != OpKind::AveragePoolGrad) {
    p.x = x.data;
    p.xElem = *elemOf(x.dtype);
  }
  if (grad) {
    p.dy = pooled.data;
    p.dyElem = *elemOf(pooled.dtype);
  }
  p.out = out.data;
  p.outElem = *elemOf(out.dtype);
  p.includePad = !max && call.getInt("count_include_pad");
  if (call.op == OpKind::MaxPool && call.outputs.size() > 1 &&
      call.outputs[1].data) {
    if (call.outputs[1].dtype != DType::I64)
      return fail(call, "Indices must be i64");
    p.indices = call.outputs[1].as<int64_t>();
  }
  return Steps{p};
}

bool isBatchNorm(OpKind k) {
  return k == OpKind::BatchNormalization ||
         k == OpKind::BatchNormalizationGradData ||
         k == OpKind::BatchNormalizationGradParams;
}

// BatchNormalization (X, scale, B, mean, var -> Y[, running mean, running
// var]), BatchNormalizationGradData (dY, X, scale, mean, var -> dX) and
// BatchNormalizationGradParams (dY, X, mean, var -> dscale): a channel step
// for each channel's statistics, then, but for GradParams, a channel map
// applying its coefficients (DeviceCode.h).
llvm::Expected<Steps> lowerBatchNorm(const KernelCall &call,
                                     const Scratch &scratch) {
  bool forward = call.op == OpKind::BatchNormalization;
  const TensorRef &X = forward ? call.inputs[0] : call.inputs[1];
  if (X.rank() < 2)
    return fail(call, "X " + ir::shapeStr(X.shape) + " has rank < 2");
  if (!forward && call.inputs[0].shape != X.shape)
    return fail(call, llvm::formatv("gradient {0} and X {1} differ",
                                    ir::shapeStr(call.inputs[0].shape),
                                    ir::shapeStr(X.shape)));
  ChannelStep s;
  s.images = X.shape[0];
  s.channels = X.shape[1];
  s.spatial = 1;
  for (size_t d = 2; d < X.rank(); ++d)
    s.spatial *= X.shape[d];
  s.x = X.data;
  s.xElem = *elemOf(X.dtype);
  s.training = call.getInt("training_mode");
  s.epsilon = call.getFloat("epsilon");
  // The per-channel operands: scale, bias, mean, var (null where absent).
  const auto &in = call.inputs;
  const TensorRef *scale = nullptr, *bias = nullptr, *mean, *var;
  switch (call.op) {
  case OpKind::BatchNormalization:
    s.op = ChannelOp::BatchNorm;
    s.momentum = call.getFloat("momentum");
    if (call.getInt("unbiased_running_var") &&
        s.images * s.spatial > 1)
      s.unbias = double(s.images * s.spatial) /
                 double(s.images * s.spatial - 1);
    scale = &in[1];
    bias = &in[2];
    mean = &in[3];
    var = &in[4];
    break;
  case OpKind::BatchNormalizationGradData:
    s.op = ChannelOp::BatchNormGradData;
    scale = &in[2];
    mean = &in[3];
    var = &in[4];
    break;
  default: // BatchNormalizationGradParams
    s.op = ChannelOp::BatchNormGradParams;
    mean = &in[2];
    var = &in[3];
    break;
  }
  std::vector<const TensorRef *> perChannel = {mean, var};
  for (const TensorRef *t : {scale, bias})
    if (t)
      perChannel.push_back(t);
  if (s.op == ChannelOp::BatchNormGradParams ||
      (forward && call.outputs.size() == 3))
    for (size_t k = forward ? 1 : 0; k < call.outputs.size(); ++k)
      perChannel.push_back(&call.outputs[k]);
  for (const TensorRef *t : perChannel)
    if (t->numElements() != s.channels)
      return fail(call, llvm::formatv("per-channel operand {0} does not have "
                                      "{1} elements",
                                      ir::shapeStr(t->shape), s.channels));
  auto set = [](const TensorRef *t, const void *&data, Elem &elem) {
    if (t) {
      data = t->data;
      elem = *elemOf(t->dtype);
    }
  };
  set(scale, s.scale, s.scaleElem);
  set(bias, s.bias, s.biasElem);
  set(mean, s.mean, s.meanElem);
  set(var, s.var, s.varElem);
  if (!forward)
    set(&in[0], s.dy, s.dyElem);
  if (forward && call.outputs.size() == 3) {
    s.runMean = call.outputs[1].data;
    s.runMeanElem = *elemOf(call.outputs[1].dtype);
    s.runVar = call.outputs[2].data;
    s.runVarElem = *elemOf(call.outputs[2].dtype);
  }
  if (s.op == ChannelOp::BatchNormGradParams) {
    s.out = call.outputs[0].data;
    s.outElem = *elemOf(call.outputs[0].dtype);
    return Steps{s};
  }
  int64_t coefs = forward ? 2 : 4;
  auto coef = scratchBlock(call, scratch, size_t(coefs * s.channels) * 4);
  if (!coef)
    return coef.takeError();
  s.coef = reinterpret_cast<float *>(*coef);
  ChannelMapStep m;
  m.grad = !forward;
  m.elements = X.numElements();
  m.channels = s.channels;
  m.spatial = s.spatial;
  m.x = s.x;
  m.xElem = s.xElem;
  m.dy = s.dy;
  m.dyElem = s.dyElem;
  m.coef = s.coef;
  m.out = call.outputs[0].data;
  m.outElem = *elemOf(call.outputs[0].dtype);
  return Steps{s, m};
}

} // namespace cleave::runtime::cuda
