// cuDNN's view of a convolution call (Conv, ConvGradData, ConvGradFilter):
// the descriptors' numbers, or why cuDNN does not take the call, in which
// case the CUDA backend lowers it to im2col and GEMMs (Lowering.h) as
// before. Pure C++ with no cuDNN header, so the mapping from an ONNX-style
// call to cuDNN's Nd descriptors is tested on any machine
// (tests/unit/cudnn_conv_test.cpp); CudaBackend.cpp feeds it to cuDNN.
//
// cuDNN takes 2-D and 3-D convolutions in NCHW / NCDHW with symmetric
// padding; a 1-D one is a 2-D one of height 1. Types: f32 (FMA math, no
// TF32, as the GEMMs) or bf16 with f32 accumulation, every operand of one
// type.
#pragma once

#include "runtime/Kernel.h"

#include "llvm/Support/Error.h"

#include <vector>

namespace cleave::runtime::cuda {

struct CudnnConvShape {
  // NC + spatial dims (4 or 5 entries each): the image, the filter and the
  // output of the forward convolution, whichever call this is (for
  // ConvGradData the image is dX, for ConvGradFilter the filter is dW).
  std::vector<int> x, w, y;
  std::vector<int> pads, strides, dilations; // one per spatial dim
  int groups = 1;
  bool bf16 = false;
  bool bias = false; // Conv with a bias operand (added after the product)
};

// The call's shape for cuDNN, or an error saying why cuDNN does not take
// it (asymmetric padding, more than 3 spatial dims, mixed or unsupported
// types, dims past int, operands that do not fit each other).
llvm::Expected<CudnnConvShape> cudnnConvShape(const KernelCall &call);

} // namespace cleave::runtime::cuda
