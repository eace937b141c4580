// The CUDA backend's kernels (CudaKernels.h): thin launchers around the
// functions of DeviceCode.h, which the host tests run one element at a
// time. Grid-stride loops, 256 threads a block; row ops put one warp on a
// row (BatchNorm's channel steps one on a channel), whose lanes combine
// their partial sums and maxima by shuffles.
#include "runtime/cuda/CudaKernels.h"

#include <cuda_runtime.h>

#include <cstdlib>
#include <string>

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

// A Cast between f32 and bf16 over contiguous memory (mixed precision's
// casts of weights, activations and gradients, a fifth of a GPT-2-small
// step through mapKernel): four elements a thread, 16- and 8-byte accesses
// where both ends are aligned, the rounding of load() and store().
constexpr int kCastVector = 4;

__global__ void castToBf16Kernel(const float *in, uint16_t *out, int64_t n,
                                 bool vector) {
  for (int64_t q = firstIndex(); q * kCastVector < n; q += gridStride()) {
    const int64_t i = q * kCastVector;
    if (vector && i + kCastVector <= n) {
      float4 x = reinterpret_cast<const float4 *>(in)[q];
      ushort4 y;
      y.x = floatToBf16(x.x);
      y.y = floatToBf16(x.y);
      y.z = floatToBf16(x.z);
      y.w = floatToBf16(x.w);
      reinterpret_cast<ushort4 *>(out)[q] = y;
    } else {
      for (int64_t e = i; e < n && e < i + kCastVector; ++e)
        out[e] = floatToBf16(in[e]);
    }
  }
}

__global__ void castToF32Kernel(const uint16_t *in, float *out, int64_t n,
                                bool vector) {
  for (int64_t q = firstIndex(); q * kCastVector < n; q += gridStride()) {
    const int64_t i = q * kCastVector;
    if (vector && i + kCastVector <= n) {
      ushort4 x = reinterpret_cast<const ushort4 *>(in)[q];
      reinterpret_cast<float4 *>(out)[q] =
          make_float4(bf16ToFloat(x.x), bf16ToFloat(x.y), bf16ToFloat(x.z),
                      bf16ToFloat(x.w));
    } else {
      for (int64_t e = i; e < n && e < i + kCastVector; ++e)
        out[e] = bf16ToFloat(in[e]);
    }
  }
}

// Whether an indexer walks n elements one after the other from its base.
bool walksInOrder(const Indexer &ix, int64_t n) {
  return n <= 1 || (ix.rank == 1 && ix.dims[0] == n && ix.strides[0] == 1);
}

bool aligned(const void *p, int bytes) {
  return reinterpret_cast<uintptr_t>(p) % bytes == 0;
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

__global__ void indexKernel(IndexStep s) {
  for (int64_t i = firstIndex(); i < s.threads; i += gridStride())
    indexElement(s, i);
}

__global__ void resizeKernel(ResizeStep s) {
  for (int64_t i = firstIndex(); i < s.threads; i += gridStride()) {
    if (s.grad)
      resizeGradElement(s, i);
    else
      resizeElement(s, i);
  }
}

__global__ void gridSampleKernel(GridSampleStep s) {
  for (int64_t i = firstIndex(); i < s.threads; i += gridStride())
    gridSampleElement(s, i);
}

// Fused attention: a block of kAttnBlockRows threads, one a row, loads
// each tile of the other side into shared memory once for all of its rows
// (DeviceAttention.h's block steps; the host drivers there run the same
// phases in turn). Threads past the last row load and wait with the others.
// The forward and dQ: a block of query rows over key tiles (Steps).
template <class Steps, class T>
__global__ void __launch_bounds__(kAttnBlockRows)
    attentionKeyTilesKernel(typename Steps::Step s) {
  extern __shared__ double sharedMem[];
  T *tiles = reinterpret_cast<T *>(sharedMem);
  const AttentionOperands &a = s.in;
  const int tid = threadIdx.x;
  const AttnForwardBlock k = attnForwardBlockAt(a, blockIdx.x);
  const bool active = tid < k.rows.count;
  typename Steps::Row r;
  if (active)
    Steps::begin(s, attnBlockRow(a, k.rows, tid), r);
  for (int64_t j0 = 0; j0 < k.keyEnd; j0 += kAttnTile) {
    // The barrier that orders the loads before the reads also tells every
    // thread whether any row sees a key of the tile.
    if (__syncthreads_or(Steps::load(s, k, j0, tiles, tid)) && active)
      Steps::tile(s, r, j0, tiles, tid);
    __syncthreads();
  }
  if (active)
    Steps::end(s, r);
}

template <class T, int D>
constexpr auto attentionKernel = attentionKeyTilesKernel<AttnForwardSteps<T, D>, T>;
template <class T, int D>
constexpr auto attentionGradQKernel =
    attentionKeyTilesKernel<AttnGradQSteps<T, D>, T>;

__global__ void attentionDeltaKernel(AttentionGradStep s, int64_t rows) {
  for (int64_t i = firstIndex(); i < rows; i += gridStride())
    attentionDeltaRow(s, i);
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
      if (__syncthreads_or(
              attnGradKVBlockLoad<T, D>(s, k, h, i0, sharedMem, tid)) &&
          active)
        attnGradKVBlockTile<T, D>(a, r, h, i0, sharedMem, tid);
      __syncthreads();
    }
  }
  if (active)
    attnGradKVEnd(s, r);
}

