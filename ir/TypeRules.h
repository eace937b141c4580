// Result type rules, one per family of ops; Ops.def names one for each op.
#pragma once

#include "ir/OpInfo.h"
#include "support/ShapeMath.h"

namespace cleave::ir::typerules {

#define CLEAVE_RULE(Name)                                                      \
  llvm::Expected<std::vector<TensorType>> Name(const TypeQuery &q);
CLEAVE_RULE(sameAsFirst)
CLEAVE_RULE(bitwiseUnary)
CLEAVE_RULE(floatPredicate)
CLEAVE_RULE(cast)
CLEAVE_RULE(broadcast)
CLEAVE_RULE(pow)
CLEAVE_RULE(compare)
CLEAVE_RULE(mod)
CLEAVE_RULE(bitwise)
CLEAVE_RULE(where)
CLEAVE_RULE(matmul)
CLEAVE_RULE(gemm)
CLEAVE_RULE(batchNorm)
CLEAVE_RULE(layerNorm)
CLEAVE_RULE(softmax)
CLEAVE_RULE(attention)
CLEAVE_RULE(softmaxCrossEntropy)
CLEAVE_RULE(dropout)
CLEAVE_RULE(reduce)
CLEAVE_RULE(argReduce)
CLEAVE_RULE(topKIndices)
CLEAVE_RULE(concat)
CLEAVE_RULE(expand)
CLEAVE_RULE(pad)
CLEAVE_RULE(flatten)
CLEAVE_RULE(gather)
CLEAVE_RULE(gatherElements)
CLEAVE_RULE(scatterND)
CLEAVE_RULE(scatterElements)
CLEAVE_RULE(cumSum)
CLEAVE_RULE(dft)
CLEAVE_RULE(reshape)
CLEAVE_RULE(slice)
CLEAVE_RULE(split)
CLEAVE_RULE(squeeze)
CLEAVE_RULE(tile)
CLEAVE_RULE(transpose)
CLEAVE_RULE(trilu)
CLEAVE_RULE(unsqueeze)
CLEAVE_RULE(conv)
CLEAVE_RULE(pool)
CLEAVE_RULE(globalPool)
CLEAVE_RULE(resize)
CLEAVE_RULE(gridSample)
CLEAVE_RULE(gradient)
CLEAVE_RULE(optimizer)
CLEAVE_RULE(comm)
#undef CLEAVE_RULE

} // namespace cleave::ir::typerules

namespace cleave::ir {

// NumPy-style multidirectional broadcast of two shapes.
llvm::Expected<Shape> broadcastShapes(llvm::ArrayRef<int64_t> a,
                                      llvm::ArrayRef<int64_t> b);
// Maps a possibly negative axis into [0, rank); error if out of range.
llvm::Expected<int64_t> normalizeAxis(int64_t axis, int64_t rank);
// Shape checks and ONNX Slice lengths (support/ShapeMath.h).
using support::checkShape;
using support::sliceLength;

// Where a FusedAttention's Q, K, V and O keep their axes: [B, H, T, D]
// (Heads); [B, T, H, D] with seq_major 1 (SeqMajor: the projections' layout
// before the heads move forward); [T, B, H, D] with time_major 1
// (TimeMajor: nn.MultiheadAttention's sequence-first layout). The mask and
// L are [B, H, Tq, Tk] and [B, Hq, Tq] in every layout.
enum class AttentionLayout { Heads, SeqMajor, TimeMajor };
template <class WithAttrs>
AttentionLayout attentionLayout(const WithAttrs &op) {
  if (op.getInt("time_major") != 0)
    return AttentionLayout::TimeMajor;
  return op.getInt("seq_major") != 0 ? AttentionLayout::SeqMajor
                                     : AttentionLayout::Heads;
}
// The positions of B, H and T among a rank-4 operand's axes (D is last).
struct AttentionAxes {
  int batch, heads, time;
};
inline AttentionAxes attentionAxes(AttentionLayout layout) {
  switch (layout) {
  case AttentionLayout::SeqMajor:
    return {0, 2, 1};
  case AttentionLayout::TimeMajor:
    return {1, 2, 0};
  case AttentionLayout::Heads:
    break;
  }
  return {0, 1, 2};
}
// The layout's own order of [B, H, T, D] ("[B, Tk, Hkv, D]" for K with
// seq_major), for messages.
inline std::string attentionShapeName(AttentionLayout layout,
                                      const std::string &heads,
                                      const std::string &time) {
  switch (layout) {
  case AttentionLayout::SeqMajor:
    return "[B, " + time + ", " + heads + ", D]";
  case AttentionLayout::TimeMajor:
    return "[" + time + ", B, " + heads + ", D]";
  case AttentionLayout::Heads:
    break;
  }
  return "[B, " + heads + ", " + time + ", D]";
}

// The sizes of a FusedAttention's Q and K in a layout. Packed (Q, K and V
// one tensor whose heads axis holds Hq + 2 Hkv heads, packedKvHeads = Hkv
// > 0), `q` and `k` are both that tensor's shape.
struct AttentionDims {
  int64_t batch = 0, queryHeads = 0, queryLen = 0, headDim = 0,
          kvHeads = 0, keyLen = 0;
};
inline AttentionDims attentionDims(llvm::ArrayRef<int64_t> q,
                                   llvm::ArrayRef<int64_t> k,
                                   AttentionLayout layout,
                                   int64_t packedKvHeads = 0) {
  const AttentionAxes a = attentionAxes(layout);
  if (packedKvHeads > 0)
    return {q[size_t(a.batch)], q[size_t(a.heads)] - 2 * packedKvHeads,
            q[size_t(a.time)],  q[3],
            packedKvHeads,      q[size_t(a.time)]};
  return {q[size_t(a.batch)], q[size_t(a.heads)], q[size_t(a.time)], q[3],
          k[size_t(a.heads)], k[size_t(a.time)]};
}
// A FusedAttention's (or its gradient's) Hkv when Q, K and V are packed in
// one tensor, else 0.
template <class WithAttrs> int64_t attentionPackedKvHeads(const WithAttrs &op) {
  return op.getInt("packed_kv_heads");
}
// `shape` (a Q, K, V or O in `layout`) with `heads` heads.
inline Shape withAttentionHeads(llvm::ArrayRef<int64_t> shape,
                                AttentionLayout layout, int64_t heads) {
  Shape out(shape.begin(), shape.end());
  out[size_t(attentionAxes(layout).heads)] = heads;
  return out;
}

} // namespace cleave::ir
