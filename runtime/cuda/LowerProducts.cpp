// Lowering of the products to row-major GEMM steps: MatMul with NumPy
// batch broadcasting and its gradient parts (sums over broadcast batches in
// the CPU's order), Gemm and its parts, and convolution as im2col / col2im
// and GEMMs.
#include "runtime/cuda/LoweringSupport.h"

#include "runtime/MatMulLayout.h"

#include "llvm/Support/FormatVariadic.h"

#include <algorithm>

namespace cleave::runtime::cuda {

using ir::DType;
using ir::OpKind;

namespace {

// --- products --------------------------------------------------------------

GemmStep gemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k,
              const TensorRef &A, int64_t lda, const TensorRef &B, int64_t ldb,
              void *C, Elem c, int64_t ldc, float alpha = 1, float beta = 0) {
  GemmStep s;
  s.transA = ta;
  s.transB = tb;
  s.m = m;
  s.n = n;
  s.k = k;
  s.A = A.data;
  s.B = B.data;
  s.C = C;
  s.lda = lda;
  s.ldb = ldb;
  s.ldc = ldc;
  s.alpha = alpha;
  s.beta = beta;
  s.ab = *elemOf(A.dtype);
  s.c = c;
  return s;
}

// The batch layout (runtime/MatMulLayout.h, shared with the CPU backend so
// both sum broadcast gradients in the same order), with the op's name in
// errors.
llvm::Expected<MatMulLayout> layout(const KernelCall &call,
                                    llvm::ArrayRef<int64_t> a,
                                    llvm::ArrayRef<int64_t> b,
                                    llvm::ArrayRef<int64_t> y) {
  auto l = matMulLayout(a, b, y);
  if (!l)
    return fail(call, llvm::toString(l.takeError()));
  return l;
}

// The stride s with mat[e] == e * s for every e, if there is one.
std::optional<int64_t> uniformStride(const std::vector<int64_t> &mat) {
  int64_t s = mat.size() > 1 ? mat[1] - mat[0] : 0;
  for (size_t e = 0; e < mat.size(); ++e)
    if (mat[e] != int64_t(e) * s)
      return std::nullopt;
  return s;
}

// For each target matrix, the products of the entries that write it, in
// increasing entry order (beta 0 for the first, 1 after); a target no
// entry writes is zeroed. As the CPU backend sums broadcast gradients.
template <typename Product>
void sumProducts(Steps &steps, int64_t targets,
                 const std::vector<int64_t> &target, const TensorRef &out,
                 int64_t matrix, Product product) {
  std::vector<std::vector<int64_t>> entries(targets);
  for (int64_t e = 0; e < int64_t(target.size()); ++e)
    entries[target[e]].push_back(e);
  for (int64_t t = 0; t < targets; ++t) {
    if (entries[t].empty()) {
      MapArgs z;
      z.op = MapOp::Zero;
      z.n = matrix;
      z.out = out.data;
      z.outElem = *elemOf(out.dtype);
      z.outAt = indexer({matrix}, {1}, t * matrix);
      steps.push_back(z);
    }
    for (size_t i = 0; i < entries[t].size(); ++i)
      steps.push_back(product(entries[t][i], i == 0 ? 0.0f : 1.0f));
  }
}

} // namespace

