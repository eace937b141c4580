// Data movement and shape ops. ONNX passes their static information
// (Reshape's target, Slice's bounds, Split's sizes, Pad's amounts, Squeeze
// and Unsqueeze axes, Expand's shape) as inputs in later opsets and as
// attributes in earlier ones; every form becomes the IR op's attributes,
// and the inputs must be constants after folding. Shape arithmetic ops that
// only make constants (Shape, Size, Range, ConstantOfShape) are accepted
// when the folder evaluates them. The sequence ops and GatherND, which have
// no IR op of their own, are decomposed (frontend/Decompose.h).
#include "frontend/translate/Translation.h"

#include "frontend/Decompose.h"
#include "frontend/OnnxNode.h"
#include "frontend/ShapeFolding.h"
#include "ir/TypeRules.h"

#include <algorithm>
#include <tuple>

namespace cleave::frontend {

using namespace cleave::ir;

static bool allZero(llvm::ArrayRef<int64_t> v) {
  return std::all_of(v.begin(), v.end(), [](int64_t p) { return p == 0; });
}

static llvm::Error translateReshape(ImportContext &ctx,
                                    const onnx::NodeProto &n, int index) {
  auto operands = ctx.tensorOperands(n, index, OpKind::Reshape);
  if (!operands)
    return operands.takeError();
  std::string where = describeNode(n, index);
  auto dims = ctx.staticInts(n, index, 1, "target shape");
  if (!dims)
    return dims.takeError();
  const Shape &xShape = ctx.input(n, 0)->type.shape;
  bool allowZero = attrInt(n, "allowzero", 0);
  int64_t known = 1, infer = -1;
  std::vector<int64_t> out;
  for (size_t i = 0; i < dims->size(); ++i) {
    int64_t d = (*dims)[i];
    if (d == 0 && !allowZero) {
      if (i >= xShape.size())
        return importError("{0}: target dim {1} is 0 (copy) but the input "
                           "has rank {2}",
                           where, i, xShape.size());
      d = xShape[i];
    }
    if (d == -1) {
      if (infer >= 0)
        return importError("{0}: more than one -1 in the target shape", where);
      infer = i;
    } else if (d < 0) {
      return importError("{0}: target dim {1} is {2}", where, i, d);
    } else if (d > (int64_t(1) << 48) ||
               (d && known > (int64_t(1) << 48) / d)) {
      return importError("{0}: target shape is too large", where);
    } else {
      known *= d;
    }
    out.push_back(d);
  }
  int64_t total = TensorType(DType::F32, xShape).numElements();
  if (infer >= 0) {
    if (known == 0 || total % known)
      return importError("{0}: cannot reshape {1} to {2}", where,
                         shapeStr(xShape), shapeStr(*dims));
    out[infer] = total / known;
  }
  return ctx.emit(n, index, OpKind::Reshape, std::move(*operands),
                  {{"shape", Attribute(out)}});
}

// Squeeze and Unsqueeze: axes as an attribute (before opset 13) or a
// constant input; Squeeze without axes drops every dim of size 1.
static llvm::Error translateSqueezeOrUnsqueeze(ImportContext &ctx,
                                               const onnx::NodeProto &n,
                                               int index) {
  OpKind kind = irOpOf(n);
  auto operands = ctx.tensorOperands(n, index, kind);
  if (!operands)
    return operands.takeError();
  auto given = ctx.axesOf(n, index);
  if (!given)
    return given.takeError();
  std::vector<int64_t> axes = std::move(*given);
  if (kind == OpKind::Squeeze && axes.empty()) {
    const Shape &xShape = ctx.input(n, 0)->type.shape;
    for (size_t i = 0; i < xShape.size(); ++i)
      if (xShape[i] == 1)
        axes.push_back(i);
  }
  return ctx.emit(n, index, kind, std::move(*operands),
                  {{"axes", Attribute(axes)}});
}

// Slice with its bounds known: default axes and steps filled in, negative
// axes made positive.
static llvm::Error emitSlice(ImportContext &ctx, const onnx::NodeProto &n,
                             int index, std::vector<Value *> operands,
                             std::vector<int64_t> starts,
                             std::vector<int64_t> ends,
                             std::vector<int64_t> axes,
                             std::vector<int64_t> steps) {
  if (axes.empty())
    for (size_t i = 0; i < starts.size(); ++i)
      axes.push_back(i);
  if (steps.empty())
    steps.assign(starts.size(), 1);
  for (int64_t &a : axes)
    if (a < 0)
      a += ctx.input(n, 0)->type.shape.size();
  return ctx.emit(n, index, OpKind::Slice, std::move(operands),
                  {{"starts", Attribute(starts)},
                   {"ends", Attribute(ends)},
                   {"axes", Attribute(axes)},
                   {"steps", Attribute(steps)}});
}

// Before opset 10, starts/ends/axes are attributes and steps are 1.
static llvm::Error translateSliceBefore10(ImportContext &ctx,
                                          const onnx::NodeProto &n, int index) {
  auto operands = ctx.tensorOperands(n, index, OpKind::Slice);
  if (!operands)
    return operands.takeError();
  auto s = attrInts(n, "starts"), e = attrInts(n, "ends");
  if (!s || !e)
    return importError("{0}: needs 'starts' and 'ends'",
                       describeNode(n, index));
  return emitSlice(ctx, n, index, std::move(*operands), *s, *e,
                   attrInts(n, "axes").value_or(std::vector<int64_t>{}), {});
}

// Since opset 10, starts, ends, axes and steps are (constant) inputs.
static llvm::Error translateSlice(ImportContext &ctx, const onnx::NodeProto &n,
                                  int index) {
  auto operands = ctx.tensorOperands(n, index, OpKind::Slice);
  if (!operands)
    return operands.takeError();
  std::vector<int64_t> starts, ends, axes, steps;
  for (auto [k, what, out] : {std::tuple{1, "starts", &starts},
                              {2, "ends", &ends},
                              {3, "axes", &axes},
                              {4, "steps", &steps}}) {
    if (k > 2 && !ctx.input(n, k))
      continue;
    auto v = ctx.staticInts(n, index, k, what);
    if (!v)
      return v.takeError();
    *out = *v;
  }
  return emitSlice(ctx, n, index, std::move(*operands), starts, ends, axes,
                   steps);
}

static llvm::Error translateExpand(ImportContext &ctx, const onnx::NodeProto &n,
                                   int index) {
  auto operands = ctx.tensorOperands(n, index, OpKind::Expand);
  if (!operands)
    return operands.takeError();
  auto dims = ctx.staticInts(n, index, 1, "shape");
  if (!dims)
    return dims.takeError();
  return ctx.emit(n, index, OpKind::Expand, std::move(*operands),
                  {{"shape", Attribute(*dims)}});
}

// Split sizes from the `split` attribute (before opset 13) or input, from
// num_outputs (opset 18), or equal parts, one per output.
static llvm::Error translateSplit(ImportContext &ctx, const onnx::NodeProto &n,
                                  int index) {
  auto operands = ctx.tensorOperands(n, index, OpKind::Split);
  if (!operands)
    return operands.takeError();
  std::string where = describeNode(n, index);
  const Shape &xShape = ctx.input(n, 0)->type.shape;
  auto axis = normalizeAxis(attrInt(n, "axis", 0), xShape.size());
  if (!axis)
    return importError("{0}: {1}", where, llvm::toString(axis.takeError()));
  std::vector<int64_t> sizes;
  if (auto a = attrInts(n, "split")) {
    sizes = *a;
  } else if (ctx.input(n, 1)) {
    auto v = ctx.staticInts(n, index, 1, "split");
    if (!v)
      return v.takeError();
    sizes = *v;
  } else if (findAttr(n, "num_outputs")) {
    // Split-18: num_outputs chunks of ceil(dim / num_outputs), the last one
    // smaller when the axis does not divide evenly.
    int64_t parts = attrInt(n, "num_outputs", 0), dim = xShape[*axis];
    if (parts <= 0 || parts != n.output_size())
      return importError("{0}: num_outputs {1} does not match its {2} "
                         "outputs",
                         where, parts, n.output_size());
    int64_t chunk = (dim + parts - 1) / parts;
    for (int64_t i = 0, left = dim; i < parts; ++i, left -= chunk)
      sizes.push_back(std::max<int64_t>(0, std::min(chunk, left)));
    if (sizes.back() == 0)
      return importError("{0}: an axis of size {1} cannot make {2} chunks",
                         where, dim, parts);
  } else {
    int64_t parts = n.output_size(), dim = xShape[*axis];
    if (parts == 0 || dim % parts)
      return importError("{0}: axis of size {1} does not split evenly into "
                         "{2}",
                         where, dim, parts);
    sizes.assign(parts, dim / parts);
  }
  return ctx.emit(n, index, OpKind::Split, std::move(*operands),
                  {{"split", Attribute(sizes)}});
}

// Without `perm`, Transpose reverses the dims.
static llvm::Error translateTranspose(ImportContext &ctx,
                                      const onnx::NodeProto &n, int index) {
  auto operands = ctx.tensorOperands(n, index, OpKind::Transpose);
  if (!operands)
    return operands.takeError();
  AttrMap attrs;
  ImportContext::Entry *x = ctx.input(n, 0);
  int64_t rank = x ? x->type.rank() : 0;
  if (auto given = attrInts(n, "perm")) {
    // PyTorch's legacy exporter writes negative entries (Mamba2's
    // [0, -2, -1, 1]); they count from the end as an axis does.
    std::vector<int64_t> perm = *given;
    for (int64_t &p : perm)
      if (p < 0 && p >= -rank)
        p += rank;
    attrs.emplace("perm", Attribute(perm));
  } else {
    std::vector<int64_t> perm;
    for (int64_t i = rank; i-- > 0;)
      perm.push_back(i);
    attrs.emplace("perm", Attribute(perm));
  }
  return ctx.emit(n, index, OpKind::Transpose, std::move(*operands),
                  std::move(attrs));
}

static llvm::Error translateTrilu(ImportContext &ctx, const onnx::NodeProto &n,
                                  int index) {
  auto operands = ctx.tensorOperands(n, index, OpKind::Trilu);
  if (!operands)
    return operands.takeError();
  AttrMap attrs;
  auto k = ctx.staticScalar(n, index, 1, "k");
  if (!k)
    return k.takeError();
  if (*k)
    attrs.emplace("k", Attribute((*k)->getInt(0)));
  return ctx.emit(n, index, OpKind::Trilu, std::move(*operands),
                  std::move(attrs));
}

// CumSum's axis and Tile's repeats are constant inputs in ONNX and
// attributes of the IR ops.
static llvm::Error translateCumSum(ImportContext &ctx,
                                   const onnx::NodeProto &n, int index) {
  auto operands = ctx.tensorOperands(n, index, OpKind::CumSum);
  if (!operands)
    return operands.takeError();
  auto axis = ctx.staticInts(n, index, 1, "axis");
  if (!axis)
    return axis.takeError();
  if (axis->size() != 1)
    return importError("{0}: axis must be one value", describeNode(n, index));
  auto a = normalizeAxis((*axis)[0], (*operands)[0]->type().rank());
  if (!a)
    return importError("{0}: {1}", describeNode(n, index),
                       llvm::toString(a.takeError()));
  return ctx.emit(n, index, OpKind::CumSum, std::move(*operands),
                  {{"axis", Attribute(int64_t(*a))}});
}

// DFT (torch.fft on complex data, FNet's token mixing): the axis is an
// attribute before opset 20 and a constant input from 20 on. The IR op
// takes complex data (a last dim of 2; real data gets a zero imaginary
// part) whole: no dft_length, no onesided output. ONNX's inverse divides by N, so it is inverse and normalized.
static llvm::Error translateDFT(ImportContext &ctx, const onnx::NodeProto &n,
                                int index) {
  auto operands = ctx.tensorOperands(n, index, OpKind::DFT);
  if (!operands)
    return operands.takeError();
  Value *input = (*operands)[0];
  TensorType x = input->type();
  // Real data (a last dim of 1) gets a zero imaginary part.
  if (x.rank() >= 2 && x.shape.back() == 1 && isFloat(x.dtype)) {
    Value *zeros = ctx.graph().addConst(ctx.freshName(n.output(0) + ".imag"),
                                        TensorData::splat(x, 0.0));
    auto complex = ctx.append(n, index, OpKind::Concat, {input, zeros},
                              {{"axis", Attribute(int64_t(-1))}});
    if (!complex)
      return complex.takeError();
    input = *complex;
    x = input->type();
  }
  if (attrInt(n, "onesided", 0))
    return importError("{0}: a onesided DFT is not supported",
                       describeNode(n, index));
  if (n.input_size() > 1 && !n.input(1).empty())
    return importError("{0}: a DFT with dft_length is not supported",
                       describeNode(n, index));
  if (x.rank() < 2 || x.shape.back() != 2)
    return importError("{0}: DFT of {1}: the last dim must be 1 (real) or "
                       "2 (complex)",
                       describeNode(n, index), x.str());
  int64_t axis = attrInt(n, "axis", 1);
  if (ctx.opset() >= 20) {
    axis = -2;
    if (n.input_size() > 2 && !n.input(2).empty()) {
      auto a = ctx.staticInts(n, index, 2, "axis");
      if (!a)
        return a.takeError();
      if (a->size() != 1)
        return importError("{0}: axis must be one value",
                           describeNode(n, index));
      axis = (*a)[0];
    }
  }
  auto a = normalizeAxis(axis, x.rank());
  if (!a || *a == int64_t(x.rank()) - 1) {
    if (!a)
      llvm::consumeError(a.takeError());
    return importError("{0}: axis {1} is not a signal axis of {2}",
                       describeNode(n, index), axis, x.str());
  }
  int64_t inverse = attrInt(n, "inverse", 0) != 0;
  return ctx.emit(n, index, OpKind::DFT, {input},
                  {{"axis", Attribute(int64_t(*a))},
                   {"inverse", Attribute(inverse)},
                   {"normalized", Attribute(inverse)}},
                  false);
}

// PyTorch's embedding(weight, ids, padding_idx) is a Gather; the row
// padding_idx names gets no gradient. The dynamo exporter records the aten
// call in the node's metadata; the legacy exporter drops it (with a
// warning), and annotate_export.py's cleave.padding_idx brings it back.
static llvm::Error translateGather(ImportContext &ctx, const onnx::NodeProto &n,
                                   int index) {
  auto operands = ctx.tensorOperands(n, index, OpKind::Gather);
  if (!operands)
    return operands.takeError();
  AttrMap attrs;
  // annotate_export.py's record (either exporter).
  auto recorded = ctx.signature().paddingIdx.find(n.input(0));
  if (recorded != ctx.signature().paddingIdx.end())
    attrs.emplace("padding_idx", Attribute(recorded->second));
  // embedding(weight, indices, padding_idx=-1, scale_grad_by_freq=False,
  // sparse=False)
  if (auto args = torchCallArgs(n, "aten.embedding.default")) {
    int64_t padding = -1;
    if (args->size() > 2 &&
        !llvm::StringRef((*args)[2]).getAsInteger(10, padding) && padding >= 0)
      attrs.insert_or_assign("padding_idx", Attribute(padding));
    if (args->size() > 3 && (*args)[3] == "True")
      return importError("{0}: embedding with scale_grad_by_freq=True is not "
                         "supported",
                         describeNode(n, index));
  }
  if (attrInt(n, "axis", 0) != 0)
    attrs.clear(); // not an embedding's row gather
  return ctx.emit(n, index, OpKind::Gather, std::move(*operands),
                  std::move(attrs));
}

static llvm::Error translateTile(ImportContext &ctx, const onnx::NodeProto &n,
                                 int index) {
  auto operands = ctx.tensorOperands(n, index, OpKind::Tile);
  if (!operands)
    return operands.takeError();
  auto repeats = ctx.staticInts(n, index, 1, "repeats");
  if (!repeats)
    return repeats.takeError();
  return ctx.emit(n, index, OpKind::Tile, std::move(*operands),
                  {{"repeats", Attribute(*repeats)}});
}

// Before opset 11, pads and value are attributes. A Pad of all zeros is an
// Identity.
static llvm::Error translatePadBefore11(ImportContext &ctx,
                                        const onnx::NodeProto &n, int index) {
  auto operands = ctx.tensorOperands(n, index, OpKind::Pad);
  if (!operands)
    return operands.takeError();
  auto pads = attrInts(n, "pads");
  if (!pads)
    return importError("{0}: needs 'pads'", describeNode(n, index));
  if (allZero(*pads))
    return ctx.emit(n, index, OpKind::Identity, std::move(*operands), {},
                    false);
  return ctx.emit(n, index, OpKind::Pad, std::move(*operands),
                  {{"pads", Attribute(*pads)},
                   {"value", Attribute(attrFloat(n, "value", 0.0f))}});
}

// Since opset 11, pads and the value are constant inputs; since 18 an
// `axes` input says which axes the pads name.
static llvm::Error translatePad(ImportContext &ctx, const onnx::NodeProto &n,
                                int index) {
  auto operands = ctx.tensorOperands(n, index, OpKind::Pad);
  if (!operands)
    return operands.takeError();
  std::string where = describeNode(n, index);
  auto pads = ctx.staticInts(n, index, 1, "pads");
  if (!pads)
    return pads.takeError();
  if (ctx.input(n, 3)) {
    // Pad-18: pads name only the listed axes; spread them over all.
    auto axes = ctx.staticInts(n, index, 3, "axes");
    if (!axes)
      return axes.takeError();
    int64_t r = ctx.input(n, 0)->type.shape.size(), k = axes->size();
    if (int64_t(pads->size()) != 2 * k)
      return importError("{0}: {1} pads for {2} axes", where, pads->size(), k);
    std::vector<int64_t> full(2 * r, 0);
    for (int64_t i = 0; i < k; ++i) {
      auto a = normalizeAxis((*axes)[i], r);
      if (!a)
        return importError("{0}: {1}", where, llvm::toString(a.takeError()));
      full[*a] = (*pads)[i];
      full[r + *a] = (*pads)[k + i];
    }
    *pads = full;
  }
  AttrMap attrs;
  auto value = ctx.staticScalar(n, index, 2, "constant_value");
  if (!value)
    return value.takeError();
  if (*value)
    attrs.emplace("value", Attribute(float((*value)->getDouble(0))));
  if (allZero(*pads))
    return ctx.emit(n, index, OpKind::Identity, std::move(*operands), {},
                    false);
  attrs.emplace("pads", Attribute(*pads));
  return ctx.emit(n, index, OpKind::Pad, std::move(*operands),
                  std::move(attrs));
}

// An op accepted only when the folder turns it into a constant; reaching
// here means it did not. A ConstantOfShape of constant inputs was refused
// for its size and fills at run time instead.
static llvm::Error translateFoldOnly(ImportContext &ctx,
                                     const onnx::NodeProto &n, int index) {
  std::string runtimeInput;
  for (int k = 0; k < n.input_size() && runtimeInput.empty(); ++k)
    if (ImportContext::Entry *e = ctx.input(n, k); e && !e->foldable)
      runtimeInput = n.input(k);
  // All inputs constant: folding refused because the result is too big. A
  // constant fill (a causal mask at a long sequence) is then computed when
  // the plan runs instead: the value broadcast to the shape.
  if (runtimeInput.empty() && n.op_type() == "ConstantOfShape")
    return decomposeLargeFill(ctx, n, index);
  if (runtimeInput.empty())
    return importError("{0}: its constant result would have more than {1} "
                       "elements, too many to fold (cleave folds shape "
                       "arithmetic only)",
                       describeNode(n, index), kMaxFoldElements);
  return importError("{0}: its result depends on runtime data (input "
                     "'{1}'), but cleave needs it to fold to a constant "
                     "(static shapes)",
                     describeNode(n, index), runtimeInput);
}

static llvm::Error importSequence(ImportContext &ctx, const onnx::NodeProto &n,
                                  int index) {
  return ctx.importSequenceOp(n, index);
}

std::vector<OpTranslation> shapeTranslations() {
  const int64_t first = kOpsetFirst, last = kOpsetLast;
  const auto op = TranslationKind::Op;
  std::vector<OpTranslation> t = {
      sameNamedOp("Concat"),
      sameNamedOp("Flatten"),
      {"Gather", first, last, translateGather},
      sameNamedOp("GatherElements"),
      sameNamedOp("ScatterND"),
      {"ScatterElements", first, last, translateScatterElements},
      {"CumSum", first, last, translateCumSum},
      {"DFT", first, last, translateDFT},
      {"Tile", first, last, translateTile},
      {"Reshape", first, last, translateReshape, op, {"allowzero"}},
      {"Squeeze", first, last, translateSqueezeOrUnsqueeze, op, {"axes"}},
      {"Unsqueeze", first, last, translateSqueezeOrUnsqueeze, op, {"axes"}},
      {"Slice", first, 9, translateSliceBefore10},
      {"Slice", 10, last, translateSlice},
      {"Expand", first, last, translateExpand},
      {"Split", first, last, translateSplit, op, {"split", "num_outputs"}},
      {"Transpose", first, last, translateTranspose},
      {"Trilu", first, last, translateTrilu},
      {"Pad", first, 10, translatePadBefore11, op, {"pads", "value"}},
      {"Pad", 11, last, translatePad, op, {"pads", "value"}},
      // Decomposed into other IR ops (frontend/Decompose.h).
      {"GatherND", first, last, decomposeGatherND},
      {"OneHot", first, last, decomposeOneHot, op, {"axis"}},
      {"SplitToSequence", first, last, decomposeSplitToSequence},
      {"SequenceAt", first, last, decomposeSequenceAt},
      // Lists of IR values at import (frontend/ControlFlow.cpp).
      {"SequenceEmpty", first, last, importSequence, op, {"dtype"}},
      {"SequenceConstruct", first, last, importSequence},
      {"SequenceInsert", first, last, importSequence},
      {"DepthToSpace", first, last, decomposeDepthToSpace, op,
       {"blocksize", "mode"}},
      {"SpaceToDepth", first, last, decomposeSpaceToDepth, op, {"blocksize"}},
      {"Col2Im", first, last, decomposeCol2Im, op, {"dilations", "pads", "strides"}},
      {"ConcatFromSequence", first, last, decomposeConcatFromSequence, op,
       {"axis", "new_axis"}},
      {"RNN", first, last, decomposeRecurrent, op,
       {"activation_alpha", "activation_beta", "activations", "clip",
        "direction", "hidden_size", "layout"}},
      {"GRU", first, last, decomposeRecurrent, op,
       {"activation_alpha", "activation_beta", "activations", "clip",
        "direction", "hidden_size", "layout", "linear_before_reset"}},
      {"LSTM", first, last, decomposeRecurrent, op,
       {"activation_alpha", "activation_beta", "activations", "clip",
        "direction", "hidden_size", "input_forget", "layout"}},
  };
  for (const char *foldOnly :
       {"Shape", "Size", "ConstantOfShape", "Range", "Constant", "EyeLike"})
    t.push_back(
        {foldOnly, first, last, translateFoldOnly, TranslationKind::FoldOnly});
  return t;
}

} // namespace cleave::frontend
