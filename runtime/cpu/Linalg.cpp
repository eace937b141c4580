// Matrix products for the CPU backend: MatMul (NumPy semantics) and Gemm.
//
// f32 and f64 go to OpenBLAS. Every batch entry of a MatMul operand is
// already a dense row-major matrix inside that operand, so broadcast batches
// are handled by pointing GEMM at the right block: nothing is copied. When B
// has no batch and A's batch covers the whole output batch ([B,T,K]x[K,N]),
// A's batch folds into M and the product is a single GEMM. Integer types use
// a plain loop with a 64-bit accumulator.
#include "runtime/cpu/CpuKernels.h"

#include "llvm/ADT/SmallVector.h"

#include <algorithm>
#include "runtime/cpu/Blas.h"
#include <climits>
#include <type_traits>

namespace cleave::runtime::cpu {
namespace {

// Row-major C = alpha * op(A) * op(B) + beta * C.
template <typename T>
void anyGemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, double alpha,
             const T *a, int64_t lda, const T *b, int64_t ldb, double beta,
             T *c, int64_t ldc, const GemmBlockPrologue *prepare = nullptr) {
  if constexpr (std::is_same_v<T, float> || std::is_same_v<T, double>)
    parallelGemm<T>(ta, tb, m, n, k, T(alpha), a, lda, b, ldb, T(beta), c,
                    ldc, prepare);
  else {
    if (prepare)
      (*prepare)(0, m, 0, n);
    // Integers: exact when alpha is 1 and beta is 0 or 1 (MatMul always).
    bool exact = alpha == 1.0 && (beta == 0.0 || beta == 1.0);
    parallelFor(m, std::max<int64_t>(1, 4096 / std::max<int64_t>(1, n * k)),
                [&](int64_t r0, int64_t r1) {
                  for (int64_t i = r0; i < r1; ++i)
                    for (int64_t j = 0; j < n; ++j) {
                      int64_t acc = 0;
                      for (int64_t p = 0; p < k; ++p)
                        acc += int64_t(ta ? a[p * lda + i] : a[i * lda + p]) *
                               int64_t(tb ? b[j * ldb + p] : b[p * ldb + j]);
                      T &out = c[i * ldc + j];
                      if (exact)
                        out = T(acc + (beta == 1.0 ? int64_t(out) : 0));
                      else
                        out = T(alpha * double(acc) + beta * double(out));
                    }
                });
  }
}

template <typename T> llvm::Error matMul(const KernelCall &call) {
  const TensorRef &A = call.inputs[0], &B = call.inputs[1];
  const TensorRef &Y = call.outputs[0];
  // 1-D operands are promoted to [1,K] and [K,1]; the layout is unchanged.
  llvm::SmallVector<int64_t, 6> a(A.shape.begin(), A.shape.end()),
      b(B.shape.begin(), B.shape.end());
  if (a.size() == 1)
    a.insert(a.begin(), 1);
  if (b.size() == 1)
    b.push_back(1);
  int64_t m = a[a.size() - 2], k = a.back(), n = b.back();
  size_t ra = a.size() - 2, rb = b.size() - 2, r = std::max(ra, rb);

  // Output batch dims and, per dim, each operand's stride in matrices (0
  // where the operand broadcasts).
  llvm::SmallVector<int64_t, 4> batch(r), strideA(r, 0), strideB(r, 0);
  int64_t countA = 1, countB = 1;
  for (size_t i = r; i-- > 0;) {
    int64_t da = i >= r - ra ? a[i - (r - ra)] : 1;
    int64_t db = i >= r - rb ? b[i - (r - rb)] : 1;
    batch[i] = std::max(da, db);
    if (da != 1)
      strideA[i] = countA;
    if (db != 1)
      strideB[i] = countB;
    countA *= da;
    countB *= db;
  }
  int64_t count = 1;
  for (int64_t d : batch)
    count *= d;

  T *y = Y.as<T>();
  const T *pa = A.as<T>(), *pb = B.as<T>();
  if (count == 0 || m == 0 || n == 0)
    return llvm::Error::success();
  if (k == 0) {
    std::fill(y, y + count * m * n, T(0));
    return llvm::Error::success();
  }
  if (!fitsBlas({count * m, n, k}))
    return kernelError(call, "operands {0} x {1} are too large for BLAS",
                       ir::shapeStr(A.shape), ir::shapeStr(B.shape));

  if (countB == 1 && countA == count) {
    anyGemm<T>(false, false, count * m, n, k, 1.0, pa, k, pb, n, 0.0, y, n);
    return llvm::Error::success();
  }
  auto one = [&](int64_t i) {
    int64_t offA = 0, offB = 0, rest = i;
    for (size_t d = r; d-- > 0;) {
      int64_t c = rest % batch[d];
      rest /= batch[d];
      offA += c * strideA[d];
      offB += c * strideB[d];
    }
    anyGemm<T>(false, false, m, n, k, 1.0, pa + offA * m * k, k,
               pb + offB * k * n, n, 0.0, y + i * m * n, n);
  };
  if (batchOverThreads(count, m * n * k))
    parallelFor(count, std::max<int64_t>(1, kSmallGemmWork / (m * n * k)),
                [&](int64_t b0, int64_t b1) {
                  SerialGemmScope serial;
                  for (int64_t i = b0; i < b1; ++i)
                    one(i);
                });
  else
    for (int64_t i = 0; i < count; ++i)
      one(i);
  return llvm::Error::success();
}

template <typename T> llvm::Error gemmOp(const KernelCall &call) {
  const TensorRef &A = call.inputs[0], &B = call.inputs[1];
  const TensorRef &Y = call.outputs[0];
  bool ta = call.getInt("transA"), tb = call.getInt("transB");
  int64_t m = Y.shape[0], n = Y.shape[1], k = ta ? A.shape[0] : A.shape[1];
  double alpha = call.getFloat("alpha"), beta = call.getFloat("beta");
  T *y = Y.as<T>();
  if (m == 0 || n == 0)
    return llvm::Error::success();
  if (!fitsBlas({m, n, k, A.shape[1], B.shape[1]}))
    return kernelError(call, "operands {0} x {1} are too large for BLAS",
                       ir::shapeStr(A.shape), ir::shapeStr(B.shape));

  // Y starts as C broadcast to [M, N] (C is [], [N], [1,N], [M,1] or [M,N]);
  // without C, or with beta 0, it starts at zero and C is not read.
  bool useC = call.inputs.size() == 3 && beta != 0.0;
  // C's block of Y, copied (not summed: no bits depend on the blocks) by
  // the thread that multiplies into it, right before its product.
  GemmBlockPrologue broadcastC;
  if (useC) {
    const TensorRef &C = call.inputs[2];
    int64_t cm = C.rank() == 2 ? C.shape[0] : 1;
    int64_t cn = C.rank() >= 1 ? C.shape.back() : 1;
    const T *c = C.as<T>();
    broadcastC = [=](int64_t r0, int64_t r1, int64_t c0, int64_t c1) {
      for (int64_t i = r0; i < r1; ++i) {
        const T *ci = c + (cm == 1 ? 0 : i) * cn;
        T *yi = y + i * n;
        if (cn == 1)
          std::fill(yi + c0, yi + c1, ci[0]);
        else
          std::copy(ci + c0, ci + c1, yi + c0);
      }
    };
  }
  // Without C the product writes every element (BLAS's beta 0 reads
  // nothing of Y), so Y is not cleared first: that was a serial pass over
  // the output before every bias-free Gemm.
  if (k == 0) {
    if (useC)
      broadcastC(0, m, 0, n);
    for (int64_t i = 0; i < m * n; ++i)
      y[i] = useC ? T(beta * double(y[i])) : T(0);
    return llvm::Error::success();
  }
  anyGemm<T>(ta, tb, m, n, k, alpha, A.as<T>(), A.shape[1], B.as<T>(),
             B.shape[1], useC ? beta : 0.0, y, n, useC ? &broadcastC : nullptr);
  return llvm::Error::success();
}

llvm::Error matMulKernel(const KernelCall &call) {
  return dispatchType(call.inputs[0].dtype,
                      [&](auto v) { return matMul<decltype(v)>(call); });
}

llvm::Error gemmKernel(const KernelCall &call) {
  return dispatchType(call.inputs[0].dtype,
                      [&](auto v) { return gemmOp<decltype(v)>(call); });
}

} // namespace

void registerLinalgKernels(KernelTable &t) {
  // Registration limits the element types to kNumericTypes; dispatchType
  // also instantiates bool, which is never called.
  t.add(ir::OpKind::MatMul, matMulKernel, kNumericTypes);
  t.add(ir::OpKind::Gemm, gemmKernel, kNumericTypes);
}

} // namespace cleave::runtime::cpu
