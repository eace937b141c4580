// OpenBLAS, loaded at run time.
//
// OpenBLAS picks its GEMM kernels for the CPU when the library is loaded.
// Versions that do not know a CPU model (0.3.21 on current Xeons) fall back
// to SSE3 ("Prescott") kernels, about half the speed on the same machine.
// Loading the library ourselves lets the backend set OPENBLAS_CORETYPE first
// (SkylakeX on AVX-512 CPUs, Haswell on AVX2 ones) unless the user set it.
#pragma once

#include <cblas.h>

#include <algorithm>
#include <climits>
#include <cstdint>
#include <functional>
#include <initializer_list>

namespace cleave::runtime::cpu {

struct Blas {
  decltype(&cblas_sgemm) sgemm;
  decltype(&cblas_dgemm) dgemm;
  void (*setThreads)(int);
  char *(*coreName)();
};

// Loads OpenBLAS on first use; exits with one error line if it is missing.
const Blas &blas();

// The library the f32 GEMMs run on: OpenBLAS or oneDNN's sgemm (libdnnl,
// loaded at run time). CLEAVE_GEMM chooses (openblas, onednn or auto, the
// default); auto is oneDNN on CPUs with AVX-512 where libdnnl loads, whose
// JIT kernels ran at 1.6 to 2x OpenBLAS's forced-Haswell ones there, and
// OpenBLAS elsewhere (docs/benchmarks.md, "GEMM libraries"). A bad value,
// or onednn without libdnnl, is one error line and exit 1. Either way each
// call runs on the calling thread over a block fixed by the shape, so the
// bits do not depend on the thread count; they do depend on the library.
// On CPUs without AVX-512, products with a transposed A stay on OpenBLAS
// (oneDNN ran them at half its rate there).
enum class GemmLibrary { OpenBlas, OneDnn };
GemmLibrary gemmLibrary();
// What CLEAVE_GEMM (or auto) chose, whatever setGemmLibrary did since.
GemmLibrary defaultGemmLibrary();
// False (and no change) when oneDNN is asked for and cannot be loaded.
bool setGemmLibrary(GemmLibrary library);
// "openblas" or "onednn" (CLEAVE_GEMM's values).
const char *gemmLibraryName(GemmLibrary library);

// Row-major C = alpha * op(A) * op(B) + beta * C for float or double, on the
// calling thread: for kernels that already spread their work over the pool.
template <typename T>
void gemm(bool transA, bool transB, int64_t m, int64_t n, int64_t k, T alpha,
          const T *a, int64_t lda, const T *b, int64_t ldb, T beta, T *c,
          int64_t ldc);

// The same product split into row or column blocks over the backend's
// thread pool. OpenBLAS itself runs single-threaded: its idle threads yield
// in a loop, and on two cores they took the time the pool's threads needed
// for im2col and the elementwise work around each GEMM. An empty product
// (m or n 0) does nothing, and an empty sum (k 0) leaves beta * C, 0 for
// beta 0, without calling OpenBLAS (which rejects a k-0 operand's leading
// dimension).
// `prepare`, when given, is called with each block of C (rows [r0, r1),
// columns [c0, c1)) on the thread that then multiplies into it, right
// before its BLAS call: Gemm writes its bias rows there, so that the
// product reads them from the core's cache (a separate pass over all of C
// first left it in memory, 2.9% of a BERT step).
using GemmBlockPrologue =
    std::function<void(int64_t r0, int64_t r1, int64_t c0, int64_t c1)>;
template <typename T>
void parallelGemm(bool transA, bool transB, int64_t m, int64_t n, int64_t k,
                  T alpha, const T *a, int64_t lda, const T *b, int64_t ldb,
                  T beta, T *c, int64_t ldc,
                  const GemmBlockPrologue *prepare = nullptr);

// Below this many multiply-adds parallelGemm does not split a GEMM well
// (it keeps one under 2^18 on one thread), so kernels that run many such
// products spread the products over threads instead.
constexpr int64_t kSmallGemmWork = int64_t(1) << 18;

// Whether `count` products of `work` multiply-adds each run one product per
// task, each one BLAS call, rather than one after another, each split over
// the threads: small products always; mid-size ones when there are many
// (attention's per-head 128 x 128 x 64 products ran at half the big GEMMs'
// rate split into 64-row halves, a parallel region each). Shapes decide,
// never the thread count, so the bits stay the same on any number of
// threads.
constexpr int64_t kBatchedGemmWork = int64_t(1) << 22;
inline bool batchOverThreads(int64_t count, int64_t work) {
  return work <= kSmallGemmWork || (count >= 8 && work <= kBatchedGemmWork);
}

// While one is alive on a thread, parallelGemm on that thread is one BLAS
// call: for the tasks of a batch spread over the pool (batchOverThreads).
class SerialGemmScope {
public:
  SerialGemmScope();
  ~SerialGemmScope();
  SerialGemmScope(const SerialGemmScope &) = delete;
  SerialGemmScope &operator=(const SerialGemmScope &) = delete;

private:
  bool previous_;
};

// libdnnl (libdnnl.so.2, else libdnnl.so), opened once for the GEMMs here
// and the convolutions (ConvOneDnn.h); null where it is not installed.
void *oneDnnLibrary();
// Sets oneDNN's OpenMP limit to 1 on the calling thread, once per thread: a
// oneDNN call made there plans for one thread and never starts a team of
// its own inside the pool. False (and nothing set) where libdnnl or its
// OpenMP runtime's omp_set_num_threads cannot be found: oneDNN is then not
// used at all.
bool oneDnnOneThreadHere();
// Whether the CPU has oneDNN's avx512_core level (AVX-512 F, DQ, BW and
// VL), where its JIT kernels use AVX-512 whatever OPENBLAS_CORETYPE says.
bool cpuHasAvx512Core();

// OpenBLAS's CBLAS interface takes 32-bit sizes.
inline bool fitsBlas(std::initializer_list<int64_t> dims) {
  return std::all_of(dims.begin(), dims.end(),
                     [](int64_t d) { return d <= INT_MAX; });
}

} // namespace cleave::runtime::cpu