// --- four lanes a row (CLEAVE_CUDA_ATTENTION=lanes) -------------------------
//
// The block steps' arithmetic with each row's D values spread over four
// threads (D / 4 registers a thread for each of the row's vectors, where
// one thread a row needs D: 210 to 255 registers and spills at D 64, eight
// warps an SM). Lane q of a row holds attnDot's partial sums 2q and 2q + 1
// (the dims d with d % 8 in {2q, 2q + 1}) and the lanes add their sums by
// shuffles in attnDot's tree, so every score, and every result, has the
// block steps' bits. GPU only: the host has no lanes to run them on (the
// block steps are what the emulation runs); CudaBackend tests run both.
constexpr int kAttnLanes = 4;
constexpr int kLaneThreads = kAttnBlockRows * kAttnLanes;
static_assert(kAttnDotLanes == 2 * kAttnLanes, "two partial sums a lane");

// The dim of a lane's j-th value.
__device__ __forceinline__ int laneDim(int lane, int j) {
  return (j >> 1) * kAttnDotLanes + lane * 2 + (j & 1);
}

// attnDot of a row's vector (local(j), the lane's j-th value) with x(d).
template <int D, class Local, class Row>
__device__ __forceinline__ float laneDot(const Local &local, const Row &x,
                                         int lane, unsigned mask) {
  float p0 = 0, p1 = 0;
#pragma unroll
  for (int j = 0; j < D / kAttnLanes; j += 2) {
    p0 += local(j) * x(laneDim(lane, j));
    p1 += local(j + 1) * x(laneDim(lane, j + 1));
  }
  float s = p0 + p1;
  // Lane q's partner's sum: q + p (or p + q, the same bits) at each level.
  s += __shfl_xor_sync(mask, s, 1);
  s += __shfl_xor_sync(mask, s, 2);
  return s;
}

__device__ __forceinline__ unsigned laneMask() {
  return 0xfu << (threadIdx.x & 28);
}

