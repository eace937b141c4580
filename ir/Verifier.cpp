#include "ir/Verifier.h"

#include "ir/OpInfo.h"
#include "ir/Printer.h"
#include "ir/TypeRules.h"
#include "support/Errors.h"

#include "llvm/ADT/DenseSet.h"
#include "llvm/ADT/StringSet.h"
#include "llvm/Support/FormatVariadic.h"

namespace cleave::ir {

static llvm::Error verifyValueType(const Value *v) {
  if (auto e = checkShape(v->type().shape))
    return fail("value " + valueRef(v->name()) + ": " +
                llvm::toString(std::move(e)));
  return llvm::Error::success();
}

llvm::Error verifyGraph(const Graph &g) {
  llvm::DenseSet<const Value *> defined;
  llvm::StringSet<> names;
  auto define = [&](const Value *v) -> llvm::Error {
    if (!names.insert(v->name()).second)
      return fail("value " + valueRef(v->name()) + " is defined twice");
    defined.insert(v);
    return verifyValueType(v);
  };
  for (const Value *v : g.inputs())
    if (auto e = define(v))
      return e;
  for (const Value *v : g.declared()) {
    if (auto e = define(v))
      return e;
    if (!v->data())
      return fail(std::string(valueKindName(v->kind())) + " " +
                  valueRef(v->name()) + " has no data");
    if (v->data()->type() != v->type())
      return fail(std::string(valueKindName(v->kind())) + " " +
                  valueRef(v->name()) + " is declared " + v->type().str() +
                  " but its data is " + v->data()->type().str());
  }
  for (const auto &opPtr : g.ops()) {
    const Op &op = *opPtr;
    std::vector<TensorType> operandTypes;
    for (unsigned i = 0; i < op.numOperands(); ++i) {
      const Value *v = op.operand(i);
      if (!defined.count(v))
        return fail(op.describe() + ": operand " + std::to_string(i) + " " +
                    valueRef(v->name()) + " is used before it is defined");
      bool listed = false;
      for (const Use &u : v->uses())
        listed |= u.user == &op && u.operandIndex == i;
      if (!listed)
        return fail(op.describe() + ": use list of " + valueRef(v->name()) +
                    " is out of sync");
      operandTypes.push_back(v->type());
    }
    // A recomputed op runs in the backward, and only the backward reads it.
    bool clone = op.attrs().count(kRecomputeOfAttr);
    if (clone && op.phase() != Phase::B && op.phase() != Phase::W)
      return fail(op.describe() + ": a recomputed op (" +
                  std::string(kRecomputeOfAttr) + ") must be B or W, not " +
                  std::string(phaseName(op.phase())));
    if (op.phase() == Phase::Fwd)
      for (const Value *v : op.operands())
        if (v->definingOp() &&
            v->definingOp()->attrs().count(kRecomputeOfAttr))
          return fail(op.describe() + ": a forward op reads " +
                      valueRef(v->name()) +
                      ", which the backward recomputes");
    // An offloaded value leaves in the forward and only Fetch, in the
    // backward, brings it back (ir/Ops.def).
    if (op.kind() == OpKind::Offload) {
      if (op.phase() != Phase::Fwd)
        return fail(op.describe() + ": Offload must be fwd, not " +
                    std::string(phaseName(op.phase())));
      for (const Use &u : op.result()->uses())
        if (u.user->kind() != OpKind::Fetch)
          return fail(op.describe() + ": " + u.user->describe() + " reads " +
                      valueRef(op.result()->name()) +
                      ", which is in host memory (only Fetch may)");
    }
    if (op.kind() == OpKind::Fetch) {
      const Op *from = op.operand(0)->definingOp();
      if (!from || from->kind() != OpKind::Offload)
        return fail(op.describe() + ": Fetch reads " +
                    valueRef(op.operand(0)->name()) +
                    ", which no Offload made");
      if (op.phase() != Phase::B && op.phase() != Phase::W)
        return fail(op.describe() + ": Fetch must be B or W, not " +
                    std::string(phaseName(op.phase())));
    }
    auto types = inferResultTypes(op.kind(), operandTypes, op.attrs(),
                                  op.numResults());
    if (!types)
      return fail(op.describe() + ": " + llvm::toString(types.takeError()));
    for (unsigned i = 0; i < op.numResults(); ++i) {
      const Value *r = op.result(i);
      if (r->definingOp() != &op || r->resultIndex() != i)
        return fail(op.describe() + ": result " + std::to_string(i) +
                    " does not point back to its op");
      if ((*types)[i] != r->type())
        return fail(op.describe() + ": result " + valueRef(r->name()) +
                    " has type " + r->type().str() + " but the op gives " +
                    (*types)[i].str());
      if (auto e = define(r))
        return e;
    }
  }
  for (const Value *v : g.stash())
    if (!defined.count(v))
      return fail("stash entry " + valueRef(v->name()) + " is not defined");
  for (const StateUpdate &u : g.updates()) {
    if (!defined.count(u.state) || !defined.count(u.value))
      return fail("update of " + valueRef(u.state->name()) +
                  " refers to an undefined value");
    if (u.state->kind() != ValueKind::Param &&
        u.state->kind() != ValueKind::Buffer)
      return fail("update target " + valueRef(u.state->name()) +
                  " is not a param or buffer");
    if (u.state->type() != u.value->type())
      return fail("update of " + valueRef(u.state->name()) + " (" +
                  u.state->type().str() + ") by " + valueRef(u.value->name()) +
                  " (" + u.value->type().str() + "): types differ");
  }
  if (g.outputs().empty())
    return fail("graph @" + g.name() + " has no outputs");
  llvm::DenseSet<const Value *> seen;
  for (const Value *v : g.outputs()) {
    if (!defined.count(v))
      return fail("output " + valueRef(v->name()) + " is not defined");
    if (!seen.insert(v).second)
      return fail("output " + valueRef(v->name()) + " is listed twice");
  }
  return llvm::Error::success();
}

} // namespace cleave::ir