llvm::Expected<Steps> lowerMatMul(const KernelCall &call) {
  Steps steps;
  if (call.op == OpKind::MatMul) {
    const TensorRef &A = call.inputs[0], &B = call.inputs[1],
                    &Y = call.outputs[0];
    auto l = layout(call, A.shape, B.shape, Y.shape);
    if (!l)
      return l.takeError();
    Elem ye = *elemOf(Y.dtype);
    if (l->countB == 1) { // the batch folds into the rows
      GemmStep s = gemm(false, false, l->count * l->m, l->n, l->k, A, l->k, B,
                        l->n, Y.data, ye, l->n);
      if (l->countA != l->count) { // A broadcast: per entry
        s.m = l->m;
        s.batch = l->count;
        auto sa = uniformStride(l->matA);
        if (!sa)
          goto general;
        s.strideA = *sa * l->m * l->k;
        s.strideC = l->m * l->n;
      }
      return Steps{s};
    }
    {
      auto sa = uniformStride(l->matA), sb = uniformStride(l->matB);
      if (sa && sb) {
        GemmStep s = gemm(false, false, l->m, l->n, l->k, A, l->k, B, l->n,
                          Y.data, ye, l->n);
        s.batch = l->count;
        s.strideA = *sa * l->m * l->k;
        s.strideB = *sb * l->k * l->n;
        s.strideC = l->m * l->n;
        return Steps{s};
      }
    }
  general:
    for (int64_t e = 0; e < l->count; ++e)
      steps.push_back(gemm(false, false, l->m, l->n, l->k,
                           at(A, l->matA[e] * l->m * l->k), l->k,
                           at(B, l->matB[e] * l->k * l->n), l->n,
                           at(Y, e * l->m * l->n).data, ye, l->n));
    return steps;
  }
  if (call.op == OpKind::MatMulGradA) { // dA = SumTo(dY x B^T)
    const TensorRef &dY = call.inputs[0], &B = call.inputs[1],
                    &dA = call.outputs[0];
    auto l = layout(call, dA.shape, B.shape, dY.shape);
    if (!l)
      return l.takeError();
    int64_t m = l->m, k = l->k, n = l->n;
    Elem e = *elemOf(dA.dtype);
    if (l->countB == 1 && l->countA == l->count)
      return Steps{gemm(false, true, l->count * m, k, n, dY, n, B, n, dA.data,
                        e, k)};
    sumProducts(steps, l->countA, l->matA, dA, m * k, [&](int64_t i, float beta) {
      return gemm(false, true, m, k, n, at(dY, i * m * n), n,
                  at(B, l->matB[i] * k * n), n,
                  at(dA, l->matA[i] * m * k).data, e, k, 1.0f, beta);
    });
    return steps;
  }
  // MatMulGradB: dB = SumTo(A^T x dY)
  const TensorRef &A = call.inputs[0], &dY = call.inputs[1],
                  &dB = call.outputs[0];
  auto l = layout(call, A.shape, dB.shape, dY.shape);
  if (!l)
    return l.takeError();
  int64_t m = l->m, k = l->k, n = l->n;
  Elem e = *elemOf(dB.dtype);
  if (l->countB == 1 && l->countA == l->count)
    return Steps{gemm(true, false, k, n, l->count * m, A, k, dY, n, dB.data,
                      e, n)};
  sumProducts(steps, l->countB, l->matB, dB, k * n, [&](int64_t i, float beta) {
    return gemm(true, false, k, n, m, at(A, l->matA[i] * m * k), k,
                at(dY, i * m * n), n, at(dB, l->matB[i] * k * n).data, e, n,
                1.0f, beta);
  });
  return steps;
}

llvm::Expected<Steps> lowerGemm(const KernelCall &call) {
  bool ta = call.getInt("transA"), tb = call.getInt("transB");
  float alpha = call.getFloat("alpha");
  if (call.op == OpKind::Gemm) {
    const TensorRef &A = call.inputs[0], &B = call.inputs[1],
                    &Y = call.outputs[0];
    int64_t m = Y.shape[0], n = Y.shape[1], k = ta ? A.shape[0] : A.shape[1];
    float beta = call.getFloat("beta");
    bool useC = call.inputs.size() == 3 && beta != 0.0f;
    Steps steps;
    // Y starts as C broadcast to [M, N], or 0.
    if (useC)
      steps.push_back(copy(call.inputs[2],
                           broadcast(call.inputs[2].shape, Y.shape), Y.data,
                           contiguous(Y.shape), Y.numElements()));
    else
      steps.push_back(zero(Y));
    if (k > 0)
      steps.push_back(gemm(ta, tb, m, n, k, A, A.shape[1], B, B.shape[1],
                           Y.data, *elemOf(Y.dtype), n, alpha,
                           useC ? beta : 0.0f));
    else if (useC && beta != 1.0f) { // Y = beta * C
      MapArgs scale = mapOver(MapOp::Scale, Y, {&call.inputs[2]});
      scale.p0 = beta;
      steps.back() = scale;
    }
    return steps;
  }
  if (call.op == OpKind::GemmGradA) {
    const TensorRef &dY = call.inputs[0], &B = call.inputs[1],
                    &dA = call.outputs[0];
    int64_t m = dY.shape[0], n = dY.shape[1];
    int64_t k = tb ? B.shape[1] : B.shape[0];
    Elem e = *elemOf(dA.dtype);
    if (ta) // dA[k, m] = alpha * op(B) * dY^T
      return Steps{gemm(tb, true, k, m, n, B, B.shape[1], dY, n, dA.data, e,
                        m, alpha)};
    return Steps{gemm(false, !tb, m, k, n, dY, n, B, B.shape[1], dA.data, e,
                      k, alpha)};
  }
  // GemmGradB
  const TensorRef &A = call.inputs[0], &dY = call.inputs[1],
                  &dB = call.outputs[0];
  int64_t m = dY.shape[0], n = dY.shape[1];
  int64_t k = ta ? A.shape[0] : A.shape[1];
  Elem e = *elemOf(dB.dtype);
  if (tb) // dB[n, k] = alpha * dY^T * op(A)
    return Steps{gemm(true, ta, n, k, m, dY, n, A, A.shape[1], dB.data, e, k,
                      alpha)};
  return Steps{gemm(!ta, false, k, n, m, A, A.shape[1], dY, n, dB.data, e, n,
                    alpha)};
}