template <int D>
__global__ void __launch_bounds__(kLaneThreads)
    attentionLanesKernel(AttentionStep s) {
  constexpr int J = D / kAttnLanes;
  extern __shared__ double sharedMem[];
  float *tiles = reinterpret_cast<float *>(sharedMem);
  float *kt = tiles, *vt = tiles + kAttnTile * D,
        *score = tiles + 2 * kAttnTile * D;
  unsigned char *keep = attnForwardKeep(tiles, D);
  const AttentionOperands &a = s.in;
  const int tid = threadIdx.x, row = tid / kAttnLanes, lane = tid % kAttnLanes;
  const unsigned mask = laneMask();
  const AttnForwardBlock k = attnForwardBlockAt(a, blockIdx.x);
  const bool active = row < k.rows.count;
  const int64_t b = k.rows.b, h = k.rows.head, i = k.rows.first + row;
  const int64_t end = active ? attentionKeyEnd(a, i) : 0;
  float q[J], acc[J];
  if (active)
#pragma unroll
    for (int j = 0; j < J; ++j) {
      q[j] = attnRead<float>(a.q.data, a.q.elem, a.q.at(b, h, i, laneDim(lane, j)));
      acc[j] = 0;
    }
  float m = -INFINITY;
  double l = 0;
  for (int64_t j0 = 0; j0 < k.keyEnd; j0 += kAttnTile) {
    const bool any = __syncthreads_or(
        attnKeyTileLoad<float, D>(a, k, j0, tiles, keep, tid, kLaneThreads));
    if (any && active && j0 < end) {
      const int n = end - j0 < kAttnTile ? int(end - j0) : kAttnTile;
      float tileMax = -INFINITY;
      for (int t = 0; t < n; ++t) {
        float sc = -INFINITY;
        if (!a.keep.data || keep[row * kAttnTile + t])
          sc = attnScore(a,
                         laneDot<D>([&](int j) { return q[j]; },
                                    [&](int d) { return kt[t * D + d]; }, lane,
                                    mask),
                         b, h, i, j0 + t);
        if (lane == 0)
          score[t * kAttnBlockRows + row] = sc;
        tileMax = attnMax(sc, tileMax);
      }
      if (tileMax != -INFINITY) {
        const float mNew = attnMax(tileMax, m);
        if (mNew != m) {
          const float rescale = attnExp(m - mNew);
          l *= double(rescale);
#pragma unroll
          for (int j = 0; j < J; ++j)
            acc[j] *= rescale;
          m = mNew;
        }
        __syncwarp(mask);
        for (int t = 0; t < n; ++t) {
          const float sc = score[t * kAttnBlockRows + row];
          if (sc == -INFINITY)
            continue;
          const float p = attnExp(sc - m);
          l += double(p);
#pragma unroll
          for (int j = 0; j < J; ++j)
            acc[j] += p * vt[t * D + laneDim(lane, j)];
        }
      }
    }
    __syncthreads();
  }
  if (!active)
    return;
  const int64_t r = attnBlockRow(a, k.rows, row);
  if (l == 0) {
#pragma unroll
    for (int j = 0; j < J; ++j)
      attnWrite(s.out.data, s.out.elem, s.out.at(b, h, i, laneDim(lane, j)),
                0.0f);
    if (lane == 0)
      attnWrite(s.lse, s.lseElem, r, double(-INFINITY));
    return;
  }
#pragma unroll
  for (int j = 0; j < J; ++j)
    attnWrite(s.out.data, s.out.elem, s.out.at(b, h, i, laneDim(lane, j)),
              float(double(acc[j]) / l));
  if (lane == 0)
    attnWrite(s.lse, s.lseElem, r, double(m) + log(l));
}

template <int D>
__global__ void __launch_bounds__(kLaneThreads)
    attentionGradQLanesKernel(AttentionGradStep s) {
  constexpr int J = D / kAttnLanes;
  extern __shared__ double sharedMem[];
  float *tiles = reinterpret_cast<float *>(sharedMem);
  float *kt = tiles, *vt = tiles + kAttnTile * D;
  unsigned char *keep = attnGradQKeep(tiles, D);
  const AttentionOperands &a = s.in;
  const int tid = threadIdx.x, row = tid / kAttnLanes, lane = tid % kAttnLanes;
  const unsigned mask = laneMask();
  const AttnForwardBlock k = attnForwardBlockAt(a, blockIdx.x);
  const bool active = row < k.rows.count;
  const int64_t b = k.rows.b, h = k.rows.head, i = k.rows.first + row;
  const int64_t r = attnBlockRow(a, k.rows, row);
  float q[J], dout[J], acc[J];
  float lse = -INFINITY;
  double delta = 0;
  int64_t end = 0;
  if (active) {
    lse = attnRead<float>(s.lse, s.lseElem, r);
    delta = s.delta[r];
    end = lse == -INFINITY ? 0 : attentionKeyEnd(a, i);
#pragma unroll
    for (int j = 0; j < J; ++j) {
      const int d = laneDim(lane, j);
      q[j] = attnRead<float>(a.q.data, a.q.elem, a.q.at(b, h, i, d));
      dout[j] = attnRead<float>(s.dOut.data, s.dOut.elem, s.dOut.at(b, h, i, d));
      acc[j] = 0;
    }
  }
  for (int64_t j0 = 0; j0 < k.keyEnd; j0 += kAttnTile) {
    const bool any = __syncthreads_or(
        attnKeyTileLoad<float, D>(a, k, j0, tiles, keep, tid, kLaneThreads));
    if (any && active && j0 < end) {
      const int n = end - j0 < kAttnTile ? int(end - j0) : kAttnTile;
      for (int t = 0; t < n; ++t) {
        if (a.keep.data && !keep[row * kAttnTile + t])
          continue;
        const float sc = attnScore(
            a,
            laneDot<D>([&](int j) { return q[j]; },
                       [&](int d) { return kt[t * D + d]; }, lane, mask),
            b, h, i, j0 + t);
        if (sc == -INFINITY)
          continue;
        const float ds = attnScoreGrad(
            attnExp(sc - lse),
            laneDot<D>([&](int j) { return dout[j]; },
                       [&](int d) { return vt[t * D + d]; }, lane, mask),
            delta);
#pragma unroll
        for (int j = 0; j < J; ++j)
          acc[j] += ds * kt[t * D + laneDim(lane, j)];
      }
    }
    __syncthreads();
  }
  if (!active)
    return;
#pragma unroll
  for (int j = 0; j < J; ++j)
    attnWrite(s.dq.data, s.dq.elem, s.dq.at(b, h, i, laneDim(lane, j)),
              acc[j] * float(a.scale));
}

