#include "runtime/cpu/Blas.h"

#include "runtime/cpu/CpuKernels.h"

#include <cstdio>
#include <cstdlib>
#include <dlfcn.h>

#include <atomic>
#include <string_view>

namespace cleave::runtime::cpu {

// The kernel family to ask OpenBLAS for, from the CPU's features.
static const char *coreTypeForThisCpu() {
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512dq") &&
      __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl"))
    return "SkylakeX";
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"))
    return "Haswell";
  return nullptr;
}

static Blas load() {
  if (!std::getenv("OPENBLAS_CORETYPE"))
    if (const char *core = coreTypeForThisCpu())
      setenv("OPENBLAS_CORETYPE", core, 0);
  // Every GEMM runs single-threaded inside the pool's tasks (Blas.h), so
  // OpenBLAS needs no threads of its own; started, they wake and yield
  // the CPU around calls (about 1% of a 2-thread ResNet step).
  setenv("OPENBLAS_NUM_THREADS", "1", 1);
  void *lib = dlopen("libopenblas.so.0", RTLD_NOW | RTLD_LOCAL);
  if (!lib)
    lib = dlopen("libopenblas.so", RTLD_NOW | RTLD_LOCAL);
  auto sym = [&](const char *name) {
    void *p = lib ? dlsym(lib, name) : nullptr;
    if (!p) {
      std::fprintf(stderr,
                   "cleave: error: cannot load OpenBLAS (%s); install the "
                   "Debian package libopenblas0\n",
                   lib ? name : dlerror());
      std::exit(1);
    }
    return p;
  };
  Blas b;
  b.sgemm = reinterpret_cast<decltype(b.sgemm)>(sym("cblas_sgemm"));
  b.dgemm = reinterpret_cast<decltype(b.dgemm)>(sym("cblas_dgemm"));
  b.setThreads =
      reinterpret_cast<decltype(b.setThreads)>(sym("openblas_set_num_threads"));
  b.coreName =
      reinterpret_cast<decltype(b.coreName)>(sym("openblas_get_corename"));
  return b;
}

const Blas &blas() {
  static const Blas b = load();
  return b;
}

void *oneDnnLibrary() {
  static void *const lib = [] {
    void *l = dlopen("libdnnl.so.2", RTLD_NOW | RTLD_LOCAL);
    return l ? l : dlopen("libdnnl.so", RTLD_NOW | RTLD_LOCAL);
  }();
  return lib;
}

// omp_set_num_threads of the OpenMP runtime libdnnl was linked with.
using SetOmpThreads = void (*)(int);
static SetOmpThreads ompSetThreads() {
  static const SetOmpThreads set =
      oneDnnLibrary() ? reinterpret_cast<SetOmpThreads>(
                            dlsym(oneDnnLibrary(), "omp_set_num_threads"))
                      : nullptr;
  return set;
}

bool oneDnnOneThreadHere() {
  static thread_local bool set = false;
  if (!set && ompSetThreads()) {
    ompSetThreads()(1);
    set = true;
  }
  return set;
}

bool cpuHasAvx512Core() {
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx512f") &&
         __builtin_cpu_supports("avx512dq") &&
         __builtin_cpu_supports("avx512bw") &&
         __builtin_cpu_supports("avx512vl");
}

// oneDNN's row-major sgemm; null where libdnnl (with the OpenMP call that
// keeps it on the calling thread) cannot be loaded.
using OneDnnSgemm = int (*)(char, char, int64_t, int64_t, int64_t, float,
                            const float *, int64_t, const float *, int64_t,
                            float, float *, int64_t);
static OneDnnSgemm oneDnnSgemmFn() {
  static const OneDnnSgemm fn =
      oneDnnLibrary() && ompSetThreads()
          ? reinterpret_cast<OneDnnSgemm>(dlsym(oneDnnLibrary(), "dnnl_sgemm"))
          : nullptr;
  return fn;
}

const char *gemmLibraryName(GemmLibrary library) {
  return library == GemmLibrary::OneDnn ? "onednn" : "openblas";
}

static GemmLibrary defaultLibrary() {
  const char *env = std::getenv("CLEAVE_GEMM");
  std::string_view want = env ? env : "auto";
  if (want == "openblas")
    return GemmLibrary::OpenBlas;
  if (want == "onednn") {
    if (oneDnnSgemmFn())
      return GemmLibrary::OneDnn;
    std::fprintf(stderr, "cleave: error: CLEAVE_GEMM=onednn, but libdnnl.so.2 "
                         "cannot be loaded; install the Debian package "
                         "libdnnl2 or unset CLEAVE_GEMM\n");
    std::exit(1);
  }
  if (want != "auto") {
    std::fprintf(stderr,
                 "cleave: error: CLEAVE_GEMM=%s: expected openblas, onednn "
                 "or auto\n",
                 env);
    std::exit(1);
  }
  return cpuHasAvx512Core() && oneDnnSgemmFn() ? GemmLibrary::OneDnn
                                               : GemmLibrary::OpenBlas;
}

GemmLibrary defaultGemmLibrary() {
  static const GemmLibrary library = defaultLibrary();
  return library;
}

static std::atomic<GemmLibrary> &chosenLibrary() {
  static std::atomic<GemmLibrary> chosen = defaultGemmLibrary();
  return chosen;
}

GemmLibrary gemmLibrary() { return chosenLibrary().load(); }

bool setGemmLibrary(GemmLibrary library) {
  if (library == GemmLibrary::OneDnn && !oneDnnSgemmFn())
    return false;
  chosenLibrary().store(library);
  return true;
}

// oneDNN's sgemm on the calling thread.
static void oneDnnSgemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k,
                        float alpha, const float *a, int64_t lda,
                        const float *b, int64_t ldb, float beta, float *c,
                        int64_t ldc) {
  oneDnnOneThreadHere();
  oneDnnSgemmFn()(ta ? 'T' : 'N', tb ? 'T' : 'N', m, n, k, alpha, a, lda, b,
                  ldb, beta, c, ldc);
}