namespace {

// Conv of X [N, C, in...] by W [M, C / group, kernel...] into Y [N, M,
// out...]: the windows and the sizes of one (image, group) product, whose
// depth is rows = C / group * K (K kernel taps).
struct ConvDims {
  Window w;
  int64_t n, c, m, groups, cg, mg, rows;
};

llvm::Expected<ConvDims> convDims(const KernelCall &call, const TensorRef &x,
                                  const TensorRef &w, const TensorRef &y) {
  auto win = windowOf(call, x.shape, y.shape,
                      w.shape.drop_front(std::min<size_t>(2, w.rank())),
                      /*hasDilations=*/true);
  if (!win)
    return win.takeError();
  ConvDims d{*win, x.shape[0], x.shape[1], w.shape[0], call.getInt("group"),
             0, 0, 0};
  if (d.groups <= 0 || d.c % d.groups || d.m % d.groups ||
      w.shape[1] != d.c / d.groups || y.shape[1] != d.m)
    return fail(call, llvm::formatv("input {0}, weights {1} and output {2} do "
                                    "not fit group {3}",
                                    ir::shapeStr(x.shape),
                                    ir::shapeStr(w.shape),
                                    ir::shapeStr(y.shape), d.groups));
  d.cg = d.c / d.groups;
  d.mg = d.m / d.groups;
  d.rows = d.cg * win->kernelSize;
  return d;
}

Im2colStep im2col(const ConvDims &d, const TensorRef &x, void *cols,
                  int64_t imageStride, int64_t rowStride) {
  Im2colStep s;
  s.w = d.w;
  s.images = d.n;
  s.channels = d.c;
  s.imageStride = imageStride;
  s.rowStride = rowStride;
  s.in = x.data;
  s.inElem = *elemOf(x.dtype);
  s.out = cols;
  s.outElem = s.inElem;
  return s;
}

} // namespace

