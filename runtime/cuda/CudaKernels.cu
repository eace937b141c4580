// The CUDA backend's kernels (CudaKernels.h): thin launchers around the
// functions of DeviceCode.h, which the host tests run one element at a
// time. Grid-stride loops, 256 threads a block; row ops put one warp on a
// row (BatchNorm's channel steps one on a channel), whose lanes combine
// their partial sums and maxima by shuffles.
#include "runtime/cuda/CudaKernels.h"

#include <cuda_runtime.h>

namespace cleave::runtime::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kWarp = 32;

int blocksFor(int64_t n) {
  int64_t b = (n + kThreads - 1) / kThreads;
  return int(b < 65535 * 16 ? (b > 0 ? b : 1) : 65535 * 16);
}

__device__ int64_t firstIndex() {
  return blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
}
__device__ int64_t gridStride() { return int64_t(gridDim.x) * blockDim.x; }

// The lanes of one warp sharing a row (DeviceCode.h's Lanes).
struct WarpLanes {
  __device__ int lane() const { return threadIdx.x % kWarp; }
  __device__ int count() const { return kWarp; }
  __device__ double sum(double x) const {
    for (int o = kWarp / 2; o > 0; o /= 2)
      x += __shfl_xor_sync(0xffffffffu, x, o);
    return x;
  }
  __device__ float max(float x) const {
    for (int o = kWarp / 2; o > 0; o /= 2) {
      float y = __shfl_xor_sync(0xffffffffu, x, o);
      x = y > x || y != y ? y : x;
    }
    return x;
  }
};

__global__ void mapKernel(MapArgs m) {
  for (int64_t i = firstIndex(); i < m.n; i += gridStride())
    mapElement(m, i);
}

__global__ void gatherKernel(GatherStep g) {
  int64_t n = g.grad ? g.outer * g.inner : g.outer * g.n * g.inner;
  for (int64_t i = firstIndex(); i < n; i += gridStride()) {
    if (g.grad)
      gatherGradColumn(g, i);
    else
      gatherElement(g, i);
  }
}

__global__ void attentionKernel(AttentionStep s, int64_t rows) {
  for (int64_t i = firstIndex(); i < rows; i += gridStride())
    attentionForwardRow(s, i);
}

__global__ void attentionDeltaKernel(AttentionGradStep s, int64_t rows) {
  for (int64_t i = firstIndex(); i < rows; i += gridStride())
    attentionDeltaRow(s, i);
}

// dQ rows then dK/dV rows in one grid: they are independent.
__global__ void attentionGradKernel(AttentionGradStep s, int64_t rows,
                                    int64_t kvRows) {
  for (int64_t i = firstIndex(); i < rows + kvRows; i += gridStride()) {
    if (i < rows)
      attentionGradQRow(s, i);
    else
      attentionGradKVRow(s, i - rows);
  }
}

__global__ void padKernel(PadStep p) {
  for (int64_t i = firstIndex(); i < p.n; i += gridStride())
    padElement(p, i);
}

__global__ void optimizerKernel(OptimizerStep o) {
  for (int64_t i = firstIndex(); i < o.n; i += gridStride())
    optimizerElement(o, i);
}

__global__ void im2colKernel(Im2colStep s) {
  int64_t n = im2colCount(s);
  for (int64_t i = firstIndex(); i < n; i += gridStride())
    im2colElement(s, i);
}

__global__ void poolKernel(PoolStep p) {
  int64_t n = poolCount(p);
  for (int64_t i = firstIndex(); i < n; i += gridStride())
    poolElement(p, i);
}

__global__ void channelMapKernel(ChannelMapStep m) {
  for (int64_t i = firstIndex(); i < m.elements; i += gridStride())
    channelMapElement(m, i);
}

__global__ void reduceKernel(ReduceStep r) {
  for (int64_t o = firstIndex(); o < r.outputs; o += gridStride())
    reduceElement(r, o);
}

__global__ void reducePartialKernel(ReduceStep r, int64_t n) {
  for (int64_t i = firstIndex(); i < n; i += gridStride())
    reducePartial(r, i);
}

__global__ void reduceChunksKernel(ReduceStep r) {
  for (int64_t o = firstIndex(); o < r.outputs; o += gridStride())
    reduceChunks(r, o);
}

__global__ void columnKernel(ColumnStep c) {
  for (int64_t j = firstIndex(); j < c.len; j += gridStride())
    columnElement(c, j);
}

// Whole warps walk the rows, so every lane of a warp takes part in each
// shuffle (a row's loop bounds are the same for all its lanes).
__global__ void rowKernel(RowStep r) {
  int64_t warp = firstIndex() / kWarp;
  int64_t warps = gridStride() / kWarp;
  for (int64_t row = warp; row < r.rows; row += warps)
    rowElement(WarpLanes{}, r, row);
}

