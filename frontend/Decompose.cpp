// The decompositions of Decompose.h: ONNX ops imported as other IR ops,
// each keeping the gradient path differentiable through ops that have
// gradient rules.
#include "frontend/Decompose.h"

#include "frontend/OnnxNode.h"
#include "frontend/ShapeFolding.h"
#include "ir/TypeRules.h"

namespace cleave::frontend {

using namespace cleave::ir;

llvm::Error decomposeLargeFill(ImportContext &ctx, const onnx::NodeProto &n,
                               int index) {
  auto dims = ctx.staticInts(n, index, 0, "shape");
  if (!dims)
    return dims.takeError();
  auto value = constantOfShapeValue(n);
  if (!value)
    return importError("{0}: {1}", describeNode(n, index),
                       llvm::toString(value.takeError()));
  std::string name = n.output(0) + ".value";
  ctx.defineConstant(name, *value);
  Value *v = ctx.materialize(name, *ctx.lookup(name));
  return ctx.emit(n, index, OpKind::Expand, {v}, {{"shape", Attribute(*dims)}},
                  false);
}

// PyTorch's dynamo exporter writes torch.split as SplitToSequence and each
// use of a part as SequenceAt at a constant position. cleave has no
// sequence values: the split becomes one Split op (its parts named
// "<sequence>.<i>") and SequenceAt picks a part.
llvm::Error decomposeSequenceAt(ImportContext &ctx, const onnx::NodeProto &n,
                                int index) {
  std::string where = describeNode(n, index);
  const std::vector<Value *> *seq =
      ctx.sequence(n.input_size() ? n.input(0) : "");
  if (!seq)
    return importError("{0}: input '{1}' is not a sequence made by "
                       "SplitToSequence",
                       where, n.input_size() ? n.input(0) : "");
  auto pos = ctx.staticInts(n, index, 1, "position");
  if (!pos)
    return pos.takeError();
  int64_t size = seq->size();
  int64_t p = pos->size() == 1 ? (*pos)[0] : size;
  if (p < 0)
    p += size;
  if (p < 0 || p >= size || n.output_size() != 1)
    return importError("{0}: position is outside the sequence of {1} "
                       "tensors",
                       where, size);
  return ctx.define(n, index, n.output(0), (*seq)[p]);
}

llvm::Error decomposeSplitToSequence(ImportContext &ctx,
                                     const onnx::NodeProto &n, int index) {
  std::string where = describeNode(n, index);
  auto x = ctx.operand(n, index, 0);
  if (!x)
    return x.takeError();
  const Shape &shape = (*x)->type().shape;
  auto axis = normalizeAxis(attrInt(n, "axis", 0), shape.size());
  if (!axis)
    return importError("{0}: {1}", where, llvm::toString(axis.takeError()));
  int64_t dim = shape[*axis];
  std::vector<int64_t> sizes;
  bool squeeze = false;
  if (ctx.input(n, 1)) {
    auto split = ctx.staticInts(n, index, 1, "split");
    if (!split)
      return split.takeError();
    if (ctx.input(n, 1)->type.rank() == 0 && split->size() == 1) {
      int64_t chunk = (*split)[0];
      if (chunk <= 0)
        return importError("{0}: split size {1} is not positive", where, chunk);
      for (int64_t left = dim; left > 0; left -= chunk)
        sizes.push_back(std::min(chunk, left));
    } else {
      sizes = *split;
    }
  } else {
    sizes.assign(dim, 1);
    squeeze = attrInt(n, "keepdims", 1) == 0;
  }
  if (sizes.empty() || n.output_size() != 1)
    return importError("{0}: an empty split", where);
  AttrMap attrs{{"axis", Attribute(int64_t(*axis))},
                {"split", Attribute(sizes)}};
  auto types =
      inferResultTypes(OpKind::Split, {(*x)->type()}, attrs, sizes.size());
  if (!types)
    return importError("{0}: {1}", where, llvm::toString(types.takeError()));
  std::vector<std::string> names;
  for (size_t i = 0; i < sizes.size(); ++i)
    names.push_back(n.output(0) + "." + std::to_string(i));
  Graph &g = ctx.graph();
  Op *split = g.appendOp(OpKind::Split, {*x}, *types, names, std::move(attrs),
                         ctx.loc(n));
  std::vector<Value *> parts(split->results().begin(), split->results().end());
  if (squeeze)
    for (Value *&part : parts) {
      Shape s = part->type().shape;
      s.erase(s.begin() + *axis);
      part = g.appendOp(OpKind::Squeeze, {part},
                        {TensorType(part->type().dtype, s)}, {},
                        {{"axes", Attribute(std::vector<int64_t>{*axis})}},
                        ctx.loc(n))
                 ->result();
    }
  ctx.defineSequence(n.output(0), std::move(parts));
  return llvm::Error::success();
}

// GatherND whose indices are computed at run time (the dynamo export of
// advanced indexing by tensors, x[a, b]): the same Gather, at linear
// indices the graph computes: each component made non-negative (v + d
// where v < 0) and summed times its stride. A tuple with a component out
// of range gets the index `lead`, which Gather's range check refuses at
// run time with the node's name, instead of landing in another row.
llvm::Error gatherNDAtRuntimeIndices(ImportContext &ctx,
                                     const onnx::NodeProto &n, int index,
                                     Value *x, const std::string &where) {
  auto ind = ctx.operand(n, index, 1);
  if (!ind)
    return ind.takeError();
  const Shape &data = x->type().shape;
  const TensorType &it = (*ind)->type();
  if (it.dtype != DType::I64 && it.dtype != DType::I32)
    return importError("{0}: indices must be int64 or int32", where);
  if (it.shape.empty() || it.shape.back() < 1 ||
      it.shape.back() > int64_t(data.size()))
    return importError("{0}: indices of shape {1} do not fit data of rank "
                       "{2}",
                       where, shapeStr(it.shape), data.size());
  Graph &g = ctx.graph();
  auto append = [&](OpKind kind, std::vector<Value *> operands,
                    AttrMap attrs = {}) {
    return ctx.append(n, index, kind, std::move(operands), std::move(attrs));
  };
  auto ints = [&](const char *what, Shape shape, std::vector<int64_t> v) {
    return g.addConst(ctx.freshName(n.output(0) + what),
                      TensorData::fromInts(DType::I64, shape, v));
  };
  int64_t q = it.shape.back(), lead = 1;
  std::vector<int64_t> dims(data.begin(), data.begin() + q), strides(q);
  for (int64_t j = q; j-- > 0;) {
    strides[j] = lead;
    lead *= data[j];
  }
  Value *v = *ind;
  if (it.dtype != DType::I64) {
    auto wide = append(OpKind::Cast, {v}, {{"to", Attribute(std::string("i64"))}});
    if (!wide)
      return wide.takeError();
    v = *wide;
  }
  Value *zero = ints(".zero", {}, {0});
  Value *dimsC = ints(".dims", {q}, dims);
  auto neg = append(OpKind::Less, {v, zero});
  auto wrapped = neg ? append(OpKind::Add, {v, dimsC}) : neg.takeError();
  auto comp = wrapped ? append(OpKind::Where, {*neg, *wrapped, v})
                      : wrapped.takeError();
  if (!comp)
    return comp.takeError();
  // Out of range after wrapping: below 0 or from the dim on.
  auto low = append(OpKind::Less, {*comp, zero});
  auto high = low ? append(OpKind::GreaterOrEqual, {*comp, dimsC})
                  : low.takeError();
  auto bad = high ? append(OpKind::Or, {*low, *high}) : high.takeError();
  auto badInt = bad ? append(OpKind::Cast, {*bad},
                             {{"to", Attribute(std::string("i64"))}})
                    : bad.takeError();
  AttrMap lastAxis{{"axes", Attribute(std::vector<int64_t>{-1})},
                   {"keepdims", Attribute(int64_t(0))}};
  auto badCount = badInt ? append(OpKind::ReduceSum, {*badInt}, lastAxis)
                         : badInt.takeError();
  auto anyBad = badCount ? append(OpKind::Greater, {*badCount, zero})
                         : badCount.takeError();
  auto scaled = anyBad ? append(OpKind::Mul, {*comp, ints(".strides", {q}, strides)})
                       : anyBad.takeError();
  auto linear = scaled ? append(OpKind::ReduceSum, {*scaled}, lastAxis)
                       : scaled.takeError();
  auto checked = linear ? append(OpKind::Where,
                                 {*anyBad, ints(".outside", {}, {lead}), *linear})
                        : linear.takeError();
  if (!checked)
    return checked.takeError();
  Shape flat{lead};
  flat.insert(flat.end(), data.begin() + q, data.end());
  auto reshaped = append(
      OpKind::Reshape, {x},
      {{"shape", Attribute(std::vector<int64_t>(flat.begin(), flat.end()))}});
  if (!reshaped)
    return reshaped.takeError();
  return ctx.emit(n, index, OpKind::Gather, {*reshaped, *checked},
                  {{"axis", Attribute(int64_t(0))}}, false);
}

// GatherND with constant indices (what PyTorch exports for advanced
// indexing by aranges, as in attention-mask building) is a Gather over the
// flattened leading dims: data [d0..d(q-1), rest...] is reshaped to
// [d0*...*d(q-1), rest...] and gathered at the linear index of each index
// tuple. Both ops have gradients, so the path stays differentiable.
// Runtime indices: gatherNDAtRuntimeIndices.
llvm::Error decomposeGatherND(ImportContext &ctx, const onnx::NodeProto &n,
                              int index) {
  std::string where = describeNode(n, index);
  if (attrInt(n, "batch_dims", 0) != 0)
    return importError("{0}: GatherND with batch_dims is not supported", where);
  auto x = ctx.operand(n, index, 0);
  if (!x)
    return x.takeError();
  ImportContext::Entry *ind = ctx.input(n, 1);
  if (!ind)
    return importError("{0}: GatherND needs its indices input", where);
  if (!ind->foldable)
    return gatherNDAtRuntimeIndices(ctx, n, index, *x, where);
  const Shape &data = (*x)->type().shape;
  const Shape &ishape = ind->type.shape;
  if (ishape.empty() || ishape.back() < 1 ||
      ishape.back() > int64_t(data.size()))
    return importError("{0}: indices of shape {1} do not fit data of rank "
                       "{2}",
                       where, shapeStr(ishape), data.size());
  int64_t q = ishape.back(), lead = 1;
  for (int64_t j = 0; j < q; ++j)
    lead *= data[j];
  Shape flat{lead};
  flat.insert(flat.end(), data.begin() + q, data.end());
  Shape outIdx(ishape.begin(), ishape.end() - 1);
  int64_t tuples = TensorType(DType::I64, outIdx).numElements();
  std::vector<int64_t> linear(tuples);
  for (int64_t t = 0; t < tuples; ++t) {
    int64_t l = 0;
    for (int64_t j = 0; j < q; ++j) {
      int64_t v = ind->data->getInt(t * q + j);
      if (v < -data[j] || v >= data[j])
        return importError("{0}: index {1} is out of range for axis {2} of "
                           "size {3}",
                           where, v, j, data[j]);
      l = l * data[j] + (v < 0 ? v + data[j] : v);
    }
    linear[t] = l;
  }
  Graph &g = ctx.graph();
  Op *reshape = g.appendOp(
      OpKind::Reshape, {*x}, {TensorType((*x)->type().dtype, flat)}, {},
      {{"shape", Attribute(std::vector<int64_t>(flat.begin(), flat.end()))}},
      ctx.loc(n));
  Value *indices =
      g.addDeclared(ValueKind::Const, n.output(0) + ".linear_indices",
                    TensorData::fromInts(DType::I64, outIdx, linear));
  return ctx.emit(n, index, OpKind::Gather, {reshape->result(), indices},
                  {{"axis", Attribute(int64_t(0))}}, false);
}

} // namespace cleave::frontend

