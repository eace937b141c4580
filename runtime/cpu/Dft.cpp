// DFT for the CPU backend: the discrete Fourier transform of complex data
// (real and imaginary parts in a last dim of 2) along one axis.
//
//   y[k] = s * sum_n x[n] * exp(-+2 pi i k n / N)
//
// with the minus sign forward and the plus sign for `inverse`, s = 1/N when
// `normalized` (ONNX's inverse) and 1 otherwise. Direct O(N^2) sums in
// double with the twiddles of (k * n mod N) from one table, each lane in
// order: the bits do not depend on the thread count. The models that use
// it (FNet's token mixing) transform tens to hundreds of points; a fast
// transform would pay from a few thousand.
#include "runtime/cpu/CpuKernels.h"

#include <cmath>
#include <vector>

namespace cleave::runtime::cpu {
namespace {

template <typename T>
void dftLanes(const T *x, T *y, int64_t outer, int64_t n, int64_t inner,
              bool inverse, bool normalized) {
  std::vector<double> cosT(n), sinT(n);
  for (int64_t j = 0; j < n; ++j) {
    double a = 2.0 * M_PI * double(j) / double(n);
    cosT[j] = std::cos(a);
    sinT[j] = inverse ? std::sin(a) : -std::sin(a);
  }
  double scale = normalized && n ? 1.0 / double(n) : 1.0;
  int64_t lanes = outer * inner;
  parallelFor(lanes, std::max<int64_t>(1, (1 << 14) / std::max<int64_t>(n * n, 1)),
              [&](int64_t b, int64_t e) {
                std::vector<double> re(n), im(n);
                for (int64_t lane = b; lane < e; ++lane) {
                  int64_t o = lane / inner, i = lane % inner;
                  auto at = [&](int64_t k) { return ((o * n + k) * inner + i) * 2; };
                  for (int64_t k = 0; k < n; ++k) {
                    re[k] = double(Elem<T>::load(x[at(k)]));
                    im[k] = double(Elem<T>::load(x[at(k) + 1]));
                  }
                  for (int64_t k = 0; k < n; ++k) {
                    double sr = 0, si = 0;
                    for (int64_t m = 0, j = 0; m < n; ++m, j = (j + k) % n) {
                      sr += re[m] * cosT[j] - im[m] * sinT[j];
                      si += re[m] * sinT[j] + im[m] * cosT[j];
                    }
                    y[at(k)] = Elem<T>::store(typename Elem<T>::Compute(sr * scale));
                    y[at(k) + 1] = Elem<T>::store(typename Elem<T>::Compute(si * scale));
                  }
                }
              });
}

llvm::Error dft(const KernelCall &c) {
  const TensorRef &x = c.inputs[0], &y = c.outputs[0];
  int64_t rank = x.rank(), axis = c.getInt("axis");
  if (rank < 2 || x.shape.back() != 2)
    return kernelError(c, "input {0} is not complex (a last dim of 2)",
                       ir::shapeStr(x.shape));
  if (axis < 0)
    axis += rank;
  if (axis < 0 || axis >= rank - 1)
    return kernelError(c, "axis {0} is out of range for shape {1}",
                       c.getInt("axis"), ir::shapeStr(x.shape));
  int64_t outer = elementCount(x.shape.take_front(axis));
  int64_t n = x.shape[axis];
  int64_t inner = elementCount(x.shape.drop_front(axis + 1).drop_back());
  bool inverse = c.getInt("inverse"), normalized = c.getInt("normalized");
  switch (x.dtype) {
  case ir::DType::F64:
    dftLanes(x.as<double>(), y.as<double>(), outer, n, inner, inverse, normalized);
    break;
  case ir::DType::F16:
    dftLanes(x.as<Half>(), y.as<Half>(), outer, n, inner, inverse, normalized);
    break;
  case ir::DType::BF16:
    dftLanes(x.as<BFloat>(), y.as<BFloat>(), outer, n, inner, inverse, normalized);
    break;
  default:
    dftLanes(x.as<float>(), y.as<float>(), outer, n, inner, inverse, normalized);
    break;
  }
  return llvm::Error::success();
}

} // namespace

void registerDftKernels(KernelTable &t) {
  t.add(ir::OpKind::DFT, dft, kFloatTypes);
}

} // namespace cleave::runtime::cpu
