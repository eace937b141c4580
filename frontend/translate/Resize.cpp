// Resize (F.interpolate, nn.Upsample, segmentation heads) and GridSample.
// Resize: ONNX gives the
// output by constant `scales` or `sizes` inputs; the IR op takes the output
// dims as its `sizes` attribute and, when ONNX gave scales, keeps them in
// `scales`, since the coordinate transform divides by the scale, not by
// out / in (PyTorch's and ONNX's formulas agree on that). `roi` matters
// only to tf_crop_and_resize, which the IR op refuses.
#include "frontend/translate/Translation.h"

#include "frontend/OnnxNode.h"

#include <cmath>

namespace cleave::frontend {

using namespace cleave::ir;

// The values of input k when known at compile time (a constant, or an
// initializer's data), as doubles; none when the input is absent or empty.
static llvm::Expected<std::vector<double>>
constantValues(ImportContext &ctx, const onnx::NodeProto &n, int index, int k,
               const char *what) {
  ImportContext::Entry *e = ctx.input(n, k);
  if (!e || e->type.numElements() == 0)
    return std::vector<double>();
  if (!e->data)
    return importError("{0}: input '{1}' ({2}) must be a constant after "
                       "folding; cleave needs static shapes",
                       describeNode(n, index), n.input(k), what);
  if (auto le = e->data->load())
    return importError("{0}: {1}", describeNode(n, index),
                       llvm::toString(std::move(le)));
  std::vector<double> v(e->type.numElements());
  for (size_t i = 0; i < v.size(); ++i)
    v[i] = e->data->getDouble(i);
  return v;
}

static llvm::Error translateResize(ImportContext &ctx,
                                   const onnx::NodeProto &n, int index) {
  std::string where = describeNode(n, index);
  auto operands = ctx.tensorOperands(n, index, OpKind::Resize);
  if (!operands)
    return operands.takeError();
  const Shape &in = (*operands)[0]->type().shape;
  if (findAttr(n, "axes"))
    return importError("{0}: Resize with 'axes' is not supported{1}", where,
                       modulePathOf(n));
  // Resize-10: X, scales; 11 and later: X, roi, scales, sizes.
  bool v10 = ctx.opset() < 11;
  auto scales = constantValues(ctx, n, index, v10 ? 1 : 2, "scales");
  if (!scales)
    return scales.takeError();
  std::vector<double> sizesIn;
  if (!v10) {
    auto s = constantValues(ctx, n, index, 3, "sizes");
    if (!s)
      return s.takeError();
    sizesIn = *s;
  }
  AttrMap attrs;
  std::vector<int64_t> sizes;
  if (!sizesIn.empty()) {
    if (sizesIn.size() != in.size())
      return importError("{0}: {1} sizes for an input of rank {2}", where,
                         sizesIn.size(), in.size());
    for (double d : sizesIn)
      sizes.push_back(int64_t(d));
  } else if (!scales->empty()) {
    if (scales->size() != in.size())
      return importError("{0}: {1} scales for an input of rank {2}", where,
                         scales->size(), in.size());
    std::vector<float> kept;
    for (size_t i = 0; i < in.size(); ++i) {
      double s = (*scales)[i];
      if (!(s > 0) || !std::isfinite(s))
        return importError("{0}: scale {1} of axis {2} is not positive",
                           where, s, i);
      kept.push_back(float(s));
      // ONNX: the output dim is floor(input dim * scale).
      sizes.push_back(int64_t(std::floor(double(in[i]) * double(float(s)))));
    }
    attrs.emplace("scales", Attribute(kept));
  } else {
    return importError("{0}: Resize needs constant scales or sizes", where);
  }
  // Same size at scale 1 samples every input element at its own position,
  // whatever the mode (a cubic kernel weighs the neighbours 0 there): an
  // Identity. DINOv2's legacy export resizes its position table so
  // (interpolate_pos_encoding), to the size it already has, bicubically.
  std::string transform = attrString(n, "coordinate_transformation_mode",
                                     "half_pixel");
  bool unitScales = llvm::all_of(*scales, [](double s) { return s == 1.0; });
  if (sizes == std::vector<int64_t>(in.begin(), in.end()) && unitScales &&
      transform != "tf_crop_and_resize" && transform != "tf_half_pixel_for_nn")
    return ctx.emit(n, index, OpKind::Identity, {(*operands)[0]}, {}, false);
  attrs.emplace("sizes", Attribute(sizes));
  // Resize-10 has no coordinate_transformation_mode: its transform was the
  // asymmetric one.
  if (v10)
    attrs.emplace("coordinate_transformation_mode",
                  Attribute(std::string("asymmetric")));
  return ctx.emit(n, index, OpKind::Resize, std::move(*operands),
                  std::move(attrs));
}

// GridSample (F.grid_sample): GridSample-16 spells the modes bilinear and
// bicubic, GridSample-20 linear and cubic; the IR op takes the later
// spelling. Its type rule refuses what cleave does not compute (cubic,
// more than two spatial dims).
static llvm::Error translateGridSample(ImportContext &ctx,
                                       const onnx::NodeProto &n, int index) {
  auto operands = ctx.tensorOperands(n, index, OpKind::GridSample);
  if (!operands)
    return operands.takeError();
  std::string mode = attrString(n, "mode", "linear");
  if (mode == "bilinear")
    mode = "linear";
  else if (mode == "bicubic")
    mode = "cubic";
  return ctx.emit(n, index, OpKind::GridSample, std::move(*operands),
                  {{"mode", Attribute(mode)}});
}

std::vector<OpTranslation> resizeTranslations() {
  return {{"Resize", kOpsetFirst, kOpsetLast, translateResize},
          {"GridSample", kOpsetFirst, kOpsetLast, translateGridSample}};
}

} // namespace cleave::frontend
