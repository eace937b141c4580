// Einsum as IR ops cleave has, with their gradients: one or two operands,
// explicit letters (no "..." and no letter twice in one operand, which
// would be a diagonal). A letter that only one operand has and the output
// lacks is summed away first (ReduceSum); then the two operands are
// transposed to [batch, free, contracted] and [batch, contracted, free],
// reshaped to three dims, multiplied (MatMul), reshaped back and
// transposed to the output's order. XLNet's relative attention
// ("ibnd,jbnd->bnij") and MaxViT's come in this form.
#include "frontend/Decompose.h"

#include "frontend/OnnxNode.h"
#include "ir/TypeRules.h"

#include <algorithm>
#include <map>

namespace cleave::frontend {

using namespace cleave::ir;

namespace {

struct Operand {
  Value *value;
  std::string letters;
};

class EinsumBuilder {
public:
  EinsumBuilder(ImportContext &ctx, const onnx::NodeProto &n, int index)
      : ctx_(ctx), n_(n), index_(index) {}

  llvm::Expected<Value *> append(OpKind kind, std::vector<Value *> operands,
                                 AttrMap attrs) {
    return ctx_.append(n_, index_, kind, std::move(operands),
                       std::move(attrs));
  }

  // Sums away the letters of `op` that `keep` lacks.
  llvm::Error sumAway(Operand &op, llvm::StringRef keep) {
    std::vector<int64_t> axes;
    std::string left;
    for (size_t i = 0; i < op.letters.size(); ++i)
      if (keep.find(op.letters[i]) == llvm::StringRef::npos)
        axes.push_back(int64_t(i));
      else
        left += op.letters[i];
    if (axes.empty())
      return llvm::Error::success();
    auto v = append(OpKind::ReduceSum, {op.value},
                    {{"axes", Attribute(axes)},
                     {"keepdims", Attribute(int64_t(0))}});
    if (!v)
      return v.takeError();
    op = {*v, left};
    return llvm::Error::success();
  }

  // `op` with its letters in the order `to` (a permutation of them).
  llvm::Expected<Value *> transposeTo(const Operand &op, llvm::StringRef to) {
    std::vector<int64_t> perm;
    bool identity = true;
    for (size_t i = 0; i < to.size(); ++i) {
      perm.push_back(int64_t(op.letters.find(to[i])));
      identity &= perm.back() == int64_t(i);
    }
    if (identity)
      return op.value;
    return append(OpKind::Transpose, {op.value}, {{"perm", Attribute(perm)}});
  }

