// Lowering of elementwise ops and data movement to strided maps: which
// MapOp each ONNX-level op is, Slice/SliceGrad views, Transpose, Concat,
// Split, Expand, the Reshape family, and Pad.
#include "runtime/cuda/LoweringSupport.h"

#include "support/ShapeMath.h"

#include "llvm/ADT/StringSwitch.h"
#include "llvm/Support/FormatVariadic.h"

namespace cleave::runtime::cuda {

using ir::DType;
using ir::OpKind;

std::optional<MapOp> unaryMap(OpKind k) {
  switch (k) {
  case OpKind::Relu: return MapOp::Relu;
  case OpKind::Neg: return MapOp::Neg;
  case OpKind::Abs: return MapOp::Abs;
  case OpKind::Exp: return MapOp::Exp;
  case OpKind::Log: return MapOp::Log;
  case OpKind::Sqrt: return MapOp::Sqrt;
  case OpKind::Tanh: return MapOp::Tanh;
  case OpKind::Erf: return MapOp::Erf;
  case OpKind::Sigmoid: return MapOp::Sigmoid;
  case OpKind::Silu: return MapOp::Silu;
  case OpKind::Reciprocal: return MapOp::Reciprocal;
  case OpKind::Sin: return MapOp::Sin;
  case OpKind::Tan: return MapOp::Tan;
  case OpKind::Asin: return MapOp::Asin;
  case OpKind::Acos: return MapOp::Acos;
  case OpKind::Atan: return MapOp::Atan;
  case OpKind::Sinh: return MapOp::Sinh;
  case OpKind::Cosh: return MapOp::Cosh;
  case OpKind::Asinh: return MapOp::Asinh;
  case OpKind::Acosh: return MapOp::Acosh;
  case OpKind::Atanh: return MapOp::Atanh;
  case OpKind::Cos: return MapOp::Cos;
  case OpKind::Floor: return MapOp::Floor;
  case OpKind::Ceil: return MapOp::Ceil;
  case OpKind::Round: return MapOp::Round;
  case OpKind::Sign: return MapOp::Sign;
  case OpKind::IsNaN: return MapOp::IsNaN;
  case OpKind::HardSwish: return MapOp::HardSwish;
  default: return std::nullopt;
  }
}

std::optional<MapOp> binaryMap(OpKind k) {
  switch (k) {
  case OpKind::Add: return MapOp::Add;
  case OpKind::Sub: return MapOp::Sub;
  case OpKind::Mul: return MapOp::Mul;
  case OpKind::Div: return MapOp::Div;
  case OpKind::Pow: return MapOp::Pow;
  case OpKind::Equal: return MapOp::Equal;
  case OpKind::Less: return MapOp::Less;
  case OpKind::Greater: return MapOp::Greater;
  case OpKind::GreaterOrEqual: return MapOp::GreaterOrEqual;
  case OpKind::LessOrEqual: return MapOp::LessOrEqual;
  case OpKind::And: return MapOp::And;
  case OpKind::Or: return MapOp::Or;
  case OpKind::Xor: return MapOp::Xor;
  default: return std::nullopt;
  }
}

std::optional<MapOp> unaryGradMap(llvm::StringRef fn) {
  return llvm::StringSwitch<std::optional<MapOp>>(fn)
      .Case("abs", MapOp::AbsGrad)
      .Case("clip", MapOp::ClipGrad)
      .Case("erf", MapOp::ErfGrad)
      .Case("exp", MapOp::ExpGrad)
      .Case("gelu", MapOp::GeluGrad)
      .Case("gelu_tanh", MapOp::GeluGrad)
      .Case("leaky_relu", MapOp::LeakyReluGrad)
      .Case("log", MapOp::LogGrad)
      .Case("reciprocal", MapOp::ReciprocalGrad)
      .Case("relu", MapOp::ReluGrad)
      .Case("sigmoid", MapOp::SigmoidGrad)
      .Case("silu", MapOp::SiluGrad)
      .Case("sqrt", MapOp::SqrtGrad)
      .Case("tanh", MapOp::TanhGrad)
      .Case("sin", MapOp::SinGrad)
      .Case("cos", MapOp::CosGrad)
      .Case("tan", MapOp::TanGrad)
      .Case("asin", MapOp::AsinGrad)
      .Case("acos", MapOp::AcosGrad)
      .Case("atan", MapOp::AtanGrad)
      .Case("sinh", MapOp::SinhGrad)
      .Case("cosh", MapOp::CoshGrad)
      .Case("asinh", MapOp::AsinhGrad)
      .Case("acosh", MapOp::AcoshGrad)
      .Case("atanh", MapOp::AtanhGrad)
      .Case("hard_sigmoid", MapOp::HardSigmoidGrad)
      .Case("hard_swish", MapOp::HardSwishGrad)
      .Default(std::nullopt);
}

// Ops that only move data: their output is the input's elements in the
// same row-major order (Ops.def's LayoutOnly trait).
bool isReshapeLike(OpKind k) {
  return ir::opInfo(k).has(ir::optrait::LayoutOnly);
}

namespace {

// --- data movement ---------------------------------------------------------

// The view of a Slice / SliceGrad: the first element and the strides of
// the sliced dims of a tensor of shape `shape`.
llvm::Expected<Indexer> sliceView(const KernelCall &call,
                                  llvm::ArrayRef<int64_t> shape,
                                  llvm::ArrayRef<int64_t> sliced) {
  const auto &starts = call.getInts("starts"), &ends = call.getInts("ends"),
             &axes = call.getInts("axes"), &steps = call.getInts("steps");
  int64_t rank = shape.size();
  std::vector<int64_t> strides = stridesOf(shape), view = strides;
  int64_t base = 0;
  for (size_t i = 0; i < axes.size(); ++i) {
    int64_t a = axes[i] < 0 ? axes[i] + rank : axes[i];
    int64_t step = i < steps.size() ? steps[i] : 1;
    if (a < 0 || a >= rank || step == 0)
      return fail(call, llvm::formatv("bad axis {0} or step {1}", axes[i], step));
    int64_t first = 0;
    support::sliceLength(shape[a], starts[i], ends[i], step, &first);
    base += first * strides[a];
    view[a] = strides[a] * step;
  }
  return indexer(sliced, view, base);
}

} // namespace

llvm::Expected<Steps> lowerDataMovement(const KernelCall &call) {
  const TensorRef &x = call.inputs[0];
  switch (call.op) {
  case OpKind::Transpose: {
    const TensorRef &y = call.outputs[0];
    std::vector<int64_t> perm = call.hasAttr("perm")
                                    ? call.getInts("perm")
                                    : std::vector<int64_t>();
    if (perm.empty())
      for (size_t d = x.rank(); d-- > 0;)
        perm.push_back(int64_t(d));
    std::vector<int64_t> s = stridesOf(x.shape), strides;
    for (int64_t p : perm)
      strides.push_back(s[p]);
    return Steps{copy(x, indexer(y.shape, strides), y.data,
                      contiguous(y.shape), y.numElements())};
  }
  case OpKind::Slice: {
    const TensorRef &y = call.outputs[0];
    auto view = sliceView(call, x.shape, y.shape);
    if (!view)
      return view.takeError();
    return Steps{copy(x, *view, y.data, contiguous(y.shape), y.numElements())};
  }
  case OpKind::SliceGrad: { // dX = 0, then dY into the slice of dX
    const TensorRef &dx = call.outputs[0];
    auto view = sliceView(call, dx.shape, x.shape);
    if (!view)
      return view.takeError();
    if (call.inputs.size() < 2)
      return Steps{zero(dx), copy(x, contiguous(x.shape), dx.data, *view,
                                  x.numElements())};
    // dX = acc (the sum operand, Ops.def; maybe dX's own bytes), then dY
    // added into its slice, each element read and written by one thread.
    const TensorRef &acc = call.inputs[1];
    Steps steps;
    if (acc.data != dx.data)
      steps.push_back(copy(acc, contiguous(acc.shape), dx.data,
                           contiguous(dx.shape), dx.numElements()));
    MapArgs add;
    add.op = MapOp::Add;
    add.n = x.numElements();
    add.in[0] = operand(dx, *view);
    add.in[1] = operand(x, contiguous(x.shape));
    add.out = dx.data;
    add.outElem = *elemOf(dx.dtype);
    add.outAt = *view;
    steps.push_back(add);
    return steps;
  }
  case OpKind::Expand: {
    const TensorRef &y = call.outputs[0];
    return Steps{copy(x, broadcast(x.shape, y.shape), y.data,
                      contiguous(y.shape), y.numElements())};
  }
  case OpKind::Concat: {
    const TensorRef &y = call.outputs[0];
    auto axis = axisOf(call, call.getInt("axis"), y.rank());
    if (!axis)
      return axis.takeError();
    std::vector<int64_t> ys = stridesOf(y.shape);
    Steps steps;
    int64_t offset = 0;
    for (const TensorRef &in : call.inputs) {
      steps.push_back(copy(in, contiguous(in.shape), y.data,
                           indexer(in.shape, ys, offset * ys[*axis]),
                           in.numElements()));
      offset += in.shape[*axis];
    }
    return steps;
  }
  case OpKind::Split: {
    auto axis = axisOf(call, call.getInt("axis"), x.rank());
    if (!axis)
      return axis.takeError();
    std::vector<int64_t> xs = stridesOf(x.shape);
    Steps steps;
    int64_t offset = 0;
    for (const TensorRef &out : call.outputs) {
      steps.push_back(copy(x, indexer(out.shape, xs, offset * xs[*axis]),
                           out.data, contiguous(out.shape),
                           out.numElements()));
      offset += out.shape[*axis];
    }
    return steps;
  }
  default:
    break;
  }
  // Reshape and its kind: the same elements in the same order.
  const TensorRef &y = call.outputs[0];
  return Steps{copy(x, contiguous({x.numElements()}), y.data,
                    contiguous({y.numElements()}), y.numElements())};
}

// Pad: one thread an output element (padElement); the constant's bits in
// the element's type.
llvm::Expected<Steps> lowerPad(const KernelCall &call) {
  const TensorRef &x = call.inputs[0], &y = call.outputs[0];
  const std::string &mode = call.getString("mode");
  const auto &pads = call.getInts("pads");
  PadStep s;
  if (mode == "constant")
    s.mode = PadMode::Constant;
  else if (mode == "edge")
    s.mode = PadMode::Edge;
  else if (mode == "reflect")
    s.mode = PadMode::Reflect;
  else if (mode == "wrap")
    s.mode = PadMode::Wrap;
  else
    return fail(call, "unknown mode '" + mode + "'");
  if (pads.size() != 2 * x.rank() || y.rank() != x.rank())
    return fail(call, "pads must give a begin and an end per dim");
  s.rank = int(x.rank());
  for (size_t d = 0; d < x.rank(); ++d) {
    if (s.mode != PadMode::Constant && x.shape[d] == 0 && y.shape[d] > 0)
      return fail(call, llvm::formatv("{0} padding of axis {1} needs a "
                                      "non-empty input axis",
                                      mode, d));
    s.in[d] = x.shape[d];
    s.out[d] = y.shape[d];
    s.padBegin[d] = pads[d];
  }
  s.src = x.data;
  s.dst = y.data;
  s.size = int(ir::dtypeSize(x.dtype));
  store(&s.value, *elemOf(x.dtype), 0, call.getFloat("value"));
  s.n = y.numElements();
  if (x.numElements() == 0 && s.mode == PadMode::Constant) {
    MapArgs fill = zero(y); // nothing to read: every element is the value
    fill.op = MapOp::Fill;
    fill.p0 = call.getFloat("value");
    return Steps{fill};
  }
  return Steps{s};
}

} // namespace cleave::runtime::cuda
