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
  return ctx.emit(n, index, kind, std::move(*operands), std::move(attrs));
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
  };
}

} // namespace cleave::frontend
