// cuDNN's view of a convolution call (runtime/cuda/CudnnConv.h).
#include "runtime/cuda/CudnnConv.h"

#include "llvm/Support/FormatVariadic.h"

#include <limits>

namespace cleave::runtime::cuda {

static llvm::Error refuse(const llvm::Twine &why) {
  return llvm::createStringError(llvm::inconvertibleErrorCode(),
                                 "cuDNN does not take it: " + why);
}

llvm::Expected<CudnnConvShape> cudnnConvShape(const KernelCall &call) {
  // The forward's image, filter and output, as this call names them.
  const TensorRef *x, *w, *y;
  switch (call.op) {
  case ir::OpKind::Conv:
    x = &call.inputs[0], w = &call.inputs[1], y = &call.outputs[0];
    break;
  case ir::OpKind::ConvGradData: // dY, W -> dX
    x = &call.outputs[0], w = &call.inputs[1], y = &call.inputs[0];
    break;
  case ir::OpKind::ConvGradFilter: // X, dY -> dW
    x = &call.inputs[0], w = &call.outputs[0], y = &call.inputs[1];
    break;
  default:
    return refuse("not a convolution");
  }
  size_t rank = x->rank();
  if (rank < 3 || rank > 5 || w->rank() != rank || y->rank() != rank)
    return refuse(llvm::formatv("rank {0} (cuDNN takes 1 to 3 spatial dims)",
                                rank));
  ir::DType t = x->dtype;
  if ((t != ir::DType::F32 && t != ir::DType::BF16) || w->dtype != t ||
      y->dtype != t)
    return refuse("element types other than one f32 or bf16");
  size_t sp = rank - 2;
  const auto &pads = call.getInts("pads"), &strides = call.getInts("strides"),
             &dil = call.getInts("dilations");
  if (pads.size() != 2 * sp || strides.size() != sp || dil.size() != sp)
    return refuse("pads, strides or dilations of the wrong length");
  CudnnConvShape s;
  s.groups = int(call.getInt("group"));
  s.bf16 = t == ir::DType::BF16;
  auto narrow = [](int64_t v, int &out) {
    if (v < 0 || v > std::numeric_limits<int>::max())
      return false;
    out = int(v);
    return true;
  };
  // A 1-D convolution is a 2-D one of height 1.
  bool promote = sp == 1;
  auto dims = [&](const TensorRef &t, std::vector<int> &out) {
    out.resize(t.rank() + (promote ? 1 : 0));
    size_t k = 0;
    for (size_t d = 0; d < t.rank(); ++d) {
      if (promote && d == 2)
        out[k++] = 1;
      if (!narrow(t.shape[d], out[k++]))
        return false;
    }
    return true;
  };
  if (!dims(*x, s.x) || !dims(*w, s.w) || !dims(*y, s.y))
    return refuse("a dim past what cuDNN's int descriptors hold");
  if (promote) {
    s.pads.push_back(0);
    s.strides.push_back(1);
    s.dilations.push_back(1);
  }
  for (size_t d = 0; d < sp; ++d) {
    if (pads[d] != pads[d + sp])
      return refuse(llvm::formatv("asymmetric padding ({0} before, {1} "
                                  "after in spatial dim {2})",
                                  pads[d], pads[d + sp], d));
    int p, st, dl;
    if (!narrow(pads[d], p) || !narrow(strides[d], st) || st < 1 ||
        !narrow(dil[d], dl) || dl < 1)
      return refuse("pads, strides or dilations out of range");
    s.pads.push_back(p);
    s.strides.push_back(st);
    s.dilations.push_back(dl);
  }
  // The operands must fit one another: channels, groups, and each output
  // dim (in + 2 pad - dilation (k - 1) - 1) / stride + 1.
  int n = s.x[0], c = s.x[1], m = s.w[0];
  if (s.groups < 1 || c % s.groups || m % s.groups || s.w[1] != c / s.groups ||
      s.y[0] != n || s.y[1] != m)
    return refuse(llvm::formatv("image {0}, filter {1} and output {2} do not "
                                "fit group {3}",
                                ir::shapeStr(x->shape), ir::shapeStr(w->shape),
                                ir::shapeStr(y->shape), s.groups));
  for (size_t d = 0; d < s.pads.size(); ++d) {
    int64_t in = s.x[2 + d], k = s.w[2 + d];
    int64_t out = (in + 2 * int64_t(s.pads[d]) -
                   int64_t(s.dilations[d]) * (k - 1) - 1) /
                      s.strides[d] +
                  1;
    if (out != s.y[2 + d])
      return refuse(llvm::formatv("output dim {0} is {1}, the window gives "
                                  "{2}",
                                  d, s.y[2 + d], out));
  }
  if (call.op == ir::OpKind::Conv && call.inputs.size() > 2 &&
      call.inputs[2].data) {
    const TensorRef &b = call.inputs[2];
    if (b.dtype != t || b.numElements() != m)
      return refuse("a bias that is not one value per output channel");
    s.bias = true;
  }
  return s;
}

} // namespace cleave::runtime::cuda
