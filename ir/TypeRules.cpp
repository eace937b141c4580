// Result type rules for every op family. Each checks the constraints the op
// puts on its operands (dtypes, ranks, matching dims) and computes the result
// types; the verifier compares those with the types recorded in the graph.
#include "ir/TypeRules.h"

#include "support/Errors.h"

#include "llvm/Support/FormatVariadic.h"
#include "llvm/Support/MathExtras.h"

#include <algorithm>
#include <array>
#include <limits>

namespace cleave::ir {

using Types = llvm::Expected<std::vector<TensorType>>;

llvm::Expected<Shape> broadcastShapes(llvm::ArrayRef<int64_t> a,
                                      llvm::ArrayRef<int64_t> b) {
  size_t r = std::max(a.size(), b.size());
  Shape out(r, 1);
  for (size_t i = 0; i < r; ++i) {
    int64_t da = i < r - a.size() ? 1 : a[i - (r - a.size())];
    int64_t db = i < r - b.size() ? 1 : b[i - (r - b.size())];
    if (da != db && da != 1 && db != 1)
      return failf("shapes {0} and {1} do not broadcast", shapeStr(a),
                   shapeStr(b));
    out[i] = da == 1 ? db : da;
  }
  return out;
}

llvm::Expected<int64_t> normalizeAxis(int64_t axis, int64_t rank) {
  if (axis < -rank || axis >= rank)
    return failf("axis {0} is out of range for rank {1}", axis, rank);
  return axis < 0 ? axis + rank : axis;
}

static llvm::Error sameDType(const TypeQuery &q) {
  for (size_t i = 1; i < q.operands.size(); ++i)
    if (q.operands[i].dtype != q.operands[0].dtype)
      return failf("operand {0} is {1} but operand 0 is {2}", i,
                   dtypeName(q.operands[i].dtype),
                   dtypeName(q.operands[0].dtype));
  return llvm::Error::success();
}

static llvm::Expected<Shape> broadcastAll(llvm::ArrayRef<TensorType> ts) {
  Shape s = ts[0].shape;
  for (size_t i = 1; i < ts.size(); ++i) {
    auto b = broadcastShapes(s, ts[i].shape);
    if (!b)
      return b.takeError();
    s = *b;
  }
  return s;
}

static llvm::Error requireFloat(const TensorType &t, const char *what) {
  if (!isFloat(t.dtype))
    return failf("{0} must be a float tensor, not {1}", what, t.str());
  return llvm::Error::success();
}

namespace typerules {

Types sameAsFirst(const TypeQuery &q) { return std::vector{q.operands[0]}; }

// Not: a bool or integer operand, its type.
Types bitwiseUnary(const TypeQuery &q) {
  if (isFloat(q.operands[0].dtype))
    return failf("operand must be bool or an integer type, not {0}",
                 q.operands[0].str());
  return std::vector{q.operands[0]};
}

// IsNaN, IsInf: a float operand, a bool result of its shape.
Types floatPredicate(const TypeQuery &q) {
  if (!isFloat(q.operands[0].dtype))
    return failf("operand must be a float type, not {0}", q.operands[0].str());
  return std::vector{TensorType(DType::Bool, q.operands[0].shape)};
}

Types cast(const TypeQuery &q) {
  auto to = parseDType(q.getString("to"));
  if (!to)
    return failf("unknown element type '{0}' in attribute 'to'",
                 q.getString("to"));
  return std::vector{TensorType(*to, q.operands[0].shape)};
}

Types broadcast(const TypeQuery &q) {
  if (auto e = sameDType(q))
    return std::move(e);
  auto s = broadcastAll(q.operands);
  if (!s)
    return s.takeError();
  return std::vector{TensorType(q.operands[0].dtype, *s)};
}

Types pow(const TypeQuery &q) {
  auto s = broadcastAll(q.operands);
  if (!s)
    return s.takeError();
  return std::vector{TensorType(q.operands[0].dtype, *s)};
}

Types compare(const TypeQuery &q) {
  if (auto e = sameDType(q))
    return std::move(e);
  auto s = broadcastAll(q.operands);
  if (!s)
    return s.takeError();
  return std::vector{TensorType(DType::Bool, *s)};
}

Types mod(const TypeQuery &q) {
  if (isFloat(q.operands[0].dtype) && q.getInt("fmod") != 1)
    return failf("float operands ({0}) need fmod = 1", q.operands[0].str());
  if (q.operands[0].dtype == DType::Bool)
    return failf("operands must be numeric, not {0}", q.operands[0].str());
  return broadcast(q);
}

// And, Or, Xor: bool or integer operands of one type, broadcast; the
// result has their type.
Types bitwise(const TypeQuery &q) {
  for (const TensorType &t : q.operands)
    if (isFloat(t.dtype))
      return failf("operands must be bool or an integer type, not {0}",
                   t.str());
  return broadcast(q);
}

Types where(const TypeQuery &q) {
  if (q.operands[0].dtype != DType::Bool)
    return failf("condition must be bool, not {0}", q.operands[0].str());
  if (q.operands[1].dtype != q.operands[2].dtype)
    return failf("branches differ in type: {0} and {1}", q.operands[1].str(),
                 q.operands[2].str());
  auto s = broadcastAll(q.operands);
  if (!s)
    return s.takeError();
  return std::vector{TensorType(q.operands[1].dtype, *s)};
}

Types matmul(const TypeQuery &q) {
  if (auto e = sameDType(q))
    return std::move(e);
  Shape a = q.operands[0].shape, b = q.operands[1].shape;
  if (a.empty() || b.empty())
    return failf("operands must have rank >= 1");
  bool aVec = a.size() == 1, bVec = b.size() == 1;
  if (aVec)
    a.insert(a.begin(), 1);
  if (bVec)
    b.push_back(1);
  int64_t m = a[a.size() - 2], k = a.back();
  int64_t k2 = b[b.size() - 2], n = b.back();
  if (k != k2)
    return failf("inner dimensions differ: {0} x {1}",
                 shapeStr(q.operands[0].shape), shapeStr(q.operands[1].shape));
  auto batch = broadcastShapes(llvm::ArrayRef<int64_t>(a).drop_back(2),
                               llvm::ArrayRef<int64_t>(b).drop_back(2));
  if (!batch)
    return batch.takeError();
  Shape out = *batch;
  if (!aVec)
    out.push_back(m);
  if (!bVec)
    out.push_back(n);
  return std::vector{TensorType(q.operands[0].dtype, out)};
}

Types gemm(const TypeQuery &q) {
  if (auto e = sameDType(q))
    return std::move(e);
  const Shape &a = q.operands[0].shape, &b = q.operands[1].shape;
  if (a.size() != 2 || b.size() != 2)
    return failf("A and B must be 2-D, got {0} and {1}", shapeStr(a),
                 shapeStr(b));
  bool ta = q.getInt("transA"), tb = q.getInt("transB");
  int64_t m = ta ? a[1] : a[0], k = ta ? a[0] : a[1];
  int64_t k2 = tb ? b[1] : b[0], n = tb ? b[0] : b[1];
  if (k != k2)
    return failf("inner dimensions differ: A {0}{1} x B {2}{3}", shapeStr(a),
                 ta ? "^T" : "", shapeStr(b), tb ? "^T" : "");
  Shape out{m, n};
  if (q.operands.size() == 3) {
    auto s = broadcastShapes(q.operands[2].shape, out);
    if (!s || *s != out)
      return failf("C {0} does not broadcast to {1}",
                   shapeStr(q.operands[2].shape), shapeStr(out));
  }
  return std::vector{TensorType(q.operands[0].dtype, out)};
}

Types batchNorm(const TypeQuery &q) {
  const TensorType &x = q.operands[0];
  if (auto e = requireFloat(x, "X"))
    return std::move(e);
  if (x.rank() < 2)
    return failf("X must have rank >= 2, got {0}", x.str());
  int64_t c = x.shape[1];
  for (size_t i = 1; i < 5; ++i)
    if (q.operands[i].shape != Shape{c})
      return failf("operand {0} must have shape [{1}], got {2}", i, c,
                   q.operands[i].str());
  std::vector<TensorType> out{x};
  for (unsigned i = 1; i < q.numResults; ++i)
    out.push_back(q.operands[3]);
  return out;
}

Types layerNorm(const TypeQuery &q) {
  const TensorType &x = q.operands[0];
  if (auto e = requireFloat(x, "X"))
    return std::move(e);
  auto axis = normalizeAxis(q.getInt("axis"), x.rank());
  if (!axis)
    return axis.takeError();
  llvm::ArrayRef<int64_t> norm = llvm::ArrayRef<int64_t>(x.shape).drop_front(*axis);
  for (size_t i = 1; i < q.operands.size(); ++i) {
    auto s = broadcastShapes(q.operands[i].shape, norm);
    if (!s || llvm::ArrayRef<int64_t>(*s) != norm)
      return failf("operand {0} {1} does not broadcast to the normalized shape "
                   "{2}",
                   i, shapeStr(q.operands[i].shape), shapeStr(norm));
  }
  std::vector<TensorType> out{x};
  Shape stat(x.shape.begin(), x.shape.begin() + *axis);
  stat.resize(x.rank(), 1);
  for (unsigned i = 1; i < q.numResults; ++i)
    out.push_back(TensorType(DType::F32, stat));
  return out;
}

Types softmax(const TypeQuery &q) {
  if (auto e = requireFloat(q.operands[0], "input"))
    return std::move(e);
  auto axis = normalizeAxis(q.getInt("axis"), q.operands[0].rank());
  if (!axis)
    return axis.takeError();
  return std::vector{q.operands[0]};
}

// Q, K and V of a FusedAttention (its operands 0 to 2) as separate
// tensors: a packed one's (packed_kv_heads > 0) read out of the heads axis.
static llvm::Expected<std::array<TensorType, 3>>
attentionOperands(const TypeQuery &q, const TensorType &a, const TensorType &b,
                  const TensorType &c) {
  const int64_t packed = attentionPackedKvHeads(q);
  if (packed == 0)
    return std::array<TensorType, 3>{a, b, c};
  if (packed < 0)
    return failf("packed_kv_heads must be >= 0, got {0}", packed);
  if (a != b || a != c || a.rank() != 4)
    return failf("packed Q, K and V must be one rank-4 tensor, got {0}, {1}, "
                 "{2}",
                 a.str(), b.str(), c.str());
  const AttentionLayout layout = attentionLayout(q);
  const int64_t heads = a.shape[size_t(attentionAxes(layout).heads)];
  if (heads - 2 * packed < 1)
    return failf("a packed tensor of {0} heads holds no query heads beside "
                 "2 x {1} key/value heads",
                 heads, packed);
  return std::array<TensorType, 3>{
      TensorType(a.dtype,
                 withAttentionHeads(a.shape, layout, heads - 2 * packed)),
      TensorType(a.dtype, withAttentionHeads(a.shape, layout, packed)),
      TensorType(a.dtype, withAttentionHeads(a.shape, layout, packed))};
}

Types attention(const TypeQuery &q) {
  if (auto e = requireFloat(q.operands[0], "Q"))
    return std::move(e);
  if (q.operands[0].rank() != 4 || q.operands[1].rank() != 4 ||
      q.operands[2].rank() != 4)
    return failf(
        "Q, K and V must have rank 4 ([B, H, T, D]), got {0}, {1}, {2}",
        q.operands[0].str(), q.operands[1].str(), q.operands[2].str());
  auto qkv = attentionOperands(q, q.operands[0], q.operands[1], q.operands[2]);
  if (!qkv)
    return qkv.takeError();
  const TensorType &qt = (*qkv)[0], &k = (*qkv)[1], &v = (*qkv)[2];
  if (k.dtype != qt.dtype || v.dtype != qt.dtype)
    return failf("Q, K and V must have one element type, got {0}, {1}, {2}",
                 qt.str(), k.str(), v.str());
  const AttentionLayout layout = attentionLayout(q);
  if (q.getInt("seq_major") != 0 && q.getInt("time_major") != 0)
    return failf("seq_major and time_major cannot both be set");
  const AttentionDims d = attentionDims(qt.shape, k.shape, layout);
  const int batchAxis = attentionAxes(layout).batch;
  if (k.shape != v.shape || k.shape[size_t(batchAxis)] != d.batch ||
      k.shape[3] != qt.shape[3])
    return failf("K and V must be {3} for Q {0}, got {1}, {2}", qt.str(),
                 k.str(), v.str(), attentionShapeName(layout, "Hkv", "Tk"));
  if (d.kvHeads < 1 || d.queryHeads % d.kvHeads != 0)
    return failf("the query heads ({0}) must be a multiple of the key/value "
                 "heads ({1})",
                 d.queryHeads, d.kvHeads);
  if (q.operands.size() == 4) {
    const TensorType &mask = q.operands[3];
    Shape scores{d.batch, d.queryHeads, d.queryLen, d.keyLen};
    auto s = broadcastShapes(mask.shape, scores);
    bool fits = s && *s == scores;
    if (!s)
      llvm::consumeError(s.takeError());
    bool kernelType = mask.dtype == DType::F32 || mask.dtype == DType::F64 ||
                      mask.dtype == DType::BF16 || mask.dtype == DType::Bool;
    if (!kernelType || !fits)
      return failf("the mask {0} must be f32, f64 or bf16 (added to the "
                   "scores) or bool (true: the key is seen) and broadcast to "
                   "the scores {1}",
                   mask.str(), shapeStr(scores));
  }
  Shape rows{d.batch, d.queryHeads, d.queryLen};
  DType lse = qt.dtype == DType::F64 ? DType::F64 : DType::F32;
  return std::vector{qt, TensorType(lse, rows)};
}

Types softmaxCrossEntropy(const TypeQuery &q) {
  const TensorType &scores = q.operands[0], &labels = q.operands[1];
  if (auto e = requireFloat(scores, "scores"))
    return std::move(e);
  if (scores.rank() < 2)
    return failf("scores must have rank >= 2 ([N, C, ...]), got {0}",
                 scores.str());
  if (!isInteger(labels.dtype))
    return failf("labels must be an integer tensor, not {0}", labels.str());
  Shape expect{scores.shape[0]};
  expect.append(scores.shape.begin() + 2, scores.shape.end());
  if (labels.shape != expect)
    return failf("labels have shape {0}, expected {1} for scores {2}",
                 shapeStr(labels.shape), shapeStr(expect),
                 shapeStr(scores.shape));
  if (q.operands.size() == 3 && q.operands[2].shape != Shape{scores.shape[1]})
    return failf("weights must have shape [{0}], got {1}", scores.shape[1],
                 q.operands[2].str());
  const std::string &red = q.getString("reduction");
  if (red != "mean" && red != "sum" && red != "none")
    return failf("reduction must be mean, sum or none, not '{0}'", red);
  std::vector<TensorType> out{
      TensorType(scores.dtype, red == "none" ? expect : Shape{})};
  if (q.numResults > 1)
    out.push_back(scores);
  return out;
}

Types dropout(const TypeQuery &q) {
  std::vector<TensorType> out{q.operands[0]};
  if (q.numResults > 1)
    out.push_back(TensorType(DType::Bool, q.operands[0].shape));
  float r = q.getFloat("ratio");
  if (!(r >= 0.0f && r < 1.0f))
    return failf("ratio must be in [0, 1), got {0}", r);
  return out;
}

Types reduce(const TypeQuery &q) {
  const TensorType &x = q.operands[0];
  std::vector<bool> reduced(x.rank(), false);
  const auto &axes = q.getInts("axes");
  for (int64_t a : axes) {
    auto n = normalizeAxis(a, x.rank());
    if (!n)
      return n.takeError();
    if (reduced[*n])
      return failf("axis {0} appears twice in 'axes'", a);
    reduced[*n] = true;
  }
  if (axes.empty())
    std::fill(reduced.begin(), reduced.end(), true);
  Shape out;
  bool keep = q.getInt("keepdims");
  for (size_t i = 0; i < x.rank(); ++i) {
    if (!reduced[i])
      out.push_back(x.shape[i]);
    else if (keep)
      out.push_back(1);
  }
  return std::vector{TensorType(x.dtype, out)};
}

Types argReduce(const TypeQuery &q) {
  const TensorType &x = q.operands[0];
  auto axis = normalizeAxis(q.getInt("axis"), x.rank());
  if (!axis)
    return axis.takeError();
  Shape out;
  for (size_t i = 0; i < x.rank(); ++i)
    if (int64_t(i) != *axis)
      out.push_back(x.shape[i]);
    else if (q.getInt("keepdims"))
      out.push_back(1);
  return std::vector{TensorType(DType::I64, out)};
}

Types topKIndices(const TypeQuery &q) {
  const TensorType &x = q.operands[0];
  auto axis = normalizeAxis(q.getInt("axis"), x.rank());
  if (!axis)
    return axis.takeError();
  int64_t k = q.getInt("k");
  if (k < 0 || k > x.shape[*axis])
    return failf("k {0} is not within the {1} elements of axis {2}", k,
                 x.shape[*axis], *axis);
  Shape out = x.shape;
  out[*axis] = k;
  return std::vector{TensorType(DType::I64, out)};
}

Types concat(const TypeQuery &q) {
  if (auto e = sameDType(q))
    return std::move(e);
  const TensorType &first = q.operands[0];
  auto axis = normalizeAxis(q.getInt("axis"), first.rank());
  if (!axis)
    return axis.takeError();
  Shape out = first.shape;
  for (size_t i = 1; i < q.operands.size(); ++i) {
    const Shape &s = q.operands[i].shape;
    if (s.size() != out.size())
      return failf("operand {0} has rank {1}, operand 0 has rank {2}", i,
                   s.size(), out.size());
    for (size_t d = 0; d < s.size(); ++d)
      if (int64_t(d) != *axis && s[d] != out[d])
        return failf("operand {0} {1} differs from operand 0 {2} outside the "
                     "concatenation axis",
                     i, shapeStr(s), shapeStr(first.shape));
    out[*axis] += s[*axis];
  }
  return std::vector{TensorType(first.dtype, out)};
}

Types expand(const TypeQuery &q) {
  auto s = broadcastShapes(q.operands[0].shape, q.getInts("shape"));
  if (!s)
    return s.takeError();
  return std::vector{TensorType(q.operands[0].dtype, *s)};
}

Types pad(const TypeQuery &q) {
  const TensorType &x = q.operands[0];
  const auto &pads = q.getInts("pads");
  if (pads.size() != 2 * x.rank())
    return failf("'pads' has {0} entries, expected {1}", pads.size(),
                 2 * x.rank());
  const std::string &mode = q.getString("mode");
  if (mode != "constant" && mode != "reflect" && mode != "edge" &&
      mode != "wrap")
    return failf("mode must be constant, reflect, edge or wrap, not '{0}'",
                 mode);
  Shape out = x.shape;
  for (size_t i = 0; i < x.rank(); ++i) {
    // Pads come from the model: checked sums, not int64 overflow.
    if (llvm::AddOverflow(out[i], pads[i], out[i]) ||
        llvm::AddOverflow(out[i], pads[x.rank() + i], out[i]))
      return failf("pads {0} are out of range for axis {1}", shapeStr(pads), i);
    if (out[i] < 0)
      return failf("pads {0} remove more than axis {1} holds", shapeStr(pads),
                   i);
  }
  return std::vector{TensorType(x.dtype, out)};
}

Types flatten(const TypeQuery &q) {
  const TensorType &x = q.operands[0];
  int64_t axis = q.getInt("axis"), r = x.rank();
  if (axis < -r || axis > r)
    return failf("axis {0} is out of range for rank {1}", axis, r);
  if (axis < 0)
    axis += r;
  int64_t outer = 1, inner = 1;
  for (int64_t i = 0; i < r; ++i)
    (i < axis ? outer : inner) *= x.shape[i];
  return std::vector{TensorType(x.dtype, Shape{outer, inner})};
}

Types gather(const TypeQuery &q) {
  const TensorType &data = q.operands[0], &idx = q.operands[1];
  if (idx.dtype != DType::I64 && idx.dtype != DType::I32)
    return failf("indices must be i64 or i32, not {0}", idx.str());
  auto axis = normalizeAxis(q.getInt("axis"), data.rank());
  if (!axis)
    return axis.takeError();
  Shape out(data.shape.begin(), data.shape.begin() + *axis);
  out.append(idx.shape.begin(), idx.shape.end());
  out.append(data.shape.begin() + *axis + 1, data.shape.end());
  return std::vector{TensorType(data.dtype, out)};
}

Types gatherElements(const TypeQuery &q) {
  const TensorType &data = q.operands[0], &idx = q.operands[1];
  if (idx.dtype != DType::I64 && idx.dtype != DType::I32)
    return failf("indices must be i64 or i32, not {0}", idx.str());
  if (idx.rank() != data.rank())
    return failf("indices {0} must have the rank of data {1}", idx.str(),
                 data.str());
  auto axis = normalizeAxis(q.getInt("axis"), data.rank());
  if (!axis)
    return axis.takeError();
  for (int64_t d = 0; d < int64_t(data.rank()); ++d)
    if (d != *axis && idx.shape[d] > data.shape[d])
      return failf("indices {0} are larger than data {1} in dim {2}", idx.str(),
                   data.str(), d);
  return std::vector{TensorType(data.dtype, idx.shape)};
}

Types scatterND(const TypeQuery &q) {
  const TensorType &data = q.operands[0], &idx = q.operands[1],
                   &upd = q.operands[2];
  if (idx.dtype != DType::I64 && idx.dtype != DType::I32)
    return failf("indices must be i64 or i32, not {0}", idx.str());
  if (upd.dtype != data.dtype)
    return failf("updates {0} and data {1} differ in type", upd.str(),
                 data.str());
  if (idx.rank() < 1)
    return failf("indices must have rank >= 1, got {0}", idx.str());
  int64_t k = idx.shape.back();
  if (k < 1 || k > int64_t(data.rank()))
    return failf("the last dim of indices {0} must be in [1, rank of data {1}]",
                 idx.str(), data.str());
  Shape want(idx.shape.begin(), idx.shape.end() - 1);
  want.append(data.shape.begin() + k, data.shape.end());
  if (upd.shape != want)
    return failf("updates {0} must have shape {1}", upd.str(), shapeStr(want));
  std::string red = q.getString("reduction");
  if (red != "none" && red != "add" && red != "mul" && red != "max" &&
      red != "min")
    return failf("unknown reduction '{0}'", red);
  return std::vector{data};
}

// ScatterElements: updates shaped like the indices, which address data as
// GatherElements' do (same rank, no larger off the axis).
Types scatterElements(const TypeQuery &q) {
  const TensorType &data = q.operands[0], &idx = q.operands[1],
                   &upd = q.operands[2];
  if (upd.dtype != data.dtype)
    return failf("updates {0} and data {1} differ in type", upd.str(),
                 data.str());
  if (upd.shape != idx.shape)
    return failf("updates {0} must have the shape of indices {1}", upd.str(),
                 idx.str());
  std::string red = q.getString("reduction");
  if (red != "none" && red != "add" && red != "mul" && red != "max" &&
      red != "min")
    return failf("unknown reduction '{0}'", red);
  if (auto t = gatherElements(q); !t)
    return t.takeError();
  return std::vector{data};
}

Types cumSum(const TypeQuery &q) {
  const TensorType &x = q.operands[0];
  if (x.dtype == DType::Bool)
    return failf("operand must be numeric, not {0}", x.str());
  if (auto axis = normalizeAxis(q.getInt("axis"), x.rank()); !axis)
    return axis.takeError();
  return std::vector{x};
}

Types dft(const TypeQuery &q) {
  const TensorType &x = q.operands[0];
  if (!isFloat(x.dtype))
    return failf("operand must be float, not {0}", x.str());
  if (x.rank() < 2 || x.shape.back() != 2)
    return failf("operand {0} must be complex: a last dim of 2 (real, "
                 "imaginary)",
                 x.str());
  auto axis = normalizeAxis(q.getInt("axis"), x.rank());
  if (!axis)
    return axis.takeError();
  if (*axis == int64_t(x.rank()) - 1)
    return failf("axis {0} is the complex dim of {1}", q.getInt("axis"),
                 x.str());
  return std::vector{x};
}

Types tile(const TypeQuery &q) {
  const TensorType &x = q.operands[0];
  const auto &repeats = q.getInts("repeats");
  if (repeats.size() != x.rank())
    return failf("repeats {0} must give one count per dim of {1}",
                 shapeStr(repeats), x.str());
  Shape out(x.shape);
  for (size_t d = 0; d < out.size(); ++d) {
    if (repeats[d] < 0)
      return failf("repeats must not be negative, got {0}", repeats[d]);
    out[d] *= repeats[d];
  }
  if (auto e = checkShape(out))
    return failf("result {0}: {1}", shapeStr(out),
                 llvm::toString(std::move(e)));
  return std::vector{TensorType(x.dtype, out)};
}

Types reshape(const TypeQuery &q) {
  const auto &shape = q.getInts("shape");
  Shape out(shape.begin(), shape.end());
  if (auto e = checkShape(out))
    return failf("target shape {0}: {1}", shapeStr(out),
                 llvm::toString(std::move(e)));
  if (TensorType(q.operands[0].dtype, out).numElements() !=
      q.operands[0].numElements())
    return failf("cannot reshape {0} to {1}: element counts differ",
                 q.operands[0].str(), shapeStr(out));
  return std::vector{TensorType(q.operands[0].dtype, out)};
}

Types slice(const TypeQuery &q) {
  const TensorType &x = q.operands[0];
  const auto &starts = q.getInts("starts"), &ends = q.getInts("ends"),
             &axes = q.getInts("axes"), &steps = q.getInts("steps");
  if (ends.size() != starts.size() || axes.size() != starts.size() ||
      steps.size() != starts.size())
    return failf("starts, ends, axes and steps must have equal lengths");
  Shape out = x.shape;
  std::vector<bool> seen(x.rank(), false);
  for (size_t i = 0; i < starts.size(); ++i) {
    auto a = normalizeAxis(axes[i], x.rank());
    if (!a)
      return a.takeError();
    if (seen[*a])
      return failf("axis {0} is sliced twice", axes[i]);
    seen[*a] = true;
    if (steps[i] == 0)
      return failf("step for axis {0} is 0", axes[i]);
    out[*a] = sliceLength(x.shape[*a], starts[i], ends[i], steps[i]);
  }
  return std::vector{TensorType(x.dtype, out)};
}

Types split(const TypeQuery &q) {
  const TensorType &x = q.operands[0];
  auto axis = normalizeAxis(q.getInt("axis"), x.rank());
  if (!axis)
    return axis.takeError();
  const auto &sizes = q.getInts("split");
  if (sizes.size() != q.numResults)
    return failf("'split' has {0} sizes but the op has {1} results",
                 sizes.size(), q.numResults);
  int64_t total = 0;
  std::vector<TensorType> out;
  for (int64_t s : sizes) {
    if (s < 0)
      return failf("split size {0} is negative", s);
    total += s;
    Shape shape = x.shape;
    shape[*axis] = s;
    out.push_back(TensorType(x.dtype, shape));
  }
  if (total != x.shape[*axis])
    return failf("split sizes sum to {0} but axis {1} has size {2}", total,
                 *axis, x.shape[*axis]);
  return out;
}

Types squeeze(const TypeQuery &q) {
  const TensorType &x = q.operands[0];
  std::vector<bool> drop(x.rank(), false);
  for (int64_t a : q.getInts("axes")) {
    auto n = normalizeAxis(a, x.rank());
    if (!n)
      return n.takeError();
    if (x.shape[*n] != 1)
      return failf("cannot squeeze axis {0} of size {1}", a, x.shape[*n]);
    drop[*n] = true;
  }
  Shape out;
  for (size_t i = 0; i < x.rank(); ++i)
    if (!drop[i])
      out.push_back(x.shape[i]);
  return std::vector{TensorType(x.dtype, out)};
}

Types trilu(const TypeQuery &q) {
  if (q.operands[0].rank() < 2)
    return failf("operand must have rank >= 2, not {0}", q.operands[0].str());
  return std::vector{q.operands[0]};
}

Types transpose(const TypeQuery &q) {
  const TensorType &x = q.operands[0];
  const auto &perm = q.getInts("perm");
  if (perm.size() != x.rank())
    return failf("perm has {0} entries for rank {1}", perm.size(), x.rank());
  std::vector<bool> seen(x.rank(), false);
  Shape out;
  for (int64_t p : perm) {
    if (p < 0 || p >= int64_t(x.rank()) || seen[p])
      return failf("perm {0} is not a permutation of 0..{1}", shapeStr(perm),
                   x.rank() - 1);
    seen[p] = true;
    out.push_back(x.shape[p]);
  }
  return std::vector{TensorType(x.dtype, out)};
}

Types unsqueeze(const TypeQuery &q) {
  const TensorType &x = q.operands[0];
  const auto &axes = q.getInts("axes");
  int64_t r = x.rank() + axes.size();
  std::vector<bool> inserted(r, false);
  for (int64_t a : axes) {
    auto n = normalizeAxis(a, r);
    if (!n)
      return n.takeError();
    if (inserted[*n])
      return failf("axis {0} appears twice in 'axes'", a);
    inserted[*n] = true;
  }
  Shape out;
  size_t j = 0;
  for (int64_t i = 0; i < r; ++i)
    out.push_back(inserted[i] ? 1 : x.shape[j++]);
  return std::vector{TensorType(x.dtype, out)};
}

// Output length of one spatial axis of a convolution or pooling window.
static llvm::Expected<int64_t> windowOut(int64_t in, int64_t k, int64_t s,
                                         int64_t d, int64_t padBegin,
                                         int64_t padEnd, bool ceil) {
  if (k < 1 || s < 1 || d < 1 || padBegin < 0 || padEnd < 0)
    return failf("kernel, stride and dilation must be positive and pads "
                 "non-negative");
  // Sizes, pads, strides and dilations come from the model: checked
  // arithmetic, so absurd values are an error rather than int64 overflow.
  int64_t span = 0, padded = 0;
  if (llvm::MulOverflow(k - 1, d, span) ||
      llvm::AddOverflow(span, int64_t(1), span) ||
      llvm::AddOverflow(in, padBegin, padded) ||
      llvm::AddOverflow(padded, padEnd, padded))
    return failf("kernel {0}, dilation {1} and pads {2}+{3} are too large", k,
                 d, padBegin, padEnd);
  // out = floor or ceil((padded - span) / s) + 1. With ceil_mode a window
  // longer than the padded input still gives one output when it overhangs
  // by less than a stride (PyTorch's AvgPool2d(k, ceil_mode=True) over a
  // smaller map: EfficientNet's pooler); its taps past the end count as
  // the ceil_mode overhang does, never.
  if (padded < span && !(ceil && span - padded < s))
    return failf("window {0} is larger than the padded input {1}", span,
                 padded);
  int64_t out = 1;
  if (padded >= span) {
    // padded - span >= 0, so this stays in range for any stride s >= 1.
    out = (padded - span) / s + 1;
    if (ceil && (padded - span) % s != 0)
      ++out;
  }
  // A window starting entirely inside the end padding is dropped:
  // (out - 1) * s >= in + padBegin, without the product.
  int64_t inside = in + padBegin; // <= padded, so no overflow
  if (ceil && out - 1 >= inside / s + (inside % s != 0))
    --out;
  return out;
}

static llvm::Error checkGeometry(const TypeQuery &q, size_t spatial,
                                 bool hasDilations) {
  auto check = [&](const char *name, size_t want) -> llvm::Error {
    if (q.getInts(name).size() != want)
      return failf("'{0}' has {1} entries, expected {2}", name,
                   q.getInts(name).size(), want);
    return llvm::Error::success();
  };
  if (auto e = check("strides", spatial))
    return e;
  if (auto e = check("pads", 2 * spatial))
    return e;
  if (hasDilations)
    if (auto e = check("dilations", spatial))
      return e;
  return llvm::Error::success();
}

Types conv(const TypeQuery &q) {
  if (auto e = sameDType(q))
    return std::move(e);
  const TensorType &x = q.operands[0], &w = q.operands[1];
  if (x.rank() < 3 || w.rank() != x.rank())
    return failf("X {0} and W {1} must have the same rank >= 3", x.str(),
                 w.str());
  size_t sp = x.rank() - 2;
  if (auto e = checkGeometry(q, sp, true))
    return std::move(e);
  int64_t group = q.getInt("group");
  if (group < 1 || x.shape[1] != w.shape[1] * group || w.shape[0] % group)
    return failf("channels do not match: X has {0}, W {1} with group {2}",
                 x.shape[1], shapeStr(w.shape), group);
  if (q.operands.size() == 3 && q.operands[2].shape != Shape{w.shape[0]})
    return failf("bias must have shape [{0}], got {1}", w.shape[0],
                 q.operands[2].str());
  Shape out{x.shape[0], w.shape[0]};
  const auto &st = q.getInts("strides"), &pd = q.getInts("pads"),
             &dl = q.getInts("dilations");
  for (size_t i = 0; i < sp; ++i) {
    auto o = windowOut(x.shape[2 + i], w.shape[2 + i], st[i], dl[i], pd[i],
                       pd[sp + i], false);
    if (!o)
      return o.takeError();
    out.push_back(*o);
  }
  return std::vector{TensorType(x.dtype, out)};
}

Types pool(const TypeQuery &q) {
  const TensorType &x = q.operands[0];
  if (x.rank() < 3)
    return failf("input must have rank >= 3 ([N, C, ...]), got {0}", x.str());
  size_t sp = x.rank() - 2;
  bool hasDil = q.info.findAttr("dilations") != nullptr;
  if (auto e = checkGeometry(q, sp, hasDil))
    return std::move(e);
  const auto &ks = q.getInts("kernel_shape");
  if (ks.size() != sp)
    return failf("'kernel_shape' has {0} entries, expected {1}", ks.size(), sp);
  const auto &st = q.getInts("strides"), &pd = q.getInts("pads");
  Shape out{x.shape[0], x.shape[1]};
  for (size_t i = 0; i < sp; ++i) {
    auto o = windowOut(x.shape[2 + i], ks[i], st[i],
                       hasDil ? q.getInts("dilations")[i] : 1, pd[i],
                       pd[sp + i], q.getInt("ceil_mode"));
    if (!o)
      return o.takeError();
    out.push_back(*o);
  }
  std::vector<TensorType> res{TensorType(x.dtype, out)};
  if (q.numResults > 1)
    res.push_back(TensorType(DType::I64, out));
  return res;
}

Types globalPool(const TypeQuery &q) {
  const TensorType &x = q.operands[0];
  if (x.rank() < 3)
    return failf("input must have rank >= 3 ([N, C, ...]), got {0}", x.str());
  Shape out = x.shape;
  std::fill(out.begin() + 2, out.end(), 1);
  return std::vector{TensorType(x.dtype, out)};
}

Types comm(const TypeQuery &q) {
  if (q.info.kind == OpKind::Send)
    return std::vector<TensorType>{};
  auto dtype = parseDType(q.getString("dtype"));
  if (!dtype)
    return failf("unknown dtype '{0}'", q.getString("dtype"));
  for (int64_t d : q.getInts("shape"))
    if (d < 0)
      return failf("negative dimension {0} in shape", d);
  const std::vector<int64_t> &dims = q.getInts("shape");
  return std::vector<TensorType>{
      TensorType(*dtype, Shape(dims.begin(), dims.end()))};
}

} // namespace typerules
} // namespace cleave::ir

