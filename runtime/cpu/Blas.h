// OpenBLAS, loaded at run time.
//
// OpenBLAS picks its GEMM kernels for the CPU when the library is loaded.
// Versions that do not know a CPU model (0.3.21 on current Xeons) fall back
// to SSE3 ("Prescott") kernels, about half the speed on the same machine.
// Loading the library ourselves lets the backend set OPENBLAS_CORETYPE first
// (SkylakeX on AVX-512 CPUs, Haswell on AVX2 ones) unless the user set it.
#pragma once

#include <cblas.h>

namespace cleave::runtime::cpu {

struct Blas {
  decltype(&cblas_sgemm) sgemm;
  decltype(&cblas_dgemm) dgemm;
  void (*setThreads)(int);
  char *(*coreName)();
};

// Loads OpenBLAS on first use; exits with one error line if it is missing.
const Blas &blas();

} // namespace cleave::runtime::cpu
