// Convolution and pooling for the CPU backend, over any number of spatial
// dims (NCHW-style layouts, explicit strides, pads and dilations as the
// importer resolved them).
//
// Conv multiplies each (image, group)'s filters [Mg, Cg * prod(kernel)] by
// its input windows with OpenBLAS: straight from the input for a pointwise
// conv, per kernel tap from a zero-padded copy for 2-D stride-1 convs, or
// from an im2col matrix (see Lowering). Two shapes go elsewhere first:
// depthwise convs to direct loops (ConvDepthwise.h), and small outputs to
// one GEMM over the whole batch (ConvBatchFolded.h). Pooling windows are
// walked directly, one (image, channel) plane per task.
#include "runtime/cpu/CpuKernels.h"

#include "runtime/cpu/Blas.h"
#include "runtime/cpu/ConvBatchFolded.h"
#include "runtime/cpu/ConvDepthwise.h"
#include "runtime/cpu/ConvGeometry.h"
#include "runtime/cpu/ConvOneDnn.h"

#include "llvm/ADT/SmallVector.h"

#include <algorithm>
#include <climits>
#include <cmath>
#include <limits>
#include <memory>
#include <type_traits>

namespace cleave::runtime::cpu {
namespace {

using Dims = llvm::SmallVector<int64_t, 4>;

// Writes `rows` rows of the im2col matrix of the input planes starting at x,
// for the output positions whose outer coordinates (all spatial dims but the
// last) have flat index in [outer0, outer1): row (c, kernel tap) holds, for
// each of those positions, the input value under that tap, or 0 in the
// padding.
template <typename T>
void im2colBlock(const T *x, const WindowGeometry &g, int64_t rows,
                 int64_t outer0, int64_t outer1, T *col) {
  size_t sp = g.rank(), last = sp - 1;
  int64_t outInner = g.out[last], s = g.strides[last];
  Dims tap(sp), start(sp), pos(sp);
  for (int64_t row = 0; row < rows; ++row) {
    const T *plane = x + (row / g.kernelSize) * g.inSize;
    int64_t t = row % g.kernelSize, rest = outer0;
    for (size_t d = sp; d-- > 0;) {
      tap[d] = t % g.kernel[d];
      t /= g.kernel[d];
      start[d] = tap[d] * g.dilations[d] - g.padBegin[d];
      if (d < last) {
        pos[d] = rest % g.out[d];
        rest /= g.out[d];
      }
    }
    auto [lo, hi] = insideRange(start[last], s, outInner, g.in[last]);
    T *dst = col + row * (outer1 - outer0) * outInner;
    for (int64_t o = outer0; o < outer1; ++o, dst += outInner) {
      // Input offset of the outer output coordinates, or -1 in the padding.
      int64_t off = 0;
      for (size_t d = 0; d < last && off >= 0; ++d) {
        int64_t i = pos[d] * g.strides[d] + start[d];
        off = i < 0 || i >= g.in[d] ? -1 : off + i * g.inStrides[d];
      }
      // Step the outer coordinates to o + 1.
      for (size_t d = last; d-- > 0 && ++pos[d] == g.out[d];)
        pos[d] = 0;
      if (off < 0) {
        std::fill(dst, dst + outInner, T(0));
        continue;
      }
      // Plain loops rather than std::copy / std::fill: the pieces are a
      // few dozen elements, too short to pay for a library call each.
      const T *src = plane + off + start[last];
      for (int64_t j = 0; j < lo; ++j)
        dst[j] = T(0);
      if (s == 1) // a separate loop, so the compiler can vectorize it
        for (int64_t j = lo; j < hi; ++j)
          dst[j] = src[j];
      else
        for (int64_t j = lo; j < hi; ++j)
          dst[j] = src[j * s];
      for (int64_t j = hi; j < outInner; ++j)
        dst[j] = T(0);
    }
  }
}

// How one Conv call is turned into GEMMs; each (image, group) pair computes
// Y_g [Mg, out positions] from the group's filters [Mg, Cg * prod(kernel)].
enum class Lowering {
  // 1x1, stride 1, unpadded: the input planes already are the right-hand
  // matrix [Cg, out positions].
  Pointwise,
  // 2-D, stride 1: the input is copied into a zero-padded buffer Wp wide.
  // Read from the offset of one kernel tap, the padded planes are a matrix
  // [Cg, OH * Wp] (row stride: one padded plane) whose column oh * Wp + ow
  // is the input under that tap for output (oh, ow), so the conv is one GEMM
  // of depth Cg per tap, accumulated into an output Wp wide; the columns
  // past the output width are dropped when it is copied out. The input is
  // copied about once, where im2col writes (and the GEMM then packs) a
  // matrix prod(kernel) times its size; and GEMMs this shallow run on
  // OpenBLAS's small-matrix kernels, which read their operands in place.
  ShiftedTaps,
  // Anything else: im2col unrolls the input windows into a matrix
  // [Cg * prod(kernel), out positions].
  Im2col,
};

// Below this many channels per group the per-tap GEMMs are too shallow to
// run well, and im2col's single deep GEMM wins (an RGB stem conv).
constexpr int64_t kMinShiftedChannels = 8;

// A task should carry about this many multiply-adds at least: enough that
// the pool's wakeups and each GEMM call's fixed costs stay small beside it.
constexpr int64_t kTaskWork = int64_t(1) << 20;
// Nor should a task's block hold fewer output positions than this: narrow
// GEMMs run slower, and each ShiftedTaps block copies kernel-height - 1
// input rows more than it has output rows.
constexpr int64_t kMinTaskColumns = 256;

// One Conv call, split into tasks: (image, group, block of `blockOuter`
// outer output positions), where the outer positions are those along all
// spatial dims but the last (output rows, for 2-D).
template <typename T> struct ConvProblem {
  WindowGeometry g;
  const T *x, *w, *bias;
  T *y;
  int64_t c, m, groups, cg, mg;
  int64_t rows;               // Cg * prod(kernel): the GEMM depth
  int64_t outInner;           // output positions along the last spatial dim
  int64_t outer;              // outer output positions
  int64_t blockOuter, blocks; // outer positions per task, tasks per pair
  Lowering lowering;
  // ShiftedTaps: the filters tap-major, [group][tap][Mg][Cg].
  std::vector<T> tapWeights;

  ConvProblem(const KernelCall &call)
      : g(call, call.inputs[0].shape, call.outputs[0].shape,
          call.inputs[1].shape.drop_front(2), /*hasDilations=*/true) {
    const TensorRef &X = call.inputs[0], &W = call.inputs[1];
    x = X.as<T>();
    w = W.as<T>();
    bias = call.inputs.size() == 3 ? call.inputs[2].as<T>() : nullptr;
    y = call.outputs[0].as<T>();
    c = X.shape[1];
    m = W.shape[0];
    groups = call.getInt("group");
    cg = c / groups;
    mg = m / groups;
    rows = cg * g.kernelSize;
    outInner = g.out[g.rank() - 1];
    outer = outInner ? g.outSize / outInner : 0;
    planBlocks();
    lowering = chooseLowering();
    if (lowering == Lowering::ShiftedTaps)
      packTapWeights();
  }

  void planBlocks() {
    int64_t pairWork = mg * rows * g.outSize;
    blocks =
        std::min({pairWork / kTaskWork, g.outSize / kMinTaskColumns, outer});
    blockOuter = ceilDiv(outer, std::max<int64_t>(blocks, 1));
    blocks = blockOuter ? ceilDiv(outer, blockOuter) : 0;
  }

  Lowering chooseLowering() const {
    bool strideOne = true, unpadded = true;
    for (size_t d = 0; d < g.rank(); ++d) {
      strideOne = strideOne && g.strides[d] == 1;
      unpadded = unpadded && g.padBegin[d] == 0 && g.padEnd[d] == 0;
    }
    if (g.kernelSize == 1 && strideOne && unpadded)
      return Lowering::Pointwise;
    if (g.rank() == 2 && strideOne && g.kernelSize > 1 &&
        cg >= kMinShiftedChannels)
      return Lowering::ShiftedTaps;
    return Lowering::Im2col;
  }

  void packTapWeights() {
    tapWeights.resize(size_t(m * rows));
    for (int64_t grp = 0; grp < groups; ++grp)
      for (int64_t o = 0; o < mg; ++o)
        for (int64_t ci = 0; ci < cg; ++ci)
          for (int64_t t = 0; t < g.kernelSize; ++t)
            tapWeights[((grp * g.kernelSize + t) * mg + o) * cg + ci] =
                w[((grp * mg + o) * cg + ci) * g.kernelSize + t];
  }

  int64_t tasks(int64_t images) const { return images * groups * blocks; }

  // ShiftedTaps scratch: the padded rows one task reads, one plane per
  // channel, then room for a tap's read to run past the last plane (into
  // columns that are dropped), then the GEMM output, paddedWidth() wide.
  int64_t paddedWidth() const { return g.in[1] + g.padBegin[1] + g.padEnd[1]; }
  int64_t paddedPlane() const {
    return (blockOuter + (g.kernel[0] - 1) * g.dilations[0]) * paddedWidth();
  }
  int64_t tapOverrun() const { return (g.kernel[1] - 1) * g.dilations[1]; }
  int64_t extOffset() const { return cg * paddedPlane() + tapOverrun(); }

  size_t scratchSize() const {
    switch (lowering) {
    case Lowering::Pointwise:
      return 0;
    case Lowering::ShiftedTaps:
      return size_t(extOffset() + mg * blockOuter * paddedWidth());
    case Lowering::Im2col:
      return size_t(rows * blockOuter * outInner);
    }
    return 0;
  }

  // ShiftedTaps: zero the padded planes once per scratch buffer. Tasks then
  // write only the columns inside the input, so the pad columns stay zero.
  void prepareScratch(T *scratch) const {
    if (lowering == Lowering::ShiftedTaps)
      std::fill(scratch, scratch + extOffset(), T(0));
  }

  // Task `task` of tasks(), with scratchSize() elements of prepared scratch.
  void run(int64_t task, T *scratch) const {
    int64_t pair = task / blocks, img = pair / groups, grp = pair % groups;
    int64_t outer0 = (task % blocks) * blockOuter;
    int64_t outer1 = std::min(outer, outer0 + blockOuter);
    const T *in = x + (img * c + grp * cg) * g.inSize;
    T *out = y + (img * m + grp * mg) * g.outSize + outer0 * outInner;
    if (lowering == Lowering::ShiftedTaps)
      return runShifted(in, grp, outer0, outer1, scratch, out);
    int64_t cols = (outer1 - outer0) * outInner;
    const T *b = in + outer0 * outInner;
    int64_t ldb = g.inSize;
    if (lowering == Lowering::Im2col) {
      im2colBlock(in, g, rows, outer0, outer1, scratch);
      b = scratch;
      ldb = cols;
    }
    // Start from the bias (the GEMM then accumulates) or overwrite.
    if (bias)
      for (int64_t o = 0; o < mg; ++o)
        std::fill(out + o * g.outSize, out + o * g.outSize + cols,
                  bias[grp * mg + o]);
    gemm<T>(false, false, mg, cols, rows, T(1), w + grp * mg * rows, rows, b,
            ldb, bias ? T(1) : T(0), out, g.outSize);
  }

  // Output rows [oh0, oh1) of one (image, group) by ShiftedTaps.
  void runShifted(const T *in, int64_t grp, int64_t oh0, int64_t oh1,
                  T *scratch, T *out) const {
    int64_t wp = paddedWidth(), plane = paddedPlane(), width = g.out[1];
    int64_t extCols = (oh1 - oh0) * wp;
    T *ext = scratch + extOffset();
    int64_t inRows = oh1 - oh0 + (g.kernel[0] - 1) * g.dilations[0];
    copyPadded(in, oh0 - g.padBegin[0], inRows, scratch);
    for (int64_t t = 0; t < g.kernelSize; ++t) {
      int64_t kh = t / g.kernel[1], kw = t % g.kernel[1];
      const T *b = scratch + kh * g.dilations[0] * wp + kw * g.dilations[1];
      gemm<T>(false, false, mg, extCols, cg, T(1),
              tapWeights.data() + (grp * g.kernelSize + t) * mg * cg, cg, b,
              plane, t ? T(1) : T(0), ext, extCols);
    }
    for (int64_t o = 0; o < mg; ++o) {
      T add = bias ? bias[grp * mg + o] : T(0);
      for (int64_t r = 0; r < oh1 - oh0; ++r) {
        const T *src = ext + o * extCols + r * wp;
        T *dst = out + o * g.outSize + r * width;
        for (int64_t j = 0; j < width; ++j)
          dst[j] = src[j] + add;
      }
    }
  }

  // Input rows [ih0, ih0 + count) of the group's channels into the padded
  // planes' inner columns; rows outside the input become zeros.
  void copyPadded(const T *in, int64_t ih0, int64_t count, T *padded) const {
    int64_t w = g.in[1], wp = paddedWidth(), plane = paddedPlane();
    for (int64_t ci = 0; ci < cg; ++ci)
      for (int64_t r = 0; r < count; ++r) {
        // Plain loops: a row is a few dozen elements, too short to pay for
        // a library call.
        T *dst = padded + ci * plane + r * wp + g.padBegin[1];
        int64_t ih = ih0 + r;
        if (ih < 0 || ih >= g.in[0]) {
          for (int64_t j = 0; j < w; ++j)
            dst[j] = T(0);
          continue;
        }
        const T *src = in + ci * g.inSize + ih * w;
        for (int64_t j = 0; j < w; ++j)
          dst[j] = src[j];
      }
  }
};

// Conv as tasks over the thread pool (see ConvProblem), each running its
// GEMMs single-threaded: batches keep every thread busy with whole images,
// large images are split, and a thread's data stays in its own cache from
// the unrolling through the GEMM.
template <typename T> llvm::Error conv(const KernelCall &call) {
  const TensorRef &X = call.inputs[0], &W = call.inputs[1];
  int64_t n = X.shape[0];
  if (n == 0 || W.shape[0] == 0)
    return llvm::Error::success();
  ConvDims d = convDimsOf(call, X.shape, W.shape, call.outputs[0].shape);
  const T *bias = call.inputs.size() == 3 ? call.inputs[2].as<T>() : nullptr;
  if constexpr (std::is_same_v<T, float>)
    if (oneDnnTakesConv(d))
      return oneDnnConvForward(d, X.as<T>(), W.as<T>(), bias,
                               call.outputs[0].as<T>());
  if (isDepthwise2d(d)) {
    depthwiseForward(d, X.as<T>(), W.as<T>(), bias, call.outputs[0].as<T>());
    return llvm::Error::success();
  }
  if (foldsBatch(d)) {
    convForwardFolded(d, X.as<T>(), W.as<T>(), bias, call.outputs[0].as<T>());
    return llvm::Error::success();
  }
  ConvProblem<T> p(call);
  const WindowGeometry &g = p.g;
  if (p.rows > INT_MAX || g.outSize > INT_MAX)
    return kernelError(call, "input {0} with weights {1} is too large for BLAS",
                       ir::shapeStr(X.shape), ir::shapeStr(W.shape));
  if (p.rows == 0) {
    for (int64_t i = 0; i < n * p.m; ++i)
      std::fill(p.y + i * g.outSize, p.y + (i + 1) * g.outSize,
                p.bias ? p.bias[i % p.m] : T(0));
    return llvm::Error::success();
  }
  parallelFor(p.tasks(n), 1, [&](int64_t t0, int64_t t1) {
    auto scratch = std::make_unique_for_overwrite<T[]>(p.scratchSize());
    p.prepareScratch(scratch.get());
    for (int64_t t = t0; t < t1; ++t)
      p.run(t, scratch.get());
  });
  return llvm::Error::success();
}

template <typename T> llvm::Error maxPool(const KernelCall &call) {
  const TensorRef &X = call.inputs[0];
  WindowGeometry g(call, X.shape, call.outputs[0].shape,
                   call.getInts("kernel_shape"), /*hasDilations=*/true);
  const T *x = X.as<T>();
  T *y = call.outputs[0].as<T>();
  int64_t *indices =
      call.outputs.size() > 1 ? call.outputs[1].as<int64_t>() : nullptr;
  if (maxPoolRowsFit(g)) {
    int64_t outW = g.out[1];
    auto write = [&](int64_t p, int64_t oh, const T *best,
                     const int32_t *tap) {
      int64_t first = p * g.outSize + oh * outW;
      std::copy_n(best, outW, y + first);
      // ONNX flattens the index over the whole input (N, C, ...).
      if (indices)
        for (int64_t ow = 0; ow < outW; ++ow)
          indices[first + ow] = tap[ow] < 0 ? -1 : p * g.inSize + tap[ow];
    };
    if (indices)
      forEachMaxPoolRow2d<true>(g, X.shape[0] * X.shape[1], x, write);
    else
      forEachMaxPoolRow2d<false>(g, X.shape[0] * X.shape[1], x, write);
    return llvm::Error::success();
  }
  forEachWindow(g, X.shape[0] * X.shape[1],
                [&](int64_t p, int64_t o, llvm::ArrayRef<int64_t> start) {
                  const T *plane = x + p * g.inSize;
                  T best = -std::numeric_limits<T>::infinity();
                  int64_t at = -1;
                  forEachTap(g, start, [&](int64_t off) {
                    if (at < 0 || takesMax(plane[off], best)) {
                      best = plane[off];
                      at = off;
                    }
                  });
                  y[p * g.outSize + o] = best;
                  // ONNX flattens the index over the whole input (N, C, ...).
                  if (indices)
                    indices[p * g.outSize + o] =
                        at < 0 ? -1 : p * g.inSize + at;
                });
  return llvm::Error::success();
}

template <typename T> llvm::Error averagePool(const KernelCall &call) {
  const TensorRef &X = call.inputs[0];
  WindowGeometry g(call, X.shape, call.outputs[0].shape,
                   call.getInts("kernel_shape"), /*hasDilations=*/false);
  bool includePad = call.getInt("count_include_pad");
  const T *x = X.as<T>();
  T *y = call.outputs[0].as<T>();
  forEachWindow(g, X.shape[0] * X.shape[1],
                [&](int64_t p, int64_t o, llvm::ArrayRef<int64_t> start) {
                  const T *plane = x + p * g.inSize;
                  double sum = 0;
                  int64_t inside = 0;
                  forEachTap(g, start, [&](int64_t off) {
                    sum += plane[off];
                    ++inside;
                  });
                  int64_t count =
                      includePad ? tapsInsidePadding(g, start) : inside;
                  y[p * g.outSize + o] = count ? T(sum / double(count)) : T(0);
                });
  return llvm::Error::success();
}

template <typename T> llvm::Error globalAveragePool(const KernelCall &call) {
  const TensorRef &X = call.inputs[0];
  int64_t planes = X.shape[0] * X.shape[1];
  int64_t size = elementCount(X.shape.drop_front(2));
  const T *x = X.as<T>();
  T *y = call.outputs[0].as<T>();
  parallelFor(planes, std::max<int64_t>(1, 32768 / std::max<int64_t>(1, size)),
              [&](int64_t p0, int64_t p1) {
                for (int64_t p = p0; p < p1; ++p) {
                  double sum = 0;
                  for (int64_t i = 0; i < size; ++i)
                    sum += x[p * size + i];
                  y[p] = size ? T(sum / double(size)) : T(0);
                }
              });
  return llvm::Error::success();
}

// f32 or f64 only: other element types were refused at dispatch.
CLEAVE_FLOAT_DISPATCH(convKernel, conv)
CLEAVE_FLOAT_DISPATCH(maxPoolKernel, maxPool)
CLEAVE_FLOAT_DISPATCH(averagePoolKernel, averagePool)
CLEAVE_FLOAT_DISPATCH(globalAveragePoolKernel, globalAveragePool)

} // namespace

llvm::Error convForward(const KernelCall &call) { return convKernel(call); }

void registerConvPoolKernels(KernelTable &t) {
  t.add(ir::OpKind::Conv, convKernel, kFloatTypes);
  t.add(ir::OpKind::MaxPool, maxPoolKernel, kFloatTypes);
  t.add(ir::OpKind::AveragePool, averagePoolKernel, kFloatTypes);
  t.add(ir::OpKind::GlobalAveragePool, globalAveragePoolKernel, kFloatTypes);
}

} // namespace cleave::runtime::cpu
