// Lowering of kernel calls to device steps (Lowering.h), the host runner of
// those steps, and the emulated backend built on the two.
#include "runtime/cuda/Lowering.h"

#include "ir/TypeRules.h"

#include "llvm/ADT/StringSwitch.h"
#include "llvm/Support/FormatVariadic.h"

#include <algorithm>
#include <cstdlib>
#include <optional>

namespace cleave::runtime::cuda {

using ir::DType;
using ir::OpKind;

namespace {

llvm::Error fail(const KernelCall &call, const llvm::Twine &why) {
  return llvm::createStringError(llvm::inconvertibleErrorCode(),
                                 std::string(call.info().name) +
                                     " (cuda): " + why.str());
}

std::optional<Elem> elemOf(DType t) {
  switch (t) {
  case DType::F32: return Elem::F32;
  case DType::BF16: return Elem::BF16;
  case DType::I64: return Elem::I64;
  case DType::I32: return Elem::I32;
  case DType::Bool: return Elem::Bool;
  default: return std::nullopt;
  }
}

bool isFloatElem(DType t) { return t == DType::F32 || t == DType::BF16; }

std::vector<int64_t> stridesOf(llvm::ArrayRef<int64_t> shape) {
  std::vector<int64_t> s(shape.size(), 1);
  for (size_t i = shape.size(); i-- > 1;)
    s[i - 1] = s[i] * shape[i];
  return s;
}

// An indexer over `dims` with the given strides and base.
Indexer indexer(llvm::ArrayRef<int64_t> dims, llvm::ArrayRef<int64_t> strides,
                int64_t base = 0) {
  Indexer ix;
  ix.rank = int(dims.size());
  for (size_t d = 0; d < dims.size(); ++d) {
    ix.dims[d] = dims[d];
    ix.strides[d] = strides[d];
  }
  ix.base = base;
  return ix;
}
Indexer contiguous(llvm::ArrayRef<int64_t> shape) {
  return indexer(shape, stridesOf(shape));
}
// Reads `in` broadcast (NumPy rules, aligned at the right) over `out`.
Indexer broadcast(llvm::ArrayRef<int64_t> in, llvm::ArrayRef<int64_t> out) {
  std::vector<int64_t> s = stridesOf(in), strides(out.size(), 0);
  size_t lead = out.size() - in.size();
  for (size_t d = 0; d < in.size(); ++d)
    strides[lead + d] = in[d] == 1 ? 0 : s[d];
  return indexer(out, strides);
}

Operand operand(const TensorRef &t, Indexer at) {
  return Operand{t.data, *elemOf(t.dtype), at};
}

// A map writing `out` contiguously, each input broadcast to out's shape.
MapArgs mapOver(MapOp op, const TensorRef &out,
                std::initializer_list<const TensorRef *> ins) {
  MapArgs m;
  m.op = op;
  m.n = out.numElements();
  m.out = out.data;
  m.outElem = *elemOf(out.dtype);
  m.outAt = contiguous(out.shape);
  int i = 0;
  for (const TensorRef *t : ins)
    m.in[i++] = operand(*t, broadcast(t->shape, out.shape));
  return m;
}

// A raw copy of `n` elements of one type, from `from` to `to`.
MapArgs copy(const TensorRef &src, Indexer from, void *dst, Indexer to,
             int64_t n) {
  MapArgs m;
  m.op = MapOp::Copy;
  m.n = n;
  m.in[0] = operand(src, from);
  m.out = dst;
  m.outElem = *elemOf(src.dtype);
  m.outAt = to;
  return m;
}

MapArgs zero(const TensorRef &out) {
  MapArgs m;
  m.op = MapOp::Zero;
  m.n = out.numElements();
  m.out = out.data;
  m.outElem = *elemOf(out.dtype);
  m.outAt = contiguous(out.shape);
  return m;
}

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
  case OpKind::Reciprocal: return MapOp::Reciprocal;
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
  case OpKind::And: return MapOp::And;
  case OpKind::Or: return MapOp::Or;
  default: return std::nullopt;
  }
}

std::optional<MapOp> unaryGradMap(llvm::StringRef fn) {
  return llvm::StringSwitch<std::optional<MapOp>>(fn)
      .Case("abs", MapOp::AbsGrad)
      .Case("clip", MapOp::ClipGrad)
      .Case("erf", MapOp::ErfGrad)
      .Case("exp", MapOp::ExpGrad)
      .Case("leaky_relu", MapOp::LeakyReluGrad)
      .Case("log", MapOp::LogGrad)
      .Case("reciprocal", MapOp::ReciprocalGrad)
      .Case("relu", MapOp::ReluGrad)
      .Case("sigmoid", MapOp::SigmoidGrad)
      .Case("sqrt", MapOp::SqrtGrad)
      .Case("tanh", MapOp::TanhGrad)
      .Default(std::nullopt);
}

// Ops that only move data: their output is the input's elements in the
// same row-major order.
bool isReshapeLike(OpKind k) {
  return k == OpKind::Identity || k == OpKind::Reshape ||
         k == OpKind::Squeeze || k == OpKind::Unsqueeze ||
         k == OpKind::Flatten;
}

using Steps = std::vector<DeviceStep>;

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
    ir::sliceLength(shape[a], starts[i], ends[i], step, &first);
    base += first * strides[a];
    view[a] = strides[a] * step;
  }
  return indexer(sliced, view, base);
}

llvm::Expected<int64_t> axisOf(const KernelCall &call, int64_t axis,
                               size_t rank) {
  int64_t a = axis < 0 ? axis + int64_t(rank) : axis;
  if (a < 0 || a >= int64_t(rank))
    return fail(call, llvm::formatv("axis {0} out of range for rank {1}", axis,
                                    rank));
  return a;
}

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
    return Steps{zero(dx), copy(x, contiguous(x.shape), dx.data, *view,
                                x.numElements())};
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

// --- products --------------------------------------------------------------

GemmStep gemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k,
              const TensorRef &A, int64_t lda, const TensorRef &B, int64_t ldb,
              void *C, Elem c, int64_t ldc, float alpha = 1, float beta = 0) {
  GemmStep s;
  s.transA = ta;
  s.transB = tb;
  s.m = m;
  s.n = n;
  s.k = k;
  s.A = A.data;
  s.B = B.data;
  s.C = C;
  s.lda = lda;
  s.ldb = ldb;
  s.ldc = ldc;
  s.alpha = alpha;
  s.beta = beta;
  s.ab = *elemOf(A.dtype);
  s.c = c;
  return s;
}

// Y[batch, m, n] = A[batchA, m, k] x B[batchB, k, n] with NumPy batch
// broadcasting: per output batch entry, which A and B matrix it reads.
struct Layout {
  int64_t m = 0, k = 0, n = 0, count = 1, countA = 1, countB = 1;
  std::vector<int64_t> matA, matB;
};

llvm::Expected<Layout> layout(const KernelCall &call,
                              llvm::ArrayRef<int64_t> a,
                              llvm::ArrayRef<int64_t> b,
                              llvm::ArrayRef<int64_t> y) {
  if (a.size() < 2 || b.size() < 2)
    return fail(call, llvm::formatv("operands {0} and {1}: 1-D MatMul "
                                    "operands are not supported",
                                    ir::shapeStr(a), ir::shapeStr(b)));
  Layout l;
  l.m = a[a.size() - 2];
  l.k = a.back();
  l.n = b.back();
  size_t ra = a.size() - 2, rb = b.size() - 2, r = std::max(ra, rb);
  if (b[rb] != l.k || y.size() != r + 2 || y[r] != l.m || y[r + 1] != l.n)
    return fail(call, llvm::formatv("operands {0} x {1} do not give {2}",
                                    ir::shapeStr(a), ir::shapeStr(b),
                                    ir::shapeStr(y)));
  std::vector<int64_t> strideA(r, 0), strideB(r, 0);
  for (size_t i = r; i-- > 0;) {
    int64_t da = i >= r - ra ? a[i - (r - ra)] : 1;
    int64_t db = i >= r - rb ? b[i - (r - rb)] : 1;
    if (da != 1)
      strideA[i] = l.countA;
    if (db != 1)
      strideB[i] = l.countB;
    l.countA *= da;
    l.countB *= db;
    l.count *= y[i];
  }
  l.matA.assign(l.count, 0);
  l.matB.assign(l.count, 0);
  for (int64_t e = 0; e < l.count; ++e) {
    int64_t rest = e;
    for (size_t i = r; i-- > 0;) {
      int64_t c = rest % y[i];
      rest /= y[i];
      l.matA[e] += c * strideA[i];
      l.matB[e] += c * strideB[i];
    }
  }
  return l;
}

