// Resize (modes nearest, linear and cubic) and ResizeGrad for the CPU
// backend.
//
// Each dim gets a table from output index to the input indices it reads
// and their weights: one index (nearest), two (linear) or four (cubic),
// computed once per call (nearest in float whatever the type, as PyTorch;
// linear and cubic in the element's compute type, float for f32 and
// double for f64) with PyTorch's formulas: the input coordinate is
// (o + 0.5) * scale - 0.5 (half_pixel), o * scale (asymmetric,
// align_corners) and so on, scale being input units per output unit (1 /
// the ONNX scale when the op keeps `scales`, else in / out); linear clamps
// the coordinate into the input as PyTorch does (the same values as ONNX's
// edge padding); cubic does not, and reads the four inputs around it with
// the cubic convolution's weights (coefficient A = cubic_coeff_a, -0.75 as
// PyTorch's), indices clamped to the edge (upsample_bicubic2d's bounded
// reads, ONNX's edge padding with exclude_outside 0). A dim whose table
// maps every output index to itself with weight 1 is skipped.
//
// The forward computes each output element on its own (threads split the
// outputs). Linear and cubic interpolate the outermost resized dim last,
// as PyTorch's CPU kernel: out = w0 * f(i0) + w1 * f(i1) + ..., f the same
// over the inner dims. ResizeGrad splits the input into planes (the dims
// before the first resized one), threads split the planes, and each plane
// adds its output gradients in row-major order, each tap's weight the
// product of its dims' weights, outermost first (PyTorch's order): the
// bits do not depend on the thread count.
#include "runtime/cpu/CpuKernels.h"

#include "llvm/ADT/SmallVector.h"

#include <algorithm>
#include <cmath>
#include <optional>