namespace cleave::frontend {

// InstanceNormalization(X [N, C, D...], scale [C], B [C]): each (image,
// channel) plane normalized by its own mean and population variance,
// y = (x - mean) / sqrt(var + epsilon) * scale + B, spelled in ReduceMean,
// Sub, Mul, Add, Sqrt and Div, which all have gradients.
llvm::Error decomposeInstanceNorm(ImportContext &ctx, const onnx::NodeProto &n,
                                  int index) {
  std::string where = describeNode(n, index);
  std::vector<Value *> in;
  for (int k = 0; k < 3; ++k) {
    auto v = ctx.operand(n, index, k);
    if (!v)
      return v.takeError();
    in.push_back(*v);
  }
  const TensorType &xt = in[0]->type();
  int64_t r = xt.rank();
  if (r < 3 || in[1]->type().shape != Shape{xt.shape[1]} ||
      in[2]->type().shape != Shape{xt.shape[1]})
    return importError("{0}: InstanceNormalization needs X [N, C, D...] and "
                       "scale and B of [C]",
                       where);
  Graph &g = ctx.graph();
  auto append = [&](OpKind kind, std::vector<Value *> operands,
                    AttrMap attrs) {
    return ctx.append(n, index, kind, std::move(operands), std::move(attrs));
  };
  std::vector<int64_t> axes, perChannel{xt.shape[1]};
  for (int64_t i = 2; i < r; ++i) {
    axes.push_back(i);
    perChannel.push_back(1);
  }
  AttrMap overPlane{{"axes", Attribute(axes)},
                    {"keepdims", Attribute(int64_t(1))}};
  auto mean = append(OpKind::ReduceMean, {in[0]}, overPlane);
  if (!mean)
    return mean.takeError();
  auto centered = append(OpKind::Sub, {in[0], *mean}, {});
  if (!centered)
    return centered.takeError();
  auto squares = append(OpKind::Mul, {*centered, *centered}, {});
  if (!squares)
    return squares.takeError();
  auto var = append(OpKind::ReduceMean, {*squares}, overPlane);
  if (!var)
    return var.takeError();
  float epsilon = attrFloat(n, "epsilon", 1e-5f);
  Value *eps = g.addConst(
      ctx.freshName(n.output(0) + ".epsilon"),
      TensorData::fromDoubles(xt.dtype, {},
                              {xt.dtype == DType::F64
                                   ? ir::decimalWidened(epsilon)
                                   : double(epsilon)}));
  auto shifted = append(OpKind::Add, {*var, eps}, {});
  if (!shifted)
    return shifted.takeError();
  auto root = append(OpKind::Sqrt, {*shifted}, {});
  if (!root)
    return root.takeError();
  auto normed = append(OpKind::Div, {*centered, *root}, {});
  if (!normed)
    return normed.takeError();
  AttrMap toChannel{{"shape", Attribute(perChannel)}};
  auto scale = append(OpKind::Reshape, {in[1]}, toChannel);
  if (!scale)
    return scale.takeError();
  auto bias = append(OpKind::Reshape, {in[2]}, toChannel);
  if (!bias)
    return bias.takeError();
  auto scaled = append(OpKind::Mul, {*normed, *scale}, {});
  if (!scaled)
    return scaled.takeError();
  return ctx.emit(n, index, OpKind::Add, {*scaled, *bias}, {}, false);
}

} // namespace cleave::frontend