// The stride s with mat[e] == e * s for every e, if there is one.
std::optional<int64_t> uniformStride(const std::vector<int64_t> &mat) {
  int64_t s = mat.size() > 1 ? mat[1] - mat[0] : 0;
  for (size_t e = 0; e < mat.size(); ++e)
    if (mat[e] != int64_t(e) * s)
      return std::nullopt;
  return s;
}

// Offsets a tensor view by `elements`.
TensorRef at(const TensorRef &t, int64_t elements) {
  TensorRef r = t;
  r.data = static_cast<char *>(t.data) + elements * ir::dtypeSize(t.dtype);
  return r;
}

// For each target matrix, the products of the entries that write it, in
// increasing entry order (beta 0 for the first, 1 after); a target no
// entry writes is zeroed. As the CPU backend sums broadcast gradients.
template <typename Product>
void sumProducts(Steps &steps, int64_t targets,
                 const std::vector<int64_t> &target, const TensorRef &out,
                 int64_t matrix, Product product) {
  std::vector<std::vector<int64_t>> entries(targets);
  for (int64_t e = 0; e < int64_t(target.size()); ++e)
    entries[target[e]].push_back(e);
  for (int64_t t = 0; t < targets; ++t) {
    if (entries[t].empty()) {
      MapArgs z;
      z.op = MapOp::Zero;
      z.n = matrix;
      z.out = out.data;
      z.outElem = *elemOf(out.dtype);
      z.outAt = indexer({matrix}, {1}, t * matrix);
      steps.push_back(z);
    }
    for (size_t i = 0; i < entries[t].size(); ++i)
      steps.push_back(product(entries[t][i], i == 0 ? 0.0f : 1.0f));
  }
}

llvm::Expected<Steps> lowerMatMul(const KernelCall &call) {
  Steps steps;
  if (call.op == OpKind::MatMul) {
    const TensorRef &A = call.inputs[0], &B = call.inputs[1],
                    &Y = call.outputs[0];
    auto l = layout(call, A.shape, B.shape, Y.shape);
    if (!l)
      return l.takeError();
    Elem ye = *elemOf(Y.dtype);
    if (l->countB == 1) { // the batch folds into the rows
      GemmStep s = gemm(false, false, l->count * l->m, l->n, l->k, A, l->k, B,
                        l->n, Y.data, ye, l->n);
      if (l->countA != l->count) { // A broadcast: per entry
        s.m = l->m;
        s.batch = l->count;
        auto sa = uniformStride(l->matA);
        if (!sa)
          goto general;
        s.strideA = *sa * l->m * l->k;
        s.strideC = l->m * l->n;
      }
      return Steps{s};
    }
    {
      auto sa = uniformStride(l->matA), sb = uniformStride(l->matB);
      if (sa && sb) {
        GemmStep s = gemm(false, false, l->m, l->n, l->k, A, l->k, B, l->n,
                          Y.data, ye, l->n);
        s.batch = l->count;
        s.strideA = *sa * l->m * l->k;
        s.strideB = *sb * l->k * l->n;
        s.strideC = l->m * l->n;
        return Steps{s};
      }
    }
  general:
    for (int64_t e = 0; e < l->count; ++e)
      steps.push_back(gemm(false, false, l->m, l->n, l->k,
                           at(A, l->matA[e] * l->m * l->k), l->k,
                           at(B, l->matB[e] * l->k * l->n), l->n,
                           at(Y, e * l->m * l->n).data, ye, l->n));
    return steps;
  }
  if (call.op == OpKind::MatMulGradA) { // dA = SumTo(dY x B^T)
    const TensorRef &dY = call.inputs[0], &B = call.inputs[1],
                    &dA = call.outputs[0];
    auto l = layout(call, dA.shape, B.shape, dY.shape);
    if (!l)
      return l.takeError();
    int64_t m = l->m, k = l->k, n = l->n;
    Elem e = *elemOf(dA.dtype);
    if (l->countB == 1 && l->countA == l->count)
      return Steps{gemm(false, true, l->count * m, k, n, dY, n, B, n, dA.data,
                        e, k)};
    sumProducts(steps, l->countA, l->matA, dA, m * k, [&](int64_t i, float beta) {
      return gemm(false, true, m, k, n, at(dY, i * m * n), n,
                  at(B, l->matB[i] * k * n), n,
                  at(dA, l->matA[i] * m * k).data, e, k, 1.0f, beta);
    });
    return steps;
  }
  // MatMulGradB: dB = SumTo(A^T x dY)
  const TensorRef &A = call.inputs[0], &dY = call.inputs[1],
                  &dB = call.outputs[0];
  auto l = layout(call, A.shape, dB.shape, dY.shape);
  if (!l)
    return l.takeError();
  int64_t m = l->m, k = l->k, n = l->n;
  Elem e = *elemOf(dB.dtype);
  if (l->countB == 1 && l->countA == l->count)
    return Steps{gemm(true, false, k, n, l->count * m, A, k, dY, n, dB.data,
                      e, n)};
  sumProducts(steps, l->countB, l->matB, dB, k * n, [&](int64_t i, float beta) {
    return gemm(true, false, k, n, m, at(A, l->matA[i] * m * k), k,
                at(dY, i * m * n), n, at(dB, l->matB[i] * k * n).data, e, n,
                1.0f, beta);
  });
  return steps;
}

llvm::Expected<Steps> lowerGemm(const KernelCall &call) {
  bool ta = call.getInt("transA"), tb = call.getInt("transB");
  float alpha = call.getFloat("alpha");
  if (call.op == OpKind::Gemm) {
    const TensorRef &A = call.inputs[0], &B = call.inputs[1],
                    &Y = call.outputs[0];
    int64_t m = Y.shape[0], n = Y.shape[1], k = ta ? A.shape[0] : A.shape[1];
    float beta = call.getFloat("beta");
    bool useC = call.inputs.size() == 3 && beta != 0.0f;
    Steps steps;
    // Y starts as C broadcast to [M, N], or 0.
    if (useC)
      steps.push_back(copy(call.inputs[2],
                           broadcast(call.inputs[2].shape, Y.shape), Y.data,
                           contiguous(Y.shape), Y.numElements()));
    else
      steps.push_back(zero(Y));
    if (k > 0)
      steps.push_back(gemm(ta, tb, m, n, k, A, A.shape[1], B, B.shape[1],
                           Y.data, *elemOf(Y.dtype), n, alpha,
                           useC ? beta : 0.0f));
    else if (useC && beta != 1.0f) { // Y = beta * C
      MapArgs scale = mapOver(MapOp::Scale, Y, {&call.inputs[2]});
      scale.p0 = beta;
      steps.back() = scale;
    }
    return steps;
  }
  if (call.op == OpKind::GemmGradA) {
    const TensorRef &dY = call.inputs[0], &B = call.inputs[1],
                    &dA = call.outputs[0];
    int64_t m = dY.shape[0], n = dY.shape[1];
    int64_t k = tb ? B.shape[1] : B.shape[0];
    Elem e = *elemOf(dA.dtype);
    if (ta) // dA[k, m] = alpha * op(B) * dY^T
      return Steps{gemm(tb, true, k, m, n, B, B.shape[1], dY, n, dA.data, e,
                        m, alpha)};
    return Steps{gemm(false, !tb, m, k, n, dY, n, B, B.shape[1], dA.data, e,
                      k, alpha)};
  }
  // GemmGradB
  const TensorRef &A = call.inputs[0], &dY = call.inputs[1],
                  &dB = call.outputs[0];
  int64_t m = dY.shape[0], n = dY.shape[1];
  int64_t k = ta ? A.shape[0] : A.shape[1];
  Elem e = *elemOf(dB.dtype);
  if (tb) // dB[n, k] = alpha * dY^T * op(A)
    return Steps{gemm(true, ta, n, k, m, dY, n, A, A.shape[1], dB.data, e, k,
                      alpha)};
  return Steps{gemm(!ta, false, k, n, m, A, A.shape[1], dY, n, dB.data, e, n,
                    alpha)};
}

// --- reductions -------------------------------------------------------------

