// The lowerings of Resize and ResizeGrad (DeviceResize.h): each dim's scale
// (input units per output unit) and whether it maps every index to itself,
// with the CPU kernel's formulas and checks (runtime/cpu/Resize.cpp); and
// of GridSample and its gradients (DeviceGridSample.h), f32 only.
#include "runtime/cuda/LoweringSupport.h"

#include "runtime/GridSampleCall.h"

#include "llvm/ADT/StringSwitch.h"
#include "llvm/Support/FormatVariadic.h"

namespace cleave::runtime::cuda {

llvm::Expected<Steps> lowerResize(const KernelCall &call) {
  bool grad = call.op == OpKind::ResizeGrad;
  const TensorRef &x = call.inputs[0], &y = call.outputs[0];
  // `in` has the forward's input shape, `out` its output's.
  const TensorRef &in = grad ? y : x, &out = grad ? x : y;
  ResizeStep s;
  s.grad = grad;
  const std::string &mode = call.getString("mode");
  if (mode != "nearest" && mode != "linear" && mode != "cubic")
    return fail(call, "mode '" + mode + "' is not supported");
  s.taps = mode == "nearest" ? 1 : mode == "linear" ? 2 : 4;
  s.linear = s.taps > 1;
  if (call.hasAttr("cubic_coeff_a"))
    s.cubicA = call.getFloat("cubic_coeff_a");
  if (s.linear && !isFloatElem(x.dtype))
    return fail(call, "mode " + mode + " needs a float tensor, not " +
                          std::string(ir::dtypeName(x.dtype)));
  const std::string &coord = call.getString("coordinate_transformation_mode");
  auto c = llvm::StringSwitch<std::optional<ResizeCoord>>(coord)
               .Case("half_pixel", ResizeCoord::HalfPixel)
               .Case("pytorch_half_pixel", ResizeCoord::PytorchHalfPixel)
               .Case("align_corners", ResizeCoord::AlignCorners)
               .Case("asymmetric", ResizeCoord::Asymmetric)
               .Case("tf_half_pixel_for_nn", ResizeCoord::TfHalfPixelForNN)
               .Default(std::nullopt);
  if (!c)
    return fail(call, "coordinate_transformation_mode '" + coord +
                          "' is not supported");
  s.coord = *c;
  const std::string &round = call.getString("nearest_mode");
  s.round = llvm::StringSwitch<ResizeRound>(round)
                .Case("round_prefer_ceil", ResizeRound::PreferCeil)
                .Case("floor", ResizeRound::Floor)
                .Case("ceil", ResizeRound::Ceil)
                .Default(ResizeRound::PreferFloor);
  const std::vector<float> *scales =
      call.hasAttr("scales") ? &call.attr("scales").getFloats() : nullptr;
  if (in.rank() != out.rank() || (scales && scales->size() != in.rank()))
    return fail(call, "shapes " + ir::shapeStr(in.shape) + " and " +
                          ir::shapeStr(out.shape) + " do not match");
  s.x = x.data;
  s.xElem = *elemOf(x.dtype);
  s.out = y.data;
  s.outElem = *elemOf(y.dtype);
  s.rank = int(in.rank());
  int resized = 0;
  for (int d = 0; d < s.rank; ++d) {
    int64_t n = in.shape[d], o = out.shape[d];
    if (n < 1)
      return fail(call, "cannot resize an empty dim (" +
                            ir::shapeStr(in.shape) + ")");
    s.in[d] = n;
    s.outDims[d] = o;
    if (s.coord == ResizeCoord::AlignCorners)
      s.scale[d] = o > 1 ? float(n - 1) / float(o - 1) : 0.0f;
    else if (scales)
      s.scale[d] = float(1.0 / double((*scales)[d]));
    else
      s.scale[d] = float(n) / float(o);
    bool same = n == o;
    for (int64_t j = 0; same && j < o; ++j)
      same = resizeKeepsIndex(s, d, j);
    s.identity[d] = same;
    resized += !same;
  }
  int most = s.taps == 4 ? kMaxResized / 2 : kMaxResized;
  if (s.linear && (!grad || s.taps == 4) && resized > most)
    return fail(call, llvm::formatv("{0} over {1} dims (the CUDA kernel "
                                    "interpolates at most {2})",
                                    mode, resized, most));
  s.threads = y.numElements();
  if (s.threads == 0)
    return Steps{};
  return Steps{s};
}

llvm::Expected<Steps> lowerGridSample(const KernelCall &call) {
  GridSampleStep s;
  // X's shape: the forward's input, dX for the data gradient.
  const TensorRef *x = nullptr, *grid = nullptr;
  switch (call.op) {
  case OpKind::GridSample:
    s.kind = GridSampleKind::Forward;
    x = &call.inputs[0];
    grid = &call.inputs[1];
    s.a = static_cast<const float *>(x->data);
    s.b = static_cast<const float *>(grid->data);
    break;
  case OpKind::GridSampleGradData:
    s.kind = GridSampleKind::GradData;
    x = &call.outputs[0];
    grid = &call.inputs[1];
    s.a = static_cast<const float *>(call.inputs[0].data);
    s.b = static_cast<const float *>(grid->data);
    break;
  default:
    s.kind = GridSampleKind::GradGrid;
    x = &call.inputs[1];
    grid = &call.inputs[2];
    s.a = static_cast<const float *>(call.inputs[0].data);
    s.b = static_cast<const float *>(x->data);
    s.c = static_cast<const float *>(grid->data);
    break;
  }
  for (const TensorRef &t : call.inputs)
    if (t.dtype != DType::F32)
      return fail(call, "the CUDA kernels sample f32 only, not " +
                            std::string(ir::dtypeName(t.dtype)));
  auto geo = grid::geometryOf(call, x->shape, grid->shape);
  if (!geo)
    return fail(call, llvm::toString(geo.takeError()));
  s.g = *geo;
  s.out = static_cast<float *>(call.outputs[0].data);
  s.threads = s.kind == GridSampleKind::Forward    ? call.outputs[0].numElements()
              : s.kind == GridSampleKind::GradData ? s.g.n * s.g.c
                                                   : s.g.n * s.g.ho * s.g.wo;
  if (s.threads == 0)
    return Steps{};
  return Steps{s};
}

} // namespace cleave::runtime::cuda