template <int D>
__global__ void __launch_bounds__(kLaneThreads)
    attentionGradKVLanesKernel(AttentionGradStep s) {
  constexpr int J = D / kAttnLanes;
  extern __shared__ double sharedMem[];
  const AttentionOperands &a = s.in;
  AttnKVShared<float> sh(sharedMem, D);
  const int tid = threadIdx.x, row = tid / kAttnLanes, lane = tid % kAttnLanes;
  const unsigned mask = laneMask();
  const AttnGradKVBlock k = attnGradKVBlockAt(a, blockIdx.x);
  const bool active = row < k.rows.count;
  const int64_t b = k.rows.b, kvh = k.rows.head, jk = k.rows.first + row;
  const int64_t begin = active ? attentionQueryBegin(a, jk) : a.queryLen;
  float kv[J], vv[J], accK[J], accV[J];
  if (active)
#pragma unroll
    for (int j = 0; j < J; ++j) {
      const int d = laneDim(lane, j);
      kv[j] = attnRead<float>(a.k.data, a.k.elem, a.k.at(b, kvh, jk, d));
      vv[j] = attnRead<float>(a.v.data, a.v.elem, a.v.at(b, kvh, jk, d));
      accK[j] = accV[j] = 0;
    }
  const int64_t group = a.queryHeads / a.kvHeads;
  for (int64_t g = 0; g < group; ++g) {
    const int64_t h = kvh * group + g;
    for (int64_t i0 = k.queryBegin; i0 < a.queryLen; i0 += kAttnTile) {
      const bool any = __syncthreads_or(attnGradKVBlockLoad<float, D>(
          s, k, h, i0, sharedMem, tid, kLaneThreads));
      if (any && active) {
        const int n =
            a.queryLen - i0 < kAttnTile ? int(a.queryLen - i0) : kAttnTile;
        for (int t = 0; t < n; ++t) {
          const int64_t i = i0 + t;
          if (i < begin || (a.keep.data && !sh.keep[row * kAttnTile + t]))
            continue;
          const float lse = sh.lse[t];
          if (lse == -INFINITY)
            continue;
          const float sc = attnScore(
              a,
              laneDot<D>([&](int j) { return kv[j]; },
                         [&](int d) { return sh.q[t * D + d]; }, lane, mask),
              b, h, i, jk);
          if (sc == -INFINITY)
            continue;
          const float p = attnExp(sc - lse);
          const float ds = attnScoreGrad(
              p,
              laneDot<D>([&](int j) { return vv[j]; },
                         [&](int d) { return sh.dout[t * D + d]; }, lane,
                         mask),
              sh.delta[t]);
#pragma unroll
          for (int j = 0; j < J; ++j) {
            const int d = laneDim(lane, j);
            accV[j] += p * sh.dout[t * D + d];
            accK[j] += ds * sh.q[t * D + d];
          }
        }
      }
      __syncthreads();
    }
  }
  if (!active)
    return;
#pragma unroll
  for (int j = 0; j < J; ++j) {
    const int d = laneDim(lane, j);
    attnWrite(s.dk.data, s.dk.elem, s.dk.at(b, kvh, jk, d),
              accK[j] * float(a.scale));
    attnWrite(s.dv.data, s.dv.elem, s.dv.at(b, kvh, jk, d), accV[j]);
  }
}

// CLEAVE_CUDA_ATTENTION=lanes picks the kernels above where they apply
// (f32 or bf16 operands, D 64 or 128); anything else keeps the block steps.
bool attentionLanes(const AttentionOperands &a) {
  static const bool wanted = [] {
    const char *v = std::getenv("CLEAVE_CUDA_ATTENTION");
    return v && std::string(v) == "lanes";
  }();
  return wanted && !attentionWide(a) && (a.headDim == 64 || a.headDim == 128);
}