llvm::Expected<Steps> lowerSumTo(const KernelCall &call) {
  const TensorRef &X = call.inputs[0], &Y = call.outputs[0];
  if (X.rank() < Y.rank())
    return fail(call, llvm::formatv("shape {0} has more dims than {1}",
                                    ir::shapeStr(Y.shape),
                                    ir::shapeStr(X.shape)));
  size_t lead = X.rank() - Y.rank();
  std::vector<int64_t> xs = stridesOf(X.shape);
  // Output coordinates (Y's shape aligned to X's) and the reduced dims.
  std::vector<int64_t> keptDims, keptStrides, redDims, redStrides;
  for (size_t d = 0; d < X.rank(); ++d) {
    int64_t yd = d >= lead ? Y.shape[d - lead] : 1;
    if (yd != X.shape[d] && yd != 1)
      return fail(call, llvm::formatv("shape {0} does not broadcast to {1}",
                                      ir::shapeStr(Y.shape),
                                      ir::shapeStr(X.shape)));
    if (d >= lead) {
      keptDims.push_back(yd);
      keptStrides.push_back(yd == 1 ? 0 : xs[d]);
    }
    if (yd == 1 && X.shape[d] != 1) {
      redDims.push_back(X.shape[d]);
      redStrides.push_back(xs[d]);
    }
  }
  ReduceStep r;
  r.in = X.data;
  r.inElem = *elemOf(X.dtype);
  r.out = Y.data;
  r.outElem = *elemOf(Y.dtype);
  r.outputs = Y.numElements();
  r.base = indexer(keptDims, keptStrides);
  r.reduced = indexer(redDims, redStrides);
  r.count = 1;
  for (int64_t d : redDims)
    r.count *= d;
  return Steps{r};
}

// --- rows, columns, gathers, optimizers -----------------------------------

RowStep rowsAlong(RowOp op, const TensorRef &x, int64_t axis) {
  RowStep r;
  r.op = op;
  r.len = x.shape[axis];
  r.inner = 1;
  for (size_t d = axis + 1; d < x.rank(); ++d)
    r.inner *= x.shape[d];
  r.rows = r.len ? x.numElements() / r.len : 0;
  r.x = x.data;
  r.xElem = *elemOf(x.dtype);
  return r;
}

void setOut(RowStep &r, const TensorRef &t) {
  r.out = t.data;
  r.outElem = *elemOf(t.dtype);
}

// LayerNorm's rows: everything from `axis` on, one row per leading index.
llvm::Expected<RowStep> layerNormRows(const KernelCall &call, RowOp op,
                                      const TensorRef &x) {
  auto axis = axisOf(call, call.getInt("axis"), x.rank());
  if (!axis)
    return axis.takeError();
  RowStep r;
  r.op = op;
  r.len = 1;
  for (size_t d = *axis; d < x.rank(); ++d)
    r.len *= x.shape[d];
  r.rows = r.len ? x.numElements() / r.len : 0;
  r.x = x.data;
  r.xElem = *elemOf(x.dtype);
  r.epsilon = call.getFloat("epsilon");
  return r;
}

// A LayerNorm scale or bias: broadcast to the row, which the kernels read
// as index j % numel: its shape must be the row's trailing dims.
llvm::Error rowOperand(const KernelCall &call, const TensorRef &t,
                       const TensorRef &x, const void *&data, Elem &elem,
                       int64_t &len) {
  for (size_t d = 0; d < t.rank(); ++d)
    if (t.rank() > x.rank() ||
        (t.shape[d] != x.shape[x.rank() - t.rank() + d] &&
         !(t.numElements() == 1)))
      return fail(call, "a scale or bias of shape " + ir::shapeStr(t.shape) +
                            " that is not the normalized dims'");
  data = t.data;
  elem = *elemOf(t.dtype);
  len = std::max<int64_t>(t.numElements(), 1);
  return llvm::Error::success();
}

double *doubles(const Scratch &scratch, int64_t n) {
  return static_cast<double *>(scratch(size_t(std::max<int64_t>(n, 1)) * 8));
}

void setLabels(RowStep &r, const KernelCall &call, const TensorRef &labels,
               const TensorRef *weights) {
  r.labels = labels.data;
  r.labelElem = *elemOf(labels.dtype);
  if (weights) {
    r.weights = weights->data;
    r.weightElem = *elemOf(weights->dtype);
  }
  r.hasIgnore = call.hasAttr("ignore_index");
  if (r.hasIgnore)
    r.ignoreIndex = call.getInt("ignore_index");
}

llvm::Expected<Steps> lowerRows(const KernelCall &call,
                                const Scratch &scratch) {
  const TensorRef &x = call.inputs[0];
  switch (call.op) {
  case OpKind::Softmax:
  case OpKind::LogSoftmax:
  case OpKind::SoftmaxGrad:
  case OpKind::LogSoftmaxGrad: {
    auto axis = axisOf(call, call.getInt("axis"), x.rank());
    if (!axis)
      return axis.takeError();
    if (call.op == OpKind::Softmax || call.op == OpKind::LogSoftmax) {
      RowStep r = rowsAlong(call.op == OpKind::Softmax ? RowOp::Softmax
                                                       : RowOp::LogSoftmax,
                            x, *axis);
      setOut(r, call.outputs[0]);
      return Steps{r};
    }
    RowStep r = rowsAlong(call.op == OpKind::SoftmaxGrad ? RowOp::SoftmaxGrad
                                                         : RowOp::LogSoftmaxGrad,
                          x, *axis); // x: dY
    r.aux = call.inputs[1].data;     // Y
    r.auxElem = *elemOf(call.inputs[1].dtype);
    setOut(r, call.outputs[0]);
    return Steps{r};
  }
  case OpKind::LayerNormalization: {
    auto r = layerNormRows(call, RowOp::LayerNorm, x);
    if (!r)
      return r.takeError();
    if (auto e = rowOperand(call, call.inputs[1], x, r->scale, r->scaleElem,
                            r->scaleLen))
      return std::move(e);
    if (call.inputs.size() > 2 && call.inputs[2].data)
      if (auto e = rowOperand(call, call.inputs[2], x, r->bias, r->biasElem,
                              r->biasLen))
        return std::move(e);
    setOut(*r, call.outputs[0]);
    for (size_t k = 1; k < call.outputs.size(); ++k) {
      if (call.outputs[k].dtype != DType::F32)
        return fail(call, "Mean and InvStdDev must be f32");
      (k == 1 ? r->mean : r->invStd) = call.outputs[k].as<float>();
    }
    return Steps{*r};
  }
  case OpKind::LayerNormalizationGradData: { // dY, X, Scale
    auto r = layerNormRows(call, RowOp::LayerNormGradData, call.inputs[1]);
    if (!r)
      return r.takeError();
    r->aux = x.data;
    r->auxElem = *elemOf(x.dtype);
    if (auto e = rowOperand(call, call.inputs[2], call.inputs[1], r->scale,
                            r->scaleElem, r->scaleLen))
      return std::move(e);
    setOut(*r, call.outputs[0]);
    return Steps{*r};
  }
  case OpKind::LayerNormalizationGradParams: { // dY, X -> dScale
    auto r = layerNormRows(call, RowOp::LayerNormStats, call.inputs[1]);
    if (!r)
      return r.takeError();
    if (call.outputs[0].numElements() != r->len)
      return fail(call, "dScale must have the normalized dims' size");
    r->stats = doubles(scratch, 2 * r->rows);
    ColumnStep c;
    c.rows = r->rows;
    c.len = r->len;
    c.dy = x.data;
    c.dyElem = *elemOf(x.dtype);
    c.x = call.inputs[1].data;
    c.xElem = *elemOf(call.inputs[1].dtype);
    c.stats = r->stats;
    c.out = call.outputs[0].data;
    c.outElem = *elemOf(call.outputs[0].dtype);
    return Steps{*r, c};
  }
  case OpKind::SoftmaxCrossEntropyLoss: { // scores, labels[, weights]
    if (x.rank() < 2)
      return fail(call, "scores must have rank >= 2");
    RowStep r = rowsAlong(RowOp::CrossEntropy, x, 1);
    setLabels(r, call, call.inputs[1],
              call.inputs.size() > 2 && call.inputs[2].data ? &call.inputs[2]
                                                            : nullptr);
    r.stats = doubles(scratch, 2 * r.rows + 1);
    if (call.outputs.size() > 1)
      setOut(r, call.outputs[1]);
    LossStep l;
    const std::string &red = call.getString("reduction");
    l.kind = red == "none" ? LossKind::PerRow : LossKind::Total;
    l.mean = red == "mean";
    l.rows = r.rows;
    l.stats = r.stats;
    l.out = call.outputs[0].data;
    l.outElem = *elemOf(call.outputs[0].dtype);
    return Steps{r, l};
  }
  case OpKind::SoftmaxCrossEntropyLossGrad: { // dL, scores, labels[, weights]
    const TensorRef &scores = call.inputs[1];
    if (scores.rank() < 2)
      return fail(call, "scores must have rank >= 2");
    RowStep r = rowsAlong(RowOp::CrossEntropyGrad, scores, 1);
    setLabels(r, call, call.inputs[2],
              call.inputs.size() > 3 && call.inputs[3].data ? &call.inputs[3]
                                                            : nullptr);
    r.aux = x.data;
    r.auxElem = *elemOf(x.dtype);
    const std::string &red = call.getString("reduction");
    r.perRowGrad = red == "none";
    r.stats = doubles(scratch, 1);
    setOut(r, call.outputs[0]);
    LossStep l;
    l.kind = LossKind::Divisor;
    l.mean = red == "mean";
    l.rows = r.rows;
    l.stats = r.stats;
    l.labels = r.labels;
    l.labelElem = r.labelElem;
    l.weights = r.weights;
    l.weightElem = r.weightElem;
    l.hasIgnore = r.hasIgnore;
    l.ignoreIndex = r.ignoreIndex;
    l.classes = r.len;
    return Steps{l, r};
  }
  default:
    return fail(call, "not a row op");
  }
}