// Conv and its gradient parts as im2col (Im2colStep) and GEMMs. Image n's
// column matrix is [C * K, P] (P output positions); group g's Cg * K rows
// pair with its filters W_g [M / group, Cg * K]:
//   Conv:           Y[n, g] = W_g x cols[n, g], one GEMM per group batched
//                   over the images (W_g shared: stride 0); a bias is
//                   copied into Y first and the GEMMs add onto it;
//   ConvGradData:   cols[n, g] = W_g^T x dY[n, g] in f32 (the CPU keeps
//                   them in f32 too), then col2im gathers them into dX;
//   ConvGradFilter: dW_g = the sum over images of dY[n, g] x cols[n, g]^T,
//                   folded into one GEMM per group (batched over groups):
//                   the columns are laid out [C * K, N * P] and dY copied
//                   to [M, N * P], so the depth runs over images and
//                   positions and the batch sum is the GEMM's own, in f32.
llvm::Expected<Steps> lowerConv(const KernelCall &call,
                                const Scratch &scratch) {
  Steps steps;
  if (call.op == OpKind::Conv) {
    const TensorRef &X = call.inputs[0], &W = call.inputs[1],
                    &Y = call.outputs[0];
    auto d = convDims(call, X, W, Y);
    if (!d)
      return d.takeError();
    if (X.dtype != W.dtype)
      return fail(call, "the image and the filter operands must have one "
                        "element type");
    int64_t p = d->w.outSize, perImage = d->c * d->w.kernelSize * p;
    auto cols = scratchBlock(call, scratch,
                             size_t(d->n * perImage) * ir::dtypeSize(X.dtype));
    if (!cols)
      return cols.takeError();
    bool bias = call.inputs.size() > 2 && call.inputs[2].data;
    if (bias) {
      const TensorRef &B = call.inputs[2];
      if (B.numElements() != d->m)
        return fail(call, llvm::formatv("bias {0} does not have {1} elements",
                                        ir::shapeStr(B.shape), d->m));
      MapArgs fill;
      fill.op = B.dtype == Y.dtype ? MapOp::Copy : MapOp::Cast;
      fill.n = Y.numElements();
      fill.in[0] = operand(B, indexer({d->n, d->m, p}, {0, 1, 0}));
      fill.out = Y.data;
      fill.outElem = *elemOf(Y.dtype);
      fill.outAt = contiguous({d->n, d->m, p});
      steps.push_back(fill);
    }
    steps.push_back(im2col(*d, X, *cols, perImage, p));
    TensorRef colsRef{X.dtype, {}, *cols};
    for (int64_t g = 0; g < d->groups; ++g) {
      GemmStep s = gemm(false, false, d->mg, p, d->rows,
                        at(W, g * d->mg * d->rows), d->rows,
                        at(colsRef, g * d->rows * p), p,
                        at(Y, g * d->mg * p).data, *elemOf(Y.dtype), p, 1.0f,
                        bias ? 1.0f : 0.0f);
      s.batch = d->n;
      s.strideB = perImage;
      s.strideC = d->m * p;
      steps.push_back(s);
    }
    return steps;
  }
  if (call.op == OpKind::ConvGradData) { // dY, W -> dX
    const TensorRef &dY = call.inputs[0], &W = call.inputs[1],
                    &dX = call.outputs[0];
    auto d = convDims(call, dX, W, dY);
    if (!d)
      return d.takeError();
    if (dY.dtype != W.dtype)
      return fail(call, "the gradient and the filter operands must have one "
                        "element type");
    int64_t p = d->w.outSize, perImage = d->c * d->w.kernelSize * p;
    auto cols = scratchBlock(call, scratch, size_t(d->n * perImage) * 4);
    if (!cols)
      return cols.takeError();
    float *col = reinterpret_cast<float *>(*cols);
    for (int64_t g = 0; g < d->groups; ++g) {
      GemmStep s = gemm(true, false, d->rows, p, d->mg,
                        at(W, g * d->mg * d->rows), d->rows,
                        at(dY, g * d->mg * p), p, col + g * d->rows * p,
                        Elem::F32, p);
      s.batch = d->n;
      s.strideB = d->m * p;
      s.strideC = perImage;
      steps.push_back(s);
    }
    Im2colStep c2i;
    c2i.adjoint = true;
    c2i.w = d->w;
    c2i.images = d->n;
    c2i.channels = d->c;
    c2i.imageStride = perImage;
    c2i.rowStride = p;
    c2i.in = col;
    c2i.inElem = Elem::F32;
    c2i.out = dX.data;
    c2i.outElem = *elemOf(dX.dtype);
    steps.push_back(c2i);
    return steps;
  }
  // ConvGradFilter: X, dY -> dW
  const TensorRef &X = call.inputs[0], &dY = call.inputs[1],
                  &dW = call.outputs[0];
  auto d = convDims(call, X, dW, dY);
  if (!d)
    return d.takeError();
  if (dY.dtype != X.dtype)
    return fail(call, "the image and the gradient operands must have one "
                      "element type");
  int64_t p = d->w.outSize, np = d->n * p;
  size_t size = ir::dtypeSize(X.dtype);
  size_t colBytes = (size_t(d->c * d->w.kernelSize * np) * size + 63) / 64 * 64;
  auto block =
      scratchBlock(call, scratch, colBytes + size_t(d->m * np) * size);
  if (!block)
    return block.takeError();
  TensorRef cols{X.dtype, {}, *block}, dYt{dY.dtype, {}, *block + colBytes};
  steps.push_back(im2col(*d, X, cols.data, p, np));
  steps.push_back(copy(dY, indexer({d->m, d->n, p}, {p, d->m * p, 1}),
                       dYt.data, contiguous({d->m, d->n, p}), d->m * np));
  GemmStep s = gemm(false, true, d->mg, d->rows, np, dYt, np, cols, np,
                    dW.data, *elemOf(dW.dtype), d->rows);
  s.batch = d->groups;
  s.strideA = d->mg * np;
  s.strideB = d->rows * np;
  s.strideC = d->mg * d->rows;
  steps.push_back(s);
  return steps;
}

} // namespace cleave::runtime::cuda
