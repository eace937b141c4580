// A FusedAttention or FusedAttentionGrad kernel call as the fused
// attention's device steps (runtime/cuda/DeviceAttention.h): the shapes,
// scale, causal flag and every operand's element type and strides, read
// once for both backends. The CPU backend runs the steps' rows on its
// threads (runtime/cpu/Attention.cpp); the CUDA backend launches them, and
// its emulation runs them on the host (runtime/cuda/Lowering.cpp). The
// pointers are the call's own, in the backend's memory.
#pragma once

#include "runtime/Kernel.h"
#include "runtime/cuda/DeviceAttention.h"

namespace cleave::runtime {

// FusedAttention(Q, K, V[, mask]) -> O, L.
llvm::Expected<cuda::AttentionStep> attentionStep(const KernelCall &call);

// The query rows of a FusedAttentionGrad call, B * Hq * Tq (a packed
// operand's key and value heads not counted): the doubles its `delta`
// scratch holds; 0 for operands not of rank 4 (attentionGradStep refuses
// them).
int64_t attentionGradRows(const KernelCall &call);

// FusedAttentionGrad(dO, Q, K, V, O, L[, mask]) -> dQ, dK, dV; `delta` is
// scratch of one double per query row (attentionGradRows) in the backend's
// memory.
llvm::Expected<cuda::AttentionGradStep>
attentionGradStep(const KernelCall &call, double *delta);

// The CPU backend's blocked kernels on a step in host memory (any strides,
// masks and causal alignment), on the calling thread or, inside a CPU
// backend's kernel, its threads. The backward fills `delta` first.
void runAttentionForwardOnCpu(const cuda::AttentionStep &s);
void runAttentionBackwardOnCpu(const cuda::AttentionGradStep &s);

} // namespace cleave::runtime