llvm::Expected<Steps> lowerGather(const KernelCall &call) {
  bool grad = call.op == OpKind::GatherGrad;
  const TensorRef &src = call.inputs[0], &idx = call.inputs[1],
                  &out = call.outputs[0];
  if (idx.dtype != DType::I64 && idx.dtype != DType::I32)
    return fail(call, "indices must be i64 or i32");
  const TensorRef &table = grad ? out : src; // the gathered-from shape
  auto axis = axisOf(call, call.getInt("axis"), table.rank());
  if (!axis)
    return axis.takeError();
  GatherStep g;
  g.data = src.data;
  g.elem = *elemOf(src.dtype);
  g.idx = idx.data;
  g.idxElem = *elemOf(idx.dtype);
  g.out = out.data;
  g.n = idx.numElements();
  g.dim = table.shape[*axis];
  for (int64_t d = 0; d < *axis; ++d)
    g.outer *= table.shape[d];
  for (size_t d = *axis + 1; d < table.rank(); ++d)
    g.inner *= table.shape[d];
  g.grad = grad;
  if (grad)
    return Steps{zero(out), g};
  return Steps{g};
}

llvm::Expected<Steps> lowerOptimizer(const KernelCall &call) {
  OptimizerStep o;
  o.adamw = call.op == OpKind::AdamW;
  const TensorRef &param = call.inputs[0], &lr = call.inputs[2];
  if (lr.numElements() != 1)
    return fail(call, "the learning rate must be one element");
  o.n = param.numElements();
  o.param = param.data;
  o.grad = call.inputs[1].data;
  o.elem = *elemOf(param.dtype);
  o.lr = lr.data;
  o.lrElem = *elemOf(lr.dtype);
  o.paramOut = call.outputs[0].data;
  o.gradScale = call.getFloat("grad_scale");
  o.weightDecay = call.getFloat("weight_decay");
  if (!o.adamw) {
    o.momentum = call.getFloat("momentum");
    o.nesterov = call.getInt("nesterov");
    if (call.inputs.size() > 3 && call.inputs[3].data) {
      o.m = call.inputs[3].data;
      o.mElem = *elemOf(call.inputs[3].dtype);
      if (call.outputs.size() < 2)
        return fail(call, "a velocity operand needs a velocity result");
      o.mOut = call.outputs[1].data;
    } else if (o.momentum != 0) {
      return fail(call, "momentum needs a velocity operand");
    }
    return Steps{o};
  }
  const TensorRef &step = call.inputs[3];
  if (step.numElements() != 1)
    return fail(call, "the step count must be one element");
  o.step = step.data;
  o.stepElem = *elemOf(step.dtype);
  o.m = call.inputs[4].data;
  o.mElem = *elemOf(call.inputs[4].dtype);
  o.v = call.inputs[5].data;
  o.vElem = *elemOf(call.inputs[5].dtype);
  o.mOut = call.outputs[1].data;
  o.vOut = call.outputs[2].data;
  o.beta1 = call.getFloat("beta1");
  o.beta2 = call.getFloat("beta2");
  o.epsilon = call.getFloat("epsilon");
  return Steps{o};
}

bool isRowOp(OpKind k) {
  return k == OpKind::Softmax || k == OpKind::SoftmaxGrad ||
         k == OpKind::LogSoftmax || k == OpKind::LogSoftmaxGrad ||
         k == OpKind::LayerNormalization ||
         k == OpKind::LayerNormalizationGradData ||
         k == OpKind::LayerNormalizationGradParams ||
         k == OpKind::SoftmaxCrossEntropyLoss ||
         k == OpKind::SoftmaxCrossEntropyLossGrad;
}

// ReduceSum / ReduceMean / ReduceMax over `axes` (empty: all), keepdims
// or not: the output's elements are the kept dims in order either way.
llvm::Expected<Steps> lowerReduce(const KernelCall &call) {
  const TensorRef &X = call.inputs[0], &Y = call.outputs[0];
  std::vector<bool> reduced(X.rank(), call.getInts("axes").empty());
  for (int64_t a : call.getInts("axes")) {
    auto axis = axisOf(call, a, X.rank());
    if (!axis)
      return axis.takeError();
    reduced[*axis] = true;
  }
  std::vector<int64_t> xs = stridesOf(X.shape), keptDims, keptStrides,
                       redDims, redStrides;
  for (size_t d = 0; d < X.rank(); ++d) {
    (reduced[d] ? redDims : keptDims).push_back(X.shape[d]);
    (reduced[d] ? redStrides : keptStrides).push_back(xs[d]);
  }
  ReduceStep r;
  r.kind = call.op == OpKind::ReduceMax    ? ReduceKind::Max
           : call.op == OpKind::ReduceMean ? ReduceKind::Mean
                                           : ReduceKind::Sum;
  r.in = X.data;
  r.inElem = *elemOf(X.dtype);
  r.out = Y.data;
  r.outElem = *elemOf(Y.dtype);
  r.outputs = Y.numElements();
  r.base = indexer(keptDims, keptStrides);
  r.reduced = indexer(redDims, redStrides);
  r.count = 1;
  for (int64_t d : redDims)
    r.count *= d;
  return Steps{r};
}

// --- convolution, pooling, batch normalization ---------------------------

// The call's one scratch request, `bytes` long (none for 0 bytes).
llvm::Expected<char *> scratchBlock(const KernelCall &call,
                                    const Scratch &scratch, size_t bytes) {
  if (bytes == 0)
    return nullptr;
  auto *p = static_cast<char *>(scratch(bytes));
  if (!p)
    return fail(call, llvm::formatv("no scratch memory for {0} bytes", bytes));
  return p;
}

// The windows from input `in` to output `out` ([N, C, spatial...] both)
// with kernel dims `kernel`, and the call's strides, pads and (for the ops
// that have them) dilations.
llvm::Expected<Window> windowOf(const KernelCall &call,
                                llvm::ArrayRef<int64_t> in,
                                llvm::ArrayRef<int64_t> out,
                                llvm::ArrayRef<int64_t> kernel,
                                bool hasDilations) {
  size_t sp = in.size() > 2 ? in.size() - 2 : 0;
  if (sp == 0 || out.size() != in.size() || kernel.size() != sp ||
      out[0] != in[0])
    return fail(call, llvm::formatv("input {0}, output {1} and kernel {2} do "
                                    "not fit together",
                                    ir::shapeStr(in), ir::shapeStr(out),
                                    ir::shapeStr(kernel)));
  const auto &strides = call.getInts("strides"), &pads = call.getInts("pads");
  std::vector<int64_t> dilations(sp, 1);
  if (hasDilations)
    dilations = call.getInts("dilations");
  if (strides.size() != sp || pads.size() != 2 * sp || dilations.size() != sp)
    return fail(call, llvm::formatv("{0} spatial dims need {0} strides, {1} "
                                    "pads and {0} dilations",
                                    sp, 2 * sp));
  Window w;
  w.rank = int(sp);
  for (size_t d = 0; d < sp; ++d) {
    if (strides[d] <= 0 || dilations[d] <= 0)
      return fail(call, "strides and dilations must be positive");
    w.in[d] = in[d + 2];
    w.out[d] = out[d + 2];
    w.kernel[d] = kernel[d];
    w.strides[d] = strides[d];
    w.padBegin[d] = pads[d];
    w.padEnd[d] = pads[sp + d];
    w.dilations[d] = dilations[d];
    w.inSize *= w.in[d];
    w.outSize *= w.out[d];
    w.kernelSize *= w.kernel[d];
  }
  return w;
}

