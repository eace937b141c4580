// Normalization, softmax, loss and dropout. The normalizations map 1:1 to
// IR ops, and so does the cross-entropy loss unless PyTorch's call had
// what ONNX's op drops (translateSoftmaxCrossEntropy); Softmax and
// LogSoftmax before opset 13 (which flatten the input to 2-D at `axis`)
// become a reshape, a softmax over the last dim and a reshape back; Dropout's ratio and training mode
// inputs become attributes; BatchNormalization and Dropout train in the
// module's mode (translateBatchNorm).
#include "frontend/translate/Translation.h"

#include "frontend/Decompose.h"
#include "frontend/OnnxNode.h"

#include <optional>

namespace cleave::frontend {

using namespace cleave::ir;

// Before opset 13, softmax treats the input as 2-D, [prod(dims before
// axis), prod(dims from axis on)] with axis defaulting to 1, and normalizes
// over the second dim. When axis is the last dim that is the same as
// today's op; otherwise it is a reshape, a softmax over the last dim and a
// reshape back.
static llvm::Error translateSoftmaxBefore13(ImportContext &ctx,
                                            const onnx::NodeProto &n,
                                            int index) {
  OpKind kind = irOpOf(n);
  auto operands = ctx.tensorOperands(n, index, kind);
  if (!operands)
    return operands.takeError();
  const Shape &xShape = ctx.input(n, 0)->type.shape;
  int64_t r = xShape.size();
  int64_t axis = attrInt(n, "axis", 1);
  if (axis < 0)
    axis += r;
  if (axis < 0 || axis > r)
    return importError("{0}: axis {1} is out of range", describeNode(n, index),
                       attrInt(n, "axis", 1));
  if (axis == r - 1)
    return ctx.emit(n, index, kind, std::move(*operands),
                    {{"axis", Attribute(int64_t(-1))}}, false);
  int64_t outer = 1, inner = 1;
  for (int64_t i = 0; i < r; ++i)
    (i < axis ? outer : inner) *= xShape[i];
  Value *x = (*operands)[0];
  TensorType flat(x->type().dtype, Shape{outer, inner});
  Graph &g = ctx.graph();
  Op *in2d = g.appendOp(
      OpKind::Reshape, {x}, {flat}, {},
      {{"shape", Attribute(std::vector<int64_t>{outer, inner})}}, ctx.loc(n));
  Op *sm = g.appendOp(kind, {in2d->result()}, {flat}, {},
                      {{"axis", Attribute(int64_t(-1))}}, ctx.loc(n));
  return ctx.emit(n, index, OpKind::Reshape, {sm->result()},
                  {{"shape", Attribute(std::vector<int64_t>(xShape.begin(),
                                                            xShape.end()))}},
                  false);
}

// The training_mode attribute of a BatchNorm or Dropout: --module-mode's
// when it overrides, else what the model records (`recorded`), else none
// (the ONNX attribute, if any, or the op's default, inference).
static void setTrainingMode(const ImportContext &ctx,
                            std::optional<int64_t> recorded, AttrMap &attrs) {
  using Mode = ImportOptions::ModuleMode;
  Mode forced = ctx.options().moduleMode;
  if (forced != Mode::Auto)
    attrs.emplace("training_mode", Attribute(int64_t(forced == Mode::Train)));
  else if (recorded)
    attrs.emplace("training_mode", Attribute(*recorded));
}

// Dropout-12 and later: `ratio` and `training_mode` are optional constant
// scalar inputs.
static llvm::Error translateDropout(ImportContext &ctx,
                                    const onnx::NodeProto &n, int index) {
  auto operands = ctx.tensorOperands(n, index, OpKind::Dropout);
  if (!operands)
    return operands.takeError();
  AttrMap attrs;
  auto ratio = ctx.staticScalar(n, index, 1, "ratio");
  if (!ratio)
    return ratio.takeError();
  if (*ratio)
    attrs.emplace("ratio", Attribute(float((*ratio)->getDouble(0))));
  auto mode = ctx.staticScalar(n, index, 2, "training_mode");
  if (!mode)
    return mode.takeError();
  // PyTorch's exporters (opset 12 on) give every F.dropout its training
  // mode and write only F.scaled_dot_product_attention's dropout without
  // one (both exporters, when dropout_p is not 0). PyTorch drops attention
  // weights whenever the call asks for it (modules pass 0 outside train());
  // read as ONNX's inference default, the attention dropout of a model
  // trained with it would silently not train.
  std::optional<int64_t> recorded;
  if (*mode)
    recorded = (*mode)->getInt(0);
  else if (ctx.fromPyTorch() && ctx.opset() >= 12 && *ratio &&
           (*ratio)->getDouble(0) > 0)
    recorded = 1;
  setTrainingMode(ctx, recorded, attrs);
  return ctx.emit(n, index, OpKind::Dropout, std::move(*operands),
                  std::move(attrs));
}

// BatchNormalization in the module's mode. PyTorch's dynamo exporter writes
// a train()-mode BatchNorm in inference form (one output, no
// training_mode) and records in its signature that the module updates its
// running statistics, which happens only in train(): such an op trains on
// batch statistics. PyTorch's running variance takes the batch's unbiased
// variance (ONNX's, the population one). --module-mode overrides.
static llvm::Error translateBatchNorm(ImportContext &ctx,
                                      const onnx::NodeProto &n, int index) {
  auto operands = ctx.tensorOperands(n, index, OpKind::BatchNormalization);
  if (!operands)
    return operands.takeError();
  const std::set<std::string> &mutated = ctx.signature().mutated;
  bool updatesStatistics =
      (n.input_size() > 3 && mutated.count(n.input(3))) ||
      (n.input_size() > 4 && mutated.count(n.input(4)));
  // batch_norm(x, None, None, training=True) (BiT's weight
  // standardization, track_running_stats=False) is exported as
  // aten._native_batch_norm_legit.no_stats: the graph computes the batch's
  // mean and variance and feeds them to an inference-form op, whose
  // gradient would leave out the path through those statistics. In
  // training mode the op computes the same statistics and differentiates
  // through them.
  for (const auto &p : n.metadata_props())
    if (p.key() == "pkg.torch.onnx.fx_node" &&
        llvm::StringRef(p.value()).contains("_native_batch_norm_legit.no_stats"))
      updatesStatistics = true;
  AttrMap attrs;
  setTrainingMode(ctx,
                  updatesStatistics ? std::optional<int64_t>(1) : std::nullopt,
                  attrs);
  if (ctx.fromPyTorch())
    attrs.emplace("unbiased_running_var", Attribute(int64_t(1)));
  return ctx.emit(n, index, OpKind::BatchNormalization, std::move(*operands),
                  std::move(attrs));
}

std::vector<OpTranslation> normalizationTranslations() {
  std::vector<OpTranslation> t = {
      {"BatchNormalization", kOpsetFirst, kOpsetLast, translateBatchNorm},
      sameNamedOp("LayerNormalization"),
      {"InstanceNormalization", kOpsetFirst, kOpsetLast, decomposeInstanceNorm,
       TranslationKind::Op, {"epsilon"}},
      sameNamedOp("RMSNormalization"),
      {"SoftmaxCrossEntropyLoss", kOpsetFirst, kOpsetLast,
       translateSoftmaxCrossEntropy},
      {"Dropout", kOpsetFirst, kOpsetLast, translateDropout},
  };
  for (const char *op : {"Softmax", "LogSoftmax"}) {
    t.push_back({op, kOpsetFirst, 12, translateSoftmaxBefore13});
    t.push_back({op, 13, kOpsetLast, translateSameNamedOp});
  }
  return t;
}

} // namespace cleave::frontend
