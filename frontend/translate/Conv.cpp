// Convolution and pooling (NCHW). The IR ops take every geometry attribute
// explicitly: strides, dilations and pads get their ONNX defaults,
// `auto_pad` is resolved to pads, Conv's kernel shape comes from its weight
// and the pooling ops' from `kernel_shape`. Forms cleave does not run
// (dilated AveragePool, MaxPool's column-major indices) are refused by name.
#include "frontend/translate/Translation.h"

#include "frontend/OnnxNode.h"

#include <algorithm>

namespace cleave::frontend {

using namespace cleave::ir;

// Pads for auto_pad SAME_UPPER / SAME_LOWER / VALID.
static llvm::Expected<std::vector<int64_t>>
autoPads(const std::string &mode, llvm::ArrayRef<int64_t> in,
         llvm::ArrayRef<int64_t> kernel, llvm::ArrayRef<int64_t> strides,
         llvm::ArrayRef<int64_t> dil) {
  size_t sp = in.size();
  std::vector<int64_t> pads(2 * sp, 0);
  if (mode == "VALID")
    return pads;
  if (mode != "SAME_UPPER" && mode != "SAME_LOWER")
    return importError("auto_pad '{0}' is not one of NOTSET, SAME_UPPER, "
                       "SAME_LOWER, VALID",
                       mode);
  for (size_t i = 0; i < sp; ++i) {
    int64_t out = (in[i] + strides[i] - 1) / strides[i];
    int64_t span = (kernel[i] - 1) * dil[i] + 1;
    int64_t total = std::max<int64_t>(0, (out - 1) * strides[i] + span - in[i]);
    int64_t small = total / 2, big = total - small;
    pads[i] = mode == "SAME_UPPER" ? small : big;
    pads[sp + i] = mode == "SAME_UPPER" ? big : small;
  }
  return pads;
}

// avg_pool{1,2,3}d's divisor_override from a dynamo-exported node's call
// (self, kernel_size, stride, padding, ceil_mode, count_include_pad,
// divisor_override): the exporter writes AveragePool, whose divisor is the
// window's size, and drops it. 0 when there is none.
static int64_t avgPoolDivisorOverride(const onnx::NodeProto &n) {
  for (const char *call : {"aten.avg_pool1d.default", "aten.avg_pool2d.default",
                           "aten.avg_pool3d.default"}) {
    auto args = torchCallArgs(n, call);
    if (!args)
      continue;
    for (size_t i = 0; i < args->size(); ++i) {
      llvm::StringRef arg((*args)[i]);
      int64_t d = 0;
      if ((arg.consume_front("divisor_override=") ||
           (i == 6 && !arg.contains('='))) &&
          !arg.getAsInteger(10, d))
        return d;
    }
  }
  return 0;
}

static llvm::Error translateConvOrPool(ImportContext &ctx,
                                       const onnx::NodeProto &n, int index) {
  const std::string &op = n.op_type();
  OpKind kind = irOpOf(n);
  auto operands = ctx.tensorOperands(n, index, kind);
  if (!operands)
    return operands.takeError();
  std::string where = describeNode(n, index);
  const Shape &xShape = ctx.input(n, 0)->type.shape;
  AttrMap attrs;
  size_t sp = xShape.size() >= 2 ? xShape.size() - 2 : 0;
  std::vector<int64_t> kernel;
  if (kind == OpKind::Conv) {
    ImportContext::Entry *w = ctx.input(n, 1);
    if (w && w->type.rank() >= 2)
      kernel.assign(w->type.shape.begin() + 2, w->type.shape.end());
    if (auto ks = attrInts(n, "kernel_shape"); ks && *ks != kernel)
      return importError("{0}: kernel_shape {1} disagrees with the weight's "
                         "shape",
                         where, shapeStr(*ks));
  } else {
    kernel = attrInts(n, "kernel_shape").value_or(std::vector<int64_t>{});
    attrs.emplace("kernel_shape", Attribute(kernel));
  }
  if (kernel.size() != sp)
    return importError("{0}: kernel has {1} dims for {2} spatial dims", where,
                       kernel.size(), sp);
  std::vector<int64_t> ones(sp, 1), zeros(2 * sp, 0);
  auto strides = attrInts(n, "strides").value_or(ones);
  auto dil = attrInts(n, "dilations").value_or(ones);
  auto pads = attrInts(n, "pads").value_or(zeros);
  std::string autoPad = attrString(n, "auto_pad", "NOTSET");
  if (autoPad != "NOTSET") {
    if (strides.size() != sp || dil.size() != sp)
      return importError("{0}: strides and dilations need {1} entries", where,
                         sp);
    auto p = autoPads(autoPad, llvm::ArrayRef<int64_t>(xShape).drop_front(2),
                      kernel, strides, dil);
    if (!p)
      return importError("{0}: {1}", where, llvm::toString(p.takeError()));
    pads = *p;
  }
  if (op == "AveragePool" &&
      std::any_of(dil.begin(), dil.end(), [](int64_t d) { return d != 1; }))
    return importError("{0}: dilated average pooling (AveragePool-19 "
                       "dilations) is not supported",
                       where);
  if (op == "MaxPool" && attrInt(n, "storage_order", 0) != 0)
    return importError("{0}: storage_order=1 (column-major indices) is not "
                       "supported",
                       where);
  attrs.emplace("strides", Attribute(strides));
  attrs.emplace("pads", Attribute(pads));
  if (op != "AveragePool")
    attrs.emplace("dilations", Attribute(dil));
  // PyTorch's exporter writes a Conv3d without bias as a bias of zeros of
  // shape [M, 2], which ONNX does not allow (onnxruntime refuses it too):
  // a constant all-zero bias of another shape than [M] is no bias.
  if (kind == OpKind::Conv && operands->size() == 3) {
    ImportContext::Entry *b = ctx.input(n, 2), *w = ctx.input(n, 1);
    if (b && w && b->foldable && b->data && w->type.rank() >= 1 &&
        b->type.shape != Shape{w->type.shape[0]}) {
      bool zero = true;
      for (int64_t i = 0; i < b->type.numElements() && zero; ++i)
        zero = b->data->getDouble(i) == 0.0;
      if (zero)
        operands->pop_back();
    }
  }
  // divisor_override: the window's sum (an average counting the padding)
  // times its size over the divisor. PyTorch clips a ceil_mode window at
  // the padded input's end, which that average does not; refused.
  if (int64_t divisor = op == "AveragePool" ? avgPoolDivisorOverride(n) : 0) {
    if (attrInt(n, "ceil_mode", 0))
      return importError("{0}: average pooling with both divisor_override "
                         "and ceil_mode is not supported",
                         where);
    attrs.insert_or_assign("count_include_pad", Attribute(int64_t(1)));
    auto pooled = ctx.append(n, index, kind, std::move(*operands), std::move(attrs));
    if (!pooled)
      return pooled.takeError();
    double area = 1;
    for (int64_t k : kernel)
      area *= double(k);
    Value *scale = ctx.graph().addConst(
        ctx.freshName(n.output(0) + ".divisor_override"),
        TensorData::fromDoubles((*pooled)->type().dtype, {}, {area / double(divisor)}));
    return ctx.emit(n, index, OpKind::Mul, {*pooled, scale}, {}, false);
  }
  return ctx.emit(n, index, kind, std::move(*operands), std::move(attrs));
}

// ConvTranspose(X, W[, B]) is the input gradient of the convolution it
// transposes: the IR's ConvTranspose(X, W) (ConvGradData's arithmetic) of
// the shape that convolution would read (its `shape`), then the bias per
// output channel. X is [N, C, D...], W
// [C, M / group, K...], Y [N, M, O...] with O = stride (D - 1) +
// output_padding + (K - 1) dilation + 1 - pad_begin - pad_end; with
// output_shape the pads follow from it (ONNX's rule, SAME_UPPER putting
// the odd one at the end, anything else at the start). Its gradients are
// a Conv (dX, B work) and a ConvGradFilter (dW, W work).
static llvm::Error translateConvTranspose(ImportContext &ctx,
                                          const onnx::NodeProto &n,
                                          int index) {
  std::string where = describeNode(n, index);
  std::vector<Value *> in;
  for (int k = 0; k < n.input_size() && k < 3; ++k) {
    if (n.input(k).empty())
      continue;
    auto v = ctx.operand(n, index, k);
    if (!v)
      return v.takeError();
    in.push_back(*v);
  }
  if (in.size() < 2)
    return importError("{0}: ConvTranspose needs X and W", where);
  const TensorType &xt = in[0]->type(), &wt = in[1]->type();
  size_t rank = xt.rank();
  if (rank < 3 || wt.rank() != rank)
    return importError("{0}: ConvTranspose needs X [N, C, D...] and W of the "
                       "same rank, got {1} and {2}",
                       where, shapeStr(xt.shape), shapeStr(wt.shape));
  size_t sp = rank - 2;
  int64_t group = attrInt(n, "group", 1);
  if (group < 1 || wt.shape[0] != xt.shape[1] || xt.shape[1] % group)
    return importError("{0}: W {1} does not fit X {2} in {3} group(s)", where,
                       shapeStr(wt.shape), shapeStr(xt.shape), group);
  std::vector<int64_t> kernel(wt.shape.begin() + 2, wt.shape.end());
  if (auto ks = attrInts(n, "kernel_shape"); ks && *ks != kernel)
    return importError("{0}: kernel_shape {1} disagrees with the weight's "
                       "shape",
                       where, shapeStr(*ks));
  std::vector<int64_t> ones(sp, 1), zeros(sp, 0);
  auto strides = attrInts(n, "strides").value_or(ones);
  auto dil = attrInts(n, "dilations").value_or(ones);
  auto outPad = attrInts(n, "output_padding").value_or(zeros);
  auto pads = attrInts(n, "pads").value_or(std::vector<int64_t>(2 * sp, 0));
  if (strides.size() != sp || dil.size() != sp || outPad.size() != sp ||
      pads.size() != 2 * sp)
    return importError("{0}: strides, dilations and output_padding need {1} "
                       "entries and pads {2}",
                       where, sp, 2 * sp);
  std::string autoPad = attrString(n, "auto_pad", "NOTSET");
  auto outShape = attrInts(n, "output_shape");
  if (autoPad == "VALID")
    pads.assign(2 * sp, 0);
  else if (autoPad != "NOTSET" && autoPad != "SAME_UPPER" &&
           autoPad != "SAME_LOWER")
    return importError("{0}: auto_pad '{1}' is not one of NOTSET, "
                       "SAME_UPPER, SAME_LOWER, VALID",
                       where, autoPad);
  std::vector<int64_t> wanted;
  if (outShape) { // the last sp entries; a full shape may lead with N, M
    if (outShape->size() < sp)
      return importError("{0}: output_shape {1} has fewer than {2} spatial "
                         "dims",
                         where, shapeStr(*outShape), sp);
    wanted.assign(outShape->end() - sp, outShape->end());
  } else if (autoPad == "SAME_UPPER" || autoPad == "SAME_LOWER") {
    for (size_t i = 0; i < sp; ++i)
      wanted.push_back(xt.shape[2 + i] * strides[i]);
  }
  for (size_t i = 0; i < wanted.size(); ++i) {
    int64_t total = strides[i] * (xt.shape[2 + i] - 1) + outPad[i] +
                    (kernel[i] - 1) * dil[i] + 1 - wanted[i];
    bool upper = autoPad == "SAME_UPPER";
    if (total >= 0) {
      pads[i] = upper ? total / 2 : total - total / 2;
      pads[sp + i] = upper ? total - total / 2 : total / 2;
      continue;
    }
    // Larger than the transposed convolution makes: ONNX's rule puts the
    // rows of zeros past the end (a negative end pad) unless SAME_UPPER.
    // cleave takes them as output_padding does: fewer than the stride.
    if (upper || -total + outPad[i] >= strides[i])
      return importError("{0}: output_shape {1} is larger than the "
                         "transposed convolution makes by more than its "
                         "stride less one, at the end",
                         where, shapeStr(wanted));
    pads[i] = pads[sp + i] = 0;
    outPad[i] += -total;
  }
  Shape yShape{xt.shape[0], wt.shape[1] * group};
  for (size_t i = 0; i < sp; ++i) {
    if (strides[i] < 1 || dil[i] < 1 || outPad[i] < 0 ||
        (outPad[i] >= strides[i] && outPad[i] >= dil[i]))
      return importError("{0}: strides and dilations must be at least 1 and "
                         "output_padding below the stride or the dilation",
                         where);
    int64_t o = strides[i] * (xt.shape[2 + i] - 1) + outPad[i] +
                (kernel[i] - 1) * dil[i] + 1 - pads[i] - pads[sp + i];
    if (o < 1)
      return importError("{0}: the pads leave no output", where);
    yShape.push_back(o);
  }
  AttrMap attrs{{"dilations", Attribute(dil)},
                {"group", Attribute(group)},
                {"pads", Attribute(pads)},
                {"shape", Attribute(std::vector<int64_t>(yShape.begin(), yShape.end()))},
                {"strides", Attribute(strides)}};
  auto y = ctx.append(n, index, OpKind::ConvTranspose, {in[0], in[1]},
                      std::move(attrs));
  if (!y)
    return y.takeError();
  Value *out = *y;
  if (in.size() == 3) {
    if (in[2]->type().shape != Shape{yShape[1]})
      return importError("{0}: B {1} is not one value per output channel "
                         "({2})",
                         where, shapeStr(in[2]->type().shape), yShape[1]);
    std::vector<int64_t> perChannel(rank - 1, 1);
    perChannel[0] = yShape[1];
    auto b = ctx.append(n, index, OpKind::Reshape, {in[2]},
                        {{"shape", Attribute(perChannel)}});
    if (!b)
      return b.takeError();
    auto sum = ctx.append(n, index, OpKind::Add, {out, *b}, {});
    if (!sum)
      return sum.takeError();
    out = *sum;
  }
  return ctx.define(n, index, n.output(0), out);
}

std::vector<OpTranslation> convTranslations() {
  const auto op = TranslationKind::Op;
  return {
      {"Conv",
       kOpsetFirst,
       kOpsetLast,
       translateConvOrPool,
       op,
       {"auto_pad", "kernel_shape"}},
      {"MaxPool",
       kOpsetFirst,
       kOpsetLast,
       translateConvOrPool,
       op,
       {"auto_pad", "storage_order"}},
      {"AveragePool",
       kOpsetFirst,
       kOpsetLast,
       translateConvOrPool,
       op,
       {"auto_pad", "dilations"}},
      sameNamedOp("GlobalAveragePool"),
      {"ConvTranspose",
       kOpsetFirst,
       kOpsetLast,
       translateConvTranspose,
       op,
       {"auto_pad", "dilations", "group", "kernel_shape", "output_padding",
        "output_shape", "pads", "strides"}},
  };
}

} // namespace cleave::frontend