// Conv of X [N, C, in...] by W [M, C / group, kernel...] into Y [N, M,
// out...]: the windows and the sizes of one (image, group) product, whose
// depth is rows = C / group * K (K kernel taps).
struct ConvDims {
  Window w;
  int64_t n, c, m, groups, cg, mg, rows;
};

llvm::Expected<ConvDims> convDims(const KernelCall &call, const TensorRef &x,
                                  const TensorRef &w, const TensorRef &y) {
  auto win = windowOf(call, x.shape, y.shape,
                      w.shape.drop_front(std::min<size_t>(2, w.rank())),
                      /*hasDilations=*/true);
  if (!win)
    return win.takeError();
  ConvDims d{*win, x.shape[0], x.shape[1], w.shape[0], call.getInt("group"),
             0, 0, 0};
  if (d.groups <= 0 || d.c % d.groups || d.m % d.groups ||
      w.shape[1] != d.c / d.groups || y.shape[1] != d.m)
    return fail(call, llvm::formatv("input {0}, weights {1} and output {2} do "
                                    "not fit group {3}",
                                    ir::shapeStr(x.shape),
                                    ir::shapeStr(w.shape),
                                    ir::shapeStr(y.shape), d.groups));
  d.cg = d.c / d.groups;
  d.mg = d.m / d.groups;
  d.rows = d.cg * win->kernelSize;
  return d;
}

Im2colStep im2col(const ConvDims &d, const TensorRef &x, void *cols,
                  int64_t imageStride, int64_t rowStride) {
  Im2colStep s;
  s.w = d.w;
  s.images = d.n;
  s.channels = d.c;
  s.imageStride = imageStride;
  s.rowStride = rowStride;
  s.in = x.data;
  s.inElem = *elemOf(x.dtype);
  s.out = cols;
  s.outElem = s.inElem;
  return s;
}

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
                                const Scratch &scratch) {
  Steps steps;
  if (call.op == OpKind::Conv) {
    const TensorRef &X = call.inputs[0], &W = call.inputs[1],
                    &Y = call.outputs[0];
    auto d = convDims(call, X, W, Y);
    if (!d)
      return d.takeError();
    if (X.dtype != W.dtype)
      return fail(call, "the image and the filter operands must have one "
                        "element type");
    int64_t p = d->w.outSize, perImage = d->c * d->w.kernelSize * p;
    auto cols = scratchBlock(call, scratch,
                             size_t(d->n * perImage) * ir::dtypeSize(X.dtype));
    if (!cols)
      return cols.takeError();
    bool bias = call.inputs.size() > 2 && call.inputs[2].data;
    if (bias) {
      const TensorRef &B = call.inputs[2];
      if (B.numElements() != d->m)
        return fail(call, llvm::formatv("bias {0} does not have {1} elements",
                                        ir::shapeStr(B.shape), d->m));
      MapArgs fill;
      fill.op = B.dtype == Y.dtype ? MapOp::Copy : MapOp::Cast;
      fill.n = Y.numElements();
      fill.in[0] = operand(B, indexer({d->n, d->m, p}, {0, 1, 0}));
      fill.out = Y.data;
      fill.outElem = *elemOf(Y.dtype);
      fill.outAt = contiguous({d->n, d->m, p});
      steps.push_back(fill);
    }
    steps.push_back(im2col(*d, X, *cols, perImage, p));
    TensorRef colsRef{X.dtype, {}, *cols};
    for (int64_t g = 0; g < d->groups; ++g) {
      GemmStep s = gemm(false, false, d->mg, p, d->rows,
                        at(W, g * d->mg * d->rows), d->rows,
                        at(colsRef, g * d->rows * p), p,
                        at(Y, g * d->mg * p).data, *elemOf(Y.dtype), p, 1.0f,
                        bias ? 1.0f : 0.0f);
      s.batch = d->n;
      s.strideB = perImage;
      s.strideC = d->m * p;
      steps.push_back(s);
    }
    return steps;
  }
  if (call.op == OpKind::ConvGradData) { // dY, W -> dX
    const TensorRef &dY = call.inputs[0], &W = call.inputs[1],
                    &dX = call.outputs[0];
    auto d = convDims(call, dX, W, dY);
    if (!d)
      return d.takeError();
    if (dY.dtype != W.dtype)
      return fail(call, "the gradient and the filter operands must have one "
                        "element type");
    int64_t p = d->w.outSize, perImage = d->c * d->w.kernelSize * p;
    auto cols = scratchBlock(call, scratch, size_t(d->n * perImage) * 4);
    if (!cols)
      return cols.takeError();
    float *col = reinterpret_cast<float *>(*cols);
    for (int64_t g = 0; g < d->groups; ++g) {
      GemmStep s = gemm(true, false, d->rows, p, d->mg,
                        at(W, g * d->mg * d->rows), d->rows,
                        at(dY, g * d->mg * p), p, col + g * d->rows * p,
                        Elem::F32, p);
      s.batch = d->n;
      s.strideB = d->m * p;
      s.strideC = perImage;
      steps.push_back(s);
    }
    Im2colStep c2i;
    c2i.adjoint = true;
    c2i.w = d->w;
    c2i.images = d->n;
    c2i.channels = d->c;
    c2i.imageStride = perImage;
    c2i.rowStride = p;
    c2i.in = col;
    c2i.inElem = Elem::F32;
    c2i.out = dX.data;
    c2i.outElem = *elemOf(dX.dtype);
    steps.push_back(c2i);
    return steps;
  }
  // ConvGradFilter: X, dY -> dW
  const TensorRef &X = call.inputs[0], &dY = call.inputs[1],
                  &dW = call.outputs[0];
  auto d = convDims(call, X, dW, dY);
  if (!d)
    return d.takeError();
  if (dY.dtype != X.dtype)
    return fail(call, "the image and the gradient operands must have one "
                      "element type");
  int64_t p = d->w.outSize, np = d->n * p;
  size_t size = ir::dtypeSize(X.dtype);
  size_t colBytes = (size_t(d->c * d->w.kernelSize * np) * size + 63) / 64 * 64;
  auto block =
      scratchBlock(call, scratch, colBytes + size_t(d->m * np) * size);
  if (!block)
    return block.takeError();
  TensorRef cols{X.dtype, {}, *block}, dYt{dY.dtype, {}, *block + colBytes};
  steps.push_back(im2col(*d, X, cols.data, p, np));
  steps.push_back(copy(dY, indexer({d->m, d->n, p}, {p, d->m * p, 1}),
                       dYt.data, contiguous({d->m, d->n, p}), d->m * np));
  GemmStep s = gemm(false, true, d->mg, d->rows, np, dYt, np, cols, np,
                    dW.data, *elemOf(dW.dtype), d->rows);
  s.batch = d->groups;
  s.strideA = d->mg * np;
  s.strideB = d->rows * np;
  s.strideC = d->mg * d->rows;
  steps.push_back(s);
  return steps;
}

bool isPool(OpKind k) {
  return k == OpKind::MaxPool || k == OpKind::AveragePool ||
         k == OpKind::MaxPoolGrad || k == OpKind::AveragePoolGrad ||
         k == OpKind::GlobalAveragePool;
}

