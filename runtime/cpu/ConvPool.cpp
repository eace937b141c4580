// Convolution and pooling for the CPU backend, over any number of spatial
// dims (NCHW-style layouts, explicit strides, pads and dilations as the
// importer resolved them).
//
// Conv lowers each (image, group) pair to one GEMM: im2col unrolls the
// group's input windows into a [Cg * prod(kernel), prod(out)] matrix, and
// the group's filters [Mg, Cg * prod(kernel)] multiply it straight into the
// output. A 1x1, stride-1, unpadded conv needs no unrolling: the input plane
// block already is that matrix. Large GEMMs use OpenBLAS's own threads; when
// each GEMM is too small for OpenBLAS to thread, the (image, group) pairs are
// spread over threads instead. Pooling windows are walked directly, one
// (image, channel) plane per task.
#include "runtime/cpu/CpuKernels.h"

#include "llvm/ADT/SmallVector.h"

#include <algorithm>
#include "runtime/cpu/Blas.h"
#include <climits>
#include <cmath>
#include <limits>
#include <type_traits>

namespace cleave::runtime::cpu {
namespace {

using Dims = llvm::SmallVector<int64_t, 4>;

// Below this many multiply-adds OpenBLAS keeps a GEMM on one thread.
constexpr int64_t kSmallGemmWork = int64_t(1) << 18;

int64_t product(llvm::ArrayRef<int64_t> d) {
  int64_t p = 1;
  for (int64_t v : d)
    p *= v;
  return p;
}

int64_t ceilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

// Values of i in [0, count) with 0 <= start + i * step < limit, as [lo, hi).
// Gives the output columns an im2col row reads from the input, and the
// kernel taps of a pooling window that land inside the input.
std::pair<int64_t, int64_t> insideRange(int64_t start, int64_t step,
                                        int64_t count, int64_t limit) {
  int64_t lo = start >= 0 ? 0 : ceilDiv(-start, step);
  int64_t hi =
      start <= limit - 1 ? std::min(count, (limit - 1 - start) / step + 1) : 0;
  return {std::min(lo, hi), hi};
}

// Window geometry of one conv or pool call, per spatial dim.
struct Geometry {
  Dims in, out, kernel, strides, padBegin, padEnd, dilations, inStrides;
  int64_t inSize = 1, outSize = 1, kernelSize = 1;