// Launches kernel over `blocks` blocks of `threads` threads with `shared`
// bytes of dynamic shared memory (over 48 KiB needs the kernel's opt-in,
// which fails past the device's limit).
template <class Kernel, class Step>
int launchAttentionKernel(Kernel kernel, const Step &s, int64_t blocks,
                          int threads, size_t shared, cudaStream_t stream) {
  if (blocks == 0)
    return 0;
  if (shared > 48 * 1024) {
    cudaError_t err = cudaFuncSetAttribute(
        kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(shared));
    if (err != cudaSuccess)
      return int(err);
  }
  kernel<<<unsigned(blocks), threads, shared, stream>>>(s);
  return launched();
}

// One thread a row (the block steps).
template <class Kernel, class Step>
int launchAttentionBlocks(Kernel kernel, const Step &s, int64_t blocks,
                          size_t shared, cudaStream_t stream) {
  return launchAttentionKernel(kernel, s, blocks, kAttnBlockRows, shared,
                               stream);
}

// Four threads a row (the lanes kernels).
template <class Kernel, class Step>
int launchAttentionLanes(Kernel kernel, const Step &s, int64_t blocks,
                         size_t shared, cudaStream_t stream) {
  return launchAttentionKernel(kernel, s, blocks, kLaneThreads, shared,
                               stream);
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
  const Elem from = m.in[0].elem, to = m.outElem;
  if (m.op == MapOp::Cast && from != to &&
      (from == Elem::F32 || from == Elem::BF16) &&
      (to == Elem::F32 || to == Elem::BF16) && walksInOrder(m.in[0].at, m.n) &&
      walksInOrder(m.outAt, m.n)) {
    const int64_t quads = (m.n + kCastVector - 1) / kCastVector;
    cudaStream_t st = cudaStream_t(stream);
    if (from == Elem::F32) {
      const float *in = static_cast<const float *>(m.in[0].data) + m.in[0].at.base;
      uint16_t *out = static_cast<uint16_t *>(m.out) + m.outAt.base;
      castToBf16Kernel<<<blocksFor(quads), kThreads, 0, st>>>(
          in, out, m.n, aligned(in, 16) && aligned(out, 8));
    } else {
      const uint16_t *in =
          static_cast<const uint16_t *>(m.in[0].data) + m.in[0].at.base;
      float *out = static_cast<float *>(m.out) + m.outAt.base;
      castToF32Kernel<<<blocksFor(quads), kThreads, 0, st>>>(
          in, out, m.n, aligned(in, 8) && aligned(out, 16));
    }
    return launched();
  }
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
  if (attentionLanes(a))
    return a.headDim == 64
               ? launchAttentionLanes(attentionLanesKernel<64>, s, blocks,
                                      shared, st)
               : launchAttentionLanes(attentionLanesKernel<128>, s, blocks,
                                      shared, st);
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
  if (attentionLanes(a)) {
    const size_t kvShared = attnGradKVShared<float>(a.headDim, false);
    if (a.headDim == 64) {
      if (int err = launchAttentionLanes(attentionGradQLanesKernel<64>, s,
                                         qBlocks, qShared, st))
        return err;
      return launchAttentionLanes(attentionGradKVLanesKernel<64>, s, kvBlocks,
                                  kvShared, st);
    }
    if (int err = launchAttentionLanes(attentionGradQLanesKernel<128>, s,
                                       qBlocks, qShared, st))
      return err;
    return launchAttentionLanes(attentionGradKVLanesKernel<128>, s, kvBlocks,
                                kvShared, st);
  }
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

int launchIndex(const IndexStep &s, void *stream) {
  if (s.threads == 0)
    return 0;
  indexKernel<<<blocksFor(s.threads), kThreads, 0, cudaStream_t(stream)>>>(s);
  return launched();
}

int launchResize(const ResizeStep &s, void *stream) {
  if (s.threads == 0)
    return 0;
  resizeKernel<<<blocksFor(s.threads), kThreads, 0, cudaStream_t(stream)>>>(s);
  return launched();
}

int launchGridSample(const GridSampleStep &s, void *stream) {
  if (s.threads == 0)
    return 0;
  gridSampleKernel<<<blocksFor(s.threads), kThreads, 0,
                     cudaStream_t(stream)>>>(s);
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
