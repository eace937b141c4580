// The CUDA backends the tests run models on, one of each per test binary:
// the emulated one (its arithmetic on the host, always there) and GPU 0's
// where one is visible.
#ifndef CLEAVE_TESTS_UNIT_DEVICEBACKENDS_H
#define CLEAVE_TESTS_UNIT_DEVICEBACKENDS_H

#include "runtime/Kernel.h"
#include "runtime/cuda/Lowering.h"
#ifdef CLEAVE_HAVE_CUDA
#include "runtime/cuda/CudaBackend.h"
#endif

#include <memory>
#include <string>

namespace cleave::testsupport {

inline runtime::Backend &cudaEmulated() {
  static auto b = runtime::cuda::createCudaEmulatedBackend();
  return *b;
}

// GPU 0's backend, or null with why not (no device, or no CUDA backend
// in this build) in `why`.
inline runtime::Backend *cudaGpu(std::string &why) {
#ifdef CLEAVE_HAVE_CUDA
  static std::string reason;
  static std::unique_ptr<runtime::Backend> gpu = [] {
    auto b = runtime::createCudaBackend(0);
    if (!b) {
      reason = llvm::toString(b.takeError());
      return std::unique_ptr<runtime::Backend>();
    }
    return std::move(*b);
  }();
  why = reason;
  return gpu.get();
#else
  why = "built without the CUDA backend";
  return nullptr;
#endif
}

} // namespace cleave::testsupport

#endif
