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

int launched();

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

// Fused attention: a block of kAttnBlockRows threads, one a row, loads
// each tile of the other side into shared memory once for all of its rows
// (DeviceAttention.h's block steps; the host drivers there run the same
// phases in turn). Threads past the last row load and wait with the others.
template <class T, int D>
__global__ void __launch_bounds__(kAttnBlockRows)
    attentionKernel(AttentionStep s) {
  extern __shared__ double sharedMem[];
  T *tiles = reinterpret_cast<T *>(sharedMem);
  const AttentionOperands &a = s.in;
  const int tid = threadIdx.x;
  const AttnForwardBlock k = attnForwardBlockAt(a, blockIdx.x);
  const bool active = tid < k.rows.count;
  AttnForwardRow<T, D> r;
  if (active)
    attnForwardBegin(s, attnBlockRow(a, k.rows, tid), r);
  for (int64_t j0 = 0; j0 < k.keyEnd; j0 += kAttnTile) {
    attnForwardBlockLoad<T, D>(a, k, j0, tiles, tid);
    __syncthreads();
    if (active)
      attnForwardBlockTile<T, D>(a, r, j0, tiles, tid);
    __syncthreads();
  }
  if (active)
    attnForwardEnd(s, r);
}

__global__ void attentionDeltaKernel(AttentionGradStep s, int64_t rows) {
  for (int64_t i = firstIndex(); i < rows; i += gridStride())
    attentionDeltaRow(s, i);
}

template <class T, int D>
__global__ void __launch_bounds__(kAttnBlockRows)
    attentionGradQKernel(AttentionGradStep s) {
  extern __shared__ double sharedMem[];
  T *tiles = reinterpret_cast<T *>(sharedMem);
  const AttentionOperands &a = s.in;
  const int tid = threadIdx.x;
  const AttnForwardBlock k = attnForwardBlockAt(a, blockIdx.x);
  const bool active = tid < k.rows.count;
  AttnGradQRow<T, D> r;
  if (active)
    attnGradQBegin(s, attnBlockRow(a, k.rows, tid), r);
  for (int64_t j0 = 0; j0 < k.keyEnd; j0 += kAttnTile) {
    attnForwardBlockLoad<T, D>(a, k, j0, tiles, tid);
    __syncthreads();
    if (active)
      attnGradQBlockTile<T, D>(a, r, j0, tiles);
    __syncthreads();
  }
  if (active)
    attnGradQEnd(s, r);
}

// With the head size fixed, each row keeps v_j in shared memory (its
// registers hold k_j and the two accumulators).
template <class T, int D>
__global__ void __launch_bounds__(kAttnBlockRows)
    attentionGradKVKernel(AttentionGradStep s) {
  extern __shared__ double sharedMem[];
  const AttentionOperands &a = s.in;
  const int tid = threadIdx.x;
  const AttnGradKVBlock k = attnGradKVBlockAt(a, blockIdx.x);
  const bool active = tid < k.rows.count;
  AttnGradKVRow<T, D, (D > 0)> r;
  r.vs = attnKVSharedV<T>(sharedMem, attnDim<D>(a), tid);
  if (active)
    attnGradKVBegin(s, attnBlockKvRow(a, k.rows, tid), r);
  const int64_t group = a.queryHeads / a.kvHeads;
  for (int64_t g = 0; g < group; ++g) {
    const int64_t h = k.rows.head * group + g;
    for (int64_t i0 = k.queryBegin; i0 < a.queryLen; i0 += kAttnTile) {
      attnGradKVBlockLoad<T, D>(s, k, h, i0, sharedMem, tid);
      __syncthreads();
      if (active)
        attnGradKVBlockTile<T, D>(a, r, h, i0, sharedMem);
      __syncthreads();
    }
  }
  if (active)
    attnGradKVEnd(s, r);
}

