// recognize-attention: scaled dot-product attention as the exporters spell
// it (PyTorch's dynamo exporter lowers scaled_dot_product_attention to
// these ops, the TorchScript exporter and hand-written attention give the
// same tree, and opset 23's Attention expands to it at import):
//
//   S = MatMul(Q * c1, Kt * c2)        Kt = K transposed, c1 c2 optional
//   S = S * c3  or  S / c3             optional
//   S = S + mask                       optional, either operand order, or
//   S = Where(hide, fill, S)           masked_fill(hide, -inf) (nanoGPT's),
//   S = Where(keep, S, fill)           fill -inf or the lowest float
//   P = Softmax(S, axis -1)
//   P = Where(IsNaN(P), 0, P)          optional (SDPA's safe softmax), or
//   P = Where(ReduceMax(mask) == -inf, 0, P)    (opset 23 Attention's)
//   O = MatMul(P, V)
//
// becomes one FusedAttention(Q, K, V[, mask]) {scale = c1 c2 c3}, whose
// kernels never hold the scores (docs/design/fused-attention.md). A mask
// that hides keys as -inf and leaves the rest as they are (masked_fill
// with -inf, an additive Where(c, 0, -inf)) becomes the boolean mask it
// applies, c or Not(c), one byte a score instead of a float. A masked_fill
// with a finite fill (at or below the lowest f32) becomes the additive
// mask that equals it, Where(hide, fill, 0): a score plus the fill rounds
// to the fill, so every row's softmax, a row that sees no key included, is
// the same. K and V
// repeated for grouped-query heads (Unsqueeze, Expand, Reshape) are read
// unrepeated. K is
// found under Kt when Kt is a Transpose of the last two axes, or the
// dynamo exporter's Reshape-Transpose-Reshape of them; otherwise a
// Transpose of Kt is inserted. Where Q, K and V come from the projections'
// [B, T, H, D] by Transposes and O goes back by one, the fused op reads
// and writes that layout (seq_major); where they come from the
// sequence-first [T, B, H, D] (nn.MultiheadAttention) and O goes back to
// it, that one (time_major).
//
// Left unfused, so that training stays exact: scores, probabilities or
// their intermediates used anywhere else (a model returning its attention
// weights), dropout on P (nothing sits between Softmax and the MatMul but
// the safe-softmax Where), a mask that depends on a parameter (a learned
// bias: the fused op has no gradient for it), operands not of rank 4 or
// not one element type among f32, f64 and bf16, V's head size unlike
// Q's, a head size above the kernels' bound.
#include "passes/Pass.h"
#include "passes/ScalarConstant.h"

#include "ir/OpInfo.h"
#include "ir/TypeRules.h"

#include "llvm/ADT/DenseMap.h"
#include "llvm/ADT/DenseSet.h"
#include "llvm/ADT/SmallVector.h"

#include <cmath>
#include <limits>
#include <map>
#include <tuple>
#include <optional>