template <typename T>
void gemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, T alpha,
          const T *a, int64_t lda, const T *b, int64_t ldb, T beta, T *c,
          int64_t ldc) {
  auto opA = ta ? CblasTrans : CblasNoTrans,
       opB = tb ? CblasTrans : CblasNoTrans;
  if constexpr (std::is_same_v<T, float>) {
    // On an AVX2 CPU oneDNN's sgemm with a transposed A ran at half
    // OpenBLAS's rate (docs/benchmarks.md), so there those stay on
    // OpenBLAS; with AVX-512 it ran at 1.6x OpenBLAS's Haswell kernels.
    static const bool oneDnnTakesTransposedA = cpuHasAvx512Core();
    if ((!ta || oneDnnTakesTransposedA) &&
        gemmLibrary() == GemmLibrary::OneDnn) {
      oneDnnSgemm(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
      return;
    }
    blas().sgemm(CblasRowMajor, opA, opB, int(m), int(n), int(k), alpha, a,
                 int(lda), b, int(ldb), beta, c, int(ldc));
  } else
    blas().dgemm(CblasRowMajor, opA, opB, int(m), int(n), int(k), alpha, a,
                 int(lda), b, int(ldb), beta, c, int(ldc));
}

static thread_local bool serialGemm = false;

SerialGemmScope::SerialGemmScope() : previous_(serialGemm) {
  serialGemm = true;
}
SerialGemmScope::~SerialGemmScope() { serialGemm = previous_; }

template <typename T>
void parallelGemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, T alpha,
                  const T *a, int64_t lda, const T *b, int64_t ldb, T beta,
                  T *c, int64_t ldc, const GemmBlockPrologue *prepare) {
  if (m == 0 || n == 0)
    return;
  if (k == 0) {
    if (prepare)
      (*prepare)(0, m, 0, n);
    for (int64_t i = 0; i < m; ++i)
      for (int64_t j = 0; j < n; ++j)
        c[i * ldc + j] = beta == T(0) ? T(0) : beta * c[i * ldc + j];
    return;
  }
  // Blocks of at least this many multiply-adds are worth a thread.
  const int64_t minWork = int64_t(1) << 17;
  if (serialGemm || m * n * std::max<int64_t>(k, 1) < 2 * minWork) {
    if (prepare)
      (*prepare)(0, m, 0, n);
    gemm(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
    return;
  }
  // The product is cut into blocks of rows (or columns) whose size depends
  // only on the shape, never on the thread count, and each block is one
  // BLAS call: BLAS kernels round edge tiles differently from full ones, so
  // cuts that moved with the threads would move the bits too. Each block
  // packs the other operand again and costs its call's fixed share, so a
  // block gets at least about kBlockWork multiply-adds and, where the cut
  // dimension allows, kMinBlock rows (or columns): on one thread OpenBLAS
  // ran 32-row blocks of a 512^3 product at 77% of one call's rate, 128-row
  // ones at 94%; on 2 threads the transformers' 1024-row products ran 5 to
  // 8% faster in four blocks of 256 rows than in eight of 128 (each block
  // packs all of the other operand), and their steps 3 to 7% faster
  // (docs/benchmarks.md, 2026-12-08). A power of two of blocks (at most
  // kMaxBlocks, at least 2), so that 2, 4 or 8 threads get equal shares.
  // Each block is a task of its own (parallelTasks), taken by the next
  // free thread.
  constexpr int64_t kBlockWork = int64_t(1) << 20, kMaxBlocks = 16,
                    kMinBlock = 256;
  // Row blocks split the rows as evenly as whole rows allow (ViT's 1040 rows in 4 blocks of 260:
  // rounded up to 16, 272, 272, 272 and 224 left one thread of two idle
  // for a twelfth of the product, and the products ran 4 to 8% slower);
  // column blocks start on a 64-byte line, so that no line of C is
  // written by two threads.
  auto blockOf = [&](int64_t length, int64_t round) {
    int64_t want = 2;
    while (want < kMaxBlocks && 2 * want * kBlockWork <= m * n * k &&
           2 * want * kMinBlock <= length)
      want *= 2;
    int64_t b = (length + want - 1) / want;
    return (b + round - 1) / round * round;
  };
  if (m >= n) {
    int64_t block = blockOf(m, 1), blocks = (m + block - 1) / block;
    parallelTasks(blocks, [&](int64_t bi) {
      int64_t r0 = bi * block, r1 = std::min(m, r0 + block);
      if (prepare)
        (*prepare)(r0, r1, 0, n);
      gemm(ta, tb, r1 - r0, n, k, alpha, ta ? a + r0 : a + r0 * lda, lda, b,
           ldb, beta, c + r0 * ldc, ldc);
    });
  } else {
    int64_t block = blockOf(n, 16), blocks = (n + block - 1) / block;
    parallelTasks(blocks, [&](int64_t bi) {
      int64_t c0 = bi * block, c1 = std::min(n, c0 + block);
      if (prepare)
        (*prepare)(0, m, c0, c1);
      gemm(ta, tb, m, c1 - c0, k, alpha, a, lda, tb ? b + c0 * ldb : b + c0,
           ldb, beta, c + c0, ldc);
    });
  }
}

template void gemm<float>(bool, bool, int64_t, int64_t, int64_t, float,
                          const float *, int64_t, const float *, int64_t, float,
                          float *, int64_t);
template void gemm<double>(bool, bool, int64_t, int64_t, int64_t, double,
                           const double *, int64_t, const double *, int64_t,
                           double, double *, int64_t);
template void parallelGemm<float>(bool, bool, int64_t, int64_t, int64_t, float,
                                  const float *, int64_t, const float *,
                                  int64_t, float, float *, int64_t,
                                  const GemmBlockPrologue *);
template void parallelGemm<double>(bool, bool, int64_t, int64_t, int64_t,
                                   double, const double *, int64_t,
                                   const double *, int64_t, double, double *,
                                   int64_t, const GemmBlockPrologue *);

} // namespace cleave::runtime::cpu