// Launches kernel over `blocks` blocks of kAttnBlockRows threads with
// `shared` bytes of dynamic shared memory (over 48 KiB needs the kernel's
// opt-in, which fails past the device's limit).
template <class Kernel, class Step>
int launchAttentionBlocks(Kernel kernel, const Step &s, int64_t blocks,
                          size_t shared, cudaStream_t stream) {
  if (blocks == 0)
    return 0;
  if (shared > 48 * 1024) {
    cudaError_t err = cudaFuncSetAttribute(
        kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(shared));
    if (err != cudaSuccess)
      return int(err);
  }
  kernel<<<unsigned(blocks), kAttnBlockRows, shared, stream>>>(s);
  return launched();
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

__global__ void columnPartialKernel(ColumnStep c, int64_t n) {
  for (int64_t i = firstIndex(); i < n; i += gridStride())
    columnPartial(c, i);
}

__global__ void columnChunksKernel(ColumnStep c) {
  for (int64_t j = firstIndex(); j < c.len; j += gridStride())
    columnChunks(c, j);
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

// Every thread that sees an exponent of all ones writes the same 1, so
// the result does not depend on which thread wrote.
__global__ void nonFiniteKernel(const void *data, int64_t count, bool wide,
                                int *found) {
  bool bad = false;
  for (int64_t i = firstIndex(); i < count; i += gridStride()) {
    if (wide) {
      uint64_t b = static_cast<const uint64_t *>(data)[i];
      bad |= (b & 0x7ff0000000000000ull) == 0x7ff0000000000000ull;
    } else {
      uint32_t b = static_cast<const uint32_t *>(data)[i];
      bad |= (b & 0x7f800000u) == 0x7f800000u;
    }
  }
  if (bad)
    *found = 1;
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

// The kernels for a head size fixed at compile time where it is a common
// one (arrays in registers), else for any size up to kMaxHeadDim; double
// where an operand is f64.
int launchAttention(const AttentionStep &s, void *stream) {
  const AttentionOperands &a = s.in;
  const int64_t blocks = attnBlockCount(a.batch, a.queryHeads, a.queryLen);
  cudaStream_t st = cudaStream_t(stream);
  if (attentionWide(a))
    return launchAttentionBlocks(attentionKernel<double, 0>, s, blocks,
                                 attnForwardShared<double>(a.headDim), st);
  const size_t shared = attnForwardShared<float>(a.headDim);
  if (a.headDim == 64)
    return launchAttentionBlocks(attentionKernel<float, 64>, s, blocks, shared,
                                 st);
  if (a.headDim == 128)
    return launchAttentionBlocks(attentionKernel<float, 128>, s, blocks,
                                 shared, st);
  return launchAttentionBlocks(attentionKernel<float, 0>, s, blocks, shared,
                               st);
}

// Delta for every query row, then dQ by blocks of query rows and dK, dV by
// blocks of kv rows (independent of each other).
int launchAttentionGrad(const AttentionGradStep &s, void *stream) {
  const AttentionOperands &a = s.in;
  const int64_t rows = attentionRows(a);
  if (rows == 0)
    return 0;
  cudaStream_t st = cudaStream_t(stream);
  attentionDeltaKernel<<<blocksFor(rows), kThreads, 0, st>>>(s, rows);
  if (int err = launched())
    return err;
  const int64_t qBlocks = attnBlockCount(a.batch, a.queryHeads, a.queryLen);
  const int64_t kvBlocks = attnBlockCount(a.batch, a.kvHeads, a.keyLen);
  auto both = [&](auto q, auto kv, size_t qShared, size_t kvShared) {
    if (int err = launchAttentionBlocks(q, s, qBlocks, qShared, st))
      return err;
    return launchAttentionBlocks(kv, s, kvBlocks, kvShared, st);
  };
  if (attentionWide(a))
    return both(attentionGradQKernel<double, 0>,
                attentionGradKVKernel<double, 0>,
                attnGradQShared<double>(a.headDim),
                attnGradKVShared<double>(a.headDim, false));
  const size_t qShared = attnGradQShared<float>(a.headDim);
  if (a.headDim == 64)
    return both(attentionGradQKernel<float, 64>,
                attentionGradKVKernel<float, 64>, qShared,
                attnGradKVShared<float>(a.headDim, true));
  if (a.headDim == 128)
    return both(attentionGradQKernel<float, 128>,
                attentionGradKVKernel<float, 128>, qShared,
                attnGradKVShared<float>(a.headDim, true));
  return both(attentionGradQKernel<float, 0>, attentionGradKVKernel<float, 0>,
              qShared, attnGradKVShared<float>(a.headDim, false));
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
  if (c.chunk == 0) {
    columnKernel<<<blocksFor(c.len), kThreads, 0, cudaStream_t(stream)>>>(c);
    return launched();
  }
  int64_t n = c.len * c.chunks();
  columnPartialKernel<<<blocksFor(n), kThreads, 0, cudaStream_t(stream)>>>(c,
                                                                          n);
  if (int err = launched())
    return err;
  columnChunksKernel<<<blocksFor(c.len), kThreads, 0, cudaStream_t(stream)>>>(
      c);
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

int launchNonFinite(const void *data, int64_t count, bool wide, int *found,
                    void *stream) {
  if (count == 0)
    return 0;
  nonFiniteKernel<<<blocksFor(count), kThreads, 0, cudaStream_t(stream)>>>(
      data, count, wide, found);
  return launched();
}

int launchLoss(const LossStep &l, void *stream) {
  lossKernel<<<1, 1, 0, cudaStream_t(stream)>>>(l);
  return launched();
}

} // namespace cleave::runtime::cuda
