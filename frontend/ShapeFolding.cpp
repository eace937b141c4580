// The shape-arithmetic folder (ShapeFolding.h): a table of fold rules, one
// function per ONNX op (or family of ops that share one), each evaluating
// the node on constant inputs at import. foldNode looks the node's op up,
// gathers the constant inputs the rule needs and runs it; an op without a
// rule, or with a runtime input, is left to the importer's translation.
#include "frontend/ShapeFolding.h"

#include "frontend/OnnxNode.h"
#include "frontend/OnnxTensor.h"
#include "ir/TypeRules.h"
#include "support/Errors.h"

#include "llvm/ADT/StringMap.h"
#include "llvm/Support/FormatVariadic.h"

#include <algorithm>
#include <cmath>
#include <onnx/onnx_pb.h>

namespace cleave::frontend {

using namespace cleave::ir;
using Data = std::shared_ptr<TensorData>;

// memcpy that accepts empty ranges (whose pointers may be null).
static void copyBytes(void *dst, const void *src, size_t n) {
  if (n)
    std::memcpy(dst, src, n);
}

static std::vector<int64_t> toInts(const TensorData &d) {
  std::vector<int64_t> v(d.type().numElements());
  for (size_t i = 0; i < v.size(); ++i)
    v[i] = d.getInt(i);
  return v;
}

// Row-major strides of `shape` aligned right against a rank-`r` output, with
// 0 for broadcast dims.
static std::vector<int64_t> broadcastStrides(llvm::ArrayRef<int64_t> shape,
                                             size_t r) {
  std::vector<int64_t> s(r, 0);
  int64_t stride = 1;
  for (size_t i = 0; i < shape.size(); ++i) {
    size_t d = shape.size() - 1 - i, o = r - 1 - i;
    s[o] = shape[d] == 1 ? 0 : stride;
    stride *= shape[d];
  }
  return s;
}

// Calls f(outIndex, inIndex[k]...) for every element of a broadcast.
template <typename F>
static void forEachBroadcast(llvm::ArrayRef<int64_t> out,
                             llvm::ArrayRef<const Shape *> ins, F f) {
  size_t r = out.size();
  std::vector<std::vector<int64_t>> strides;
  for (const Shape *s : ins)
    strides.push_back(broadcastStrides(*s, r));
  std::vector<int64_t> idx(r, 0), in(ins.size(), 0);
  int64_t total = 1;
  for (int64_t d : out)
    total *= d;
  for (int64_t o = 0; o < total; ++o) {
    f(o, in);
    for (size_t d = r; d-- > 0;) {
      ++idx[d];
      for (size_t k = 0; k < ins.size(); ++k)
        in[k] += strides[k][d];
      if (idx[d] < out[d])
        break;
      for (size_t k = 0; k < ins.size(); ++k)
        in[k] -= strides[k][d] * idx[d];
      idx[d] = 0;
    }
  }
}

static Data makeData(DType dt, Shape shape) {
  TensorType t(dt, std::move(shape));
  return std::make_shared<TensorData>(t, std::string(t.byteSize(), '\0'));
}

static void setDouble(TensorData &d, int64_t i, double v) {
  storeElement(d.type().dtype, d.mutableBytes(), i, v);
}
static void setInt(TensorData &d, int64_t i, int64_t v) {
  storeElementInt(d.type().dtype, d.mutableBytes(), i, v);
}

// ONNX Mod on integers: fmod=0 takes the divisor's sign (Python's %),
// fmod=1 the dividend's (C's %).
static int64_t modInt(int64_t a, int64_t b, bool fmodMode) {
  int64_t r = a % b;
  if (!fmodMode && r != 0 && ((r < 0) != (b < 0)))
    r += b;
  return r;
}

static llvm::Expected<Data> elementwise(const std::string &op,
                                        llvm::ArrayRef<Data> in,
                                        bool fmodMode = false) {
  Shape shape = in[0]->type().shape;
  for (size_t i = 1; i < in.size(); ++i) {
    auto s = broadcastShapes(shape, in[i]->type().shape);
    if (!s)
      return s.takeError();
    shape = *s;
  }
  if (TensorType(DType::F32, shape).numElements() > kMaxFoldElements)
    return Data();
  bool cmp = op == "Equal" || op == "Less" || op == "Greater" ||
             op == "LessOrEqual" || op == "GreaterOrEqual" || op == "And" ||
             op == "Or" || op == "Xor" || op == "Not" || op == "IsNaN";
  DType dt = op == "Where" ? in[1]->type().dtype
             : cmp         ? DType::Bool
                           : in[0]->type().dtype;
  bool fl = isFloat(op == "Where" ? dt : in[0]->type().dtype);
  Data out = makeData(dt, shape);
  std::vector<const Shape *> shapes;
  for (const Data &d : in)
    shapes.push_back(&d->type().shape);
  llvm::Error failure = llvm::Error::success();
  forEachBroadcast(shape, shapes, [&](int64_t o, const std::vector<int64_t> &k) {
    if (op == "Where") {
      const Data &pick = in[0]->getInt(k[0]) ? in[1] : in[2];
      size_t j = in[0]->getInt(k[0]) ? k[1] : k[2];
      if (fl)
        setDouble(*out, o, pick->getDouble(j));
      else
        setInt(*out, o, pick->getInt(j));
      return;
    }
    if (op == "Not") {
      setInt(*out, o, !in[0]->getInt(k[0]));
      return;
    }
    if (op == "BitwiseNot") { // stored in the operand's width
      setInt(*out, o, ~in[0]->getInt(k[0]));
      return;
    }
    if (op == "IsNaN") {
      setInt(*out, o, fl && std::isnan(in[0]->getDouble(k[0])));
      return;
    }
    if (fl) {
      double a = in[0]->getDouble(k[0]);
      double b = in.size() > 1 ? in[1]->getDouble(k[1]) : 0;
      double r = op == "Add"       ? a + b
                 : op == "Sub"     ? a - b
                 : op == "Mul"     ? a * b
                 : op == "Div"     ? a / b
                 : op == "Max"     ? std::max(a, b)
                 : op == "Min"     ? std::min(a, b)
                 : op == "Neg"     ? -a
                 : op == "Abs"     ? std::fabs(a)
                 : op == "Sqrt"    ? std::sqrt(a)
                 : op == "Cos"     ? std::cos(a)
                 : op == "Sin"     ? std::sin(a)
                 : op == "Floor"   ? std::floor(a)
                 : op == "Ceil"    ? std::ceil(a)
                 : op == "Round"   ? std::nearbyint(a) // halves to even
                 : op == "Sign"    ? double((a > 0) - (a < 0))
                 : op == "Mod"     ? std::fmod(a, b)
                 : op == "Pow"     ? std::pow(a, b)
                 : op == "Equal"   ? double(a == b)
                 : op == "Less"    ? double(a < b)
                 : op == "Greater" ? double(a > b)
                 : op == "LessOrEqual"    ? double(a <= b)
                 : op == "GreaterOrEqual" ? double(a >= b)
                                   : 0.0;
      if (cmp)
        setInt(*out, o, r != 0);
      else
        setDouble(*out, o, r);
      return;
    }
    int64_t a = in[0]->getInt(k[0]);
    int64_t b = in.size() > 1 ? in[1]->getInt(k[1]) : 0;
    if (op == "Pow") { // an integer base: the exponent may be a float
      setInt(*out, o, int64_t(std::pow(double(a), in[1]->getDouble(k[1]))));
      return;
    }
    if ((op == "Div" || op == "Mod") && b == 0) {
      if (!failure)
        failure = failf("integer division by zero");
      return;
    }
    int64_t r = op == "Add"       ? int64_t(uint64_t(a) + uint64_t(b))
                : op == "Sub"     ? int64_t(uint64_t(a) - uint64_t(b))
                : op == "Mul"     ? int64_t(uint64_t(a) * uint64_t(b))
                : op == "Div"     ? (b == -1 ? int64_t(0 - uint64_t(a))
                                             : a / b)
                : op == "Max"     ? std::max(a, b)
                : op == "Min"     ? std::min(a, b)
                : op == "Neg"     ? int64_t(0 - uint64_t(a))
                : op == "Abs"     ? (a < 0 ? int64_t(0 - uint64_t(a)) : a)
                : op == "Sign"    ? int64_t((a > 0) - (a < 0))
                : op == "Mod"     ? (b == -1 ? 0 : modInt(a, b, fmodMode))
                : op == "Equal"   ? a == b
                : op == "Less"    ? a < b
                : op == "Greater" ? a > b
                : op == "LessOrEqual"    ? a <= b
                : op == "GreaterOrEqual" ? a >= b
                : op == "And"     ? (a && b)
                : op == "Or"      ? (a || b)
                : op == "Xor"     ? ((a != 0) != (b != 0))
                : op == "BitwiseAnd" ? (a & b)
                : op == "BitwiseOr"  ? (a | b)
                : op == "BitwiseXor" ? (a ^ b)
                                  : 0;
    setInt(*out, o, r);
  });
  if (failure)
    return std::move(failure);
  return out;
}

// Copies `src` into a new tensor of `shape` (same element count or a
// broadcast of it).
static Data broadcastTo(const TensorData &src, const Shape &shape) {
  Data out = makeData(src.type().dtype, shape);
  size_t w = dtypeSize(src.type().dtype);
  const uint8_t *s = src.bytes().data();
  uint8_t *d = out->mutableBytes();
  const Shape *in = &src.type().shape;
  forEachBroadcast(shape, {in}, [&](int64_t o, const std::vector<int64_t> &k) {
    copyBytes(d + o * w, s + k[0] * w, w);
  });
  return out;
}

static Data reshaped(const TensorData &src, Shape shape) {
  llvm::ArrayRef<uint8_t> b = src.bytes();
  return std::make_shared<TensorData>(TensorType(src.type().dtype, shape),
                                      std::string(b.begin(), b.end()));
}

static llvm::Expected<FoldResult> one(llvm::Expected<Data> d) {
  if (!d)
    return d.takeError();
  if (!*d)
    return FoldResult();
  return FoldResult(std::vector<Data>{*d});
}

llvm::Expected<std::shared_ptr<TensorData>>
constantOfShapeValue(const onnx::NodeProto &node) {
  const auto *a = findAttr(node, "value");
  if (!a)
    return TensorData::fromDoubles(DType::F32, {1}, {0.0});
  auto t = tensorFromOnnx(a->t(), "", {});
  if (!t)
    return t.takeError();
  if ((*t)->type().numElements() != 1)
    return failf("'value' must hold one element");
  llvm::ArrayRef<uint8_t> b = (*t)->bytes();
  return std::make_shared<TensorData>(TensorType((*t)->type().dtype, {1}),
                                      std::vector<uint8_t>(b.begin(), b.end()));
}

// The constant values of a node's inputs (null where an input is absent).
struct FoldValues : std::vector<Data> {
  bool need(size_t k) const { return k < size() && (*this)[k]; }
};

using FoldFn = llvm::Expected<FoldResult> (*)(const onnx::NodeProto &node,
                                              llvm::ArrayRef<FoldInput> inputs,
                                              const FoldValues &in);

// Shape needs only the input's type.
static llvm::Expected<FoldResult> foldShape(const onnx::NodeProto &node,
                                            llvm::ArrayRef<FoldInput> inputs,
                                            const FoldValues &in) {
  if (inputs.empty() || !inputs[0].type)
    return FoldResult();
  const Shape &s = inputs[0].type->shape;
  int64_t r = s.size();
  int64_t start = attrInt(node, "start", 0), end = attrInt(node, "end", r);
  start = std::clamp<int64_t>(start < 0 ? start + r : start, 0, r);
  end = std::clamp<int64_t>(end < 0 ? end + r : end, 0, r);
  std::vector<int64_t> dims;
  for (int64_t i = start; i < end; ++i)
    dims.push_back(s[i]);
  return one(TensorData::fromInts(DType::I64, {int64_t(dims.size())}, dims));
}

// EyeLike: ones on the k-th diagonal of a 2-D shape, zeros elsewhere, in
// `dtype` (the input's type when absent); only the input's type is read.
static llvm::Expected<FoldResult> foldEyeLike(const onnx::NodeProto &node,
                                              llvm::ArrayRef<FoldInput> inputs,
                                              const FoldValues &in) {
  if (inputs.empty() || !inputs[0].type || inputs[0].type->rank() != 2)
    return FoldResult();
  DType dt = inputs[0].type->dtype;
  if (findAttr(node, "dtype")) {
    auto to = dtypeFromOnnx(attrInt(node, "dtype", 0));
    if (!to) {
      llvm::consumeError(to.takeError());
      return FoldResult(); // let the importer report the type
    }
    dt = *to;
  }
  const Shape &s = inputs[0].type->shape;
  if (TensorType(dt, s).numElements() > kMaxFoldElements)
    return FoldResult();
  int64_t k = attrInt(node, "k", 0);
  Data out = makeData(dt, s);
  for (int64_t i = 0; i < s[0]; ++i)
    for (int64_t j = 0; j < s[1]; ++j)
      setDouble(*out, i * s[1] + j, j - i == k ? 1.0 : 0.0);
  return one(out);
}

static llvm::Expected<FoldResult> foldSize(const onnx::NodeProto &node,
                                           llvm::ArrayRef<FoldInput> inputs,
                                           const FoldValues &in) {
  if (inputs.empty() || !inputs[0].type)
    return FoldResult();
  return one(
      TensorData::fromInts(DType::I64, {}, {inputs[0].type->numElements()}));
}

static llvm::Expected<FoldResult> foldIdentity(const onnx::NodeProto &node,
                                               llvm::ArrayRef<FoldInput> inputs,
                                               const FoldValues &in) {
  return one(in[0]);
}

static llvm::Expected<FoldResult> foldBinary(const onnx::NodeProto &node,
                                             llvm::ArrayRef<FoldInput> inputs,
                                             const FoldValues &in) {
  const std::string &op = node.op_type();
  if (!in.need(1))
    return FoldResult();
  return one(elementwise(op, in, attrInt(node, "fmod", 0) != 0));
}

static llvm::Expected<FoldResult> foldMaxOrMin(const onnx::NodeProto &node,
                                               llvm::ArrayRef<FoldInput> inputs,
                                               const FoldValues &in) {
  if (in.size() != 2) // variadic forms are left to the runtime
    return FoldResult();
  return foldBinary(node, inputs, in);
}

// Clip(x, min, max) = Min(Max(x, min), max), each bound optional: inputs
// from opset 11, attributes before (a legacy export's "same" padding
// clamps its pad amounts at 0 this way).
static llvm::Expected<FoldResult> foldClip(const onnx::NodeProto &node,
                                           llvm::ArrayRef<FoldInput> inputs,
                                           const FoldValues &in) {
  Data x = in[0];
  auto bound = [&](size_t k, const char *attr) -> Data {
    if (in.need(k))
      return in[k];
    if (const onnx::AttributeProto *a = findAttr(node, attr))
      return TensorData::fromDoubles(x->type().dtype, {}, {double(a->f())});
    return nullptr;
  };
  const std::pair<Data, const char *> steps[] = {{bound(1, "min"), "Max"},
                                                 {bound(2, "max"), "Min"}};
  for (const auto &[b, op] : steps) {
    if (!b)
      continue;
    auto r = elementwise(op, {x, b});
    if (!r)
      return r.takeError();
    if (!*r)
      return FoldResult();
    x = *r;
  }
  return one(x);
}

static llvm::Expected<FoldResult> foldUnary(const onnx::NodeProto &node,
                                            llvm::ArrayRef<FoldInput> inputs,
                                            const FoldValues &in) {
  const std::string &op = node.op_type();
  return one(elementwise(op, {in[0]}));
}

static llvm::Expected<FoldResult>
foldGatherElements(const onnx::NodeProto &node,
                   llvm::ArrayRef<FoldInput> inputs, const FoldValues &in) {
  // out[i0..] = data[i0.., indices[i0..] at axis, ..]: index tables built
  // from buffers (BERT's token types) fold here.
  if (!in.need(1))
    return FoldResult();
  const Shape &ds = in[0]->type().shape, &is = in[1]->type().shape;
  int64_t r = ds.size();
  int64_t axis = attrInt(node, "axis", 0);
  if (axis < 0)
    axis += r;
  if (axis < 0 || axis >= r || int64_t(is.size()) != r)
    return failf("GatherElements needs indices of the data's rank and an "
                 "axis inside it");
  Data out = makeData(in[0]->type().dtype, is);
  bool fl = isFloat(in[0]->type().dtype);
  int64_t n = out->type().numElements();
  std::vector<int64_t> idx(r, 0);
  for (int64_t o = 0; o < n; ++o) {
    int64_t src = 0;
    for (int64_t d = 0; d < r; ++d) {
      int64_t v = idx[d];
      if (d == axis) {
        v = in[1]->getInt(o);
        if (v < -ds[d] || v >= ds[d])
          return failf("GatherElements index {0} is out of range for an "
                       "axis of size {1}",
                       v, ds[d]);
        if (v < 0)
          v += ds[d];
      } else if (v >= ds[d]) {
        return failf("GatherElements indices are larger than the data");
      }
      src = src * ds[d] + v;
    }
    if (fl)
      setDouble(*out, o, in[0]->getDouble(src));
    else
      setInt(*out, o, in[0]->getInt(src));
    for (int64_t d = r; d-- > 0;)
      if (++idx[d] < is[d])
        break;
      else
        idx[d] = 0;
  }
  return one(out);
}

static llvm::Expected<FoldResult> foldTrilu(const onnx::NodeProto &node,
                                            llvm::ArrayRef<FoldInput> inputs,
                                            const FoldValues &in) {
  // The lower (upper=0) or upper triangle of the last two dims, from
  // diagonal k on; the rest zero.
  const Shape &shape = in[0]->type().shape;
  if (shape.size() < 2)
    return failf("Trilu needs a rank of at least 2");
  int64_t k = in.need(1) ? in[1]->getInt(0) : 0;
  bool upper = attrInt(node, "upper", 1) != 0;
  int64_t rows = shape[shape.size() - 2], cols = shape.back();
  Data out = makeData(in[0]->type().dtype, shape);
  bool fl = isFloat(in[0]->type().dtype);
  for (int64_t i = 0, n = in[0]->type().numElements(); i < n; ++i) {
    int64_t c = i % cols, r = (i / cols) % rows;
    bool keep = upper ? c - r >= k : c - r <= k;
    if (!keep)
      continue;
    if (fl)
      setDouble(*out, i, in[0]->getDouble(i));
    else
      setInt(*out, i, in[0]->getInt(i));
  }
  return one(out);
}

static llvm::Expected<FoldResult> foldOneHot(const onnx::NodeProto &node,
                                             llvm::ArrayRef<FoldInput> inputs,
                                             const FoldValues &in) {
  // indices [..], depth (one element), values [off, on]: the output has
  // depth inserted at `axis`, `on` where the index (negative: from the
  // end) equals the position along it. Legacy exports build shapes with
  // it (Mamba2's chunked scan).
  if (!in.need(1) || !in.need(2))
    return FoldResult();
  if (in[1]->type().numElements() != 1 || in[2]->type().numElements() != 2)
    return failf("OneHot needs a one-element depth and two values [off, on]");
  int64_t depth = isFloat(in[1]->type().dtype)
                      ? int64_t(in[1]->getDouble(0))
                      : in[1]->getInt(0);
  if (depth < 1)
    return failf("OneHot depth {0} is not positive", depth);
  const Shape &is = in[0]->type().shape;
  auto axis = normalizeAxis(attrInt(node, "axis", -1), is.size() + 1);
  if (!axis)
    return axis.takeError();
  Shape out(is.begin(), is.end());
  out.insert(out.begin() + *axis, depth);
  if (TensorType(in[2]->type().dtype, out).numElements() > kMaxFoldElements)
    return FoldResult();
  Data res = makeData(in[2]->type().dtype, out);
  int64_t inner = 1;
  for (size_t d = *axis; d < is.size(); ++d)
    inner *= is[d];
  bool fl = isFloat(in[2]->type().dtype);
  for (int64_t o = 0, n = res->type().numElements(); o < n; ++o) {
    int64_t j = (o / inner) % depth, i = (o / (inner * depth)) * inner + o % inner;
    int64_t idx = isFloat(in[0]->type().dtype) ? int64_t(in[0]->getDouble(i))
                                              : in[0]->getInt(i);
    if (idx < 0)
      idx += depth;
    int64_t pick = idx == j ? 1 : 0;
    if (fl)
      setDouble(*res, o, in[2]->getDouble(pick));
    else
      setInt(*res, o, in[2]->getInt(pick));
  }
  return one(res);
}

static llvm::Expected<FoldResult> foldWhere(const onnx::NodeProto &node,
                                            llvm::ArrayRef<FoldInput> inputs,
                                            const FoldValues &in) {
  const std::string &op = node.op_type();
  if (!in.need(1) || !in.need(2))
    return FoldResult();
  return one(elementwise(op, in));
}

static llvm::Expected<FoldResult> foldCast(const onnx::NodeProto &node,
                                           llvm::ArrayRef<FoldInput> inputs,
                                           const FoldValues &in) {
  // CastLike casts to its second input's type (only its first is a value).
  bool like = node.op_type() == "CastLike";
  if (like && (inputs.size() != 2 || !inputs[1].type))
    return FoldResult();
  auto to = like ? llvm::Expected<DType>(inputs[1].type->dtype)
                 : dtypeFromOnnx(attrInt(node, "to", 0));
  if (!to) {
    llvm::consumeError(to.takeError());
    return FoldResult(); // let the importer report the type
  }
  Data out = makeData(*to, in[0]->type().shape);
  for (int64_t i = 0; i < in[0]->type().numElements(); ++i) {
    if (isFloat(*to))
      setDouble(*out, i, in[0]->getDouble(i));
    else if (isFloat(in[0]->type().dtype) && *to != DType::Bool) {
      double v = std::trunc(in[0]->getDouble(i));
      setInt(*out, i,
             std::isfinite(v) && std::fabs(v) < 9.2e18 ? int64_t(v) : 0);
    } else if (*to == DType::Bool)
      setInt(*out, i, in[0]->getDouble(i) != 0);
    else
      setInt(*out, i, in[0]->getInt(i));
  }
  return one(out);
}

static llvm::Expected<FoldResult>
foldConstantOfShape(const onnx::NodeProto &node,
                    llvm::ArrayRef<FoldInput> inputs, const FoldValues &in) {
  std::vector<int64_t> dims = toInts(*in[0]);
  Shape shape(dims.begin(), dims.end());
  if (auto e = checkShape(shape))
    return std::move(e);
  auto value = constantOfShapeValue(node);
  if (!value)
    return value.takeError();
  DType dt = (*value)->type().dtype;
  double v = (*value)->getDouble(0);
  if (TensorType(dt, shape).numElements() > kMaxFoldElements)
    return FoldResult();
  Data out = makeData(dt, shape);
  for (int64_t i = 0; i < out->type().numElements(); ++i)
    setDouble(*out, i, v);
  return one(out);
}

static llvm::Expected<FoldResult> foldRange(const onnx::NodeProto &node,
                                            llvm::ArrayRef<FoldInput> inputs,
                                            const FoldValues &in) {
  if (!in.need(1) || !in.need(2))
    return FoldResult();
  DType dt = in[0]->type().dtype;
  double start = in[0]->getDouble(0), limit = in[1]->getDouble(0),
         delta = in[2]->getDouble(0);
  if (delta == 0)
    return failf("Range delta is 0");
  double count = std::ceil((limit - start) / delta);
  int64_t n = count > 0 ? int64_t(std::min(count, 1e18)) : 0;
  if (n > kMaxFoldElements)
    return FoldResult();
  Data out = makeData(dt, {n});
  for (int64_t i = 0; i < n; ++i)
    setDouble(*out, i, start + double(i) * delta);
  return one(out);
}

static llvm::Expected<FoldResult> foldReshape(const onnx::NodeProto &node,
                                              llvm::ArrayRef<FoldInput> inputs,
                                              const FoldValues &in) {
  if (!in.need(1))
    return FoldResult();
  std::vector<int64_t> dims = toInts(*in[1]);
  const Shape &src = in[0]->type().shape;
  int64_t known = 1, infer = -1;
  Shape out;
  for (size_t i = 0; i < dims.size(); ++i) {
    int64_t d = dims[i];
    if (d == 0 && !attrInt(node, "allowzero", 0))
      d = i < src.size() ? src[i] : 0;
    if (d == -1) {
      if (infer >= 0)
        return failf("more than one -1 in the target shape");
      infer = i;
      d = 1;
    } else if (d < 0) {
      return failf("bad target dimension {0}", d);
    } else {
      known *= d;
    }
    out.push_back(d);
  }
  int64_t total = in[0]->type().numElements();
  if (infer >= 0)
    out[infer] = known ? total / known : 0;
  if (TensorType(DType::F32, out).numElements() != total)
    return failf("cannot reshape {0} to {1}", shapeStr(src), shapeStr(out));
  return one(reshaped(*in[0], out));
}

static llvm::Expected<FoldResult>
foldSqueezeOrUnsqueeze(const onnx::NodeProto &node,
                       llvm::ArrayRef<FoldInput> inputs, const FoldValues &in) {
  const std::string &op = node.op_type();
  std::optional<std::vector<int64_t>> axes = attrInts(node, "axes");
  if (in.need(1))
    axes = toInts(*in[1]);
  const Shape &src = in[0]->type().shape;
  Shape out;
  if (op == "Unsqueeze") {
    if (!axes)
      return failf("Unsqueeze needs axes");
    int64_t r = src.size() + axes->size();
    std::vector<bool> ins(r, false);
    for (int64_t a : *axes) {
      auto n = normalizeAxis(a, r);
      if (!n)
        return n.takeError();
      ins[*n] = true;
    }
    size_t j = 0;
    for (int64_t i = 0; i < r; ++i)
      out.push_back(ins[i] ? 1 : (j < src.size() ? src[j++] : 1));
  } else {
    std::vector<bool> drop(src.size(), false);
    if (!axes || axes->empty()) {
      for (size_t i = 0; i < src.size(); ++i)
        drop[i] = src[i] == 1;
    } else {
      for (int64_t a : *axes) {
        auto n = normalizeAxis(a, src.size());
        if (!n)
          return n.takeError();
        if (src[*n] != 1)
          return failf("cannot squeeze axis {0} of size {1}", a, src[*n]);
        drop[*n] = true;
      }
    }
    for (size_t i = 0; i < src.size(); ++i)
      if (!drop[i])
        out.push_back(src[i]);
  }
  return one(reshaped(*in[0], out));
}

static llvm::Expected<FoldResult> foldExpand(const onnx::NodeProto &node,
                                             llvm::ArrayRef<FoldInput> inputs,
                                             const FoldValues &in) {
  if (!in.need(1))
    return FoldResult();
  std::vector<int64_t> dims = toInts(*in[1]);
  auto s = broadcastShapes(in[0]->type().shape, dims);
  if (!s)
    return s.takeError();
  if (auto e = checkShape(*s))
    return std::move(e);
  if (TensorType(DType::F32, *s).numElements() > kMaxFoldElements)
    return FoldResult();
  return one(broadcastTo(*in[0], *s));
}

// Tile of a constant (Whisper's position ids: arange repeated per row).
static llvm::Expected<FoldResult> foldTile(const onnx::NodeProto &node,
                                           llvm::ArrayRef<FoldInput> inputs,
                                           const FoldValues &in) {
  if (!in.need(1))
    return FoldResult();
  const Shape &is = in[0]->type().shape;
  std::vector<int64_t> reps = toInts(*in[1]);
  if (reps.size() != is.size())
    return failf("Tile: {0} repeats for rank {1}", reps.size(), is.size());
  Shape out;
  for (size_t d = 0; d < is.size(); ++d) {
    if (reps[d] < 0)
      return failf("Tile: repeat {0} is negative", reps[d]);
    if (reps[d] && is[d] > kMaxFoldElements / reps[d])
      return FoldResult();
    out.push_back(is[d] * reps[d]);
  }
  if (TensorType(in[0]->type().dtype, out).numElements() > kMaxFoldElements)
    return FoldResult();
  Data res = makeData(in[0]->type().dtype, out);
  size_t w = dtypeSize(in[0]->type().dtype), r = out.size();
  std::vector<int64_t> idx(r, 0), srcStride(r, 1);
  for (size_t d = r; d-- > 1;)
    srcStride[d - 1] = srcStride[d] * is[d];
  for (int64_t o = 0, n = res->type().numElements(); o < n; ++o) {
    int64_t src = 0;
    for (size_t d = 0; d < r; ++d)
      src += (idx[d] % is[d]) * srcStride[d];
    copyBytes(res->mutableBytes() + o * w, in[0]->bytes().data() + src * w, w);
    for (size_t d = r; d-- > 0;) {
      if (++idx[d] < out[d])
        break;
      idx[d] = 0;
    }
  }
  return one(res);
}

// Transpose of a constant (the exporters reverse a pads list this way:
// Reshape to [k, 2], Transpose, Reshape back).
static llvm::Expected<FoldResult> foldTranspose(const onnx::NodeProto &node,
                                                llvm::ArrayRef<FoldInput> inputs,
                                                const FoldValues &in) {
  if (!in.need(0))
    return FoldResult();
  const Shape &shape = in[0]->type().shape;
  int64_t r = shape.size();
  std::vector<int64_t> perm;
  if (auto p = attrInts(node, "perm"))
    perm = *p;
  else
    for (int64_t i = r; i-- > 0;)
      perm.push_back(i);
  std::vector<bool> seen(r, false);
  if (int64_t(perm.size()) != r)
    return failf("Transpose: perm has {0} entries for rank {1}", perm.size(),
                 r);
  for (int64_t &p : perm) {
    if (p < 0)
      p += r;
    if (p < 0 || p >= r || seen[p])
      return failf("Transpose: perm is not a permutation of 0..{0}", r - 1);
    seen[p] = true;
  }
  Shape out(r);
  for (int64_t i = 0; i < r; ++i)
    out[i] = shape[perm[i]];
  Data res = makeData(in[0]->type().dtype, out);
  std::vector<int64_t> inStride(r, 1);
  for (int64_t i = r - 1; i > 0; --i)
    inStride[i - 1] = inStride[i] * shape[i];
  size_t w = dtypeSize(in[0]->type().dtype);
  int64_t n = res->type().numElements();
  std::vector<int64_t> idx(r, 0);
  for (int64_t o = 0; o < n; ++o) {
    int64_t src = 0;
    for (int64_t i = 0; i < r; ++i)
      src += idx[i] * inStride[perm[i]];
    copyBytes(res->mutableBytes() + o * w, in[0]->bytes().data() + src * w, w);
    for (int64_t i = r - 1; i >= 0; --i) {
      if (++idx[i] < out[i])
        break;
      idx[i] = 0;
    }
  }
  return one(res);
}

static llvm::Expected<FoldResult> foldConcat(const onnx::NodeProto &node,
                                             llvm::ArrayRef<FoldInput> inputs,
                                             const FoldValues &in) {
  for (const Data &d : in)
    if (!d)
      return FoldResult();
  const Shape &first = in[0]->type().shape;
  auto axis = normalizeAxis(attrInt(node, "axis", 0), first.size());
  if (!axis)
    return axis.takeError();
  Shape out = first;
  out[*axis] = 0;
  for (const Data &d : in) {
    if (d->type().rank() != first.size() ||
        d->type().dtype != in[0]->type().dtype)
      return failf("Concat inputs differ in rank or type");
    out[*axis] += d->type().shape[*axis];
  }
  Data res = makeData(in[0]->type().dtype, out);
  int64_t outer = 1;
  for (int64_t i = 0; i < *axis; ++i)
    outer *= out[i];
  size_t w = dtypeSize(in[0]->type().dtype);
  uint8_t *dst = res->mutableBytes();
  for (int64_t o = 0; o < outer; ++o)
    for (const Data &d : in) {
      int64_t chunk = d->type().numElements() / std::max<int64_t>(outer, 1);
      if (outer == 0)
        break;
      copyBytes(dst, d->bytes().data() + o * chunk * w, chunk * w);
      dst += chunk * w;
    }
  return one(res);
}

static llvm::Expected<FoldResult> foldGather(const onnx::NodeProto &node,
                                             llvm::ArrayRef<FoldInput> inputs,
                                             const FoldValues &in) {
  if (!in.need(1))
    return FoldResult();
  const Shape &ds = in[0]->type().shape;
  auto axis = normalizeAxis(attrInt(node, "axis", 0), ds.size());
  if (!axis)
    return axis.takeError();
  std::vector<int64_t> idx = toInts(*in[1]);
  Shape out(ds.begin(), ds.begin() + *axis);
  out.append(in[1]->type().shape.begin(), in[1]->type().shape.end());
  out.append(ds.begin() + *axis + 1, ds.end());
  int64_t outer = 1, inner = 1;
  for (int64_t i = 0; i < *axis; ++i)
    outer *= ds[i];
  for (size_t i = *axis + 1; i < ds.size(); ++i)
    inner *= ds[i];
  Data res = makeData(in[0]->type().dtype, out);
  size_t w = dtypeSize(in[0]->type().dtype);
  uint8_t *dst = res->mutableBytes();
  int64_t dim = ds[*axis];
  for (int64_t o = 0; o < outer; ++o)
    for (int64_t k : idx) {
      if (k < -dim || k >= dim)
        return failf("index {0} is out of range for axis of size {1}", k, dim);
      if (k < 0)
        k += dim;
      copyBytes(dst, in[0]->bytes().data() + ((o * dim + k) * inner) * w,
                inner * w);
      dst += inner * w;
    }
  return one(res);
}

static llvm::Expected<FoldResult> foldReduce(const onnx::NodeProto &node,
                                             llvm::ArrayRef<FoldInput> inputs,
                                             const FoldValues &in) {
  const std::string &op = node.op_type();
  // Over constant masks: Attention's function body asks whether a row of
  // its bias is all -inf.
  const Shape &src = in[0]->type().shape;
  int64_t r = src.size();
  std::optional<std::vector<int64_t>> axes = attrInts(node, "axes");
  if (in.need(1))
    axes = toInts(*in[1]);
  if ((!axes || axes->empty()) && attrInt(node, "noop_with_empty_axes", 0))
    return one(in[0]);
  std::vector<bool> reduced(r, !axes || axes->empty());
  for (int64_t a : axes.value_or(std::vector<int64_t>{})) {
    auto n = normalizeAxis(a, r);
    if (!n)
      return n.takeError();
    reduced[*n] = true;
  }
  bool keep = attrInt(node, "keepdims", 1) != 0;
  Shape out, kept;
  for (int64_t d = 0; d < r; ++d) {
    kept.push_back(reduced[d] ? 1 : src[d]);
    if (!reduced[d] || keep)
      out.push_back(kept.back());
  }
  int64_t total = in[0]->type().numElements();
  int64_t count = TensorType(DType::F32, kept).numElements();
  if (total == 0)
    return FoldResult(); // the identity of max/min: let the runtime say
  std::vector<double> acc(count, 0.0);
  std::vector<bool> seen(count, false);
  std::vector<int64_t> idx(r, 0);
  for (int64_t i = 0; i < total; ++i) {
    int64_t o = 0;
    for (int64_t d = 0; d < r; ++d)
      o = o * kept[d] + (reduced[d] ? 0 : idx[d]);
    double v = in[0]->getDouble(i);
    acc[o] = op == "ReduceSum"   ? acc[o] + v
             : !seen[o]          ? v
             : op == "ReduceMax" ? std::max(acc[o], v)
                                 : std::min(acc[o], v);
    seen[o] = true;
    for (int64_t d = r; d-- > 0;)
      if (++idx[d] < src[d])
        break;
      else
        idx[d] = 0;
  }
  Data res = makeData(in[0]->type().dtype, out);
  for (int64_t o = 0; o < count; ++o)
    if (isFloat(in[0]->type().dtype))
      setDouble(*res, o, acc[o]);
    else
      setInt(*res, o, int64_t(acc[o]));
  return one(res);
}

static llvm::Expected<FoldResult> foldPad(const onnx::NodeProto &node,
                                          llvm::ArrayRef<FoldInput> inputs,
                                          const FoldValues &in) {
  // Only the no-op: a constant padded by zeros (Attention's body pads its
  // mask to the key length, which is usually its length already).
  if (!in.need(1))
    return FoldResult();
  std::vector<int64_t> pads = toInts(*in[1]);
  if (std::all_of(pads.begin(), pads.end(), [](int64_t p) { return p == 0; }))
    return one(in[0]);
  return FoldResult();
}

static llvm::Expected<FoldResult> foldSlice(const onnx::NodeProto &node,
                                            llvm::ArrayRef<FoldInput> inputs,
                                            const FoldValues &in) {
  if (!in.need(1) || !in.need(2))
    return FoldResult();
  const Shape &ds = in[0]->type().shape;
  std::vector<int64_t> starts = toInts(*in[1]), ends = toInts(*in[2]);
  std::vector<int64_t> axes, steps(starts.size(), 1);
  for (size_t i = 0; i < starts.size(); ++i)
    axes.push_back(i);
  if (in.need(3))
    axes = toInts(*in[3]);
  if (in.need(4))
    steps = toInts(*in[4]);
  if (ends.size() != starts.size() || axes.size() != starts.size() ||
      steps.size() != starts.size())
    return failf("Slice starts, ends, axes and steps differ in length");
  size_t r = ds.size();
  std::vector<int64_t> begin(r, 0), step(r, 1);
  Shape out = ds;
  for (size_t i = 0; i < starts.size(); ++i) {
    auto a = normalizeAxis(axes[i], r);
    if (!a)
      return a.takeError();
    if (steps[i] == 0)
      return failf("Slice step is 0");
    out[*a] = sliceLength(ds[*a], starts[i], ends[i], steps[i], &begin[*a]);
    step[*a] = steps[i];
  }
  Data res = makeData(in[0]->type().dtype, out);
  size_t w = dtypeSize(in[0]->type().dtype);
  std::vector<int64_t> srcStride(r, 1), idx(r, 0);
  for (size_t d = r; d-- > 1;)
    srcStride[d - 1] = srcStride[d] * ds[d];
  int64_t total = res->type().numElements();
  uint8_t *dst = res->mutableBytes();
  for (int64_t o = 0; o < total; ++o) {
    int64_t src = 0;
    for (size_t d = 0; d < r; ++d)
      src += (begin[d] + idx[d] * step[d]) * srcStride[d];
    copyBytes(dst + o * w, in[0]->bytes().data() + src * w, w);
    for (size_t d = r; d-- > 0;) {
      if (++idx[d] < out[d])
        break;
      idx[d] = 0;
    }
  }
  return one(res);
}

// The fold rules, by ONNX op. `typesOnly` rules read the inputs' static
// types alone; the others run when every value input is a constant, and
// see the first `valueInputs` inputs' values (all when -1).
struct FoldRule {
  const char *op;
  FoldFn fold;
  bool typesOnly = false;
  int valueInputs = -1;
};

static const FoldRule kFoldRules[] = {
    {"Shape", foldShape, true},
    {"Size", foldSize, true},
    {"EyeLike", foldEyeLike, true},
    {"Identity", foldIdentity},
    {"Add", foldBinary},
    {"Sub", foldBinary},
    {"Mul", foldBinary},
    {"Div", foldBinary},
    {"Mod", foldBinary},
    {"Pow", foldBinary},
    {"Max", foldMaxOrMin},
    {"Min", foldMaxOrMin},
    {"Equal", foldBinary},
    {"Less", foldBinary},
    {"Greater", foldBinary},
    {"LessOrEqual", foldBinary},
    {"GreaterOrEqual", foldBinary},
    {"And", foldBinary},
    {"Or", foldBinary},
    {"Xor", foldBinary},
    {"BitwiseAnd", foldBinary},
    {"BitwiseOr", foldBinary},
    {"BitwiseXor", foldBinary},
    {"Neg", foldUnary},
    {"Abs", foldUnary},
    {"Not", foldUnary},
    {"BitwiseNot", foldUnary},
    {"Sqrt", foldUnary},
    {"IsNaN", foldUnary},
    {"Cos", foldUnary},
    {"Sin", foldUnary},
    {"Floor", foldUnary},
    {"Sign", foldUnary},
    {"Ceil", foldUnary},
    {"Clip", foldClip},
    {"Round", foldUnary},
    {"Transpose", foldTranspose},
    {"Where", foldWhere},
    {"OneHot", foldOneHot},
    {"Cast", foldCast},
    {"CastLike", foldCast, false, 1},
    {"GatherElements", foldGatherElements},
    {"Trilu", foldTrilu},
    {"ConstantOfShape", foldConstantOfShape},
    {"Range", foldRange},
    {"Reshape", foldReshape},
    {"Squeeze", foldSqueezeOrUnsqueeze},
    {"Unsqueeze", foldSqueezeOrUnsqueeze},
    {"Expand", foldExpand},
    {"Tile", foldTile},
    {"Concat", foldConcat},
    {"Gather", foldGather},
    {"ReduceMax", foldReduce},
    {"ReduceMin", foldReduce},
    {"ReduceSum", foldReduce},
    {"Pad", foldPad},
    {"Slice", foldSlice},
};

static const FoldRule *findFoldRule(llvm::StringRef op) {
  static const llvm::StringMap<const FoldRule *> byOp = [] {
    llvm::StringMap<const FoldRule *> m;
    for (const FoldRule &r : kFoldRules)
      m[r.op] = &r;
    return m;
  }();
  auto it = byOp.find(op);
  return it == byOp.end() ? nullptr : it->second;
}

llvm::Expected<FoldResult> foldNode(const onnx::NodeProto &node,
                                    llvm::ArrayRef<FoldInput> inputs) {
  const FoldRule *rule = findFoldRule(node.op_type());
  if (!rule)
    return FoldResult();
  if (rule->typesOnly)
    return rule->fold(node, inputs, {});
  llvm::ArrayRef<FoldInput> valueInputs =
      rule->valueInputs < 0 ? inputs : inputs.take_front(rule->valueInputs);
  FoldValues in;
  for (const FoldInput &i : valueInputs) {
    if (i.type && !i.constant)
      return FoldResult(); // a runtime value: not foldable
    in.push_back(i.constant);
  }
  if (!in.need(0))
    return FoldResult();
  return rule->fold(node, inputs, in);
}

} // namespace cleave::frontend
