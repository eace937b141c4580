// The arithmetic of the CUDA backend's own kernels, in headers that both
// nvcc (CudaKernels.cu, where each function runs in a GPU thread) and the
// host C++ compiler (Lowering.cpp's runStepsOnHost, where a loop runs the
// same functions over every index: the emulated backend, which
// tests/unit/cuda_lowering_test.cpp checks against the CPU) compile. So the index math and
// the formulas are tested against the CPU backend on any machine, GPU or
// not; what only a GPU can test is the launch around them.
//
// Three shapes of kernel cover the ops:
//   - a strided map (`mapElement`): element i of the output, at an offset an
//     Indexer gives, is an op of up to three operands read through their own
//     Indexers. Broadcasting is a zero stride, Transpose permuted strides,
//     Slice a base offset and scaled strides, Concat and Split one map per
//     piece; elementwise math, Cast, Where and UnaryGrad are the op.
//   - a row op (`rowElement`, `channelElement`): one row of a reduction
//     (or one BatchNorm channel), written against a `Lanes` that splits the
//     row among the lanes of a warp on the GPU (sums and maxima by shuffles)
//     and is one lane on the host.
//   - a window op (`im2colElement`, `poolElement`): one element of a conv's
//     column matrix or of a pool, walking its window; the gradients gather,
//     one thread per input element, instead of scattering, so they need no
//     atomics and sum in a fixed order.
//
// The code is split by family: DeviceElements.h (element types, indexers,
// maps), DeviceReductions.h, DeviceGather.h, DeviceWindows.h,
// DeviceOptimizers.h, DeviceIndex.h (the index ops: cumulative sums,
// arg- and top-k selection, Trilu, GatherElements, the scatters),
// DeviceResize.h, DeviceGridSample.h. Include this header for all of them.
#pragma once

#include "runtime/cuda/DeviceAttention.h"
#include "runtime/cuda/DeviceElements.h"
#include "runtime/cuda/DeviceGather.h"
#include "runtime/cuda/DeviceGridSample.h"
#include "runtime/cuda/DeviceIndex.h"
#include "runtime/cuda/DeviceOptimizers.h"
#include "runtime/cuda/DeviceReductions.h"
#include "runtime/cuda/DeviceResize.h"
#include "runtime/cuda/DeviceWindows.h"