// Pools and their gradients as pool steps (DeviceCode.h); GlobalAveragePool
// as a mean over each plane.
llvm::Expected<Steps> lowerPool(const KernelCall &call) {
  const TensorRef &out = call.outputs[0];
  if (call.op == OpKind::GlobalAveragePool) {
    const TensorRef &X = call.inputs[0];
    if (X.rank() < 2 || out.numElements() != X.shape[0] * X.shape[1])
      return fail(call, llvm::formatv("input {0} does not pool to {1}",
                                      ir::shapeStr(X.shape),
                                      ir::shapeStr(out.shape)));
    int64_t planes = X.shape[0] * X.shape[1], size = 1;
    for (size_t d = 2; d < X.rank(); ++d)
      size *= X.shape[d];
    if (size == 0) // as the CPU: the mean of nothing is 0
      return Steps{zero(out)};
    ReduceStep r;
    r.kind = ReduceKind::Mean;
    r.in = X.data;
    r.inElem = *elemOf(X.dtype);
    r.out = out.data;
    r.outElem = *elemOf(out.dtype);
    r.outputs = planes;
    r.base = indexer({planes}, {size});
    r.reduced = indexer({size}, {1});
    r.count = size;
    return Steps{r};
  }
  bool max = call.op == OpKind::MaxPool || call.op == OpKind::MaxPoolGrad;
  bool grad = call.op == OpKind::MaxPoolGrad ||
              call.op == OpKind::AveragePoolGrad;
  // The forward input (X; AveragePoolGrad has only its shape, dX's) and
  // the pooled tensor (Y or dY).
  const TensorRef &x = call.op == OpKind::MaxPoolGrad       ? call.inputs[1]
                       : call.op == OpKind::AveragePoolGrad ? out
                                                            : call.inputs[0];
  const TensorRef &pooled = grad ? call.inputs[0] : out;
  auto w = windowOf(call, x.shape, pooled.shape, call.getInts("kernel_shape"),
                    /*hasDilations=*/max);
  if (!w)
    return w.takeError();
  if (pooled.shape[1] != x.shape[1] || (grad && out.shape != x.shape))
    return fail(call, llvm::formatv("input {0}, pooled {1} and result {2} do "
                                    "not fit together",
                                    ir::shapeStr(x.shape),
                                    ir::shapeStr(pooled.shape),
                                    ir::shapeStr(out.shape)));
  PoolStep p;
  p.kind = call.op == OpKind::MaxPool       ? PoolKind::Max
           : call.op == OpKind::AveragePool ? PoolKind::Average
           : max                            ? PoolKind::MaxGrad
                                            : PoolKind::AverageGrad;
  p.w = *w;
  p.planes = x.shape[0] * x.shape[1];
  if (call.op != OpKind::AveragePoolGrad) {
    p.x = x.data;
    p.xElem = *elemOf(x.dtype);
  }
  if (grad) {
    p.dy = pooled.data;
    p.dyElem = *elemOf(pooled.dtype);
  }
  p.out = out.data;
  p.outElem = *elemOf(out.dtype);
  p.includePad = !max && call.getInt("count_include_pad");
  if (call.op == OpKind::MaxPool && call.outputs.size() > 1 &&
      call.outputs[1].data) {
    if (call.outputs[1].dtype != DType::I64)
      return fail(call, "Indices must be i64");
    p.indices = call.outputs[1].as<int64_t>();
  }
  return Steps{p};
}

bool isBatchNorm(OpKind k) {
  return k == OpKind::BatchNormalization ||
         k == OpKind::BatchNormalizationGradData ||
         k == OpKind::BatchNormalizationGradParams;
}

// BatchNormalization (X, scale, B, mean, var -> Y[, running mean, running
// var]), BatchNormalizationGradData (dY, X, scale, mean, var -> dX) and
// BatchNormalizationGradParams (dY, X, mean, var -> dscale): a channel step
// for each channel's statistics, then, but for GradParams, a channel map
// applying its coefficients (DeviceCode.h).
llvm::Expected<Steps> lowerBatchNorm(const KernelCall &call,
                                     const Scratch &scratch) {
  bool forward = call.op == OpKind::BatchNormalization;
  const TensorRef &X = forward ? call.inputs[0] : call.inputs[1];
  if (X.rank() < 2)
    return fail(call, "X " + ir::shapeStr(X.shape) + " has rank < 2");
  if (!forward && call.inputs[0].shape != X.shape)
    return fail(call, llvm::formatv("gradient {0} and X {1} differ",
                                    ir::shapeStr(call.inputs[0].shape),
                                    ir::shapeStr(X.shape)));
  ChannelStep s;
  s.images = X.shape[0];
  s.channels = X.shape[1];
  s.spatial = 1;
  for (size_t d = 2; d < X.rank(); ++d)
    s.spatial *= X.shape[d];
  s.x = X.data;
  s.xElem = *elemOf(X.dtype);
  s.training = call.getInt("training_mode");
  s.epsilon = call.getFloat("epsilon");
  // The per-channel operands: scale, bias, mean, var (null where absent).
  const auto &in = call.inputs;
  const TensorRef *scale = nullptr, *bias = nullptr, *mean, *var;
  switch (call.op) {
  case OpKind::BatchNormalization:
    s.op = ChannelOp::BatchNorm;
    s.momentum = call.getFloat("momentum");
    scale = &in[1];
    bias = &in[2];
    mean = &in[3];
    var = &in[4];
    break;
  case OpKind::BatchNormalizationGradData:
    s.op = ChannelOp::BatchNormGradData;
    scale = &in[2];
    mean = &in[3];
    var = &in[4];
    break;
  default: // BatchNormalizationGradParams
    s.op = ChannelOp::BatchNormGradParams;
    mean = &in[2];
    var = &in[3];
    break;
  }
  std::vector<const TensorRef *> perChannel = {mean, var};
  for (const TensorRef *t : {scale, bias})
    if (t)
      perChannel.push_back(t);
  if (s.op == ChannelOp::BatchNormGradParams ||
      (forward && call.outputs.size() == 3))
    for (size_t k = forward ? 1 : 0; k < call.outputs.size(); ++k)
      perChannel.push_back(&call.outputs[k]);
  for (const TensorRef *t : perChannel)
    if (t->numElements() != s.channels)
      return fail(call, llvm::formatv("per-channel operand {0} does not have "
                                      "{1} elements",
                                      ir::shapeStr(t->shape), s.channels));
  auto set = [](const TensorRef *t, const void *&data, Elem &elem) {
    if (t) {
      data = t->data;
      elem = *elemOf(t->dtype);
    }
  };
  set(scale, s.scale, s.scaleElem);
  set(bias, s.bias, s.biasElem);
  set(mean, s.mean, s.meanElem);
  set(var, s.var, s.varElem);
  if (!forward)
    set(&in[0], s.dy, s.dyElem);
  if (forward && call.outputs.size() == 3) {
    s.runMean = call.outputs[1].data;
    s.runMeanElem = *elemOf(call.outputs[1].dtype);
    s.runVar = call.outputs[2].data;
    s.runVarElem = *elemOf(call.outputs[2].dtype);
  }
  if (s.op == ChannelOp::BatchNormGradParams) {
    s.out = call.outputs[0].data;
    s.outElem = *elemOf(call.outputs[0].dtype);
    return Steps{s};
  }
  int64_t coefs = forward ? 2 : 4;
  auto coef = scratchBlock(call, scratch, size_t(coefs * s.channels) * 4);
  if (!coef)
    return coef.takeError();
  s.coef = reinterpret_cast<float *>(*coef);
  ChannelMapStep m;
  m.grad = !forward;
  m.elements = X.numElements();
  m.channels = s.channels;
  m.spatial = s.spatial;
  m.x = s.x;
  m.xElem = s.xElem;
  m.dy = s.dy;
  m.dyElem = s.dyElem;
  m.coef = s.coef;
  m.out = call.outputs[0].data;
  m.outElem = *elemOf(call.outputs[0].dtype);
  return Steps{s, m};
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

// A combined gradient op that split-backward leaves whole only where it is
// not split (MatMulGrad, ...): its two parts, and which of its inputs each
// takes (as the CPU backend's addSplitGradient).
struct GradientParts {
  OpKind first, second;
  std::vector<int> firstInputs, secondInputs;
};

std::optional<GradientParts> combinedParts(OpKind k) {
  switch (k) {
  case OpKind::MatMulGrad:
    return GradientParts{OpKind::MatMulGradA, OpKind::MatMulGradB, {0, 2}, {1, 0}};
  case OpKind::GemmGrad:
    return GradientParts{OpKind::GemmGradA, OpKind::GemmGradB, {0, 2}, {1, 0}};
  case OpKind::ConvGrad:
    return GradientParts{OpKind::ConvGradData, OpKind::ConvGradFilter, {0, 2},
                         {1, 0}};
  case OpKind::LayerNormalizationGrad:
    return GradientParts{OpKind::LayerNormalizationGradData,
                         OpKind::LayerNormalizationGradParams, {0, 1, 2},
                         {0, 1}};
  case OpKind::BatchNormalizationGrad:
    return GradientParts{OpKind::BatchNormalizationGradData,
                         OpKind::BatchNormalizationGradParams, {0, 1, 2, 3, 4},
                         {0, 1, 3, 4}};
  default:
    return std::nullopt;
  }
}

// The combined op as its two parts, each lowered on its inputs and output.
// Both parts' scratch comes from one block: the parts are lowered once to
// learn their requests, then again with pieces of the block.
llvm::Expected<Steps> lowerCombined(const KernelCall &call,
                                    const GradientParts &parts,
                                    const Scratch &scratch) {
  std::vector<TensorRef> ins[2];
  for (int i : parts.firstInputs)
    ins[0].push_back(call.inputs[i]);
  for (int i : parts.secondInputs)
    ins[1].push_back(call.inputs[i]);
  KernelCall sub[2] = {
      {parts.first, call.attrs, ins[0], call.outputs.slice(0, 1), call.seed},
      {parts.second, call.attrs, ins[1], call.outputs.slice(1, 1), call.seed}};
  auto aligned = [](size_t b) { return (b + 255) / 256 * 256; };
  size_t need[2] = {0, 0};
  for (int k = 0; k < 2; ++k) {
    auto measured = lowerCall(sub[k], [&, k](size_t bytes) {
      need[k] += aligned(bytes);
      return reinterpret_cast<void *>(uintptr_t(256)); // never read
    });
    if (!measured)
      return measured.takeError();
  }
  char *block = nullptr;
  if (need[0] + need[1]) {
    block = static_cast<char *>(scratch(need[0] + need[1]));
    if (!block)
      return fail(call, "no scratch memory");
  }
  Steps steps;
  size_t used = 0;
  for (int k = 0; k < 2; ++k) {
    auto part = lowerCall(sub[k], [&](size_t bytes) {
      void *p = block + used;
      used += aligned(bytes);
      return p;
    });
    if (!part)
      return part.takeError();
    steps.insert(steps.end(), part->begin(), part->end());
  }
  return steps;
}

} // namespace

