// Result type rules, one per family of ops; Ops.def names one for each op.
#pragma once

#include "ir/OpInfo.h"
#include "support/ShapeMath.h"

namespace cleave::ir::typerules {

#define CLEAVE_RULE(Name)                                                      \
  llvm::Expected<std::vector<TensorType>> Name(const TypeQuery &q);
CLEAVE_RULE(sameAsFirst)
CLEAVE_RULE(boolUnary)
CLEAVE_RULE(floatPredicate)
CLEAVE_RULE(cast)
CLEAVE_RULE(broadcast)
CLEAVE_RULE(pow)
CLEAVE_RULE(compare)
CLEAVE_RULE(mod)
CLEAVE_RULE(logical)
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

// The sizes of a FusedAttention's Q [B, Hq, Tq, D] and K [B, Hkv, Tk, D],
// or with seq_major [B, Tq, Hq, D] and [B, Tk, Hkv, D] (the projections'
// layout before the heads move forward).
struct AttentionDims {
  int64_t batch = 0, queryHeads = 0, queryLen = 0, headDim = 0,
          kvHeads = 0, keyLen = 0;
};
inline AttentionDims attentionDims(llvm::ArrayRef<int64_t> q,
                                   llvm::ArrayRef<int64_t> k, bool seqMajor) {
  const int h = seqMajor ? 2 : 1, t = seqMajor ? 1 : 2;
  return {q[0], q[size_t(h)], q[size_t(t)], q[3], k[size_t(h)], k[size_t(t)]};
}

} // namespace cleave::ir