namespace cleave::passes {
namespace {

using ir::Op;
using ir::OpKind;
using ir::Value;

constexpr int64_t kMaxFusedHeadDim = 256; // the kernels' per-row arrays

struct AttentionMatch {
  Value *q = nullptr, *kt = nullptr, *k = nullptr, *v = nullptr;
  Value *mask = nullptr;
  // masked_fill: the boolean condition, the fill, and whether true hides
  // (Where(hide, fill, S)) or keeps (Where(keep, S, fill)); `mask` is null.
  Value *fillCond = nullptr;
  double fill = 0;
  bool hideWhereTrue = true;
  // A mask that only hides keys as -inf does, as its boolean condition:
  // masked_fill with -inf, or an additive Where(c, 0, -inf) /
  // Where(c, -inf, 0). The fused op reads the condition (true: seen) and
  // the f32 mask is never made.
  Value *keepCond = nullptr;
  bool keepWhereTrue = true;
  double scale = 1;
};

// An additive mask Where(c, 0, -inf) or Where(c, -inf, 0), with c boolean
// and both branches scalar constants: c, and whether true keeps the key.
// Adding -inf hides a key and adding 0 leaves a finite score's bits as
// they were, so the boolean mask gives the same scores.
std::optional<std::pair<Value *, bool>> infinityMaskCondition(Value *mask) {
  Op *def = mask->definingOp();
  if (!def || def->kind() != OpKind::Where ||
      def->operand(0)->type().dtype != ir::DType::Bool)
    return std::nullopt;
  auto a = scalarConstant(def->operand(1)), b = scalarConstant(def->operand(2));
  if (!a || !b)
    return std::nullopt;
  if (*a == 0 && *b == -INFINITY)
    return std::make_pair(def->operand(0), true);
  if (*a == -INFINITY && *b == 0)
    return std::make_pair(def->operand(0), false);
  return std::nullopt;
}


// `v` = x * c, c * x or x / c with c a scalar constant: x, and the factor
// folded into `scale`. Otherwise `v` itself. With `single`, x * c must be
// `v`'s only use (the score chain); the operands' scalings may be shared.
Value *unscale(const ir::Graph &g, Value *v, double &scale, bool single) {
  Op *def = v->definingOp();
  if (!def || (single && (v->uses().size() != 1 || g.isPinned(v))))
    return v;
  if (def->kind() == OpKind::Mul)
    for (int side = 0; side < 2; ++side)
      if (auto c = scalarConstant(def->operand(side))) {
        scale *= *c;
        return def->operand(1 - side);
      }
  if (def->kind() == OpKind::Div)
    if (auto c = scalarConstant(def->operand(1)); c && *c != 0) {
      scale /= *c;
      return def->operand(0);
    }
  return v;
}

// Whether a masked_fill with `fill` hides a key as an additive -inf does:
// -inf itself, or a fill at or below the lowest f32 (torch.finfo.min),
// which absorbs any score added to it (any below 1e30 in magnitude), so
// Where(hide, fill, S) equals S + Where(hide, fill, 0) bit for bit, a row
// that sees no key included.
bool hidesLikeInfinity(double fill) {
  return fill <= -double(std::numeric_limits<float>::max());
}

bool isPerm(const Op *op, std::initializer_list<int64_t> perm) {
  return op && op->kind() == OpKind::Transpose &&
         op->getInts("perm") == std::vector<int64_t>(perm);
}

// Q, K or V [B, H, T, D] had in the projections' [B, T, H, D], which the
// fused op then reads in place (seq_major). `x` is a Transpose {perm = [0,
// 2, 1, 3]} of such a value (`view(B, T, H, D).transpose(1, 2)`), or is
// made from such Transposes by a cone of ops that treat the heads and the
// time axis alike: elementwise Neg, Add, Sub, Mul, Div, Slice and Concat,
// and Unsqueeze and Reshape of the axes after [B, H, T] (rotary
// embeddings: x * cos + rotate_half(x) * sin, rotate_half slicing and
// concatenating the last axis, or in the interleaved form stacking the
// even and odd lanes on a new last axis and flattening it). The cone is
// then made again on the [B, T, H, D] values with those two axes swapped
// (a Slice's or Concat's axis too), and an elementwise operand that is not
// in it (cos, sin) is swapped by a Reshape, which it must allow: a size-1
// head or time axis. Every value the cone makes is read only inside it (x only once),
// so the [B, H, T, D] cone and its Transposes die; the elementwise results
// are the same bits in either layout.
class SeqMajorCone {
public:
  explicit SeqMajorCone(ir::Graph &g) : g_(g) {}

  // Whether `x` can be had in [B, T, H, D] without a Transpose.
  bool reaches(Value *x) {
    if (x->type().rank() != 4)
      return false;
    if (isLeaf(x->definingOp()))
      return true;
    if (x->uses().size() != 1 || g_.isPinned(x))
      return false;
    llvm::DenseSet<const Op *> cone;
    if (!collect(x, cone))
      return false;
    for (const Op *op : cone) {
      if (isLeaf(op) || op->result() == x)
        continue;
      if (g_.isPinned(op->result()))
        return false;
      for (const ir::Use &use : op->result()->uses())
        if (!cone.count(use.user))
          return false;
    }
    cone_.insert(cone.begin(), cone.end());
    return true;
  }