CublasGemm cublasArgs(const GemmStep &s) {
  // Row-major C = op(A) op(B) is column-major C^T = op(B)^T op(A)^T, and a
  // row-major matrix read column-major is its transpose: cuBLAS multiplies
  // the step's B by its A, with the same transposes.
  return CublasGemm{s.transB,  s.transA,  s.n,       s.m,       s.k,
                    s.B,       s.A,       s.ldb,     s.lda,     s.ldc,
                    s.strideB, s.strideA, s.strideC};
}

bool lowers(OpKind op, DType dtype) {
  if (!elemOf(dtype))
    return false;
  if (isReshapeLike(op) || op == OpKind::Transpose || op == OpKind::Slice ||
      op == OpKind::Concat || op == OpKind::Split || op == OpKind::Expand ||
      op == OpKind::Cast || op == OpKind::Equal || op == OpKind::Gather ||
      op == OpKind::Pad)
    return true;
  if (op == OpKind::Where || op == OpKind::Not || op == OpKind::And ||
      op == OpKind::Or)
    return dtype == DType::Bool;
  // Integer arithmetic (intMap); integer products, divisions (the CPU
  // fails a whole Div on a zero divisor), powers and reductions are not
  // lowered.
  if (dtype == DType::I64 || dtype == DType::I32)
    return op == OpKind::Add || op == OpKind::Sub || op == OpKind::Mul ||
           op == OpKind::Neg || op == OpKind::Abs || op == OpKind::Relu ||
           op == OpKind::Max || op == OpKind::Min || op == OpKind::Clip ||
           op == OpKind::Less || op == OpKind::Greater;
  if (!isFloatElem(dtype))
    return false;
  if (op == OpKind::Clip || op == OpKind::LeakyRelu || op == OpKind::Max ||
      op == OpKind::Min || op == OpKind::Dropout || op == OpKind::DropoutGrad ||
      op == OpKind::LogSoftmax || op == OpKind::LogSoftmaxGrad ||
      combinedParts(op))
    return true;
  return unaryMap(op) || binaryMap(op) || op == OpKind::UnaryGrad ||
         op == OpKind::SliceGrad || op == OpKind::SumTo ||
         op == OpKind::MatMul || op == OpKind::MatMulGradA ||
         op == OpKind::MatMulGradB || op == OpKind::Gemm ||
         op == OpKind::GemmGradA || op == OpKind::GemmGradB || isRowOp(op) ||
         op == OpKind::GatherGrad || op == OpKind::SGD ||
         op == OpKind::AdamW || op == OpKind::ReduceSum ||
         op == OpKind::ReduceMean || op == OpKind::ReduceMax ||
         op == OpKind::Conv || op == OpKind::ConvGradData ||
         op == OpKind::ConvGradFilter || isPool(op) || isBatchNorm(op);
}