  Geometry(const KernelCall &call, llvm::ArrayRef<int64_t> kernelDims,
           bool hasDilations) {
    llvm::ArrayRef<int64_t> x = call.inputs[0].shape, y = call.outputs[0].shape;
    size_t sp = x.size() - 2;
    in.assign(x.begin() + 2, x.end());
    out.assign(y.begin() + 2, y.end());
    kernel.assign(kernelDims.begin(), kernelDims.end());
    const auto &st = call.getInts("strides"), &pd = call.getInts("pads");
    strides.assign(st.begin(), st.end());
    padBegin.assign(pd.begin(), pd.begin() + sp);
    padEnd.assign(pd.begin() + sp, pd.end());
    if (hasDilations) {
      const auto &dl = call.getInts("dilations");
      dilations.assign(dl.begin(), dl.end());
    } else {
      dilations.assign(sp, 1);
    }
    std::vector<int64_t> s = stridesOf(in);
    inStrides.assign(s.begin(), s.end());
    inSize = product(in);
    outSize = product(out);
    kernelSize = product(kernel);
  }
  size_t rank() const { return in.size(); }
};

// Writes rows [row0, row1) of the im2col matrix of `channels` input planes
// starting at x: row (c, kernel tap) holds, for every output position, the
// input value under that tap, or 0 in the padding.
template <typename T>
void im2col(const T *x, const Geometry &g, int64_t row0, int64_t row1, T *col) {
  size_t sp = g.rank(), last = sp - 1;
  int64_t outInner = g.out[last], outOuter = g.outSize / outInner;
  Dims tap(sp), start(sp);
  for (int64_t row = row0; row < row1; ++row) {
    const T *plane = x + (row / g.kernelSize) * g.inSize;
    int64_t t = row % g.kernelSize;
    for (size_t d = sp; d-- > 0;) {
      tap[d] = t % g.kernel[d];
      t /= g.kernel[d];
      start[d] = tap[d] * g.dilations[d] - g.padBegin[d];
    }
    auto [lo, hi] =
        insideRange(start[last], g.strides[last], outInner, g.in[last]);
    T *dst = col + row * g.outSize;
    for (int64_t o = 0; o < outOuter; ++o, dst += outInner) {
      // Input offset of the outer output coordinates, or -1 in the padding.
      int64_t off = 0, rest = o;
      for (size_t d = last; d-- > 0 && off >= 0;) {
        int64_t i = (rest % g.out[d]) * g.strides[d] + start[d];
        rest /= g.out[d];
        off = i < 0 || i >= g.in[d] ? -1 : off + i * g.inStrides[d];
      }
      if (off < 0) {
        std::fill(dst, dst + outInner, T(0));
        continue;
      }
      const T *src = plane + off + start[last];
      int64_t s = g.strides[last];
      std::fill(dst, dst + lo, T(0));
      if (s == 1)
        std::copy(src + lo, src + hi, dst + lo);
      else
        for (int64_t j = lo; j < hi; ++j)
          dst[j] = src[j * s];
      std::fill(dst + hi, dst + outInner, T(0));
    }
  }
}

template <typename T>
void gemm(int64_t m, int64_t n, int64_t k, const T *a, int64_t lda, const T *b,
          int64_t ldb, T beta, T *c, int64_t ldc) {
  parallelGemm<T>(false, false, m, n, k, T(1), a, lda, b, ldb, beta, c, ldc);
}

template <typename T> llvm::Error conv(const KernelCall &call) {
  const TensorRef &X = call.inputs[0], &W = call.inputs[1];
  const TensorRef &Y = call.outputs[0];
  Geometry g(call, W.shape.drop_front(2), /*hasDilations=*/true);
  int64_t n = X.shape[0], c = X.shape[1], m = W.shape[0];
  int64_t groups = call.getInt("group");
  int64_t cg = c / groups, mg = m / groups, rows = cg * g.kernelSize;
  const T *x = X.as<T>(), *w = W.as<T>();
  T *y = Y.as<T>();
  if (n == 0 || m == 0)
    return llvm::Error::success();
  if (rows > INT_MAX || g.outSize > INT_MAX)
    return kernelError(call, "input {0} with weights {1} is too large for BLAS",
                       ir::shapeStr(X.shape), ir::shapeStr(W.shape));

  // Start from the bias (GEMM then accumulates) or from zero.
  bool hasBias = call.inputs.size() == 3;
  const T *bias = hasBias ? call.inputs[2].as<T>() : nullptr;
  parallelFor(n * m, std::max<int64_t>(1, 16384 / g.outSize),
              [&](int64_t b, int64_t e) {
                for (int64_t i = b; i < e; ++i)
                  std::fill(y + i * g.outSize, y + (i + 1) * g.outSize,
                            hasBias ? bias[i % m] : T(0));
              });
  if (rows == 0)
    return llvm::Error::success();

  bool pointwise = g.kernelSize == 1;
  for (size_t d = 0; d < g.rank(); ++d)
    pointwise = pointwise && g.strides[d] == 1 && g.padBegin[d] == 0 &&
                g.padEnd[d] == 0;

  // One (image, group) product; `col` has room for the im2col matrix.
  auto runOne = [&](int64_t ng, T *col, bool parallelUnroll) {
    int64_t img = ng / groups, grp = ng % groups;
    const T *in = x + (img * c + grp * cg) * g.inSize;
    const T *b = in;
    if (!pointwise) {
      if (parallelUnroll)
        parallelFor(
            rows, std::max<int64_t>(1, 16384 / g.outSize),
            [&](int64_t r0, int64_t r1) { im2col(in, g, r0, r1, col); });
      else
        im2col(in, g, 0, rows, col);
      b = col;
    }
    gemm<T>(mg, g.outSize, rows, w + grp * mg * rows, rows, b, g.outSize, T(1),
            y + (img * m + grp * mg) * g.outSize, g.outSize);
  };

  size_t colSize = pointwise ? 0 : size_t(rows * g.outSize);
  if (mg * g.outSize * rows <= kSmallGemmWork) {
    parallelFor(n * groups, 1, [&](int64_t b, int64_t e) {
      std::vector<T> col(colSize);
      for (int64_t i = b; i < e; ++i)
        runOne(i, col.data(), false);
    });
  } else {
    std::vector<T> col(colSize);
    for (int64_t i = 0; i < n * groups; ++i)
      runOne(i, col.data(), true);
  }
  return llvm::Error::success();
}

// Walks the kernel taps of one pooling window that land inside the input,
// calling f(flat input offset). `start` is the window's first input
// coordinate per dim; returns false if no tap lands inside.
template <typename F>
bool forEachTap(const Geometry &g, llvm::ArrayRef<int64_t> start, F &&f) {
  size_t sp = g.rank(), last = sp - 1;
  Dims lo(sp), hi(sp), k(sp);
  for (size_t d = 0; d < sp; ++d) {
    std::tie(lo[d], hi[d]) =
        insideRange(start[d], g.dilations[d], g.kernel[d], g.in[d]);
    if (lo[d] >= hi[d])
      return false;
    k[d] = lo[d];
  }
  int64_t step = g.dilations[last];
  while (true) {
    // Outer dims pick a row of the input; the last dim runs along it.
    int64_t row = start[last];
    for (size_t d = 0; d < last; ++d)
      row += (start[d] + k[d] * g.dilations[d]) * g.inStrides[d];
    for (int64_t t = lo[last]; t < hi[last]; ++t)
      f(row + t * step);
    size_t d = last;
    while (d-- > 0) {
      if (++k[d] < hi[d])
        break;
      k[d] = lo[d];
    }
    if (d == size_t(-1))
      return true;
  }
}

// Runs f(plane, output position, window start) for every output element,
// planes spread over threads.
template <typename F>
void forEachWindow(const Geometry &g, int64_t planes, F &&f) {
  int64_t work = std::max<int64_t>(1, g.outSize * g.kernelSize);
  size_t sp = g.rank();
  parallelFor(planes, std::max<int64_t>(1, 32768 / work),
              [&](int64_t p0, int64_t p1) {
                Dims pos(sp), start(sp);
                for (int64_t p = p0; p < p1; ++p) {
                  for (size_t d = 0; d < sp; ++d) {
                    pos[d] = 0;
                    start[d] = -g.padBegin[d];
                  }
                  for (int64_t o = 0; o < g.outSize; ++o) {
                    f(p, o, llvm::ArrayRef<int64_t>(start));
                    // Step to the next output position, last dim fastest.
                    for (size_t d = sp; d-- > 0;) {
                      start[d] += g.strides[d];
                      if (++pos[d] < g.out[d])
                        break;
                      pos[d] = 0;
                      start[d] = -g.padBegin[d];
                    }
                  }
                }
              });
}

template <typename T> llvm::Error maxPool(const KernelCall &call) {
  const TensorRef &X = call.inputs[0];
  Geometry g(call, call.getInts("kernel_shape"), /*hasDilations=*/true);
  const T *x = X.as<T>();
  T *y = call.outputs[0].as<T>();
  int64_t *indices =
      call.outputs.size() > 1 ? call.outputs[1].as<int64_t>() : nullptr;
  forEachWindow(g, X.shape[0] * X.shape[1],
                [&](int64_t p, int64_t o, llvm::ArrayRef<int64_t> start) {
                  const T *plane = x + p * g.inSize;
                  T best = -std::numeric_limits<T>::infinity();
                  int64_t at = -1;
                  forEachTap(g, start, [&](int64_t off) {
                    if (at < 0 || plane[off] > best) {
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
  Geometry g(call, call.getInts("kernel_shape"), /*hasDilations=*/false);
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
                  // count_include_pad counts the taps inside the padded
                  // input; the extra cells a ceil_mode window reaches past
                  // the end padding never count.
                  int64_t count = inside;
                  if (includePad) {
                    count = 1;
                    for (size_t d = 0; d < g.rank(); ++d) {
                      auto [lo, hi] =
                          insideRange(start[d] + g.padBegin[d], 1, g.kernel[d],
                                      g.in[d] + g.padBegin[d] + g.padEnd[d]);
                      count *= hi - lo;
                    }
                  }
                  y[p * g.outSize + o] = count ? T(sum / double(count)) : T(0);
                });
  return llvm::Error::success();
}

template <typename T> llvm::Error globalAveragePool(const KernelCall &call) {
  const TensorRef &X = call.inputs[0];
  int64_t planes = X.shape[0] * X.shape[1];
  int64_t size = product(X.shape.drop_front(2));
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

void registerConvPoolKernels(KernelTable &t) {
  t.add(ir::OpKind::Conv, convKernel, kFloatTypes);
  t.add(ir::OpKind::MaxPool, maxPoolKernel, kFloatTypes);
  t.add(ir::OpKind::AveragePool, averagePoolKernel, kFloatTypes);
  t.add(ir::OpKind::GlobalAveragePool, globalAveragePoolKernel, kFloatTypes);
}

} // namespace cleave::runtime::cpu