namespace cleave::frontend {

llvm::Error decomposeReduceNorm(ImportContext &ctx, const onnx::NodeProto &n,
                                int index) {
  llvm::StringRef op(n.op_type());
  auto x = ctx.operand(n, index, 0);
  if (!x)
    return x.takeError();
  auto given = ctx.reductionAxesOf(n, index);
  if (!given)
    return given.takeError();
  // The steps: the terms (|x| for L1, x * x for L2 and SumSquare), their
  // sum over the axes, then Sqrt (L2) or Log (LogSum). Where the node
  // reduces nothing (noop_with_empty_axes, no axes) the sum is left out
  // and each element is its own term, as ONNX's function bodies and
  // reference give (|x| for L2, x * x for SumSquare).
  struct Step {
    OpKind kind;
    AttrMap attrs;
  };
  std::vector<Step> steps;
  if (op == "ReduceL1")
    steps.push_back({OpKind::Abs, {}});
  else if (op != "ReduceLogSum")
    steps.push_back({OpKind::Mul, {}});
  if (*given) {
    AttrMap reduce{{"keepdims", Attribute(attrInt(n, "keepdims", 1))}};
    if (!(*given)->empty())
      reduce.emplace("axes", Attribute(**given));
    steps.push_back({OpKind::ReduceSum, std::move(reduce)});
  }
  if (op == "ReduceL2")
    steps.push_back({OpKind::Sqrt, {}});
  else if (op == "ReduceLogSum")
    steps.push_back({OpKind::Log, {}});
  Value *v = *x;
  for (size_t i = 0; i + 1 < steps.size(); ++i) {
    std::vector<Value *> operands{v};
    if (steps[i].kind == OpKind::Mul)
      operands.push_back(v);
    auto next = ctx.append(n, index, steps[i].kind, operands, steps[i].attrs);
    if (!next)
      return next.takeError();
    v = *next;
  }
  std::vector<Value *> operands{v};
  if (steps.back().kind == OpKind::Mul)
    operands.push_back(v);
  return ctx.emit(n, index, steps.back().kind, operands, steps.back().attrs,
                  false);
}

// OneHot whose indices are computed at run time (the folder takes constant
// ones): depth must be known at compile time (the output's shape). The
// indices, made int64 and wrapped (v + depth where v < 0), are compared
// with the positions 0..depth-1 along the new axis; Where picks values[1]
// (on) or values[0] (off). An index out of range matches no position: all
// off, as ONNX says.
llvm::Error decomposeOneHot(ImportContext &ctx, const onnx::NodeProto &n,
                            int index) {
  auto ind = ctx.operand(n, index, 0);
  if (!ind)
    return ind.takeError();
  auto depthData = ctx.staticScalar(n, index, 1, "depth");
  if (!depthData)
    return depthData.takeError();
  if (!*depthData)
    return importError("{0}: depth is missing", describeNode(n, index));
  // The positions are a constant of `depth` elements: a bound keeps a
  // corrupt depth from asking for all of memory.
  constexpr int64_t kMaxDepth = int64_t(1) << 26;
  bool floating = isFloat((*depthData)->type().dtype);
  double asked = floating ? (*depthData)->getDouble(0)
                          : double((*depthData)->getInt(0));
  if (!(asked >= 1) || asked > double(kMaxDepth))
    return importError("{0}: depth {1} is not in [1, {2}]",
                       describeNode(n, index),
                       floating ? llvm::formatv("{0}", asked).str()
                                : std::to_string((*depthData)->getInt(0)),
                       kMaxDepth);
  int64_t depth = int64_t(asked);
  auto values = ctx.operand(n, index, 2);
  if (!values)
    return values.takeError();
  if ((*values)->type().shape != Shape{2})
    return importError("{0}: values must be [off, on], not {1}",
                       describeNode(n, index), (*values)->type().str());
  int64_t rank = int64_t((*ind)->type().rank());
  int64_t axis = attrInt(n, "axis", -1);
  if (axis < -(rank + 1) || axis > rank)
    return importError("{0}: axis {1} is out of range for indices of rank "
                       "{2}",
                       describeNode(n, index), axis, rank);
  if (axis < 0)
    axis += rank + 1;
  auto append = [&](OpKind kind, std::vector<Value *> operands,
                    AttrMap attrs = {}) {
    return ctx.append(n, index, kind, std::move(operands), std::move(attrs));
  };
  Graph &g = ctx.graph();
  Value *v = *ind;
  if (v->type().dtype != DType::I64) {
    auto wide = append(OpKind::Cast, {v}, {{"to", Attribute(std::string("i64"))}});
    if (!wide)
      return wide.takeError();
    v = *wide;
  }
  auto ints = [&](const char *what, Shape shape, std::vector<int64_t> data) {
    return g.addConst(ctx.freshName(n.output(0) + what),
                      TensorData::fromInts(DType::I64, shape, data));
  };
  auto neg = append(OpKind::Less, {v, ints(".zero", {}, {0})});
  auto shifted = neg ? append(OpKind::Add, {v, ints(".depth", {}, {depth})})
                     : neg.takeError();
  auto wrapped = shifted ? append(OpKind::Where, {*neg, *shifted, v})
                         : shifted.takeError();
  auto lifted = wrapped ? append(OpKind::Unsqueeze, {*wrapped},
                                 {{"axes", Attribute(std::vector<int64_t>{axis})}})
                        : wrapped.takeError();
  if (!lifted)
    return lifted.takeError();
  // Positions along the new axis: [depth, 1, ...] broadcasts over the
  // index dims after it.
  Shape positionShape(size_t(rank + 1 - axis), 1);
  positionShape[0] = depth;
  std::vector<int64_t> positions(static_cast<size_t>(depth));
  for (int64_t j = 0; j < depth; ++j)
    positions[size_t(j)] = j;
  auto hit = append(OpKind::Equal, {*lifted, ints(".positions", positionShape,
                                                  positions)});
  auto slice = [&](int64_t at) {
    return append(OpKind::Slice, {*values},
                  {{"axes", Attribute(std::vector<int64_t>{0})},
                   {"starts", Attribute(std::vector<int64_t>{at})},
                   {"ends", Attribute(std::vector<int64_t>{at + 1})},
                   {"steps", Attribute(std::vector<int64_t>{1})}});
  };
  auto off = hit ? slice(0) : hit.takeError();
  auto on = off ? slice(1) : off.takeError();
  if (!on)
    return on.takeError();
  return ctx.emit(n, index, OpKind::Where, {*hit, *on, *off}, {}, false);
}

// A one-element constant of type `dt` for node `n`'s decomposition, named
// after its output and `what`.
static Value *scalarFor(ImportContext &ctx, const onnx::NodeProto &n,
                        DType dt, const char *what, double v) {
  return ctx.graph().addConst(ctx.freshName(n.output(0) + "." + what),
                              TensorData::fromDoubles(dt, {}, {v}));
}

llvm::Error decomposeReduceLogSumExp(ImportContext &ctx,
                                     const onnx::NodeProto &n, int index) {
  auto x = ctx.operand(n, index, 0);
  if (!x)
    return x.takeError();
  auto given = ctx.reductionAxesOf(n, index);
  if (!given)
    return given.takeError();
  if (!*given) // the input unchanged, as ONNX says
    return ctx.define(n, index, n.output(0), *x);
  std::vector<int64_t> axes = std::move(**given);
  const int64_t rank = int64_t((*x)->type().shape.size());
  if (axes.empty())
    for (int64_t a = 0; a < rank; ++a)
      axes.push_back(a);
  for (int64_t &a : axes)
    if (a < 0)
      a += rank;
  AttrMap kept{{"keepdims", Attribute(int64_t(1))},
               {"axes", Attribute(axes)}};
  auto max = ctx.append(n, index, OpKind::ReduceMax, {*x}, kept);
  if (!max)
    return max.takeError();
  // An infinite maximum (a row of -inf, or one with +inf) is taken as 0:
  // the row's result is then -inf or +inf, not inf - inf.
  auto infinite = ctx.append(n, index, OpKind::IsInf, {*max}, {});
  if (!infinite)
    return infinite.takeError();
  Value *zero = scalarFor(ctx, n, (*x)->type().dtype, "zero", 0.0);
  auto shift = ctx.append(n, index, OpKind::Where, {*infinite, zero, *max}, {});
  if (!shift)
    return shift.takeError();
  auto centred = ctx.append(n, index, OpKind::Sub, {*x, *shift}, {});
  if (!centred)
    return centred.takeError();
  auto e = ctx.append(n, index, OpKind::Exp, {*centred}, {});
  if (!e)
    return e.takeError();
  auto sum = ctx.append(n, index, OpKind::ReduceSum, {*e}, kept);
  if (!sum)
    return sum.takeError();
  auto log = ctx.append(n, index, OpKind::Log, {*sum}, {});
  if (!log)
    return log.takeError();
  if (attrInt(n, "keepdims", 1))
    return ctx.emit(n, index, OpKind::Add, {*log, *shift}, {}, false);
  auto total = ctx.append(n, index, OpKind::Add, {*log, *shift}, {});
  if (!total)
    return total.takeError();
  return ctx.emit(n, index, OpKind::Squeeze, {*total},
                  {{"axes", Attribute(axes)}}, false);
}

llvm::Error decomposeExponentialUnit(ImportContext &ctx,
                                     const onnx::NodeProto &n, int index) {
  auto x = ctx.operand(n, index, 0);
  if (!x)
    return x.takeError();
  const DType dt = (*x)->type().dtype;
  // An attribute as float data takes it, float64 data the decimal it was
  // written as (ir::decimalWidened); the products of two in double.
  auto widened = [&](const char *name, float def) {
    float f = attrFloat(n, name, def);
    return dt == DType::F64 ? ir::decimalWidened(f) : double(f);
  };
  double negcoef = 1, negiptcoef = 1, poscoef = 1;
  if (n.op_type() == "Elu") {
    negcoef = widened("alpha", 1.0f);
  } else if (n.op_type() == "Celu") {
    negcoef = widened("alpha", 1.0f);
    negiptcoef = 1.0 / negcoef;
  } else { // Selu: ONNX's defaults are PyTorch's constants as floats
    poscoef = widened("gamma", 1.05070102214813232421875f);
    negcoef = widened("alpha", 1.67326319217681884765625f) * poscoef;
  }
  auto constant = [&](const char *what, double v) {
    return scalarFor(ctx, n, dt, what, v);
  };
  auto times = [&](Value *v, const char *what,
                   double c) -> llvm::Expected<Value *> {
    if (c == 1)
      return v;
    return ctx.append(n, index, OpKind::Mul, {v, constant(what, c)}, {});
  };
  Value *zero = constant("zero", 0.0);
  auto positive = ctx.append(n, index, OpKind::Greater, {*x, zero}, {});
  if (!positive)
    return positive.takeError();
  auto nonPositive =
      ctx.append(n, index, OpKind::Where, {*positive, zero, *x}, {});
  if (!nonPositive)
    return nonPositive.takeError();
  auto inner = times(*nonPositive, "negiptcoef", negiptcoef);
  if (!inner)
    return inner.takeError();
  auto e = ctx.append(n, index, OpKind::Exp, {*inner}, {});
  if (!e)
    return e.takeError();
  auto em1 = ctx.append(n, index, OpKind::Sub, {*e, constant("one", 1.0)}, {});
  if (!em1)
    return em1.takeError();
  auto negative = times(*em1, "negcoef", negcoef);
  if (!negative)
    return negative.takeError();
  auto pos = times(*x, "poscoef", poscoef);
  if (!pos)
    return pos.takeError();
  return ctx.emit(n, index, OpKind::Where, {*positive, *pos, *negative}, {},
                  false);
}

llvm::Error decomposeSoftplus(ImportContext &ctx, const onnx::NodeProto &n,
                              int index) {
  auto x = ctx.operand(n, index, 0);
  if (!x)
    return x.takeError();
  auto abs = ctx.append(n, index, OpKind::Abs, {*x}, {});
  if (!abs)
    return abs.takeError();
  auto neg = ctx.append(n, index, OpKind::Neg, {*abs}, {});
  if (!neg)
    return neg.takeError();
  auto e = ctx.append(n, index, OpKind::Exp, {*neg}, {});
  if (!e)
    return e.takeError();
  Value *one = scalarFor(ctx, n, (*x)->type().dtype, "one", 1.0);
  auto onePlus = ctx.append(n, index, OpKind::Add, {*e, one}, {});
  if (!onePlus)
    return onePlus.takeError();
  auto log = ctx.append(n, index, OpKind::Log, {*onePlus}, {});
  if (!log)
    return log.takeError();
  auto relu = ctx.append(n, index, OpKind::Relu, {*x}, {});
  if (!relu)
    return relu.takeError();
  return ctx.emit(n, index, OpKind::Add, {*relu, *log}, {}, false);
}

// Reshape to `split`, Transpose by `perm`, Reshape to `out`: the data
// movement of DepthToSpace and SpaceToDepth.
static llvm::Error reshapeTransposeReshape(ImportContext &ctx,
                                           const onnx::NodeProto &n,
                                           int index, Value *x,
                                           std::vector<int64_t> split,
                                           std::vector<int64_t> perm,
                                           std::vector<int64_t> out) {
  auto a = ctx.append(n, index, OpKind::Reshape, {x},
                      {{"shape", Attribute(std::move(split))}});
  if (!a)
    return a.takeError();
  auto b = ctx.append(n, index, OpKind::Transpose, {*a},
                      {{"perm", Attribute(std::move(perm))}});
  if (!b)
    return b.takeError();
  auto c = ctx.append(n, index, OpKind::Reshape, {*b},
                      {{"shape", Attribute(std::move(out))}});
  if (!c)
    return c.takeError();
  return ctx.define(n, index, n.output(0), *c);
}

// X [N, C, H, W] and a blocksize that divides what it must.
static llvm::Expected<std::pair<Value *, int64_t>>
blockOperand(ImportContext &ctx, const onnx::NodeProto &n, int index,
             bool depthToSpace) {
  std::string where = describeNode(n, index);
  auto x = ctx.operand(n, index, 0);
  if (!x)
    return x.takeError();
  const Shape &s = (*x)->type().shape;
  int64_t b = attrInt(n, "blocksize", 0);
  if (s.size() != 4 || b < 1)
    return importError("{0}: {1} needs X [N, C, H, W] and a blocksize of at "
                       "least 1",
                       where, n.op_type());
  if (depthToSpace ? s[1] % (b * b) != 0 : s[2] % b != 0 || s[3] % b != 0)
    return importError("{0}: blocksize {1} does not divide {2} {3}", where, b,
                       depthToSpace ? "the channels of" : "the height and "
                                                          "width of",
                       shapeStr(s));
  return std::make_pair(*x, b);
}

llvm::Error decomposeDepthToSpace(ImportContext &ctx, const onnx::NodeProto &n,
                                  int index) {
  auto xb = blockOperand(ctx, n, index, true);
  if (!xb)
    return xb.takeError();
  auto [x, b] = *xb;
  const Shape &s = x->type().shape;
  int64_t c = s[1] / (b * b);
  std::string mode = attrString(n, "mode", "DCR");
  std::vector<int64_t> out{s[0], c, s[2] * b, s[3] * b};
  if (mode == "DCR")
    return reshapeTransposeReshape(ctx, n, index, x,
                                   {s[0], b, b, c, s[2], s[3]},
                                   {0, 3, 4, 1, 5, 2}, out);
  if (mode == "CRD")
    return reshapeTransposeReshape(ctx, n, index, x,
                                   {s[0], c, b, b, s[2], s[3]},
                                   {0, 1, 4, 2, 5, 3}, out);
  return importError("{0}: mode '{1}' is not DCR or CRD",
                     describeNode(n, index), mode);
}

llvm::Error decomposeSpaceToDepth(ImportContext &ctx, const onnx::NodeProto &n,
                                  int index) {
  auto xb = blockOperand(ctx, n, index, false);
  if (!xb)
    return xb.takeError();
  auto [x, b] = *xb;
  const Shape &s = x->type().shape;
  return reshapeTransposeReshape(
      ctx, n, index, x, {s[0], s[1], s[2] / b, b, s[3] / b, b},
      {0, 3, 5, 1, 2, 4}, {s[0], s[1] * b * b, s[2] / b, s[3] / b});
}

llvm::Error decomposeRecurrent(ImportContext &ctx, const onnx::NodeProto &n,
                               int index) {
  std::string where = describeNode(n, index);
  const std::string &kind = n.op_type();
  const int64_t gates = kind == "LSTM" ? 4 : kind == "GRU" ? 3 : 1;
  auto input = [&](int k) -> llvm::Expected<Value *> {
    if (k >= n.input_size() || n.input(k).empty())
      return nullptr;
    return ctx.operand(n, index, k);
  };
  auto x = input(0), w = input(1), r = input(2), b = input(3);
  if (!x)
    return x.takeError();
  if (!w)
    return w.takeError();
  if (!r)
    return r.takeError();
  if (!b)
    return b.takeError();
  if (n.input_size() > 4 && !n.input(4).empty())
    return importError("{0}: sequence_lens is not supported (every sequence "
                       "runs its full length)",
                       where);
  auto h0 = input(5);
  if (!h0)
    return h0.takeError();
  llvm::Expected<Value *> c0 = nullptr;
  if (kind == "LSTM") {
    c0 = input(6);
    if (!c0)
      return c0.takeError();
    if (n.input_size() > 7 && !n.input(7).empty())
      return importError("{0}: LSTM peepholes (input P) are not supported",
                         where);
    if (attrInt(n, "input_forget", 0))
      return importError("{0}: LSTM input_forget is not supported", where);
  }
  std::string direction = attrString(n, "direction", "forward");
  // The default activations, spelled out or not (the legacy exporter
  // writes them), and no clip; an RNN's may be Relu or Sigmoid too
  // (nn.RNN(nonlinearity="relu")), one per direction.
  OpKind rnnAct[2] = {OpKind::Tanh, OpKind::Tanh};
  const onnx::AttributeProto *given = findAttr(n, "activations");
  if (kind == "RNN" && given) {
    if (given->strings_size() < 1 || given->strings_size() > 2)
      return importError("{0}: an RNN takes one activation a direction, not "
                         "{1}",
                         where, given->strings_size());
    for (int i = 0; i < given->strings_size(); ++i) {
      llvm::StringRef f(given->strings(i));
      if (f.equals_insensitive("relu"))
        rnnAct[i] = OpKind::Relu;
      else if (f.equals_insensitive("sigmoid"))
        rnnAct[i] = OpKind::Sigmoid;
      else if (!f.equals_insensitive("tanh"))
        return importError("{0}: RNN activation '{1}' is not supported "
                           "(Tanh, Relu and Sigmoid are)",
                           where, f);
    }
    if (given->strings_size() == 1)
      rnnAct[1] = rnnAct[0];
    given = nullptr; // checked
  }
  if (const onnx::AttributeProto *a = given) {
    std::vector<std::string> want = kind == "LSTM"  ? std::vector<std::string>{"sigmoid", "tanh", "tanh"}
                                    : kind == "GRU" ? std::vector<std::string>{"sigmoid", "tanh"}
                                                    : std::vector<std::string>{"tanh"};
    size_t per = want.size();
    bool ok = a->strings_size() == int(per) ||
              (direction == "bidirectional" && a->strings_size() == int(2 * per));
    for (int i = 0; ok && i < a->strings_size(); ++i)
      ok = llvm::StringRef(a->strings(i)).equals_insensitive(want[size_t(i) % per]);
    if (!ok)
      return importError("{0}: only the default activations of {1} are "
                         "supported",
                         where, kind);
  }
  if (findAttr(n, "activation_alpha") || findAttr(n, "activation_beta") ||
      findAttr(n, "clip"))
    return importError("{0}: activation_alpha, activation_beta and clip are "
                       "not supported",
                       where);
  if (direction != "forward" && direction != "reverse" &&
      direction != "bidirectional")
    return importError("{0}: direction '{1}' is not forward, reverse or "
                       "bidirectional",
                       where, direction);
  int64_t dirs = direction == "bidirectional" ? 2 : 1;
  int64_t layout = attrInt(n, "layout", 0);
  int64_t hidden = attrInt(n, "hidden_size", 0);
  bool linearBeforeReset = attrInt(n, "linear_before_reset", 0) != 0;
  Graph &g = ctx.graph();
  auto append = [&](OpKind k, std::vector<Value *> ops,
                    AttrMap attrs = {}) -> llvm::Expected<Value *> {
    return ctx.append(n, index, k, std::move(ops), std::move(attrs));
  };
  const Shape xs = (*x)->type().shape;
  if (xs.size() != 3 || hidden < 1 || (layout != 0 && layout != 1))
    return importError("{0}: {1} needs X of rank 3, hidden_size and layout 0 "
                       "or 1",
                       where, kind);
  DType dt = (*x)->type().dtype;
  int64_t steps = layout ? xs[1] : xs[0], batch = layout ? xs[0] : xs[1],
          in = xs[2], gh = gates * hidden;
  if ((*w)->type().shape != Shape{dirs, gh, in} ||
      (*r)->type().shape != Shape{dirs, gh, hidden} ||
      (*b && (*b)->type().shape != Shape{dirs, 2 * gh}))
    return importError("{0}: W, R or B do not have the shapes {1} with "
                       "hidden_size {2} and {3} direction(s) needs",
                       where, kind, hidden, dirs);
  Value *xt = *x;
  if (layout) { // [B, T, I] -> [T, B, I]
    auto t = append(OpKind::Transpose, {xt},
                    {{"perm", Attribute(std::vector<int64_t>{1, 0, 2})}});
    if (!t)
      return t.takeError();
    xt = *t;
  }
  auto slice = [&](Value *v, int64_t axis, int64_t from,
                   int64_t to) -> llvm::Expected<Value *> {
    return append(OpKind::Slice, {v},
                  {{"axes", Attribute(std::vector<int64_t>{axis})},
                   {"starts", Attribute(std::vector<int64_t>{from})},
                   {"ends", Attribute(std::vector<int64_t>{to})},
                   {"steps", Attribute(std::vector<int64_t>{1})}});
  };
  auto reshape = [&](Value *v, std::vector<int64_t> shape) {
    return append(OpKind::Reshape, {v}, {{"shape", Attribute(std::move(shape))}});
  };
  // The direction's slice of a [dirs, a, b] tensor as [a, b].
  auto ofDirection = [&](Value *v, int64_t d) -> llvm::Expected<Value *> {
    auto s = slice(v, 0, d, d + 1);
    if (!s)
      return s.takeError();
    const Shape &sh = (*s)->type().shape;
    return reshape(*s, std::vector<int64_t>(sh.begin() + 1, sh.end()));
  };
  Value *one = g.addConst(ctx.freshName(n.output(0) + ".one"),
                          TensorData::fromDoubles(dt, {}, {1.0}));
  std::vector<Value *> ys, lastH, lastC;
  for (int64_t d = 0; d < dirs; ++d) {
    bool reverse = direction == "reverse" || d == 1;
    auto wd = ofDirection(*w, d);
    if (!wd)
      return wd.takeError();
    auto rd = ofDirection(*r, d);
    if (!rd)
      return rd.takeError();
    auto wT = append(OpKind::Transpose, {*wd},
                     {{"perm", Attribute(std::vector<int64_t>{1, 0})}});
    if (!wT)
      return wT.takeError();
    auto rT = append(OpKind::Transpose, {*rd},
                     {{"perm", Attribute(std::vector<int64_t>{1, 0})}});
    if (!rT)
      return rT.takeError();
    // Every step's input part at once: [T, B, G·H], with W's bias.
    auto xw = append(OpKind::MatMul, {xt, *wT});
    if (!xw)
      return xw.takeError();
    Value *wb = nullptr, *rb = nullptr;
    if (*b) {
      auto bd = ofDirection(*b, d);
      if (!bd)
        return bd.takeError();
      auto wbs = slice(*bd, 0, 0, gh);
      if (!wbs)
        return wbs.takeError();
      auto rbs = slice(*bd, 0, gh, 2 * gh);
      if (!rbs)
        return rbs.takeError();
      wb = *wbs, rb = *rbs;
      auto sum = append(OpKind::Add, {*xw, wb});
      if (!sum)
        return sum.takeError();
      *xw = *sum;
    }
    auto start = [&](llvm::Expected<Value *> &given,
                     const char *what) -> llvm::Expected<Value *> {
      if (*given)
        return ofDirection(*given, d);
      return g.addConst(ctx.freshName(n.output(0) + what),
                        TensorData::splat(TensorType(dt, {batch, hidden}), 0.0));
    };
    auto h = start(h0, ".h0");
    if (!h)
      return h.takeError();
    llvm::Expected<Value *> c = nullptr;
    if (kind == "LSTM") {
      c = start(c0, ".c0");
      if (!c)
        return c.takeError();
    }
    std::vector<Value *> hs(size_t(steps), nullptr);
    for (int64_t i = 0; i < steps; ++i) {
      int64_t t = reverse ? steps - 1 - i : i;
      auto xs1 = slice(*xw, 0, t, t + 1);
      if (!xs1)
        return xs1.takeError();
      auto xg = reshape(*xs1, {batch, gh});
      if (!xg)
        return xg.takeError();
      auto hr = append(OpKind::MatMul, {*h, *rT});
      if (!hr)
        return hr.takeError();
      if (rb) {
        auto s = append(OpKind::Add, {*hr, rb});
        if (!s)
          return s.takeError();
        *hr = *s;
      }
      auto gate = [&](Value *v, int64_t k) { return slice(v, 1, k * hidden, (k + 1) * hidden); };
      auto act = [&](OpKind f, Value *a, Value *bv) -> llvm::Expected<Value *> {
        auto s = append(OpKind::Add, {a, bv});
        if (!s)
          return s.takeError();
        return append(f, {*s});
      };
      llvm::Expected<Value *> next = nullptr;
      if (kind == "RNN") {
        next = act(rnnAct[d], *xg, *hr);
      } else if (kind == "GRU") { // gates z, r, h
        auto xz = gate(*xg, 0), hz = gate(*hr, 0), xr = gate(*xg, 1),
             hrr = gate(*hr, 1), xh = gate(*xg, 2);
        for (auto *e : {&xz, &hz, &xr, &hrr, &xh})
          if (!*e)
            return e->takeError();
        auto z = act(OpKind::Sigmoid, *xz, *hz);
        if (!z)
          return z.takeError();
        auto rg = act(OpKind::Sigmoid, *xr, *hrr);
        if (!rg)
          return rg.takeError();
        llvm::Expected<Value *> inner = nullptr;
        if (linearBeforeReset) { // r ⊙ (H R_h^T + Rb_h)
          auto hh = gate(*hr, 2);
          if (!hh)
            return hh.takeError();
          inner = append(OpKind::Mul, {*rg, *hh});
        } else { // (r ⊙ H) R_h^T + Rb_h
          auto rh = append(OpKind::Mul, {*rg, *h});
          if (!rh)
            return rh.takeError();
          auto rhT = slice(*rT, 1, 2 * hidden, 3 * hidden);
          if (!rhT)
            return rhT.takeError();
          inner = append(OpKind::MatMul, {*rh, *rhT});
          if (inner && rb) {
            auto rbh = slice(rb, 0, 2 * hidden, 3 * hidden);
            if (!rbh)
              return rbh.takeError();
            inner = append(OpKind::Add, {*inner, *rbh});
          }
        }
        if (!inner)
          return inner.takeError();
        auto cand = act(OpKind::Tanh, *xh, *inner);
        if (!cand)
          return cand.takeError();
        auto keep = append(OpKind::Sub, {one, *z});
        if (!keep)
          return keep.takeError();
        auto a = append(OpKind::Mul, {*keep, *cand});
        if (!a)
          return a.takeError();
        auto bz = append(OpKind::Mul, {*z, *h});
        if (!bz)
          return bz.takeError();
        next = append(OpKind::Add, {*a, *bz});
      } else { // LSTM: gates i, o, f, c
        std::vector<Value *> gs;
        for (int64_t k = 0; k < 4; ++k) {
          auto xk = gate(*xg, k), hk = gate(*hr, k);
          if (!xk)
            return xk.takeError();
          if (!hk)
            return hk.takeError();
          auto a = act(k == 3 ? OpKind::Tanh : OpKind::Sigmoid, *xk, *hk);
          if (!a)
            return a.takeError();
          gs.push_back(*a);
        }
        auto fc = append(OpKind::Mul, {gs[2], *c});
        if (!fc)
          return fc.takeError();
        auto ic = append(OpKind::Mul, {gs[0], gs[3]});
        if (!ic)
          return ic.takeError();
        auto cNew = append(OpKind::Add, {*fc, *ic});
        if (!cNew)
          return cNew.takeError();
        *c = *cNew;
        auto tc = append(OpKind::Tanh, {*cNew});
        if (!tc)
          return tc.takeError();
        next = append(OpKind::Mul, {gs[1], *tc});
      }
      if (!next)
        return next.takeError();
      *h = *next;
      hs[size_t(t)] = *next;
    }
    // Y's [T, 1, B, H] of this direction, in time order.
    std::vector<Value *> parts;
    for (Value *v : hs) {
      auto u = reshape(v, {1, 1, batch, hidden});
      if (!u)
        return u.takeError();
      parts.push_back(*u);
    }
    auto y = append(OpKind::Concat, parts, {{"axis", Attribute(int64_t(0))}});
    if (!y)
      return y.takeError();
    ys.push_back(*y);
    lastH.push_back(*h);
    if (kind == "LSTM")
      lastC.push_back(*c);
  }
  // Y [T, D, B, H] (layout 1: [B, T, D, H]); Y_h, Y_c [D, B, H] ([B, D, H]).
  auto stack = [&](std::vector<Value *> parts, int64_t axis,
                   std::vector<int64_t> perm) -> llvm::Expected<Value *> {
    llvm::Expected<Value *> v = parts[0];
    if (parts.size() > 1)
      v = append(OpKind::Concat, parts, {{"axis", Attribute(axis)}});
    if (v && layout)
      v = append(OpKind::Transpose, {*v}, {{"perm", Attribute(perm)}});
    return v;
  };
  std::vector<Value *> hParts, cParts;
  for (Value *v : lastH) {
    auto u = reshape(v, {1, batch, hidden});
    if (!u)
      return u.takeError();
    hParts.push_back(*u);
  }
  for (Value *v : lastC) {
    auto u = reshape(v, {1, batch, hidden});
    if (!u)
      return u.takeError();
    cParts.push_back(*u);
  }
  std::vector<std::pair<int, llvm::Expected<Value *>>> outs;
  if (n.output_size() > 0 && !n.output(0).empty())
    outs.emplace_back(0, stack(ys, 1, {2, 0, 1, 3}));
  if (n.output_size() > 1 && !n.output(1).empty())
    outs.emplace_back(1, stack(hParts, 0, {1, 0, 2}));
  if (n.output_size() > 2 && !n.output(2).empty() && kind == "LSTM")
    outs.emplace_back(2, stack(cParts, 0, {1, 0, 2}));
  for (auto &[k, v] : outs) {
    if (!v)
      return v.takeError();
    if (auto e = ctx.define(n, index, n.output(k), *v))
      return e;
  }
  return llvm::Error::success();
}

// Appends one decomposition's IR ops for node `n`, a step at a time: after
// the first failure the later steps append nothing and return null, and
// takeError() gives that failure.
class OpChain {
public:
  OpChain(ImportContext &ctx, const onnx::NodeProto &n, int index)
      : ctx_(ctx), n_(n), index_(index) {}
  Value *operator()(OpKind kind, std::vector<Value *> in, AttrMap attrs = {}) {
    if (err_)
      return nullptr;
    for (Value *v : in)
      if (!v)
        return nullptr;
    auto r = ctx_.append(n_, index_, kind, std::move(in), std::move(attrs));
    if (!r) {
      err_ = r.takeError();
      return nullptr;
    }
    return *r;
  }
  llvm::Error takeError() { return std::move(err_); }

private:
  ImportContext &ctx_;
  const onnx::NodeProto &n_;
  int index_;
  llvm::Error err_ = llvm::Error::success();
};

llvm::Error translateSoftmaxCrossEntropy(ImportContext &ctx,
                                         const onnx::NodeProto &n, int index) {
  // cross_entropy_loss(self, target, weight=None, reduction=Mean,
  // ignore_index=-100, label_smoothing=0.0)
  double smoothing = 0.0;
  auto call = torchCallArgs(n, "aten.cross_entropy_loss.default");
  if (call) {
    std::string text;
    for (size_t i = 0; i < call->size(); ++i) {
      llvm::StringRef arg((*call)[i]);
      if (arg.consume_front("label_smoothing="))
        text = arg.str();
      else if (i == 5 && arg.find('=') == llvm::StringRef::npos)
        text = arg.str();
    }
    if (!text.empty() && llvm::StringRef(text).trim().getAsDouble(smoothing))
      return importError("{0}: cannot read label_smoothing '{1}' from the "
                         "node's PyTorch call",
                         describeNode(n, index), text);
    if (!(smoothing >= 0.0 && smoothing <= 1.0))
      return importError("{0}: label_smoothing {1} is not in [0, 1]",
                         describeNode(n, index), smoothing);
  }
  auto operands = ctx.tensorOperands(n, index, OpKind::SoftmaxCrossEntropyLoss);
  if (!operands)
    return operands.takeError();
  if ((*operands).size() < 2)
    return importError("{0}: needs scores and labels", describeNode(n, index));
  Value *x = (*operands)[0], *y = (*operands)[1];
  Value *w = (*operands).size() > 2 ? (*operands)[2] : nullptr;
  bool probabilities = call && isFloat(y->type().dtype);
  if (smoothing == 0.0 && !probabilities)
    return ctx.emit(n, index, OpKind::SoftmaxCrossEntropyLoss,
                    std::move(*operands), {});

  const TensorType &xt = x->type();
  if (xt.rank() < 2 || !isFloat(xt.dtype))
    return importError("{0}: scores must be floating point [N, C, ...], not "
                       "{1}",
                       describeNode(n, index), xt.str());
  if (probabilities && y->type() != xt)
    return importError("{0}: probability targets must have the scores' type "
                       "{1}, not {2}",
                       describeNode(n, index), xt.str(), y->type().str());
  std::string reduction = attrString(n, "reduction", "mean");
  int64_t rank = int64_t(xt.rank()), classes = xt.shape[1];
  DType dt = xt.dtype;
  OpChain op(ctx, n, index);
  auto scalar = [&](const char *what, double v) {
    return scalarFor(ctx, n, dt, what, v);
  };
  auto axes = [](std::vector<int64_t> a, int64_t keep) {
    return AttrMap{{"axes", Attribute(std::move(a))},
                   {"keepdims", Attribute(keep)}};
  };
  std::vector<int64_t> all;
  for (int64_t d = 0; d < rank - (reduction == "none" ? 1 : 0); ++d)
    all.push_back(d);
  // w as [1, C, 1, ...], to scale the class axis of [N, C, ...].
  Value *wide = nullptr;
  if (w) {
    std::vector<int64_t> shape(size_t(rank), 1);
    shape[1] = classes;
    wide = op(OpKind::Reshape, {w}, {{"shape", Attribute(shape)}});
  }
  Value *logp = op(OpKind::LogSoftmax, {x}, {{"axis", Attribute(int64_t(1))}});
  std::pair<OpKind, std::vector<Value *>> last;
  if (probabilities) {
    Value *t = y;
    if (smoothing > 0.0)
      t = op(OpKind::Add, {op(OpKind::Mul, {y, scalar("keep", 1.0 - smoothing)}),
                           scalar("spread", smoothing / double(classes))});
    Value *terms = op(OpKind::Mul, {logp, t});
    if (wide)
      terms = op(OpKind::Mul, {terms, wide});
    Value *perRow = op(OpKind::ReduceSum, {terms}, axes({1}, 0));
    if (reduction != "none") {
      std::vector<int64_t> rowAxes;
      for (int64_t d = 0; d < rank - 1; ++d)
        rowAxes.push_back(d);
      perRow = op(OpKind::ReduceSum, {perRow}, axes(rowAxes, 0));
    }
    if (reduction == "mean")
      last = {OpKind::Div,
              {op(OpKind::Neg, {perRow}),
               scalar("positions", double(xt.numElements() / classes))}};
    else
      last = {OpKind::Neg, {perRow}};
  } else {
    AttrMap nllAttrs{{"reduction", Attribute(reduction)}};
    if (findAttr(n, "ignore_index"))
      nllAttrs.emplace("ignore_index", Attribute(attrInt(n, "ignore_index", -100)));
    Value *nll = op(OpKind::SoftmaxCrossEntropyLoss,
                    w ? std::vector<Value *>{x, y, w} : std::vector<Value *>{x, y},
                    std::move(nllAttrs));
    // -sum_c w_c log p_c per position, 0 where the label is ignored.
    Value *terms = wide ? op(OpKind::Mul, {logp, wide}) : logp;
    std::vector<int64_t> rowAxes;
    for (int64_t d = 0; d < rank - 1; ++d)
      rowAxes.push_back(d);
    Value *smooth = op(OpKind::Neg, {op(OpKind::ReduceSum, {terms}, axes({1}, 0))});
    Value *keep = nullptr;
    if (findAttr(n, "ignore_index")) {
      Value *ignored = ctx.graph().addConst(
          ctx.freshName(n.output(0) + ".ignore_index"),
          TensorData::fromInts(y->type().dtype, {},
                               {attrInt(n, "ignore_index", -100)}));
      keep = op(OpKind::Not, {op(OpKind::Equal, {y, ignored})});
      smooth = op(OpKind::Where, {keep, smooth, scalar("zero", 0.0)});
    }
    if (reduction != "none")
      smooth = op(OpKind::ReduceSum, {smooth}, axes(rowAxes, 0));
    if (reduction == "mean") {
      // The denominator of the op's own mean: the labels' weights (or
      // count) over the positions not ignored.
      Value *count = nullptr;
      if (w) {
        Value *label = y;
        if (keep)
          label = op(OpKind::Where,
                     {keep, y, ctx.graph().addConst(
                                   ctx.freshName(n.output(0) + ".class0"),
                                   TensorData::fromInts(y->type().dtype, {}, {0}))});
        Value *picked = op(OpKind::Gather, {w, label}, {{"axis", Attribute(int64_t(0))}});
        if (keep)
          picked = op(OpKind::Where, {keep, picked, scalar("unweighted", 0.0)});
        count = op(OpKind::ReduceSum, {picked}, axes(rowAxes, 0));
      } else if (keep) {
        count = op(OpKind::ReduceSum,
                   {op(OpKind::Cast, {keep}, {{"to", Attribute(std::string(dtypeName(dt)))}})},
                   axes(rowAxes, 0));
      } else {
        count = scalar("positions", double(xt.numElements() / classes));
      }
      smooth = op(OpKind::Div, {smooth, count});
    }
    last = {OpKind::Add,
            {op(OpKind::Mul, {nll, scalar("keep", 1.0 - smoothing)}),
             op(OpKind::Mul, {smooth, scalar("spread", smoothing / double(classes))})}};
  }
  if (auto e = op.takeError())
    return e;
  // The last op gets the node's loss output (its name, as a graph output
  // keeps it); log_prob, when the node names it, is the LogSoftmax.
  if (n.output_size() > 1 && !n.output(1).empty())
    if (auto e = ctx.define(n, index, n.output(1), logp))
      return e;
  onnx::NodeProto lossOnly(n);
  while (lossOnly.output_size() > 1)
    lossOnly.mutable_output()->RemoveLast();
  return ctx.emit(lossOnly, index, last.first, std::move(last.second), {}, false);
}

llvm::Error translateScatterElements(ImportContext &ctx,
                                     const onnx::NodeProto &n, int index) {
  auto operands = ctx.tensorOperands(n, index, OpKind::ScatterElements);
  if (!operands)
    return operands.takeError();
  // scatter_reduce.two(self, dim, index, src, reduce, *, include_self=True)
  auto call = torchCallArgs(n, "aten.scatter_reduce.two");
  bool mean = false, includeSelf = true;
  if (call && attrString(n, "reduction", "none") == "none") {
    for (size_t i = 0; i < call->size(); ++i) {
      llvm::StringRef arg((*call)[i]);
      if (arg.consume_front("include_self="))
        includeSelf = arg != "False";
      else if (i == 4 || arg.consume_front("reduce="))
        mean = mean || arg.trim("'\"") == "mean";
    }
  }
  if (!mean || operands->size() != 3)
    return ctx.emit(n, index, OpKind::ScatterElements, std::move(*operands), {});
  Value *self = (*operands)[0], *at = (*operands)[1], *src = (*operands)[2];
  DType dt = self->type().dtype;
  if (!isFloat(dt))
    return importError("{0}: scatter_reduce 'mean' of {1} (an integer mean "
                       "rounds) is not supported",
                       describeNode(n, index), self->type().str());
  int64_t axis = attrInt(n, "axis", 0);
  OpChain op(ctx, n, index);
  auto fill = [&](Value *like, const char *what, double v) {
    const Shape &shape = like->type().shape;
    return op(OpKind::Expand, {scalarFor(ctx, n, dt, what, v)},
              {{"shape", Attribute(std::vector<int64_t>(shape.begin(), shape.end()))}});
  };
  AttrMap add{{"axis", Attribute(axis)}, {"reduction", Attribute(std::string("add"))}};
  Value *sum = op(OpKind::ScatterElements,
                  {includeSelf ? self : fill(self, "zeros", 0.0), at, src}, add);
  Value *count = op(OpKind::ScatterElements,
                    {fill(self, includeSelf ? "ones" : "zeros", includeSelf ? 1.0 : 0.0),
                     at, fill(src, "counted", 1.0)},
                    add);
  if (includeSelf) {
    if (auto e = op.takeError())
      return e;
    return ctx.emit(n, index, OpKind::Div, {sum, count}, {}, false);
  }
  Value *landed = op(OpKind::Greater, {count, scalarFor(ctx, n, dt, "none", 0.0)});
  Value *avg = op(OpKind::Div, {sum, op(OpKind::Max, {count, scalarFor(ctx, n, dt, "one", 1.0)})});
  if (auto e = op.takeError())
    return e;
  return ctx.emit(n, index, OpKind::Where, {landed, avg, self}, {}, false);
}

llvm::Error decomposeCol2Im(ImportContext &ctx, const onnx::NodeProto &n,
                            int index) {
  std::string where = describeNode(n, index);
  auto x = ctx.operand(n, index, 0);
  if (!x)
    return x.takeError();
  auto image = ctx.staticInts(n, index, 1, "image_shape");
  if (!image)
    return image.takeError();
  auto block = ctx.staticInts(n, index, 2, "block_shape");
  if (!block)
    return block.takeError();
  const TensorType &xt = (*x)->type();
  size_t sp = block->size();
  if (xt.rank() != 3 || image->size() != sp || sp == 0)
    return importError("{0}: input {1}, image_shape of {2} and block_shape "
                       "of {3} dims do not fit [N, C * block, L]",
                       where, xt.str(), image->size(), sp);
  std::vector<int64_t> ones(sp, 1), zeros(2 * sp, 0);
  auto strides = attrInts(n, "strides").value_or(ones);
  auto dil = attrInts(n, "dilations").value_or(ones);
  auto pads = attrInts(n, "pads").value_or(zeros);
  if (strides.size() != sp || dil.size() != sp || pads.size() != 2 * sp)
    return importError("{0}: strides, dilations and pads need {1}, {1} and "
                       "{2} entries",
                       where, sp, 2 * sp);
  int64_t taps = 1, blocks = 1;
  std::vector<int64_t> grid;
  for (size_t i = 0; i < sp; ++i) {
    int64_t span = dil[i] * ((*block)[i] - 1) + 1;
    int64_t room = (*image)[i] + pads[i] + pads[sp + i] - span;
    if ((*block)[i] < 1 || strides[i] < 1 || dil[i] < 1 || room < 0)
      return importError("{0}: block {1} does not fit image {2}", where,
                         shapeStr(*block), shapeStr(*image));
    taps *= (*block)[i];
    grid.push_back(room / strides[i] + 1);
    blocks *= grid.back();
  }
  if (xt.shape[1] % taps || xt.shape[2] != blocks)
    return importError("{0}: input {1} is not [N, C * {2}, {3}]", where,
                       xt.str(), taps, blocks);
  int64_t channels = xt.shape[1] / taps;
  std::vector<int64_t> laid{xt.shape[0], xt.shape[1]};
  laid.insert(laid.end(), grid.begin(), grid.end());
  auto cols = ctx.append(n, index, OpKind::Reshape, {*x},
                         {{"shape", Attribute(laid)}});
  if (!cols)
    return cols.takeError();
  // Weight [C * K, 1, block...]: row c * K + j is 1 at tap j.
  Shape wShape{xt.shape[1], 1};
  wShape.append(block->begin(), block->end());
  std::vector<double> w(size_t(xt.shape[1] * taps), 0.0);
  for (int64_t r = 0; r < xt.shape[1]; ++r)
    w[size_t(r * taps + r % taps)] = 1.0;
  Value *weight = ctx.graph().addConst(ctx.freshName(n.output(0) + ".taps"),
                                       TensorData::fromDoubles(xt.dtype, wShape, w));
  std::vector<int64_t> shape{xt.shape[0], channels};
  shape.insert(shape.end(), image->begin(), image->end());
  return ctx.emit(n, index, OpKind::ConvTranspose, {*cols, weight},
                  {{"dilations", Attribute(dil)},
                   {"group", Attribute(channels)},
                   {"pads", Attribute(pads)},
                   {"shape", Attribute(shape)},
                   {"strides", Attribute(strides)}},
                  false);
}

llvm::Error decomposeConcatFromSequence(ImportContext &ctx,
                                        const onnx::NodeProto &n, int index) {
  std::string where = describeNode(n, index);
  const std::vector<Value *> *seq = ctx.sequence(n.input_size() ? n.input(0) : "");
  if (!seq)
    return importError("{0}: input '{1}' is not a sequence cleave holds",
                       where, n.input_size() ? n.input(0) : "");
  if (seq->empty())
    return importError("{0}: the sequence is empty", where);
  int64_t rank = int64_t((*seq)[0]->type().rank());
  bool stack = attrInt(n, "new_axis", 0) != 0;
  int64_t axis = attrInt(n, "axis", 0), limit = rank + (stack ? 1 : 0);
  if (axis < -limit || axis >= limit)
    return importError("{0}: axis {1} is out of range for elements of rank "
                       "{2}",
                       where, axis, rank);
  if (axis < 0)
    axis += limit;
  std::vector<Value *> parts;
  for (Value *v : *seq) {
    if (!stack) {
      parts.push_back(v);
      continue;
    }
    auto lifted = ctx.append(n, index, OpKind::Unsqueeze, {v},
                             {{"axes", Attribute(std::vector<int64_t>{axis})}});
    if (!lifted)
      return lifted.takeError();
    parts.push_back(*lifted);
  }
  return ctx.emit(n, index, OpKind::Concat, std::move(parts),
                  {{"axis", Attribute(axis)}}, false);
}

} // namespace cleave::frontend