  llvm::Expected<Value *> reshape(Value *v, std::vector<int64_t> shape) {
    if (Shape(shape.begin(), shape.end()) == v->type().shape)
      return v;
    return append(OpKind::Reshape, {v}, {{"shape", Attribute(shape)}});
  }

private:
  ImportContext &ctx_;
  const onnx::NodeProto &n_;
  int index_;
};

} // namespace

llvm::Error decomposeEinsum(ImportContext &ctx, const onnx::NodeProto &n,
                            int index) {
  std::string where = describeNode(n, index);
  std::string eq;
  for (char c : attrString(n, "equation", ""))
    if (c != ' ')
      eq += c;
  auto refuse = [&](const std::string &why) {
    return importError("{0}: Einsum '{1}': {2}{3}", where, eq, why,
                       modulePathOf(n));
  };
  if (eq.find("...") != std::string::npos)
    return refuse("\"...\" (broadcast dims) is not supported");
  llvm::StringRef lhs = llvm::StringRef(eq).split("->").first;
  bool explicitOut = llvm::StringRef(eq).contains("->");
  llvm::SmallVector<llvm::StringRef, 2> terms;
  lhs.split(terms, ',');
  if (terms.size() != size_t(n.input_size()) || terms.empty() ||
      terms.size() > 2)
    return refuse("cleave takes one or two operands");
  std::map<char, int64_t> size, count;
  std::vector<Operand> ops;
  for (size_t k = 0; k < terms.size(); ++k) {
    auto v = ctx.operand(n, index, int(k));
    if (!v)
      return v.takeError();
    std::string letters = terms[k].str();
    const Shape &shape = (*v)->type().shape;
    if (letters.size() != shape.size())
      return refuse(llvm::formatv("operand {0} has rank {1} for '{2}'", k,
                                  shape.size(), letters)
                        .str());
    for (size_t i = 0; i < letters.size(); ++i) {
      char c = letters[i];
      if (!llvm::isAlpha(c))
        return refuse(std::string("'") + c + "' is not a letter");
      if (letters.find(c) != i)
        return refuse(std::string("'") + c +
                      "' twice in one operand (a diagonal) is not supported");
      auto [it, fresh] = size.emplace(c, shape[i]);
      if (!fresh && it->second != shape[i])
        return refuse(llvm::formatv("'{0}' is {1} in one operand and {2} in "
                                    "another (broadcasting is not supported)",
                                    c, it->second, shape[i])
                          .str());
      ++count[c];
    }
    ops.push_back({*v, letters});
  }
  std::string out;
  if (explicitOut) {
    out = llvm::StringRef(eq).split("->").second.str();
    for (size_t i = 0; i < out.size(); ++i)
      if (!size.count(out[i]) || out.find(out[i]) != i)
        return refuse(std::string("output letter '") + out[i] +
                      "' is not an input letter, or repeats");
  } else {
    for (const auto &[c, times] : count) // sorted, as ONNX says
      if (times == 1)
        out += c;
  }

  EinsumBuilder b(ctx, n, index);
  if (ops.size() == 1) {
    if (auto e = b.sumAway(ops[0], out))
      return e;
    auto t = b.transposeTo(ops[0], out);
    if (!t)
      return t.takeError();
    return ctx.emit(n, index, OpKind::Identity, {*t}, {}, false);
  }
  // Letters only one operand has and the output lacks are summed first.
  for (size_t k = 0; k < 2; ++k) {
    std::string keep = out + ops[1 - k].letters;
    if (auto e = b.sumAway(ops[k], keep))
      return e;
  }
  const std::string &la = ops[0].letters, &lb = ops[1].letters;
  auto has = [](const std::string &s, char c) {
    return s.find(c) != std::string::npos;
  };
  std::string batch, contract, leftFree, rightFree;
  for (char c : out)
    if (has(la, c) && has(lb, c))
      batch += c;
  for (char c : la) {
    if (has(lb, c) && !has(out, c))
      contract += c;
    if (!has(lb, c))
      leftFree += c;
  }
  for (char c : lb)
    if (!has(la, c))
      rightFree += c;
  auto product = [&](const std::string &letters) {
    int64_t p = 1;
    for (char c : letters)
      p *= size[c];
    return p;
  };
  int64_t nb = product(batch), m = product(leftFree), kk = product(contract),
          nn = product(rightFree);
  auto a = b.transposeTo(ops[0], batch + leftFree + contract);
  if (!a)
    return a.takeError();
  auto a3 = b.reshape(*a, {nb, m, kk});
  if (!a3)
    return a3.takeError();
  auto bt = b.transposeTo(ops[1], batch + contract + rightFree);
  if (!bt)
    return bt.takeError();
  auto b3 = b.reshape(*bt, {nb, kk, nn});
  if (!b3)
    return b3.takeError();
  auto c3 = b.append(OpKind::MatMul, {*a3, *b3}, {});
  if (!c3)
    return c3.takeError();
  std::string produced = batch + leftFree + rightFree;
  std::vector<int64_t> dims;
  for (char c : produced)
    dims.push_back(size[c]);
  auto c = b.reshape(*c3, dims);
  if (!c)
    return c.takeError();
  auto t = b.transposeTo({*c, produced}, out);
  if (!t)
    return t.takeError();
  return ctx.emit(n, index, OpKind::Identity, {*t}, {}, false);
}

} // namespace cleave::frontend