namespace cleave::runtime::cpu {
namespace {

using ir::DType;
using ir::OpKind;

constexpr int kMaxTaps = 4;

template <typename C> struct AxisMap {
  std::vector<int64_t> at[kMaxTaps]; // input indices per output index
  std::vector<C> w[kMaxTaps];        // their weights (linear, cubic)
  bool identity = true;
};

struct Geometry {
  int taps; // 1 nearest, 2 linear, 4 cubic
  bool linear; // interpolating: linear or cubic
  double cubicA;
  std::string coord, nearest;
  const std::vector<float> *scales; // null: in / out
};

llvm::Expected<Geometry> geometryOf(const KernelCall &c) {
  Geometry g;
  const std::string &mode = c.getString("mode");
  if (mode != "nearest" && mode != "linear" && mode != "cubic")
    return kernelError(c, "mode '{0}' is not supported", mode);
  g.taps = mode == "nearest" ? 1 : mode == "linear" ? 2 : 4;
  g.linear = g.taps > 1;
  g.cubicA = c.hasAttr("cubic_coeff_a") ? c.getFloat("cubic_coeff_a") : -0.75;
  g.coord = c.getString("coordinate_transformation_mode");
  g.nearest = c.getString("nearest_mode");
  g.scales = c.hasAttr("scales") ? &c.attr("scales").getFloats() : nullptr;
  return g;
}

// The cubic convolution's weights of the taps at -1, 0, 1, 2 from the
// coordinate's floor, t its fraction (PyTorch's
// get_cubic_upsample_coefficients).
template <typename C> void cubicWeights(C t, C a, C w[4]) {
  auto near = [a](C x) { return ((a + 2) * x - (a + 3)) * x * x + 1; };
  auto far = [a](C x) { return ((a * x - 5 * a) * x + 8 * a) * x - 4 * a; };
  w[0] = far(t + 1);
  w[1] = near(t);
  w[2] = near(1 - t);
  w[3] = far(2 - t);
}

// The input coordinate of output index o along a dim of `in` -> `out`.
template <typename C>
C sourceCoordinate(const std::string &coord, C scale, int64_t o, int64_t out) {
  if (coord == "align_corners" || coord == "asymmetric")
    return C(o) * scale;
  if (coord == "tf_half_pixel_for_nn")
    return (C(o) + C(0.5)) * scale;
  if (coord == "pytorch_half_pixel" && out <= 1)
    return C(0);
  return (C(o) + C(0.5)) * scale - C(0.5); // half_pixel
}

template <typename C>
int64_t nearestIndex(const std::string &mode, C x) {
  C r = mode == "floor"                ? std::floor(x)
        : mode == "ceil"               ? std::ceil(x)
        : mode == "round_prefer_ceil"  ? std::floor(x + C(0.5))
                                       : std::ceil(x - C(0.5));
  return int64_t(r);
}

template <typename C>
llvm::Expected<std::vector<AxisMap<C>>>
axisMaps(const KernelCall &c, const Geometry &g, llvm::ArrayRef<int64_t> in,
         llvm::ArrayRef<int64_t> out) {
  if (in.size() != out.size() || (g.scales && g.scales->size() != in.size()))
    return kernelError(c, "shapes {0} and {1} do not match", ir::shapeStr(in),
                       ir::shapeStr(out));
  std::vector<AxisMap<C>> maps(in.size());
  for (size_t d = 0; d < in.size(); ++d) {
    AxisMap<C> &m = maps[d];
    int64_t n = in[d], o = out[d];
    if (n < 1)
      return kernelError(c, "cannot resize an empty dim ({0})",
                         ir::shapeStr(in));
    C scale;
    if (g.coord == "align_corners")
      scale = o > 1 ? C(n - 1) / C(o - 1) : C(0);
    else if (g.scales)
      scale = C(1.0 / double((*g.scales)[d]));
    else
      scale = C(n) / C(o);
    for (int k = 0; k < g.taps; ++k) {
      m.at[k].resize(o);
      if (g.linear)
        m.w[k].resize(o);
    }
    for (int64_t j = 0; j < o; ++j) {
      C x = sourceCoordinate<C>(g.coord, scale, j, o);
      if (g.taps == 1) {
        m.at[0][j] = std::clamp<int64_t>(nearestIndex(g.nearest, x), 0, n - 1);
        m.identity &= n == o && m.at[0][j] == j;
        continue;
      }
      if (g.taps == 4) {
        C f = std::floor(x), t = x - f, w[4];
        cubicWeights<C>(t, C(g.cubicA), w);
        for (int k = 0; k < 4; ++k) {
          m.at[k][j] = std::clamp<int64_t>(int64_t(f) - 1 + k, 0, n - 1);
          m.w[k][j] = w[k];
        }
        m.identity &= n == o && int64_t(f) == j && t == C(0);
        continue;
      }
      x = std::max(x, C(0));
      int64_t i0 = std::min<int64_t>(int64_t(x), n - 1);
      C lambda = std::clamp(x - C(i0), C(0), C(1));
      m.at[0][j] = i0;
      m.at[1][j] = std::min<int64_t>(i0 + 1, n - 1);
      m.w[0][j] = C(1) - lambda;
      m.w[1][j] = lambda;
      m.identity &= n == o && i0 == j && lambda == C(0);
    }
  }
  return maps;
}

// --- Resize ---------------------------------------------------------------------

// Calls f(p, coord) for output elements p in [b, e), coord its index.
template <typename F>
void forEachIndex(llvm::ArrayRef<int64_t> shape, int64_t b, int64_t e, F f) {
  llvm::SmallVector<int64_t, 6> coord(shape.size(), 0);
  int64_t rest = b;
  for (size_t d = shape.size(); d-- > 0;) {
    coord[d] = rest % shape[d];
    rest /= shape[d];
  }
  for (int64_t p = b; p < e; ++p) {
    f(p, llvm::ArrayRef<int64_t>(coord));
    for (size_t d = shape.size(); d-- > 0;) {
      if (++coord[d] < shape[d])
        break;
      coord[d] = 0;
    }
  }
}

template <typename S> llvm::Error resizeLinear(const KernelCall &c) {
  using C = typename Elem<S>::Compute;
  const TensorRef &x = c.inputs[0], &y = c.outputs[0];
  auto g = geometryOf(c);
  if (!g)
    return g.takeError();
  auto maps = axisMaps<C>(c, *g, x.shape, y.shape);
  if (!maps)
    return maps.takeError();
  std::vector<int64_t> strides = stridesOf(x.shape);
  llvm::SmallVector<size_t, 6> resized;
  for (size_t d = 0; d < maps->size(); ++d)
    if (!(*maps)[d].identity)
      resized.push_back(d);
  const S *src = x.as<S>();
  S *dst = y.as<S>();
  int64_t levels = resized.size();
  int taps = g->taps;
  parallelFor(y.numElements(), 1 << 12, [&](int64_t b, int64_t e) {
    forEachIndex(y.shape, b, e, [&](int64_t p, llvm::ArrayRef<int64_t> coord) {
      int64_t base = 0;
      for (size_t d = 0; d < coord.size(); ++d)
        if ((*maps)[d].identity)
          base += coord[d] * strides[d];
      // Interpolates level k (resized dim k) at offset off.
      auto eval = [&](auto &self, int64_t k, int64_t off) -> C {
        if (k == levels)
          return Elem<S>::load(src[off]);
        size_t d = resized[k];
        const AxisMap<C> &m = (*maps)[d];
        int64_t j = coord[d];
        C out = self(self, k + 1, off + m.at[0][j] * strides[d]) * m.w[0][j];
        for (int t = 1; t < taps; ++t)
          out += self(self, k + 1, off + m.at[t][j] * strides[d]) * m.w[t][j];
        return out;
      };
      dst[p] = Elem<S>::store(eval(eval, 0, base));
    });
  });
  return llvm::Error::success();
}

// Nearest moves elements: copied as unsigned integers of their width.
template <typename U> llvm::Error resizeNearest(const KernelCall &c) {
  const TensorRef &x = c.inputs[0], &y = c.outputs[0];
  auto g = geometryOf(c);
  if (!g)
    return g.takeError();
  auto maps = axisMaps<float>(c, *g, x.shape, y.shape);
  if (!maps)
    return maps.takeError();
  std::vector<int64_t> strides = stridesOf(x.shape);
  const U *src = x.as<U>();
  U *dst = y.as<U>();
  parallelFor(y.numElements(), 1 << 14, [&](int64_t b, int64_t e) {
    forEachIndex(y.shape, b, e, [&](int64_t p, llvm::ArrayRef<int64_t> coord) {
      int64_t off = 0;
      for (size_t d = 0; d < coord.size(); ++d)
        off += (*maps)[d].at[0][coord[d]] * strides[d];
      dst[p] = src[off];
    });
  });
  return llvm::Error::success();
}

llvm::Error resize(const KernelCall &c) {
  DType dt = c.inputs[0].dtype;
  const std::string &mode = c.getString("mode");
  if (mode == "linear" || mode == "cubic") {
    switch (dt) {
    case DType::F64:
      return resizeLinear<double>(c);
    case DType::F32:
      return resizeLinear<float>(c);
    case DType::F16:
      return resizeLinear<Half>(c);
    case DType::BF16:
      return resizeLinear<BFloat>(c);
    default:
      return kernelError(c, "mode {0} needs a float tensor, not {1}", mode,
                         ir::dtypeName(dt));
    }
  }
  switch (ir::dtypeSize(dt)) {
  case 1:
    return resizeNearest<uint8_t>(c);
  case 2:
    return resizeNearest<uint16_t>(c);
  case 4:
    return resizeNearest<uint32_t>(c);
  default:
    return resizeNearest<uint64_t>(c);
  }
}

// --- ResizeGrad -----------------------------------------------------------------

// dX = 0; then plane by plane, each output gradient in row-major order
// added to the input elements it was read from (C: the tables' type).
template <typename T, typename C>
llvm::Error resizeGradWith(const KernelCall &c, const Geometry &g) {
  const TensorRef &dY = c.inputs[0], &dX = c.outputs[0];
  auto maps = axisMaps<C>(c, g, dX.shape, dY.shape);
  if (!maps)
    return maps.takeError();
  size_t rank = dX.rank();
  size_t first = 0; // the first resized dim; the dims before it are planes
  while (first < rank && (*maps)[first].identity)
    ++first;
  std::vector<int64_t> strides = stridesOf(dX.shape);
  int64_t planes = elementCount(dX.shape.take_front(first));
  llvm::ArrayRef<int64_t> planeOut = dY.shape.drop_front(first);
  int64_t inPlane = elementCount(dX.shape.drop_front(first));
  int64_t outPlane = elementCount(planeOut);
  llvm::SmallVector<size_t, 6> resized;
  for (size_t d = first; d < rank; ++d)
    if (!(*maps)[d].identity)
      resized.push_back(d);
  int64_t levels = resized.size();
  const T *dy = dY.as<T>();
  T *dx = dX.as<T>();
  auto addPlane = [&](int64_t pl) {
    T *plane = dx + pl * inPlane;
    const T *grad = dy + pl * outPlane;
    std::fill(plane, plane + inPlane, T(0));
    forEachIndex(planeOut, 0, outPlane,
                 [&](int64_t p, llvm::ArrayRef<int64_t> coord) {
      T gv = grad[p];
      if (!g.linear) {
        int64_t off = 0;
        for (size_t d = first; d < rank; ++d)
          off += (*maps)[d].at[0][coord[d - first]] * strides[d];
        plane[off] += gv;
        return;
      }
      int64_t base = 0;
      for (size_t d = first; d < rank; ++d)
        if ((*maps)[d].identity)
          base += coord[d - first] * strides[d];
      // Corner weights multiply outermost first, then the gradient.
      auto scatter = [&](auto &self, int64_t k, int64_t off, C w) -> void {
        if (k == levels) {
          plane[off] += T(w * gv);
          return;
        }
        size_t d = resized[k];
        const AxisMap<C> &m = (*maps)[d];
        int64_t j = coord[d - first];
        for (int t = 0; t < g.taps; ++t)
          self(self, k + 1, off + m.at[t][j] * strides[d],
               k ? C(w * m.w[t][j]) : m.w[t][j]);
      };
      scatter(scatter, 0, base, C(1));
    });
  };
  parallelFor(planes,
              std::max<int64_t>(1, (1 << 14) / std::max<int64_t>(outPlane, 1)),
              [&](int64_t b, int64_t e) {
                for (int64_t pl = b; pl < e; ++pl)
                  addPlane(pl);
              });
  return llvm::Error::success();
}

template <typename T> llvm::Error resizeGrad(const KernelCall &c) {
  auto g = geometryOf(c);
  if (!g)
    return g.takeError();
  // Nearest's indices in float, as the forward's.
  return g->linear ? resizeGradWith<T, T>(c, *g)
                   : resizeGradWith<T, float>(c, *g);
}

CLEAVE_FLOAT_DISPATCH(resizeGradKernel, resizeGrad)

} // namespace

void registerResizeKernels(KernelTable &t) {
  t.add(OpKind::Resize, resize, kAllTypes);
  t.add(OpKind::ResizeGrad, resizeGradKernel, kFloatTypes);
}

} // namespace cleave::runtime::cpu