llvm::Expected<Steps> lowerCall(const KernelCall &call,
                                const Scratch &scratch) {
  DType dt = call.inputs.empty() ? DType::F32 : call.inputs[0].dtype;
  if (!lowers(call.op, dt))
    return fail(call, llvm::formatv("no CUDA kernel for {0} inputs",
                                    ir::dtypeName(dt)));
  for (const TensorRef &t : call.inputs)
    if (!elemOf(t.dtype) || t.rank() > size_t(kMaxRank))
      return fail(call, "an operand " + std::string(ir::dtypeName(t.dtype)) +
                            ir::shapeStr(t.shape) +
                            " (the CUDA kernels take rank <= 8 and f32, bf16, "
                            "i64, i32 or bool)");
  for (const TensorRef &t : call.outputs)
    if (!elemOf(t.dtype) || t.rank() > size_t(kMaxRank))
      return fail(call, "a result " + std::string(ir::dtypeName(t.dtype)) +
                            ir::shapeStr(t.shape) +
                            " (the CUDA kernels take rank <= 8 and f32, bf16, "
                            "i64, i32 or bool)");
  if (auto parts = combinedParts(call.op))
    return lowerCombined(call, *parts, scratch);
  if (isRowOp(call.op))
    return lowerRows(call, scratch);
  const TensorRef &y = call.outputs[0];
  switch (call.op) {
  case OpKind::Clip:
  case OpKind::LeakyRelu: {
    bool clip = call.op == OpKind::Clip;
    MapArgs m = mapOver(clip ? MapOp::Clip : MapOp::LeakyRelu, y,
                        {&call.inputs[0]});
    if (clip) {
      // Integer bounds saturate to the type's range, as the CPU's do.
      auto bound = [&](float v) {
        if (isFloatElem(y.dtype))
          return v;
        double lim = y.dtype == DType::I32 ? 2147483647.0 : 9.2e18;
        return float(std::max(-lim, std::min(lim, double(v))));
      };
      m.p0 = bound(call.getFloat("min"));
      m.p1 = bound(call.getFloat("max"));
    } else {
      m.p0 = call.getFloat("alpha");
    }
    return Steps{m};
  }
  case OpKind::Not:
    return Steps{mapOver(MapOp::Not, y, {&call.inputs[0]})};
  case OpKind::Max:
  case OpKind::Min: { // pairwise, left to right, into the output
    MapOp op = call.op == OpKind::Max ? MapOp::Max : MapOp::Min;
    if (call.inputs.size() == 1)
      return Steps{copy(call.inputs[0], contiguous(call.inputs[0].shape),
                        y.data, contiguous(y.shape), y.numElements())};
    Steps steps{mapOver(op, y, {&call.inputs[0], &call.inputs[1]})};
    for (size_t i = 2; i < call.inputs.size(); ++i)
      steps.push_back(mapOver(op, y, {&y, &call.inputs[i]}));
    return steps;
  }
  case OpKind::Dropout: {
    const TensorRef &x = call.inputs[0];
    double ratio = call.getFloat("ratio");
    bool mask = call.outputs.size() > 1 && call.outputs[1].data;
    if (!call.getInt("training_mode") || ratio == 0.0) {
      Steps steps{copy(x, contiguous(x.shape), y.data, contiguous(y.shape),
                       y.numElements())};
      if (mask) { // every element kept
        MapArgs ones = zero(call.outputs[1]);
        ones.op = MapOp::Fill;
        ones.p0 = 1.0f;
        steps.push_back(ones);
      }
      return steps;
    }
    MapArgs m = mapOver(MapOp::Dropout, y, {&x});
    m.key = splitmix64(call.seed);
    m.ratio = ratio;
    m.p0 = float(1.0 / (1.0 - ratio));
    Steps steps{m};
    if (mask) {
      MapArgs k = mapOver(MapOp::DropoutMask, call.outputs[1], {&x});
      k.key = m.key;
      k.ratio = ratio;
      steps.push_back(k);
    }
    return steps;
  }
  case OpKind::DropoutGrad: {
    const TensorRef &mask = call.inputs[1];
    if (mask.dtype != DType::Bool || mask.shape != call.inputs[0].shape)
      return fail(call, "the mask must be bool and shaped like the gradient");
    MapArgs m = mapOver(MapOp::DropoutGrad, y, {&call.inputs[0], &mask});
    m.p0 = float(1.0 / (1.0 - double(call.getFloat("ratio"))));
    return Steps{m};
  }
  case OpKind::Pad:
    return lowerPad(call);
  default:
    break;
  }
  if (auto u = unaryMap(call.op))
    return Steps{mapOver(*u, y, {&call.inputs[0]})};
  if (auto b = binaryMap(call.op))
    return Steps{mapOver(*b, y, {&call.inputs[0], &call.inputs[1]})};
  switch (call.op) {
  case OpKind::Cast:
    return Steps{mapOver(call.inputs[0].dtype == y.dtype ? MapOp::Copy
                                                         : MapOp::Cast,
                         y, {&call.inputs[0]})};
  case OpKind::Where:
    return Steps{mapOver(MapOp::Where, y,
                         {&call.inputs[0], &call.inputs[1], &call.inputs[2]})};
  case OpKind::UnaryGrad: {
    const std::string &fn = call.getString("fn");
    auto op = unaryGradMap(fn);
    if (!op)
      return fail(call, "unknown fn '" + fn + "'");
    MapArgs m = mapOver(*op, y, {&call.inputs[0], &call.inputs[1]});
    if (fn == "clip") {
      m.p0 = call.getFloat("min");
      m.p1 = call.getFloat("max");
    } else if (fn == "leaky_relu") {
      m.p0 = call.getFloat("alpha");
    }
    return Steps{m};
  }
  case OpKind::SumTo:
    return lowerSumTo(call);
  case OpKind::ReduceSum:
  case OpKind::ReduceMean:
  case OpKind::ReduceMax:
    return lowerReduce(call);
  case OpKind::Gather:
  case OpKind::GatherGrad:
    return lowerGather(call);
  case OpKind::SGD:
  case OpKind::AdamW:
    return lowerOptimizer(call);
  case OpKind::MatMul:
  case OpKind::MatMulGradA:
  case OpKind::MatMulGradB:
    return lowerMatMul(call);
  case OpKind::Gemm:
  case OpKind::GemmGradA:
  case OpKind::GemmGradB:
    return lowerGemm(call);
  case OpKind::Conv:
  case OpKind::ConvGradData:
  case OpKind::ConvGradFilter:
    return lowerConv(call, scratch);
  case OpKind::MaxPool:
  case OpKind::MaxPoolGrad:
  case OpKind::AveragePool:
  case OpKind::AveragePoolGrad:
  case OpKind::GlobalAveragePool:
    return lowerPool(call);
  case OpKind::BatchNormalization:
  case OpKind::BatchNormalizationGradData:
  case OpKind::BatchNormalizationGradParams:
    return lowerBatchNorm(call, scratch);
  default:
    return lowerDataMovement(call);
  }
}

// --- the host runner ---------------------------------------------------------

namespace {

void runGemm(const GemmStep &s) {
  for (int64_t b = 0; b < s.batch; ++b)
    for (int64_t i = 0; i < s.m; ++i)
      for (int64_t j = 0; j < s.n; ++j) {
        float acc = 0;
        for (int64_t p = 0; p < s.k; ++p) {
          int64_t ia = s.transA ? p * s.lda + i : i * s.lda + p;
          int64_t ib = s.transB ? j * s.ldb + p : p * s.ldb + j;
          acc += load(s.A, s.ab, b * s.strideA + ia) *
                 load(s.B, s.ab, b * s.strideB + ib);
        }
        int64_t ic = b * s.strideC + i * s.ldc + j;
        float c = s.beta != 0.0f ? s.beta * load(s.C, s.c, ic) : 0.0f;
        store(s.C, s.c, ic, s.alpha * acc + c);
      }
}

void runReduce(const ReduceStep &r) {
  for (int64_t o = 0; o < r.outputs; ++o)
    reduceElement(r.kind, r.in, r.inElem, r.base(o), r.reduced, r.count,
                  r.out, r.outElem, o);
}

} // namespace

void runStepsOnHost(const std::vector<DeviceStep> &steps) {
  for (const DeviceStep &step : steps) {
    if (auto *m = std::get_if<MapArgs>(&step)) {
      for (int64_t i = 0; i < m->n; ++i)
        mapElement(*m, i);
    } else if (auto *g = std::get_if<GemmStep>(&step)) {
      runGemm(*g);
    } else if (auto *r = std::get_if<ReduceStep>(&step)) {
      runReduce(*r);
    } else if (auto *row = std::get_if<RowStep>(&step)) {
      for (int64_t i = 0; i < row->rows; ++i)
        rowElement(HostLanes{}, *row, i);
    } else if (auto *c = std::get_if<ColumnStep>(&step)) {
      for (int64_t j = 0; j < c->len; ++j)
        columnElement(*c, j);
    } else if (auto *l = std::get_if<LossStep>(&step)) {
      lossStep(*l);
    } else if (auto *g = std::get_if<GatherStep>(&step)) {
      if (g->grad)
        for (int64_t col = 0; col < g->outer * g->inner; ++col)
          gatherGradColumn(*g, col);
      else
        for (int64_t i = 0; i < g->outer * g->n * g->inner; ++i)
          gatherElement(*g, i);
    } else if (auto *o = std::get_if<OptimizerStep>(&step)) {
      for (int64_t i = 0; i < o->n; ++i)
        optimizerElement(*o, i);
    } else if (auto *pad = std::get_if<PadStep>(&step)) {
      for (int64_t i = 0; i < pad->n; ++i)
        padElement(*pad, i);
    } else if (auto *cols = std::get_if<Im2colStep>(&step)) {
      for (int64_t i = 0; i < im2colCount(*cols); ++i)
        im2colElement(*cols, i);
    } else if (auto *pool = std::get_if<PoolStep>(&step)) {
      for (int64_t i = 0; i < poolCount(*pool); ++i)
        poolElement(*pool, i);
    } else if (auto *ch = std::get_if<ChannelStep>(&step)) {
      for (int64_t i = 0; i < ch->channels; ++i)
        channelElement(HostLanes{}, *ch, i);
    } else if (auto *cm = std::get_if<ChannelMapStep>(&step)) {
      for (int64_t i = 0; i < cm->elements; ++i)
        channelMapElement(*cm, i);
    }
  }
}

// --- the emulated backend ------------------------------------------------------

namespace {

class EmulatedBackend final : public Backend {
public:
  std::string_view name() const override { return "cuda-emulated"; }
  void *allocate(size_t bytes) override {
    return std::aligned_alloc(64, (std::max<size_t>(bytes, 1) + 63) / 64 * 64);
  }
  void release(void *p) override { std::free(p); }
  void copyToDevice(void *dst, const void *src, size_t n) override {
    if (n)
      std::memcpy(dst, src, n);
  }
  void copyToHost(void *dst, const void *src, size_t n) override {
    if (n)
      std::memcpy(dst, src, n);
  }
  bool supports(OpKind op, DType dtype) const override {
    return lowers(op, dtype);
  }
  llvm::Error run(const KernelCall &call) override {
    auto steps = lowerCall(call, [this](size_t bytes) {
      if (scratch_.size() < bytes)
        scratch_.resize(bytes);
      return static_cast<void *>(scratch_.data());
    });
    if (!steps)
      return steps.takeError();
    runStepsOnHost(*steps);
    return llvm::Error::success();
  }

private:
  std::vector<uint8_t> scratch_;
};

} // namespace

std::unique_ptr<Backend> createCudaEmulatedBackend() {
  return std::make_unique<EmulatedBackend>();
}

} // namespace cleave::runtime::cuda
