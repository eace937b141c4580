// Gradient kernels of convolution and pooling for the CPU backend:
// ConvGradData, ConvGradFilter, ConvGrad, MaxPoolGrad, AveragePoolGrad,
// over any number of spatial dims (NCHW-style layouts).
//
// Conv's forward pass multiplies each (image, group)'s filters [Mg, R] by
// the im2col matrix [R, P] of its input (R = Cg * prod(kernel) rows, P
// output positions). So, per (image, group):
//   ConvGradData:   col = W^T * dY, then col2im adds each column entry back
//                   onto the input position it was read from;
//   ConvGradFilter: dW += dY * im2col(X)^T, images added in order.
// Both GEMMs go to OpenBLAS (Blas.h). A 1x1 conv that maps the input onto
// the output position for position needs no im2col or col2im. As in the
// forward kernel, depthwise convs run direct loops (ConvDepthwise.h) and
// small outputs one GEMM over the batch (ConvBatchFolded.h). Pooling
// gradients walk each window again, one (image, channel) plane per task.
//
// Every scatter-add is done by one thread in a fixed order (col2im by
// channel, pools by plane), so results do not depend on the thread count.
#include "runtime/cpu/Blas.h"
#include "runtime/cpu/ConvBatchFolded.h"
#include "runtime/cpu/ConvDepthwise.h"
#include "runtime/cpu/ConvGeometry.h"
#include "runtime/cpu/ConvOneDnn.h"
#include "runtime/cpu/CpuKernels.h"

#include "llvm/ADT/SmallVector.h"

#include <algorithm>
#include <climits>

