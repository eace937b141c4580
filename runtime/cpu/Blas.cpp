#include "runtime/cpu/Blas.h"

#include <cstdio>
#include <cstdlib>
#include <dlfcn.h>

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

} // namespace cleave::runtime::cpu