// As rowKernel: whole warps walk the channels.
__global__ void channelKernel(ChannelStep c) {
  int64_t warp = firstIndex() / kWarp;
  int64_t warps = gridStride() / kWarp;
  for (int64_t ch = warp; ch < c.channels; ch += warps)
    channelElement(WarpLanes{}, c, ch);
}

__global__ void lossKernel(LossStep l) {
  if (firstIndex() == 0)
    lossStep(l);
}

int launched() { return int(cudaGetLastError()); }

} // namespace

int launchMap(const MapArgs &m, void *stream) {
  if (m.n == 0)
    return 0;
  mapKernel<<<blocksFor(m.n), kThreads, 0, cudaStream_t(stream)>>>(m);
  return launched();
}

int launchGather(const GatherStep &g, void *stream) {
  int64_t n = g.grad ? g.outer * g.inner : g.outer * g.n * g.inner;
  if (n == 0)
    return 0;
  gatherKernel<<<blocksFor(n), kThreads, 0, cudaStream_t(stream)>>>(g);
  return launched();
}

int launchAttention(const AttentionStep &s, void *stream) {
  int64_t rows = attentionRows(s.in);
  if (rows == 0)
    return 0;
  attentionKernel<<<blocksFor(rows), kThreads, 0, cudaStream_t(stream)>>>(
      s, rows);
  return launched();
}

int launchAttentionGrad(const AttentionGradStep &s, void *stream) {
  int64_t rows = attentionRows(s.in), kvRows = attentionKvRows(s.in);
  if (rows == 0)
    return 0;
  attentionDeltaKernel<<<blocksFor(rows), kThreads, 0,
                         cudaStream_t(stream)>>>(s, rows);
  if (int err = launched())
    return err;
  attentionGradKernel<<<blocksFor(rows + kvRows), kThreads, 0,
                        cudaStream_t(stream)>>>(s, rows, kvRows);
  return launched();
}

int launchPad(const PadStep &p, void *stream) {
  if (p.n == 0)
    return 0;
  padKernel<<<blocksFor(p.n), kThreads, 0, cudaStream_t(stream)>>>(p);
  return launched();
}

int launchOptimizer(const OptimizerStep &o, void *stream) {
  if (o.n == 0)
    return 0;
  optimizerKernel<<<blocksFor(o.n), kThreads, 0, cudaStream_t(stream)>>>(o);
  return launched();
}

int launchIm2col(const Im2colStep &s, void *stream) {
  int64_t n = im2colCount(s);
  if (n == 0)
    return 0;
  im2colKernel<<<blocksFor(n), kThreads, 0, cudaStream_t(stream)>>>(s);
  return launched();
}

int launchPool(const PoolStep &p, void *stream) {
  int64_t n = poolCount(p);
  if (n == 0)
    return 0;
  poolKernel<<<blocksFor(n), kThreads, 0, cudaStream_t(stream)>>>(p);
  return launched();
}

int launchChannelMap(const ChannelMapStep &m, void *stream) {
  if (m.elements == 0)
    return 0;
  channelMapKernel<<<blocksFor(m.elements), kThreads, 0,
                     cudaStream_t(stream)>>>(m);
  return launched();
}

int launchReduce(const ReduceStep &r, void *stream) {
  if (r.outputs == 0)
    return 0;
  if (r.chunk == 0) {
    reduceKernel<<<blocksFor(r.outputs), kThreads, 0, cudaStream_t(stream)>>>(
        r);
    return launched();
  }
  int64_t n = r.outputs * r.chunks();
  reducePartialKernel<<<blocksFor(n), kThreads, 0, cudaStream_t(stream)>>>(r,
                                                                          n);
  if (int err = launched())
    return err;
  reduceChunksKernel<<<blocksFor(r.outputs), kThreads, 0,
                       cudaStream_t(stream)>>>(r);
  return launched();
}

int launchColumns(const ColumnStep &c, void *stream) {
  if (c.len == 0)
    return 0;
  columnKernel<<<blocksFor(c.len), kThreads, 0, cudaStream_t(stream)>>>(c);
  return launched();
}

int launchRows(const RowStep &r, void *stream) {
  if (r.rows == 0)
    return 0;
  rowKernel<<<blocksFor(r.rows * kWarp), kThreads, 0, cudaStream_t(stream)>>>(
      r);
  return launched();
}

int launchChannels(const ChannelStep &c, void *stream) {
  if (c.channels == 0)
    return 0;
  channelKernel<<<blocksFor(c.channels * kWarp), kThreads, 0,
                  cudaStream_t(stream)>>>(c);
  return launched();
}

int launchLoss(const LossStep &l, void *stream) {
  lossKernel<<<1, 1, 0, cudaStream_t(stream)>>>(l);
  return launched();
}

} // namespace cleave::runtime::cuda