namespace cleave::runtime::cpu {
namespace {

using Dims = WindowGeometry::Dims;

// The window geometry of a gradient call whose forward input has shape
// `inShape` and whose forward output has shape `outShape`, checked against
// each other and the attributes.
llvm::Expected<WindowGeometry> window(const KernelCall &call,
                                      llvm::ArrayRef<int64_t> inShape,
                                      llvm::ArrayRef<int64_t> outShape,
                                      llvm::ArrayRef<int64_t> kernel,
                                      bool hasDilations) {
  size_t sp = inShape.size() - 2;
  const auto &st = call.getInts("strides"), &pd = call.getInts("pads");
  bool dilationsOk = !hasDilations || call.getInts("dilations").size() == sp;
  if (inShape.size() < 3 || outShape.size() != inShape.size() ||
      kernel.size() != sp || st.size() != sp || pd.size() != 2 * sp ||
      !dilationsOk || outShape[0] != inShape[0])
    return kernelError(call,
                       "input {0}, output {1} and kernel {2} do not fit "
                       "together or with the attributes",
                       ir::shapeStr(inShape), ir::shapeStr(outShape),
                       ir::shapeStr(kernel));
  return WindowGeometry(call, inShape, outShape, kernel, hasDilations);
}

// A 1x1 conv whose input positions are its output positions.
bool isPointwise(const WindowGeometry &g) {
  if (g.kernelSize != 1 || g.in != g.out)
    return false;
  for (size_t d = 0; d < g.rank(); ++d)
    if (g.strides[d] != 1 || g.padBegin[d] != 0)
      return false;
  return true;
}

// --- Conv -------------------------------------------------------------------

llvm::Expected<ConvDims> convDims(const KernelCall &call,
                                  llvm::ArrayRef<int64_t> x,
                                  llvm::ArrayRef<int64_t> w,
                                  llvm::ArrayRef<int64_t> y) {
  auto g = window(call, x, y, w.drop_front(std::min<size_t>(2, w.size())),
                  /*hasDilations=*/true);
  if (!g)
    return g.takeError();
  int64_t groups = call.getInt("group");
  if (groups <= 0 || x[1] % groups || w[0] % groups || w[1] != x[1] / groups ||
      y[1] != w[0])
    return kernelError(call,
                       "input {0}, weights {1} and output {2} do not "
                       "fit group {3}",
                       ir::shapeStr(x), ir::shapeStr(w), ir::shapeStr(y),
                       groups);
  ConvDims d = convDimsOf(call, x, w, y);
  if (d.rows > INT_MAX || d.g.outSize > INT_MAX || d.g.inSize > INT_MAX)
    return kernelError(call, "input {0} with weights {1} is too large for BLAS",
                       ir::shapeStr(x), ir::shapeStr(w));
  return d;
}

// Runs one(i, col, parallelInner) for i in [0, count) with a scratch
// buffer of colSize elements: spread over threads when each GEMM is small,
// else in order with the work inside each spread over threads.
template <typename T, typename F>
void forEachProduct(int64_t count, int64_t gemmWork, size_t colSize, F &&one) {
  if (gemmWork <= kSmallGemmWork) {
    parallelFor(count, 1, [&](int64_t b, int64_t e) {
      std::vector<T> col(colSize);
      for (int64_t i = b; i < e; ++i)
        one(i, col.data(), false);
    });
  } else {
    std::vector<T> col(colSize);
    for (int64_t i = 0; i < count; ++i)
      one(i, col.data(), true);
  }
}

// Channels per group from which 2-D stride-1 gradients go tap by tap (the
// forward conv's ShiftedTaps threshold).
constexpr int64_t kMinShiftedChannels = 8;

// A 2-D conv with stride 1, dilation 1 and padding below the kernel size:
// its data gradient is itself a conv, and its filter gradient a sum of one
// GEMM per tap over padded copies.
bool shiftedGradients(const ConvDims &d) {
  const WindowGeometry &g = d.g;
  if (g.rank() != 2 || g.kernelSize == 1)
    return false;
  for (size_t k = 0; k < 2; ++k)
    if (g.strides[k] != 1 || g.dilations[k] != 1 ||
        g.padBegin[k] > g.kernel[k] - 1 || g.padEnd[k] > g.kernel[k] - 1)
      return false;
  return true;
}

// dX = Conv(dY, W') with W'[c, o] the filter W[o, c] turned by 180 degrees,
// padding kernel - 1 - pad and the same groups: the forward conv's
// tap-by-tap path does the work.
template <typename T>
llvm::Error convGradDataAsConv(const KernelCall &call, const ConvDims &d) {
  const WindowGeometry &g = d.g;
  const TensorRef &dY = call.inputs[0], &W = call.inputs[1];
  int64_t kh = g.kernel[0], kw = g.kernel[1], taps = g.kernelSize;
  const T *w = W.as<T>();
  std::vector<T> turned(size_t(d.m * d.cg * taps));
  for (int64_t grp = 0; grp < d.groups; ++grp)
    for (int64_t o = 0; o < d.mg; ++o)
      for (int64_t c = 0; c < d.cg; ++c)
        for (int64_t t = 0; t < taps; ++t)
          turned[size_t((((grp * d.cg + c) * d.mg + o) * taps) + taps - 1 -
                        t)] = w[((grp * d.mg + o) * d.cg + c) * taps + t];
  std::vector<int64_t> shape{d.c, d.mg, kh, kw};
  ir::AttrMap attrs{{"group", d.groups},
                    {"kernel_shape", std::vector<int64_t>{kh, kw}},
                    {"strides", std::vector<int64_t>{1, 1}},
                    {"dilations", std::vector<int64_t>{1, 1}},
                    {"pads", std::vector<int64_t>{
                                 kh - 1 - g.padBegin[0], kw - 1 - g.padBegin[1],
                                 kh - 1 - g.padEnd[0], kw - 1 - g.padEnd[1]}}};
  TensorRef inputs[2] = {dY, {W.dtype, shape, turned.data()}};
  KernelCall conv{ir::OpKind::Conv, attrs, inputs, call.outputs, 0};
  return convForward(conv);
}

// ConvGradData(dY, W) -> dX of Conv: per (image, group), col = W_g^T *
// dY_g, then col2im; 2-D stride-1 convs with enough channels as a conv.
template <typename T> llvm::Error convGradData(const KernelCall &call) {
  const TensorRef &dY = call.inputs[0], &W = call.inputs[1],
                  &dX = call.outputs[0];
  auto d = convDims(call, dX.shape, W.shape, dY.shape);
  if (!d)
    return d.takeError();
  const WindowGeometry &g = d->g;
  const T *dy = dY.as<T>(), *w = W.as<T>();
  T *dx = dX.as<T>();
  // ConvTranspose runs this kernel too; oneDNN takes the gradients only.
  if constexpr (std::is_same_v<T, float>)
    if (call.op != ir::OpKind::ConvTranspose && oneDnnTakesConv(*d))
      return oneDnnConvGradData(*d, dy, w, dx);
  if (isDepthwise2d(*d)) {
    depthwiseGradData(*d, dy, w, dx);
    return llvm::Error::success();
  }
  if (foldsBatch(*d)) {
    convGradDataFolded(*d, dy, w, dx);
    return llvm::Error::success();
  }
  if (g.outSize > 0 && shiftedGradients(*d) && d->mg >= kMinShiftedChannels)
    return convGradDataAsConv<T>(call, *d);
  if (g.outSize == 0) {
    std::fill_n(dx, dX.numElements(), T(0));
    return llvm::Error::success();
  }
  bool pointwise = isPointwise(g);
  TapRuns taps(g);
  auto one = [&](int64_t ng, T *col, bool parallelInner) {
    int64_t img = ng / d->groups, grp = ng % d->groups;
    const T *dyg = dy + (img * d->m + grp * d->mg) * g.outSize;
    const T *wg = w + grp * d->mg * d->rows;
    T *dxg = dx + (img * d->c + grp * d->cg) * g.inSize;
    if (d->mg == 0) {
      std::fill_n(dxg, d->cg * g.inSize, T(0));
      return;
    }
    T *dst = pointwise ? dxg : col;
    parallelGemm<T>(true, false, d->rows, g.outSize, d->mg, T(1), wg, d->rows,
                    dyg, g.outSize, T(0), dst, g.outSize);
    if (pointwise)
      return;
    std::fill_n(dxg, d->cg * g.inSize, T(0));
    if (parallelInner)
      parallelFor(d->cg, 1, [&](int64_t c0, int64_t c1) {
        col2im(col, g, taps, c0, c1, dxg, g.outSize);
      });
    else
      col2im(col, g, taps, 0, d->cg, dxg, g.outSize);
  };
  forEachProduct<T>(d->n * d->groups, d->mg * g.outSize * d->rows,
                    pointwise ? 0 : size_t(d->rows * g.outSize), one);
  return llvm::Error::success();
}

// ConvGradFilter tap by tap. X goes into zero-padded planes Wp wide and dY
// into rows Wp wide (zeros past the output width). Read from one tap's
// offset, a channel's padded plane lists, at column oh * Wp + j, the input
// that tap met at output (oh, j) for j < Wo; at j >= Wo it meets dY's zero
// columns. So dW[tap] = sum over images of dY_ext [Mg, Ho * Wp] times
// X_pad(tap) [Cg, Ho * Wp]^T, one GEMM per image; each (group, tap, chunk
// of images) task adds its images in order, and the chunks are added in
// order, so threads never change the result.
template <typename T>
void convGradFilterByTaps(const KernelCall &call, const ConvDims &d) {
  const WindowGeometry &g = d.g;
  const T *x = call.inputs[0].as<T>(), *dy = call.inputs[1].as<T>();
  T *dw = call.outputs[0].as<T>();
  int64_t h = g.in[0], w = g.in[1], ho = g.out[0], wo = g.out[1];
  int64_t wp = w + g.padBegin[1] + g.padEnd[1];
  int64_t plane = (h + g.padBegin[0] + g.padEnd[0]) * wp;
  int64_t cols = ho * wp, taps = g.kernelSize;
  // A tap's read of the last plane runs up to kernel width - 1 past it.
  std::vector<T> xp(size_t(d.n * d.c * plane + g.kernel[1]), T(0));
  std::vector<T> dyp(size_t(d.n * d.m * cols), T(0));
  parallelFor(d.n, 1, [&](int64_t i0, int64_t i1) {
    for (int64_t img = i0; img < i1; ++img) {
      for (int64_t c = 0; c < d.c; ++c)
        for (int64_t r = 0; r < h; ++r)
          std::copy_n(x + ((img * d.c + c) * h + r) * w, w,
                      xp.data() + (img * d.c + c) * plane +
                          (r + g.padBegin[0]) * wp + g.padBegin[1]);
      for (int64_t m = 0; m < d.m; ++m)
        for (int64_t r = 0; r < ho; ++r)
          std::copy_n(dy + ((img * d.m + m) * ho + r) * wo, wo,
                      dyp.data() + (img * d.m + m) * cols + r * wp);
    }
  });
  // A (group, tap)'s images in up to kImageChunks chunks, each its own
  // task and partial sum: a handful of taps alone would leave threads idle
  // (9 tasks on 2 threads wait for the fifth). The chunks are fixed by the
  // batch, not by the threads, and added in order.
  constexpr int64_t kImageChunks = 4;
  int64_t chunks = std::min(d.n, kImageChunks);
  int64_t perChunk = (d.n + chunks - 1) / chunks;
  int64_t pairs = d.groups * taps, block = d.mg * d.cg;
  std::vector<T> acc(size_t(chunks * pairs * block));
  parallelFor(pairs * chunks, 1, [&](int64_t t0, int64_t t1) {
    for (int64_t task = t0; task < t1; ++task) {
      int64_t chunk = task / pairs, pair = task % pairs;
      int64_t grp = pair / taps, t = pair % taps;
      int64_t kh = t / g.kernel[1], kw = t % g.kernel[1];
      T *out = acc.data() + task * block;
      int64_t first = chunk * perChunk, end = std::min(d.n, first + perChunk);
      if (first >= end)
        std::fill(out, out + block, T(0));
      for (int64_t img = first; img < end; ++img)
        gemm<T>(false, true, d.mg, d.cg, cols, T(1),
                dyp.data() + (img * d.m + grp * d.mg) * cols, cols,
                xp.data() + (img * d.c + grp * d.cg) * plane + kh * wp + kw,
                plane, img > first ? T(1) : T(0), out, d.cg);
    }
  });
  for (int64_t grp = 0; grp < d.groups; ++grp)
    for (int64_t t = 0; t < taps; ++t)
      for (int64_t o = 0; o < d.mg; ++o)
        for (int64_t c = 0; c < d.cg; ++c) {
          size_t at = size_t(((grp * taps + t) * d.mg + o) * d.cg + c);
          T sum = acc[at];
          for (int64_t chunk = 1; chunk < chunks; ++chunk)
            sum += acc[at + size_t(chunk * pairs * block)];
          dw[((grp * d.mg + o) * d.cg + c) * taps + t] = sum;
        }
}

// ConvGradFilter(X, dY) -> dW of Conv: per group, dW_g = sum over images
// of dY_g * im2col(X_g)^T, images added in order; 2-D stride-1 convs with
// enough channels tap by tap.
template <typename T> llvm::Error convGradFilter(const KernelCall &call) {
  const TensorRef &X = call.inputs[0], &dY = call.inputs[1],
                  &dW = call.outputs[0];
  auto d = convDims(call, X.shape, dW.shape, dY.shape);
  if (!d)
    return d.takeError();
  const WindowGeometry &g = d->g;
  const T *x = X.as<T>(), *dy = dY.as<T>();
  T *dw = dW.as<T>();
  if constexpr (std::is_same_v<T, float>)
    if (oneDnnTakesConv(*d))
      return oneDnnConvGradFilter(*d, x, dy, dw);
  if (isDepthwise2d(*d)) {
    depthwiseGradFilter(*d, x, dy, dw);
    return llvm::Error::success();
  }
  if (foldsBatch(*d)) {
    convGradFilterFolded(*d, x, dy, dw);
    return llvm::Error::success();
  }
  if (g.outSize > 0 && d->n > 0 && dW.numElements() > 0 &&
      shiftedGradients(*d) && d->cg >= kMinShiftedChannels) {
    convGradFilterByTaps<T>(call, *d);
    return llvm::Error::success();
  }
  std::fill_n(dw, dW.numElements(), T(0));
  if (g.outSize == 0 || dW.numElements() == 0)
    return llvm::Error::success();
  bool pointwise = isPointwise(g);
  TapRuns taps(g);
  auto one = [&](int64_t grp, T *col, bool parallelInner) {
    T *dwg = dw + grp * d->mg * d->rows;
    for (int64_t img = 0; img < d->n; ++img) {
      const T *xg = x + (img * d->c + grp * d->cg) * g.inSize;
      const T *dyg = dy + (img * d->m + grp * d->mg) * g.outSize;
      const T *cols = xg;
      if (!pointwise) {
        if (parallelInner)
          parallelFor(d->rows, std::max<int64_t>(1, 16384 / g.outSize),
                      [&](int64_t r0, int64_t r1) {
                        im2col(xg, g, taps, r0, r1, col, g.outSize);
                      });
        else
          im2col(xg, g, taps, 0, d->rows, col, g.outSize);
        cols = col;
      }
      parallelGemm<T>(false, true, d->mg, d->rows, g.outSize, T(1), dyg,
                      g.outSize, cols, g.outSize, T(1), dwg, d->rows);
    }
  };
  forEachProduct<T>(d->groups, d->n * d->mg * g.outSize * d->rows,
                    pointwise ? 0 : size_t(d->rows * g.outSize), one);
  return llvm::Error::success();
}

// --- Pooling ----------------------------------------------------------------

// Zeroes dX and runs f(dxPlane, dyValue, start) for every output position
// of every (image, channel) plane, walking the windows as the forward
// kernels do (forEachWindow): planes spread over threads, one plane's
// positions in order.
template <typename T, typename F>
void forEachPoolWindow(const WindowGeometry &g, int64_t planes, T *dx,
                       const T *dy, F &&f) {
  if (g.outSize == 0) { // no windows to visit the planes
    std::fill_n(dx, planes * g.inSize, T(0));
    return;
  }
  forEachWindow(g, planes,
                [&](int64_t p, int64_t o, llvm::ArrayRef<int64_t> start) {
                  T *dxp = dx + p * g.inSize;
                  // Zero the plane, on its thread, before its first window
                  // adds into it.
                  if (o == 0)
                    std::fill(dxp, dxp + g.inSize, T(0));
                  f(dxp, dy[p * g.outSize + o], start);
                });
}

// MaxPoolGrad(dY, X): each window's dY goes to the tap MaxPool picked (the
// first maximum, or the last NaN: takesMax); windows wholly in the padding
// pass none.
template <typename T> llvm::Error maxPoolGrad(const KernelCall &call) {
  const TensorRef &dY = call.inputs[0], &X = call.inputs[1];
  auto g = window(call, X.shape, dY.shape, call.getInts("kernel_shape"),
                  /*hasDilations=*/true);
  if (!g)
    return g.takeError();
  if (dY.shape[1] != X.shape[1])
    return kernelError(call, "gradient {0} and X {1} have different channels",
                       ir::shapeStr(dY.shape), ir::shapeStr(X.shape));
  const T *x = X.as<T>();
  T *dx = call.outputs[0].as<T>();
  if (maxPoolRowsFit(*g) && g->outSize > 0) {
    const T *dy = dY.as<T>();
    int64_t outW = g->out[1];
    forEachMaxPoolRow2d<true>(
        *g, X.shape[0] * X.shape[1], x,
        [&](int64_t p, int64_t oh, const T *, const int32_t *tap) {
          T *dxp = dx + p * g->inSize;
          // Zero the plane, on its thread, before its first row adds in.
          if (oh == 0)
            std::fill(dxp, dxp + g->inSize, T(0));
          const T *dyRow = dy + p * g->outSize + oh * outW;
          for (int64_t ow = 0; ow < outW; ++ow)
            if (tap[ow] >= 0)
              dxp[tap[ow]] += dyRow[ow];
        });
    return llvm::Error::success();
  }
  forEachPoolWindow(*g, X.shape[0] * X.shape[1], dx, dY.as<T>(),
                    [&](T *dxp, T dy, llvm::ArrayRef<int64_t> start) {
                      const T *xp = x + (dxp - dx);
                      int64_t at = -1;
                      forEachTap(*g, start, [&](int64_t off) {
                        if (at < 0 || takesMax(xp[off], xp[at]))
                          at = off;
                      });
                      if (at >= 0)
                        dxp[at] += dy;
                    });
  return llvm::Error::success();
}

// AveragePoolGrad(dY){shape}: each window's dY / count goes to every tap
// inside the input, count as AveragePool counts (taps inside the input, or
// with count_include_pad those inside the padded input).
template <typename T> llvm::Error averagePoolGrad(const KernelCall &call) {
  const TensorRef &dY = call.inputs[0], &dX = call.outputs[0];
  auto g = window(call, dX.shape, dY.shape, call.getInts("kernel_shape"),
                  /*hasDilations=*/false);
  if (!g)
    return g.takeError();
  if (dY.shape[1] != dX.shape[1])
    return kernelError(call,
                       "gradient {0} and shape {1} have different "
                       "channels",
                       ir::shapeStr(dY.shape), ir::shapeStr(dX.shape));
  bool includePad = call.getInt("count_include_pad");
  forEachPoolWindow(*g, dX.shape[0] * dX.shape[1], dX.as<T>(), dY.as<T>(),
                    [&](T *dxp, T dy, llvm::ArrayRef<int64_t> start) {
                      int64_t count = 0;
                      if (includePad)
                        count = tapsInsidePadding(*g, start);
                      else
                        forEachTap(*g, start, [&](int64_t) { ++count; });
                      if (count == 0)
                        return;
                      T share = T(double(dy) / double(count));
                      forEachTap(*g, start,
                                 [&](int64_t off) { dxp[off] += share; });
                    });
  return llvm::Error::success();
}

CLEAVE_FLOAT_DISPATCH(convGradDataKernel, convGradData)
CLEAVE_FLOAT_DISPATCH(convGradFilterKernel, convGradFilter)
CLEAVE_FLOAT_DISPATCH(maxPoolGradKernel, maxPoolGrad)
CLEAVE_FLOAT_DISPATCH(averagePoolGradKernel, averagePoolGrad)

} // namespace

void registerConvPoolGradientKernels(KernelTable &t) {
  // The parts of ConvGrad(dY, X, W) -> dX, dW (addCombinedGradients runs
  // the combined op).
  t.add(ir::OpKind::ConvGradData, convGradDataKernel, kFloatTypes);
  // ConvTranspose is ConvGradData's arithmetic as a forward op.
  t.add(ir::OpKind::ConvTranspose, convGradDataKernel, kFloatTypes);
  t.add(ir::OpKind::ConvGradFilter, convGradFilterKernel, kFloatTypes);
  t.add(ir::OpKind::MaxPoolGrad, maxPoolGradKernel, kFloatTypes);
  t.add(ir::OpKind::AveragePoolGrad, averagePoolGradKernel, kFloatTypes);
}

} // namespace cleave::runtime::cpu
