// The CUDA backend (docs/design/cuda.md): device memory, copies on its own
// stream, and every op Lowering.h lowers (the MLP and GPT training ops, f32
// and bf16), launched by CudaKernels.cu and cuBLAS. Plans whose ops it
// lacks are refused when the executor is made, naming the op. Built only
// where the CUDA toolkit is (CLEAVE_HAVE_CUDA); runs only where a GPU is.
#pragma once

#include "runtime/Kernel.h"

#include "llvm/Support/Error.h"

#include <memory>

namespace cleave::runtime {

// A backend on CUDA device `device`, with its own stream and cuBLAS
// handle. Fails with one line, "no usable CUDA device (...)" and the CUDA
// runtime's reason, where there is none (no GPU, no driver).
llvm::Expected<std::unique_ptr<Backend>> createCudaBackend(int device = 0);

// How many CUDA devices the runtime sees, or the reason it sees none.
llvm::Expected<int> cudaDeviceCount();

} // namespace cleave::runtime