  // `x` (one `reaches` accepted) in [B, T, H, D]; new ops go before `before`.
  Value *make(Op *before, Value *x) {
    Op *def = x->definingOp();
    if (isLeaf(def))
      return def->operand(0);
    if (Value *done = made_.lookup(x))
      return done;
    std::vector<Value *> operands;
    for (Value *o : def->operands())
      operands.push_back(o->definingOp() && cone_.count(o->definingOp())
                             ? make(before, o)
                             : swappedView(before, o, x->type().rank()));
    ir::AttrMap attrs = def->attrs();
    const int64_t rank = int64_t(x->type().rank());
    ir::TensorType t = x->type();
    std::swap(t.shape[1], t.shape[2]);
    if (def->kind() == OpKind::Slice) {
      std::vector<int64_t> axes = def->getInts("axes");
      for (int64_t &a : axes)
        a = swapped(a, rank);
      attrs.insert_or_assign("axes", ir::Attribute(axes));
    } else if (def->kind() == OpKind::Concat) {
      attrs.insert_or_assign("axis",
                             ir::Attribute(swapped(def->getInt("axis"), rank)));
    } else if (def->kind() == OpKind::Reshape) {
      attrs.insert_or_assign(
          "shape", ir::Attribute(std::vector<int64_t>(t.shape.begin(),
                                                      t.shape.end())));
    }
    Value *out = g_.insertOpBefore(before, def->kind(), operands, {t},
                                   {g_.uniqueName(x->name() + ".bthd")},
                                   std::move(attrs), def->loc())
                     ->result();
    made_[x] = out;
    return out;
  }

private:
  static bool isLeaf(const Op *op) { return isPerm(op, {0, 2, 1, 3}); }
  static bool elementwise(OpKind k) {
    return k == OpKind::Neg || k == OpKind::Add || k == OpKind::Sub ||
           k == OpKind::Mul || k == OpKind::Div;
  }
  // An axis of a rank `rank` value with the heads and time swapped.
  static int64_t swapped(int64_t axis, int64_t rank) {
    int64_t a = axis < 0 ? axis + rank : axis;
    return a == 1 ? 2 : a == 2 ? 1 : a;
  }
  // An operand's shape as broadcasting aligns it to rank `rank`.
  static std::vector<int64_t> aligned(const ir::TensorType &t, size_t rank) {
    std::vector<int64_t> s(rank - std::min(rank, t.rank()), 1);
    s.insert(s.end(), t.shape.begin(), t.shape.end());
    return s;
  }
  static bool swapsAsView(const ir::TensorType &t, size_t rank) {
    if (t.rank() > rank || t.numElements() < 0)
      return false;
    std::vector<int64_t> s = aligned(t, rank);
    return s[1] == 1 || s[2] == 1;
  }
  // Ops that leave the first three axes ([B, H, T]) alone: an Unsqueeze
  // after them, a Reshape of the axes after them (the interleaved rotary
  // embeddings stack two halves on a new last axis and flatten it).
  static bool keepsLeadingAxes(const Op *op) {
    const ir::TensorType &in = op->operand(0)->type(),
                         &out = op->result()->type();
    if (op->kind() == OpKind::Unsqueeze) {
      for (int64_t a : op->getInts("axes"))
        if ((a < 0 ? a + int64_t(out.rank()) : a) < 3)
          return false;
      return true;
    }
    return op->kind() == OpKind::Reshape && in.rank() >= 4 &&
           std::equal(in.shape.begin(), in.shape.begin() + 3,
                      out.shape.begin());
  }
  bool collect(Value *x, llvm::DenseSet<const Op *> &cone) {
    Op *def = x->definingOp();
    if (!def || x->type().rank() < 4 || def->numResults() != 1)
      return false;
    if (isLeaf(def) || cone.count(def)) {
      cone.insert(def);
      return true;
    }
    OpKind k = def->kind();
    if (!elementwise(k) && k != OpKind::Slice && k != OpKind::Concat &&
        !keepsLeadingAxes(def))
      return false;
    bool reached = false;
    for (Value *o : def->operands()) {
      llvm::DenseSet<const Op *> grown = cone;
      // (An elementwise operand of lower rank than the result would be
      // broadcast under a new leading axis, which moves [B, H, T] off
      // axes 0 to 2.)
      if ((!elementwise(k) || o->type().rank() == x->type().rank()) &&
          collect(o, grown)) {
        cone = std::move(grown);
        reached = true;
      } else if (!elementwise(k) ||
                 !swapsAsView(o->type(), x->type().rank())) {
        return false;
      }
    }
    if (reached)
      cone.insert(def);
    return reached;
  }
  // An elementwise operand outside the cone, viewed with the heads and
  // time swapped (one of them has size 1).
  Value *swappedView(Op *before, Value *o, size_t rank) {
    Value *&view = views_[{o, rank}];
    if (view)
      return view;
    std::vector<int64_t> s = aligned(o->type(), rank);
    std::swap(s[1], s[2]);
    view =
        g_.insertOpBefore(before, OpKind::Reshape, {o},
                          {ir::TensorType(o->type().dtype,
                                          ir::Shape(s.begin(), s.end()))},
                          {g_.uniqueName(o->name() + ".bthd")},
                          {{"shape", s}}, before->loc())
            ->result();
    return view;
  }

