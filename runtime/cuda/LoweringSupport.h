// The lowering's own helpers and its per-family entry points, shared by
// Lowering.cpp (the dispatch, lowerCall) and the files that lower each
// family of ops: LowerElementwise.cpp, LowerProducts.cpp,
// LowerReductions.cpp; LoweringSupport.cpp defines the helpers. Internal to
// runtime/cuda: users include Lowering.h.
#pragma once

#include "runtime/cuda/Lowering.h"

#include "llvm/ADT/ArrayRef.h"
#include "llvm/ADT/StringRef.h"
#include "llvm/Support/Error.h"

#include <optional>
#include <vector>

namespace cleave::runtime::cuda {

using ir::DType;
using ir::OpKind;

using Steps = std::vector<DeviceStep>;

// "<Op> (cuda): <why>", the one-line error of a call the lowering refuses.
llvm::Error fail(const KernelCall &call, const llvm::Twine &why);

// The kernels' element type of an IR type, if they handle it.
std::optional<Elem> elemOf(DType t);

inline bool isFloatElem(DType t) {
  return t == DType::F32 || t == DType::BF16;
}

// Row-major strides, in elements.
std::vector<int64_t> stridesOf(llvm::ArrayRef<int64_t> shape);

// An indexer over `dims` with the given strides and base.
Indexer indexer(llvm::ArrayRef<int64_t> dims, llvm::ArrayRef<int64_t> strides,
                int64_t base = 0);

Indexer contiguous(llvm::ArrayRef<int64_t> shape);

// The inputs a chunk of a reduction of `outputs` outputs of `count` inputs
// each (ReduceStep), or 0 for one thread an output: where there are fewer
// than 65536 outputs, count / 256 chunks (so at least 256 inputs each, the
// last one shorter), at most 2^21 partial results in all (16 MiB of
// scratch), and at least two.
int64_t reduceChunk(int64_t outputs, int64_t count);

// Reads `in` broadcast (NumPy rules, aligned at the right) over `out`.
Indexer broadcast(llvm::ArrayRef<int64_t> in, llvm::ArrayRef<int64_t> out);

Operand operand(const TensorRef &t, Indexer at);

// A map writing `out` contiguously, each input broadcast to out's shape.
MapArgs mapOver(MapOp op, const TensorRef &out,
                std::initializer_list<const TensorRef *> ins);

// A raw copy of `n` elements of one type, from `from` to `to`.
MapArgs copy(const TensorRef &src, Indexer from, void *dst, Indexer to,
             int64_t n);

MapArgs zero(const TensorRef &out);

std::optional<MapOp> unaryMap(OpKind k);

std::optional<MapOp> binaryMap(OpKind k);

std::optional<MapOp> unaryGradMap(llvm::StringRef fn);

// Ops that only move data: their output is the input's elements in the
// same row-major order.
bool isReshapeLike(OpKind k);

llvm::Expected<int64_t> axisOf(const KernelCall &call, int64_t axis,
                               size_t rank);

llvm::Expected<Steps> lowerDataMovement(const KernelCall &call);

// Offsets a tensor view by `elements`.
TensorRef at(const TensorRef &t, int64_t elements);

llvm::Expected<Steps> lowerMatMul(const KernelCall &call);

llvm::Expected<Steps> lowerGemm(const KernelCall &call);

// --- reductions -------------------------------------------------------------

llvm::Expected<Steps> lowerSumTo(const KernelCall &call);

double *doubles(const Scratch &scratch, int64_t n);

llvm::Expected<Steps> lowerRows(const KernelCall &call,
                                const Scratch &scratch);

llvm::Expected<Steps> lowerGather(const KernelCall &call);

llvm::Expected<Steps> lowerOptimizer(const KernelCall &call);

bool isRowOp(OpKind k);

// ReduceSum / ReduceMean / ReduceMax over `axes` (empty: all), keepdims
// or not: the output's elements are the kept dims in order either way.
llvm::Expected<Steps> lowerReduce(const KernelCall &call);

// --- convolution, pooling, batch normalization ---------------------------

// The call's one scratch request, `bytes` long (none for 0 bytes).
llvm::Expected<char *> scratchBlock(const KernelCall &call,
                                    const Scratch &scratch, size_t bytes);

// The windows from input `in` to output `out` ([N, C, spatial...] both)
// with kernel dims `kernel`, and the call's strides, pads and (for the ops
// that have them) dilations.
llvm::Expected<Window> windowOf(const KernelCall &call,
                                llvm::ArrayRef<int64_t> in,
                                llvm::ArrayRef<int64_t> out,
                                llvm::ArrayRef<int64_t> kernel,
                                bool hasDilations);

// Conv and its gradient parts as im2col (Im2colStep) and GEMMs. Image n's
// column matrix is [C * K, P] (P output positions); group g's Cg * K rows
// pair with its filters W_g [M / group, Cg * K]:
//   Conv:           Y[n, g] = W_g x cols[n, g], one GEMM per group batched
//                   over the images (W_g shared: stride 0); a bias is
//                   copied into Y first and the GEMMs add onto it;
//   ConvGradData:   cols[n, g] = W_g^T x dY[n, g] in f32 (the CPU keeps
//                   them in f32 too), then col2im gathers them into dX;
//   ConvGradFilter: dW_g = the sum over images of dY[n, g] x cols[n, g]^T,
//                   folded into one GEMM per group (batched over groups):
//                   the columns are laid out [C * K, N * P] and dY copied
//                   to [M, N * P], so the depth runs over images and
//                   positions and the batch sum is the GEMM's own, in f32.
llvm::Expected<Steps> lowerConv(const KernelCall &call,
                                const Scratch &scratch);

bool isPool(OpKind k);

// Pools and their gradients as pool steps (DeviceCode.h); GlobalAveragePool
// as a mean over each plane.
llvm::Expected<Steps> lowerPool(const KernelCall &call);

bool isBatchNorm(OpKind k);

// BatchNormalization (X, scale, B, mean, var -> Y[, running mean, running
// var]), BatchNormalizationGradData (dY, X, scale, mean, var -> dX) and
// BatchNormalizationGradParams (dY, X, mean, var -> dscale): a channel step
// for each channel's statistics, then, but for GradParams, a channel map
// applying its coefficients (DeviceCode.h).
llvm::Expected<Steps> lowerBatchNorm(const KernelCall &call,
                                     const Scratch &scratch);

// Pad: one thread an output element (padElement); the constant's bits in
// the element's type.
llvm::Expected<Steps> lowerPad(const KernelCall &call);

// --- index ops (LowerIndex.cpp) -------------------------------------------------

// CumSum, ArgMax/ArgMin, TopKIndices, Trilu, GatherElements,
// ScatterElements, ScatterND and their gradients as index steps
// (DeviceIndex.h); ScatterND's links in the call's scratch.
llvm::Expected<Steps> lowerIndex(const KernelCall &call,
                                 const Scratch &scratch);

// Resize and ResizeGrad (DeviceResize.h; LowerResize.cpp).
llvm::Expected<Steps> lowerResize(const KernelCall &call);
// GridSample and its gradients (DeviceGridSample.h; LowerResize.cpp).
llvm::Expected<Steps> lowerGridSample(const KernelCall &call);

// Tile as one strided copy.
llvm::Expected<Steps> lowerTile(const KernelCall &call);

} // namespace cleave::runtime::cuda
