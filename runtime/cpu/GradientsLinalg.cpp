// Gradient kernels of MatMul and Gemm for the CPU backend: MatMulGradA,
// MatMulGradB, MatMulGrad, GemmGradA, GemmGradB, GemmGrad. Every product is
// an OpenBLAS GEMM with transposes (Blas.h); nothing is transposed in memory.
//
// MatMul broadcasts batch dims, so the gradient of an operand that was
// broadcast sums the products of every output batch entry that read it.
// Each gradient matrix is written by one thread, which adds its products in
// increasing batch order, so the sums do not depend on the thread count.
// The combined ops run the two part kernels (addCombinedGradients), so their
// results are the split form's bits.
#include "runtime/MatMulLayout.h"
#include "runtime/cpu/Blas.h"
#include "runtime/cpu/CpuKernels.h"

#include <algorithm>
#include <climits>

namespace cleave::runtime::cpu {
namespace {

// --- MatMul ----------------------------------------------------------------

// The batch layout (runtime/MatMulLayout.h), with the op's name in errors
// and the BLAS size limits checked.
llvm::Expected<MatMulLayout> matMulLayout(const KernelCall &call,
                                          llvm::ArrayRef<int64_t> a,
                                          llvm::ArrayRef<int64_t> b,
                                          llvm::ArrayRef<int64_t> y) {
  auto l = runtime::matMulLayout(a, b, y);
  if (!l)
    return kernelError(call, "{0}", llvm::toString(l.takeError()));
  if (!fitsBlas({l->count * l->m, l->n, l->k, l->count * l->k}))
    return kernelError(call, "operands {0} x {1} are too large for BLAS",
                       ir::shapeStr(a), ir::shapeStr(b));
  return l;
}

// For every target matrix t in [0, targets), runs product(e, beta) for the
// output batch entries e with target[e] == t in increasing order: beta 0
// for the first, 1 after, so the products sum into the target. Targets no
// entry reads (an empty output batch) are set to zero by `zero`.
template <typename T, typename Product, typename Zero>
void sumProducts(int64_t targets, const std::vector<int64_t> &target,
                 int64_t work, Product product, Zero zero) {
  std::vector<std::vector<int64_t>> entries(targets);
  for (int64_t e = 0; e < int64_t(target.size()); ++e)
    entries[target[e]].push_back(e);
  auto one = [&](int64_t t) {
    if (entries[t].empty())
      zero(t);
    for (size_t i = 0; i < entries[t].size(); ++i)
      product(entries[t][i], i == 0 ? T(0) : T(1));
  };
  if (batchOverThreads(targets, work))
    parallelFor(targets, std::max<int64_t>(1, kSmallGemmWork / (work + 1)),
                [&](int64_t t0, int64_t t1) {
                  SerialGemmScope serial;
                  for (int64_t t = t0; t < t1; ++t)
                    one(t);
                });
  else
    for (int64_t t = 0; t < targets; ++t)
      one(t);
}

// MatMulGradA(dY, B) -> dA = SumTo(dY x B^T) over A's broadcast batch dims.
template <typename T> llvm::Error matMulGradA(const KernelCall &call) {
  const TensorRef &dY = call.inputs[0], &B = call.inputs[1],
                  &dA = call.outputs[0];
  auto l = matMulLayout(call, dA.shape, B.shape, dY.shape);
  if (!l)
    return l.takeError();
  int64_t m = l->m, k = l->k, n = l->n;
  const T *dy = dY.as<T>(), *b = B.as<T>();
  T *da = dA.as<T>();
  // One B for the whole batch and no broadcast A: the batch folds into M.
  if (l->countB == 1 && l->countA == l->count) {
    parallelGemm<T>(false, true, l->count * m, k, n, T(1), dy, n, b, n, T(0),
                    da, k);
    return llvm::Error::success();
  }
  sumProducts<T>(
      l->countA, l->matA, m * n * k,
      [&](int64_t e, T beta) {
        parallelGemm<T>(false, true, m, k, n, T(1), dy + e * m * n, n,
                b + l->matB[e] * k * n, n, beta, da + l->matA[e] * m * k, k);
      },
      [&](int64_t t) { std::fill_n(da + t * m * k, m * k, T(0)); });
  return llvm::Error::success();
}

// MatMulGradB(A, dY) -> dB = SumTo(A^T x dY) over B's broadcast batch dims.
template <typename T> llvm::Error matMulGradB(const KernelCall &call) {
  const TensorRef &A = call.inputs[0], &dY = call.inputs[1],
                  &dB = call.outputs[0];
  auto l = matMulLayout(call, A.shape, dB.shape, dY.shape);
  if (!l)
    return l.takeError();
  int64_t m = l->m, k = l->k, n = l->n;
  const T *a = A.as<T>(), *dy = dY.as<T>();
  T *db = dB.as<T>();
  // One B for the whole batch and no broadcast A: the batch folds into the
  // GEMM's inner dimension ([batch*m, k]^T x [batch*m, n]).
  if (l->countB == 1 && l->countA == l->count) {
    parallelGemm<T>(true, false, k, n, l->count * m, T(1), a, k, dy, n, T(0),
                    db, n);
    return llvm::Error::success();
  }
  sumProducts<T>(
      l->countB, l->matB, m * n * k,
      [&](int64_t e, T beta) {
        parallelGemm<T>(true, false, k, n, m, T(1), a + l->matA[e] * m * k, k,
                dy + e * m * n, n, beta, db + l->matB[e] * k * n, n);
      },
      [&](int64_t t) { std::fill_n(db + t * k * n, k * n, T(0)); });
  return llvm::Error::success();
}

// --- Gemm -----------------------------------------------------------------

// Y[m, n] = alpha * op(A)[m, k] * op(B)[k, n] (+ beta * C, whose gradient
// is a plain reduction the autodiff pass emits).
struct GemmDims {
  int64_t m, n, k;
};

llvm::Expected<GemmDims> gemmDims(const KernelCall &call,
                                  llvm::ArrayRef<int64_t> a,
                                  llvm::ArrayRef<int64_t> b,
                                  llvm::ArrayRef<int64_t> y) {
  bool ta = call.getInt("transA"), tb = call.getInt("transB");
  if (a.size() != 2 || b.size() != 2 || y.size() != 2 ||
      a[ta ? 0 : 1] != b[tb ? 1 : 0] || y[0] != a[ta ? 1 : 0] ||
      y[1] != b[tb ? 0 : 1])
    return kernelError(call,
                       "operands {0} x {1} (transA {2}, transB {3}) do not "
                       "give the gradient {4}",
                       ir::shapeStr(a), ir::shapeStr(b), int(ta), int(tb),
                       ir::shapeStr(y));
  GemmDims d{y[0], y[1], a[ta ? 0 : 1]};
  if (!fitsBlas({d.m, d.n, d.k}))
    return kernelError(call, "operands {0} x {1} are too large for BLAS",
                       ir::shapeStr(a), ir::shapeStr(b));
  return d;
}

// GemmGradA(dY, B) -> d op(A) = alpha * dY * op(B)^T, transposed back into
// dA when transA.
template <typename T> llvm::Error gemmGradA(const KernelCall &call) {
  const TensorRef &dY = call.inputs[0], &B = call.inputs[1],
                  &dA = call.outputs[0];
  auto d = gemmDims(call, dA.shape, B.shape, dY.shape);
  if (!d)
    return d.takeError();
  bool ta = call.getInt("transA"), tb = call.getInt("transB");
  T alpha = T(call.getFloat("alpha"));
  const T *dy = dY.as<T>(), *b = B.as<T>();
  T *da = dA.as<T>();
  if (ta) // dA[k, m] = alpha * op(B) * dY^T
    parallelGemm<T>(tb, true, d->k, d->m, d->n, alpha, b, B.shape[1], dy, d->n,
                    T(0), da, d->m);
  else // dA[m, k] = alpha * dY * op(B)^T
    parallelGemm<T>(false, !tb, d->m, d->k, d->n, alpha, dy, d->n, b,
                    B.shape[1], T(0), da, d->k);
  return llvm::Error::success();
}

// GemmGradB(A, dY) -> d op(B) = alpha * op(A)^T * dY, transposed back into
// dB when transB.
template <typename T> llvm::Error gemmGradB(const KernelCall &call) {
  const TensorRef &A = call.inputs[0], &dY = call.inputs[1],
                  &dB = call.outputs[0];
  auto d = gemmDims(call, A.shape, dB.shape, dY.shape);
  if (!d)
    return d.takeError();
  bool ta = call.getInt("transA"), tb = call.getInt("transB");
  T alpha = T(call.getFloat("alpha"));
  const T *a = A.as<T>(), *dy = dY.as<T>();
  T *db = dB.as<T>();
  if (tb) // dB[n, k] = alpha * dY^T * op(A)
    parallelGemm<T>(true, ta, d->n, d->k, d->m, alpha, dy, d->n, a, A.shape[1],
                    T(0), db, d->k);
  else // dB[k, n] = alpha * op(A)^T * dY
    parallelGemm<T>(!ta, false, d->k, d->n, d->m, alpha, a, A.shape[1], dy,
                    d->n, T(0), db, d->n);
  return llvm::Error::success();
}

CLEAVE_FLOAT_DISPATCH(matMulGradAKernel, matMulGradA)
CLEAVE_FLOAT_DISPATCH(matMulGradBKernel, matMulGradB)
CLEAVE_FLOAT_DISPATCH(gemmGradAKernel, gemmGradA)
CLEAVE_FLOAT_DISPATCH(gemmGradBKernel, gemmGradB)

} // namespace

void registerLinalgGradientKernels(KernelTable &t) {
  using ir::OpKind;
  // The parts of MatMulGrad(dY, A, B) -> dA, dB and of GemmGrad; the
  // combined ops run them (addCombinedGradients).
  t.add(OpKind::MatMulGradA, matMulGradAKernel, kFloatTypes);
  t.add(OpKind::MatMulGradB, matMulGradBKernel, kFloatTypes);
  t.add(OpKind::GemmGradA, gemmGradAKernel, kFloatTypes);
  t.add(OpKind::GemmGradB, gemmGradBKernel, kFloatTypes);
}

} // namespace cleave::runtime::cpu