// Gradient and optimizer ops (made by passes, not imported). The checks are
// lighter than for forward ops: the autodiff pass builds these from a graph
// that already verified, so the rules mainly compute result types and catch
// hand-written IR that mixes up operands.
namespace cleave::ir {

static llvm::Expected<Shape> shapeAttr(const TypeQuery &q) {
  const auto &s = q.getInts("shape");
  Shape shape(s.begin(), s.end());
  if (auto e = checkShape(shape))
    return std::move(e);
  return shape;
}

static llvm::Error requireSameType(const TensorType &a, const TensorType &b,
                                   const char *what) {
  if (a != b)
    return failf("{0}: {1} and {2} differ", what, a.str(), b.str());
  return llvm::Error::success();
}

namespace typerules {

// Resize: the result has the dims `sizes`; what the CPU kernel computes is
// checked here, so an unsupported mode is refused at import.
Types resize(const TypeQuery &q) {
  const TensorType &x = q.operands[0];
  const auto &sizes = q.getInts("sizes");
  if (sizes.size() != x.rank())
    return failf("sizes {0} must give one dim per dim of {1}", shapeStr(sizes),
                 x.str());
  for (int64_t s : sizes)
    if (s < 1)
      return failf("sizes must be positive, got {0}", s);
  if (q.attrs.count("scales")) {
    const auto &scales = q.get("scales").getFloats();
    if (scales.size() != x.rank())
      return failf("scales must give one scale per dim of {0}", x.str());
    for (float s : scales)
      if (!(s > 0))
        return failf("scales must be positive, got {0}", s);
  }
  const std::string &mode = q.getString("mode");
  if (mode != "nearest" && mode != "linear" && mode != "cubic")
    return failf("mode '{0}' is not supported (cleave supports nearest, "
                 "linear and cubic)",
                 mode);
  if (mode != "nearest" && !isFloat(x.dtype))
    return failf("mode {0} needs a float tensor, not {1}", mode, x.str());
  if (mode == "cubic" && q.getInt("exclude_outside") != 0)
    return failf("cubic with exclude_outside is not supported");
  const std::string &ct = q.getString("coordinate_transformation_mode");
  if (ct != "half_pixel" && ct != "pytorch_half_pixel" &&
      ct != "align_corners" && ct != "asymmetric" &&
      ct != "tf_half_pixel_for_nn")
    return failf("coordinate_transformation_mode '{0}' is not supported", ct);
  const std::string &nm = q.getString("nearest_mode");
  if (nm != "round_prefer_floor" && nm != "round_prefer_ceil" &&
      nm != "floor" && nm != "ceil")
    return failf("nearest_mode '{0}' is not supported", nm);
  if (q.getInt("antialias") != 0)
    return failf("antialias is not supported");
  if (q.getString("keep_aspect_ratio_policy") != "stretch")
    return failf("keep_aspect_ratio_policy '{0}' is not supported (the sizes "
                 "must be given per dim)",
                 q.getString("keep_aspect_ratio_policy"));
  return std::vector{TensorType(x.dtype, Shape(sizes.begin(), sizes.end()))};
}

// GridSample: X [N, C, H, W] at the grid [N, Ho, Wo, 2] -> [N, C, Ho, Wo];
// what the kernels compute is checked here, so an unsupported mode is
// refused at import.
Types gridSample(const TypeQuery &q) {
  const TensorType &x = q.operands[0], &grid = q.operands[1];
  if (x.dtype != DType::F32 && x.dtype != DType::F64)
    return failf("X must be f32 or f64, got {0}", x.str());
  if (grid.dtype != x.dtype)
    return failf("the grid must have X's element type, got {0} and {1}",
                 x.str(), grid.str());
  if (x.rank() != 4)
    return failf("X must be [N, C, H, W] (cleave samples two spatial dims), "
                 "got {0}",
                 x.str());
  if (grid.rank() != 4 || grid.shape[0] != x.shape[0] || grid.shape[3] != 2)
    return failf("the grid must be [N, H_out, W_out, 2] for X {0}, got {1}",
                 x.str(), grid.str());
  const std::string &mode = q.getString("mode");
  if (mode != "linear" && mode != "nearest")
    return failf("mode '{0}' is not supported (cleave supports linear and "
                 "nearest)",
                 mode);
  const std::string &pad = q.getString("padding_mode");
  if (pad != "zeros" && pad != "border" && pad != "reflection")
    return failf("padding_mode '{0}' is not supported", pad);
  return std::vector{TensorType(
      x.dtype, Shape{x.shape[0], x.shape[1], grid.shape[1], grid.shape[2]})};
}

Types gradient(const TypeQuery &q) {
  const TensorType &dy = q.operands[0];
  if (auto e = requireFloat(dy, "the incoming gradient"))
    return std::move(e);
  auto typed = [&](Shape s) { return TensorType(dy.dtype, std::move(s)); };
  switch (q.info.kind) {
  case OpKind::UnaryGrad:
  case OpKind::SoftmaxGrad:
  case OpKind::LogSoftmaxGrad:
  case OpKind::MaxPoolGrad:
  case OpKind::LayerNormalizationGradData:
  case OpKind::RMSNormalizationGradData:
  case OpKind::BatchNormalizationGradData:
    if (q.info.kind != OpKind::MaxPoolGrad)
      if (auto e = requireSameType(dy, q.operands[1], "gradient and operand"))
        return std::move(e);
    return std::vector{q.operands[1]};
  case OpKind::DropoutGrad:
  case OpKind::ScatterNDGradData:
  case OpKind::ScatterElementsGradData:
    return std::vector{dy};
  case OpKind::ScatterElementsGradUpdates: // shaped like the indices
    return std::vector{typed(q.operands[1].shape)};
  case OpKind::SumTo: {
    auto s = shapeAttr(q);
    if (!s)
      return s.takeError();
    auto b = broadcastShapes(*s, dy.shape);
    if (!b || *b != dy.shape)
      return failf("shape {0} does not broadcast to the operand {1}",
                   shapeStr(*s), dy.str());
    return std::vector{typed(*s)};
  }
  case OpKind::MatMulGrad:
  case OpKind::GemmGrad:
  case OpKind::ConvGrad:
    return std::vector{q.operands[1], q.operands[2]};
  case OpKind::FusedAttentionGrad: {
    auto qkv = attentionOperands(q, q.operands[1], q.operands[2],
                                 q.operands[3]);
    if (!qkv)
      return qkv.takeError();
    if (auto e = requireSameType(dy, (*qkv)[0], "gradient and Q"))
      return std::move(e);
    if (attentionPackedKvHeads(q) > 0) // one gradient, as packed as Q, K, V
      return std::vector{q.operands[1]};
    return std::vector{q.operands[1], q.operands[2], q.operands[3]};
  }
  case OpKind::LayerNormalizationGrad:
  case OpKind::RMSNormalizationGrad: {
    if (auto e = requireSameType(dy, q.operands[1], "gradient and X"))
      return std::move(e);
    auto axis = normalizeAxis(q.getInt("axis"), dy.rank());
    if (!axis)
      return axis.takeError();
    Shape norm(dy.shape.begin() + *axis, dy.shape.end());
    return std::vector{q.operands[1], typed(norm)};
  }
  case OpKind::LayerNormalizationGradParams:
  case OpKind::RMSNormalizationGradParams: {
    auto axis = normalizeAxis(q.getInt("axis"), dy.rank());
    if (!axis)
      return axis.takeError();
    return std::vector{typed(Shape(dy.shape.begin() + *axis, dy.shape.end()))};
  }
  case OpKind::BatchNormalizationGrad:
    if (auto e = requireSameType(dy, q.operands[1], "gradient and X"))
      return std::move(e);
    return std::vector{q.operands[1], q.operands[2]};
  case OpKind::BatchNormalizationGradParams:
    if (dy.rank() < 2)
      return failf("X must have rank >= 2, got {0}", dy.str());
    return std::vector{typed(Shape{dy.shape[1]})};
  case OpKind::GridSampleGradGrid: // dY, X, grid -> dGrid
    if (q.operands[1].dtype != dy.dtype || q.operands[2].dtype != dy.dtype)
      return failf("dY, X and the grid must have one element type, got {0}, "
                   "{1} and {2}",
                   dy.str(), q.operands[1].str(), q.operands[2].str());
    return std::vector{q.operands[2]};
  case OpKind::SoftmaxCrossEntropyLossGrad:
    if (dy.numElements() != 1 && q.getString("reduction") != "none")
      return failf("the gradient of a reduced loss must be a scalar, got {0}",
                   dy.str());
    return std::vector{q.operands[1]};
  case OpKind::GatherGrad:
  case OpKind::SliceGrad: {
    auto s = shapeAttr(q);
    if (!s)
      return s.takeError();
    size_t acc = q.info.kind == OpKind::GatherGrad ? 2 : 1;
    if (q.operands.size() > acc && q.operands[acc] != typed(*s))
      return failf("the sum {0} must have the gradient's type {1}",
                   q.operands[acc].str(), typed(*s).str());
    return std::vector{typed(*s)};
  }
  case OpKind::MatMulGradA:
  case OpKind::MatMulGradB:
  case OpKind::GemmGradA:
  case OpKind::GemmGradB:
  case OpKind::ConvGradData:
  case OpKind::ConvTranspose:
  case OpKind::ConvGradFilter:
  case OpKind::GatherElementsGrad:
  case OpKind::ScatterNDGradUpdates:
  case OpKind::ResizeGrad:
  case OpKind::GridSampleGradData:
  case OpKind::AveragePoolGrad: {
    auto s = shapeAttr(q);
    if (!s)
      return s.takeError();
    return std::vector{typed(*s)};
  }
  default:
    return failf("no gradient type rule for {0}", q.info.name);
  }
}

Types optimizer(const TypeQuery &q) {
  const TensorType &param = q.operands[0];
  if (auto e = requireFloat(param, "the parameter"))
    return std::move(e);
  if (auto e = requireSameType(param, q.operands[1], "parameter and gradient"))
    return std::move(e);
  if (q.operands[2].numElements() != 1)
    return failf("the learning rate must be a scalar, got {0}",
                 q.operands[2].str());
  std::vector<TensorType> out{param};
  size_t firstState = q.info.kind == OpKind::AdamW ? 4 : 3;
  for (size_t i = firstState; i < q.operands.size(); ++i) {
    if (auto e = requireSameType(param, q.operands[i],
                                 "parameter and optimizer state"))
      return std::move(e);
    out.push_back(param);
  }
  if (out.size() != q.numResults)
    return failf("{0} results given, {1} expected (the parameter, then one per "
                 "state operand)",
                 q.numResults, out.size());
  return out;
}

} // namespace typerules
} // namespace cleave::ir