  ir::Graph &g_;
  llvm::DenseSet<const Op *> cone_;
  llvm::DenseMap<Value *, Value *> made_;
  std::map<std::pair<Value *, size_t>, Value *> views_;
};

// The one reader of the attention's output `o` when it is the Transpose
// `perm` out of [B, H, T, D] ({0, 2, 1, 3} back to [B, T, H, D], the
// `.transpose(1, 2)` before the heads are merged; {2, 0, 1, 3} to
// nn.MultiheadAttention's sequence-first [T, B, H, D]), so the fused op can
// write that layout itself.
Op *layoutOutput(const ir::Graph &g, Value *o,
                 std::initializer_list<int64_t> perm) {
  if (o->uses().size() != 1 || g.isPinned(o))
    return nullptr;
  Op *user = o->uses().front().user;
  return isPerm(user, perm) && !g.isPinned(user->result()) ? user : nullptr;
}

// `x` [B, H, T, D] as nn.MultiheadAttention moves its heads forward from
// the sequence-first [T, B, H*D]: Reshape(Transpose {perm = [1, 0, 2]} of z
// [T, B*H, D]) (`q.view(T, B*H, D).transpose(0, 1)`, then the heads split
// off the batch), or one Transpose {perm = [1, 2, 0, 3]} of a [T, B, H, D]
// value. That value, or z, whose bytes are already [T, B, H, D]; null
// otherwise.
Value *timeMajorSource(Value *x) {
  Op *def = x->definingOp();
  if (isPerm(def, {1, 2, 0, 3}))
    return def->operand(0);
  if (!def || def->kind() != OpKind::Reshape)
    return nullptr;
  Op *t = def->operand(0)->definingOp();
  if (!isPerm(t, {1, 0, 2}))
    return nullptr;
  const ir::TensorType &z = t->operand(0)->type(), &xt = x->type();
  if (z.rank() != 3 || xt.rank() != 4 ||
      xt.shape[0] * xt.shape[1] != z.shape[1] || xt.shape[2] != z.shape[0] ||
      xt.shape[3] != z.shape[2])
    return nullptr;
  return t->operand(0);
}

// The fused op's [T, B, H, D] operand for x from its timeMajorSource: the
// source itself, or z viewed as [T, B, H, D] (a Reshape, which moves no
// bytes).
Value *timeMajorOperand(ir::Graph &g, Op *before, Value *x, Value *source) {
  if (source->type().rank() == 4)
    return source;
  const ir::TensorType &xt = x->type();
  std::vector<int64_t> shape{xt.shape[2], xt.shape[0], xt.shape[1],
                             xt.shape[3]};
  return g
      .insertOpBefore(before, OpKind::Reshape, {source},
                      {ir::TensorType(xt.dtype, ir::Shape(shape.begin(),
                                                          shape.end()))},
                      {g.uniqueName(x->name() + ".tbhd")}, {{"shape", shape}},
                      before->loc())
      ->result();
}

// K [B, H, T, D] under Kt [B, H, D, T], when Kt only moves its last two
// axes: Transpose(K) {perm = [0, 1, 3, 2]}, or Reshape(Transpose(
// Reshape(K) to [B*H, T, D]) {perm = [0, 2, 1]}) back to rank 4. Null if
// Kt is anything else.
Value *transposedFrom(Value *kt) {
  Op *def = kt->definingOp();
  if (isPerm(def, {0, 1, 3, 2}))
    return def->operand(0);
  if (!def || def->kind() != OpKind::Reshape)
    return nullptr;
  Op *t = def->operand(0)->definingOp();
  if (!isPerm(t, {0, 2, 1}))
    return nullptr;
  Op *flat = t->operand(0)->definingOp();
  if (!flat || flat->kind() != OpKind::Reshape)
    return nullptr;
  Value *k = flat->operand(0);
  const ir::Shape &ks = k->type().shape, &kts = kt->type().shape;
  if (ks.size() != 4 || kts.size() != 4 || ks[0] != kts[0] ||
      ks[1] != kts[1] || ks[2] != kts[3] || ks[3] != kts[2] ||
      flat->result()->type().shape !=
          ir::Shape{ks[0] * ks[1], ks[2], ks[3]})
    return nullptr;
  return k;
}

// The kv heads under a grouped-query repeat: x [B, H * g, T, D] made as
// Reshape(Expand(Unsqueeze(y) {axes = [2]}) to [B, H, g, T, D]) from y
// [B, H, T, D] (transformers' repeat_kv, opset 23 Attention's body): query
// head h reads kv head h / g, as the fused op does. Null otherwise.
Value *unrepeated(Value *x) {
  Op *reshape = x->definingOp();
  if (!reshape || reshape->kind() != OpKind::Reshape)
    return nullptr;
  Op *expand = reshape->operand(0)->definingOp();
  if (!expand || expand->kind() != OpKind::Expand)
    return nullptr;
  Op *unsqueeze = expand->operand(0)->definingOp();
  if (!unsqueeze || unsqueeze->kind() != OpKind::Unsqueeze ||
      unsqueeze->getInts("axes") != std::vector<int64_t>{2})
    return nullptr;
  Value *y = unsqueeze->operand(0);
  const ir::Shape &ys = y->type().shape, &xs = x->type().shape,
                  &es = expand->result()->type().shape;
  if (ys.size() != 4 || xs.size() != 4 || es.size() != 5 || es[0] != ys[0] ||
      es[1] != ys[1] || es[3] != ys[2] || es[4] != ys[3] ||
      xs != ir::Shape{ys[0], ys[1] * es[2], ys[2], ys[3]})
    return nullptr;
  return y;
}

// Whether `v` is computed from a parameter (a trainable tensor).
bool dependsOnParam(Value *v, llvm::DenseSet<const Value *> &seen) {
  if (!seen.insert(v).second)
    return false;
  if (v->kind() == ir::ValueKind::Param)
    return true;
  if (Op *def = v->definingOp())
    for (Value *operand : def->operands())
      if (dependsOnParam(operand, seen))
        return true;
  return false;
}

bool fusable(const ir::TensorType &t) {
  return t.rank() == 4 && (t.dtype == ir::DType::F32 ||
                           t.dtype == ir::DType::F64 ||
                           t.dtype == ir::DType::BF16);
}

// The Softmax under `p`, the value O = MatMul(p, V) reads: directly, or
// through a safe softmax that zeroes the rows that see no key, as the fused
// kernels do: Where(IsNaN(P), 0, P) (the dynamo exporter's), or Where(
// ReduceMax(mask, last axis) == -inf, 0, P) (opset 23 Attention's body,
// whose `mask` must then be the mask added to the scores: `rowMaskOf`).
Op *softmaxUnder(const ir::Graph &g, Value *p, Value *&rowMaskOf) {
  rowMaskOf = nullptr;
  if (Op *sm = interior(g, p, OpKind::Softmax))
    return sm;
  Op *where = interior(g, p, OpKind::Where);
  if (!where)
    return nullptr;
  Value *probs = where->operand(2), *cond = where->operand(0);
  auto zero = scalarConstant(where->operand(1));
  Op *test = cond->definingOp();
  if (!zero || *zero != 0 || !test || g.isPinned(probs))
    return nullptr;
  Op *sm = probs->definingOp();
  if (!sm || sm->kind() != OpKind::Softmax)
    return nullptr;
  if (test->kind() == OpKind::IsNaN) {
    if (test->operand(0) != probs || cond->uses().size() != 1 ||
        probs->uses().size() != 2 || g.isPinned(cond))
      return nullptr;
    return sm;
  }
  if (test->kind() != OpKind::Equal || probs->uses().size() != 1)
    return nullptr;
  for (int side = 0; side < 2; ++side) {
    auto inf = scalarConstant(test->operand(1 - side));
    Op *max = test->operand(side)->definingOp();
    if (!inf || *inf != -INFINITY || !max || max->kind() != OpKind::ReduceMax)
      continue;
    int64_t rank = int64_t(max->operand(0)->type().rank());
    const std::vector<int64_t> &axes = max->getInts("axes");
    if (max->getInt("keepdims") != 1 || axes.size() != 1 ||
        (axes[0] != -1 && axes[0] != rank - 1))
      continue;
    rowMaskOf = max->operand(0);
    return sm;
  }
  return nullptr;
}

std::optional<AttentionMatch> matchAttention(const ir::Graph &g, Op *root) {
  AttentionMatch m;
  m.v = root->operand(1);
  Value *rowMaskOf = nullptr;
  Op *softmax = softmaxUnder(g, root->operand(0), rowMaskOf);
  if (!softmax)
    return std::nullopt;
  Value *s = softmax->operand(0);
  int64_t rank = int64_t(s->type().rank()), axis = softmax->getInt("axis");
  if (rank != 4 || (axis != -1 && axis != 3))
    return std::nullopt;
  // The score product under `x`, through its optional scaling.
  auto scoresUnder = [&](Value *x, double &scale) -> Op * {
    return interior(g, unscale(g, x, scale, /*single=*/true), OpKind::MatMul);
  };
  Op *scores = nullptr;
  if (Op *add = interior(g, s, OpKind::Add)) {
    // The mask: one operand of the Add, the other the score chain (tried
    // in both orders: a mask that is itself scaled reads like scores).
    for (int side = 0; side < 2 && !scores; ++side) {
      double scale = 1;
      if ((scores = scoresUnder(add->operand(side), scale))) {
        m.mask = add->operand(1 - side);
        m.scale = scale;
        s = add->operand(side);
      }
    }
  } else if (Op *where = interior(g, s, OpKind::Where)) {
    // masked_fill: the fill must hide a key as -inf does.
    for (int side = 1; side <= 2 && !scores; ++side) {
      auto fill = scalarConstant(where->operand(side));
      double scale = 1;
      if (!fill || !hidesLikeInfinity(*fill) ||
          where->operand(0)->type().dtype != ir::DType::Bool)
        continue;
      if ((scores = scoresUnder(where->operand(3 - side), scale))) {
        m.fillCond = where->operand(0);
        m.fill = *fill;
        m.hideWhereTrue = side == 1;
        m.scale = scale;
        s = where->operand(3 - side);
      }
    }
  } else {
    scores = scoresUnder(s, m.scale);
  }
  if (!scores)
    return std::nullopt;
  // The safe softmax's test must read the very mask that hides the keys.
  if (rowMaskOf && rowMaskOf != m.mask)
    return std::nullopt;
  if (m.fillCond && m.fill == -INFINITY) {
    m.keepCond = m.fillCond;
    m.keepWhereTrue = !m.hideWhereTrue;
  } else if (m.mask) {
    if (auto c = infinityMaskCondition(m.mask)) {
      m.keepCond = c->first;
      m.keepWhereTrue = c->second;
    }
  }
  s = scores->result();
  m.q = unscale(g, scores->operand(0), m.scale, false);
  m.kt = unscale(g, scores->operand(1), m.scale, false);
  m.k = transposedFrom(m.kt);

  const ir::TensorType &qt = m.q->type(), &vt = m.v->type(),
                       &ktt = m.kt->type();
  if (!fusable(qt) || ktt.dtype != qt.dtype || vt.dtype != qt.dtype ||
      ktt.rank() != 4 || vt.rank() != 4)
    return std::nullopt;
  // [B, Hq, Tq, D] x [B, H, D, Tk] and V [B, H, Tk, D]: no broadcasting of
  // the batch or heads (a repeated kv head arrives already expanded).
  if (ktt.shape[0] != qt.shape[0] || ktt.shape[1] != qt.shape[1] ||
      ktt.shape[2] != qt.shape[3] || vt.shape[0] != qt.shape[0] ||
      vt.shape[1] != qt.shape[1] || vt.shape[2] != ktt.shape[3] ||
      vt.shape[3] != qt.shape[3] || qt.shape[3] > kMaxFusedHeadDim ||
      qt.shape[3] < 1)
    return std::nullopt;
  // Grouped-query attention: K and V read with their kv heads, not
  // repeated (the kernels map query heads onto them).
  if (m.k) {
    Value *k = unrepeated(m.k), *v = unrepeated(m.v);
    if (k && v && k->type() == v->type()) {
      m.k = k;
      m.v = v;
    }
  }
  if (Value *mask = m.mask ? m.mask : m.fillCond) {
    llvm::DenseSet<const Value *> seen;
    ir::Shape scoreShape = s->type().shape;
    auto b = ir::broadcastShapes(mask->type().shape, scoreShape);
    bool fits = b && *b == scoreShape;
    if (!b)
      llvm::consumeError(b.takeError());
    if ((m.mask && !fusable(ir::TensorType(mask->type().dtype, {1, 1, 1, 1}))) ||
        !fits || dependsOnParam(mask, seen))
      return std::nullopt;
  }
  return m;
}

// Whether `v` is a constant mask that is the causal rule of Tq x Tk scores
// exactly: key j kept (true, or an additive 0) iff j <= i, hidden (false,
// -inf) otherwise, the same for every leading index (those dims 1).
// transformers builds its causal mask from constants: it folds to one.
bool isCausalConstant(const Value *v, int64_t tq, int64_t tk) {
  const ir::TensorType &t = v->type();
  if (v->kind() != ir::ValueKind::Const || !v->data() || t.rank() < 2 ||
      t.shape[t.rank() - 2] != tq || t.shape[t.rank() - 1] != tk || tq < 1 ||
      tk < 1 || t.numElements() != tq * tk)
    return false;
  const bool boolean = t.dtype == ir::DType::Bool;
  if (!boolean && !ir::isFloat(t.dtype))
    return false;
  if (llvm::Error e = v->data()->load()) {
    llvm::consumeError(std::move(e));
    return false;
  }
  for (int64_t i = 0; i < tq; ++i)
    for (int64_t j = 0; j < tk; ++j) {
      double x = v->data()->getDouble(i * tk + j);
      bool kept = boolean ? x != 0 : x == 0;
      bool hidden = boolean ? x == 0 : x == -INFINITY;
      if (!(j <= i ? kept : hidden))
        return false;
    }
  return true;
}

// The causal rule out of a boolean mask: a constant that is the rule
// (the mask is then none), or And(rule, rest) in either order (rest, such
// as the padding of a batch, stays the mask). Nothing when neither.
std::optional<Value *> withoutCausalRule(Value *mask, int64_t tq,
                                         int64_t tk) {
  if (isCausalConstant(mask, tq, tk))
    return static_cast<Value *>(nullptr);
  Op *def = mask->definingOp();
  if (!def || def->kind() != OpKind::And)
    return std::nullopt;
  for (unsigned side = 0; side < 2; ++side)
    if (isCausalConstant(def->operand(side), tq, tk))
      return def->operand(1 - side);
  return std::nullopt;
}

} // namespace

llvm::Expected<bool> recognizeAttention(ir::Graph &g,
                                        const PassContext &ctx) {
  if (!ctx.training.fuseAttention)
    return false;
  std::vector<Op *> candidates;
  for (const auto &op : g.ops())
    if (op->kind() == OpKind::MatMul)
      candidates.push_back(op.get());
  bool changed = false;
  llvm::DenseSet<const Op *> replaced;
  std::map<std::tuple<Value *, bool, double>, Value *> biases;
  std::map<Value *, Value *> negated; // Not(c), made once per condition
  SeqMajorCone cones(g);
  for (Op *root : candidates) {
    if (replaced.count(root))
      continue;
    std::optional<AttentionMatch> m = matchAttention(g, root);
    if (!m)
      continue;
    // Q, K and V all moved from [B, T, H, D] and O moved back: the fused
    // op reads and writes that layout (seq_major) and the four Transposes,
    // forward and backward, are never run.
    Value *seqKt = nullptr; // K^T straight from [B, T, H, D]
    if (!m->k)
      if (Op *t = interior(g, m->kt, OpKind::Transpose);
          t && t->getInts("perm") == std::vector<int64_t>{0, 2, 3, 1})
        seqKt = t->operand(0);
    Op *seqOut = layoutOutput(g, root->result(), {0, 2, 1, 3});
    const bool seqMajor = seqOut && (seqKt || (m->k && cones.reaches(m->k))) &&
                          cones.reaches(m->q) && cones.reaches(m->v);
    // Q, K and V moved from [T, B, H, D] and O moved back: the fused op
    // reads and writes that layout (time_major), the same way.
    Op *timeOut =
        seqMajor ? nullptr : layoutOutput(g, root->result(), {2, 0, 1, 3});
    Value *timeQ = timeOut ? timeMajorSource(m->q) : nullptr,
          *timeK = timeOut && m->k ? timeMajorSource(m->k) : nullptr,
          *timeV = timeOut ? timeMajorSource(m->v) : nullptr;
    const bool timeMajor = timeQ && timeK && timeV;
    if (seqMajor) {
      m->q = cones.make(root, m->q);
      m->k = seqKt ? seqKt : cones.make(root, m->k);
      m->v = cones.make(root, m->v);
    } else if (timeMajor) {
      m->q = timeMajorOperand(g, root, m->q, timeQ);
      m->k = timeMajorOperand(g, root, m->k, timeK);
      m->v = timeMajorOperand(g, root, m->v, timeV);
    } else if (!m->k) {
      // K = Kt with its last two axes swapped; when Kt is itself another
      // Transpose (the exporters fold heads-first and k.transpose(-2, -1)
      // into one), K is one Transpose of its operand and Kt's dies.
      ir::TensorType kt = m->kt->type();
      std::swap(kt.shape[2], kt.shape[3]);
      Value *from = m->kt;
      std::vector<int64_t> perm{0, 1, 3, 2};
      if (Op *t = interior(g, m->kt, OpKind::Transpose)) {
        const std::vector<int64_t> &p = t->getInts("perm");
        from = t->operand(0);
        perm = {p[0], p[1], p[3], p[2]};
      }
      if (perm == std::vector<int64_t>{0, 1, 2, 3})
        m->k = from;
      else
        m->k = g.insertOpBefore(root, OpKind::Transpose, {from}, {kt},
                                {g.uniqueName(m->kt->name() + ".k")},
                                {{"perm", perm}}, root->loc())
                   ->result();
    }
    if (m->keepCond) {
      // The boolean mask, true where a key is seen.
      Value *keep = m->keepCond;
      if (!m->keepWhereTrue) {
        Value *&inverse = negated[keep];
        if (!inverse)
          inverse = g.insertOpBefore(root, OpKind::Not, {keep}, {keep->type()},
                                     {g.uniqueName(keep->name() + ".keep")},
                                     {}, root->loc())
                        ->result();
        keep = inverse;
      }
      m->mask = keep;
    } else if (m->fillCond) {
      // masked_fill's Where as the additive mask it equals.
      ir::DType dt = m->q->type().dtype;
      auto scalar = [&](double x, const std::string &name) {
        return g.addConst(g.uniqueName(name),
                          ir::TensorData::fromDoubles(dt, {}, {x}));
      };
      Value *&bias = biases[{m->fillCond, m->hideWhereTrue, m->fill}];
      if (!bias) { // made once for every layer that reads the condition
        Value *fill = scalar(m->fill, "attention.fill");
        Value *zero = scalar(0, "attention.zero");
        std::vector<Value *> ops{m->fillCond, fill, zero};
        if (!m->hideWhereTrue)
          std::swap(ops[1], ops[2]);
        bias = g.insertOpBefore(root, OpKind::Where, ops,
                                {ir::TensorType(dt, m->fillCond->type().shape)},
                                {g.uniqueName(m->fillCond->name() + ".bias")},
                                {}, root->loc())
                   ->result();
      }
      m->mask = bias;
    }
    // A mask that is (or includes) the causal rule as a constant: the
    // causal attribute instead, so the kernels skip the hidden tiles by
    // their indices, the cost model counts the scores a row sees, and only
    // the rest of the mask (padding) is read. The same scores.
    int64_t causal = 0;
    if (m->mask) {
      // P of O = MatMul(P, V): [B, Hq, Tq, Tk] whatever the layout.
      const ir::Shape &ps = root->operand(0)->type().shape;
      if (auto rest = withoutCausalRule(m->mask, ps[ps.size() - 2],
                                        ps[ps.size() - 1])) {
        causal = 1;
        m->mask = *rest;
      }
    }
    std::vector<Value *> operands{m->q, m->k, m->v};
    if (m->mask)
      operands.push_back(m->mask);
    ir::AttrMap attrs{{"scale", float(m->scale)}, {"causal", causal}};
    if (seqMajor)
      attrs.emplace("seq_major", int64_t(1));
    if (timeMajor)
      attrs.emplace("time_major", int64_t(1));
    std::vector<ir::TensorType> in;
    for (Value *v : operands)
      in.push_back(v->type());
    auto types = ir::inferResultTypes(OpKind::FusedAttention, in, attrs, 2);
    if (!types) { // the match checked what the type rule checks
      llvm::consumeError(types.takeError());
      continue;
    }
    Op *layoutOut = seqMajor ? seqOut : timeMajor ? timeOut : nullptr;
    Value *replacedValue = layoutOut ? layoutOut->result() : root->result();
    std::string name = replacedValue->name();
    Op *fused = g.insertOpBefore(
        root, OpKind::FusedAttention, operands, *types,
        {g.uniqueName(name + ".fused"), g.uniqueName(name + ".lse")},
        std::move(attrs), root->loc());
    g.replaceAllUsesWith(replacedValue, fused->result(0));
    replaced.insert(root);
    if (layoutOut)
      g.eraseOp(layoutOut); // its only operand was the root's result
    g.eraseOp(root);
    g.rename(fused->result(0), name);
    changed = true;
  }
  return changed; // the unfused chain is left to dce
}

} // namespace cleave::passes
