// The CUDA backend's launches of the device steps (Lowering.h) behind a
// plain C++ interface: the .cu file that defines them is built by nvcc and
// sees neither LLVM nor the IR, and CudaBackend.cpp (built by the C++
// compiler) sees no CUDA C++. Every launcher runs on the given stream (a
// cudaStream_t) and returns the launch's cudaError_t as an int, 0 for
// success. GEMMs are not here: CudaBackend.cpp hands them to cuBLAS.
#pragma once

#include "runtime/cuda/DeviceCode.h"

namespace cleave::runtime::cuda {

// One thread an element (grid-stride loops, 256 threads a block).
int launchMap(const MapArgs &m, void *stream);
int launchGather(const GatherStep &g, void *stream);
int launchOptimizer(const OptimizerStep &o, void *stream);
int launchPad(const PadStep &p, void *stream);
int launchIm2col(const Im2colStep &s, void *stream);
int launchPool(const PoolStep &p, void *stream);
int launchChannelMap(const ChannelMapStep &m, void *stream);
// One thread a lane, element, index position or tuple (IndexStep::threads).
int launchIndex(const IndexStep &s, void *stream);
// One thread an output element (Resize) or input element (ResizeGrad).
int launchResize(const ResizeStep &s, void *stream);
// One thread an output element (GridSample), (image, channel) plane
// (GridSampleGradData) or output position (GridSampleGradGrid).
int launchGridSample(const GridSampleStep &s, void *stream);
// One thread an output element / column.
int launchReduce(const ReduceStep &r, void *stream);
int launchColumns(const ColumnStep &c, void *stream);
// One warp a row / channel.
int launchRows(const RowStep &r, void *stream);
int launchChannels(const ChannelStep &c, void *stream);
// Fused attention, one thread a query row (the backward: one a query row
// for Delta, then one a query row for dQ and one a kv row for dK and dV).
int launchAttention(const AttentionStep &s, void *stream);
int launchAttentionGrad(const AttentionGradStep &s, void *stream);
// One thread in all.
int launchLoss(const LossStep &l, void *stream);
// Sets *found (device memory) to 1 if any of `count` f32 (f64 where wide)
// values at `data` is an infinity or a NaN; leaves it otherwise.
int launchNonFinite(const void *data, int64_t count, bool wide, int *found,
                    void *stream);

} // namespace cleave::runtime::cuda
