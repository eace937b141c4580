// ONNX ops that cleave has no IR op for and imports as a few existing IR
// ops instead: GatherND at constant indices, the tensor-sequence ops that
// PyTorch's dynamo exporter writes for torch.split, and a ConstantOfShape
// too large to fold. Each is the translate function of its entry in the
// translation table (frontend/translate/Translation.h).
#pragma once

#include "frontend/ImportContext.h"

namespace cleave::frontend {

// GatherND with constant indices: a Reshape flattening the indexed leading
// dims and a Gather at each index tuple's linear index.
llvm::Error decomposeGatherND(ImportContext &ctx, const onnx::NodeProto &n,
                              int index);

// SplitToSequence: one Split (its parts named "<sequence>.<i>", squeezed
// when `keepdims` is 0) recorded as a sequence; SequenceAt at a constant
// position picks a part.
llvm::Error decomposeSplitToSequence(ImportContext &ctx,
                                     const onnx::NodeProto &n, int index);
llvm::Error decomposeSequenceAt(ImportContext &ctx, const onnx::NodeProto &n,
                                int index);

// ConstantOfShape whose result is too large to fold: an Expand of its
// one-element value to the (constant) shape, computed when the plan runs.
llvm::Error decomposeLargeFill(ImportContext &ctx, const onnx::NodeProto &n,
                               int index);

// InstanceNormalization: per (image, channel) plane, ReduceMean, Sub,
// Mul, Add, Sqrt and Div, then the scale and bias per channel.
llvm::Error decomposeInstanceNorm(ImportContext &ctx, const onnx::NodeProto &n,
                                  int index);

// OneHot of runtime indices (a constant depth): Equal against the
// positions, then Where between values' on and off.
llvm::Error decomposeOneHot(ImportContext &ctx, const onnx::NodeProto &n,
                            int index);

// ReduceL1 as ReduceSum(|x|), ReduceL2 as Sqrt(ReduceSum(x * x)),
// ReduceSumSquare as ReduceSum(x * x) and ReduceLogSum as
// Log(ReduceSum(x)), for opsets whose ONNX gives them no body (before 18).
// Softplus as the overflow-free Relu(x) + Log(1 + Exp(-|x|)) and
// ReduceLogSumExp as PyTorch's logsumexp computes it, m + Log(ReduceSum(
// Exp(x - m))) with m the maximum (0 where it is infinite), at every
// opset: ONNX's bodies (Log(Exp(x) + 1), Log(ReduceSum(Exp(x)))) overflow
// to inf from x = 89 in float32, where PyTorch and onnxruntime give x.
llvm::Error decomposeReduceNorm(ImportContext &ctx, const onnx::NodeProto &n,
                              int index);
llvm::Error decomposeSoftplus(ImportContext &ctx, const onnx::NodeProto &n,
                              int index);
llvm::Error decomposeReduceLogSumExp(ImportContext &ctx,
                                     const onnx::NodeProto &n, int index);

// Elu, Celu and Selu as PyTorch's elu kernel computes them: x > 0 ? x *
// poscoef : (Exp(x * negiptcoef) - 1) * negcoef, the Exp of x where x <= 0
// and of 0 elsewhere. ONNX's bodies take Exp of every x and select: past
// x = 88 that is inf in the branch not taken, and its gradient 0 * inf =
// NaN.
llvm::Error decomposeExponentialUnit(ImportContext &ctx,
                                     const onnx::NodeProto &n, int index);

// DepthToSpace (PixelShuffle) and SpaceToDepth (PixelUnshuffle) of
// [N, C, H, W]: a Reshape to 6 dims, a Transpose and a Reshape (ONNX's own
// definitions, DCR and CRD modes).
llvm::Error decomposeDepthToSpace(ImportContext &ctx, const onnx::NodeProto &n,
                                  int index);
llvm::Error decomposeSpaceToDepth(ImportContext &ctx, const onnx::NodeProto &n,
                                  int index);

// RNN, GRU and LSTM unrolled over their (static) sequence: per direction
// one MatMul of every step's input with W, then per step the recurrent
// MatMul with R and the gates of ONNX's equations (default activations;
// an RNN's Tanh, Relu or Sigmoid), the steps' hidden states concatenated
// into Y; Y_h (and LSTM's Y_c) the last step's. Both layouts, forward,
// reverse and bidirectional, GRU's linear_before_reset either way; refused
// by name: sequence_lens, other activations, clip, peepholes, LSTM's
// input_forget.
llvm::Error decomposeRecurrent(ImportContext &ctx, const onnx::NodeProto &n,
                               int index);

// Einsum of one or two operands with explicit letters: ReduceSum of the
// letters only one side has, transposes and reshapes to [batch, m, k] and
// [batch, k, n], a MatMul, and back (frontend/Einsum.cpp).
llvm::Error decomposeEinsum(ImportContext &ctx, const onnx::NodeProto &n,
                            int index);

// SoftmaxCrossEntropyLoss as PyTorch's cross_entropy computes it. The
// dynamo exporter writes F.cross_entropy as this op and drops what ONNX's
// op cannot say: `label_smoothing`, and probability targets (float labels
// of the scores' shape) pass through as labels. The node's
// `pkg.torch.onnx.fx_node` metadata keeps the call (torchCallArgs):
// with smoothing e over C classes the loss is (1 - e) times the op's plus
// e / C times the mean of -sum_c w_c log p_c (the weighted count of rows
// not ignored dividing both under reduction mean); probability targets t
// give -sum_c w_c t'_c log p_c with t' = t (1 - e) + e / C, reduced over
// the positions (mean: divided by their count). Anything else is the IR
// op as written.
llvm::Error translateSoftmaxCrossEntropy(ImportContext &ctx,
                                         const onnx::NodeProto &n, int index);

// ScatterElements as written, except torch.scatter_reduce(..., "mean"),
// which the dynamo exporter writes as reduction "none" (its last update
// wins: ONNX has no mean): from the node's PyTorch call, the scatter-add
// of the updates over the scatter-add of ones, self counted once where
// include_self (PyTorch's default), else only the updates, and self kept
// where nothing lands. With include_self=False the exporter first writes
// zeros at the addressed elements, a second such node; as a mean without
// self, that gives the same zeros.
llvm::Error translateScatterElements(ImportContext &ctx,
                                     const onnx::NodeProto &n, int index);

// Col2Im (nn.Fold, opset 18): the sum of each column's block into the
// image is a transposed convolution, grouped by channel, of the columns
// laid out as [N, C * K, blocks...] with a constant one-hot weight
// [C * K, 1, block...] (tap j of each channel's K): its gradient is the
// convolution that reads the blocks back (im2col), its forward adds the
// overlaps as ConvTranspose does.
llvm::Error decomposeCol2Im(ImportContext &ctx, const onnx::NodeProto &n,
                            int index);

// ConcatFromSequence of a sequence cleave holds as a list (SplitToSequence,
// SequenceConstruct, SequenceInsert): a Concat of its elements, each
// Unsqueezed first where new_axis stacks them.
llvm::Error decomposeConcatFromSequence(ImportContext &ctx,
                                        const onnx::NodeProto &n, int index);

} // namespace cleave::frontend

