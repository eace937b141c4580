// ONNX's own training form: Gradient(xs, y) in the ai.onnx.preview.training
// domain gives dy/dx for each x. The frontend does not differentiate: the
// importer's caller supplies autodiff (ImportOptions::differentiate; the
// tools pass passes::differentiate), which appends the backward ops, tagged
// B here; the node's outputs name the gradients.
#include "frontend/translate/Translation.h"

#include "frontend/OnnxNode.h"

namespace cleave::frontend {

using namespace cleave::ir;

static llvm::Error translateGradient(ImportContext &ctx,
                                     const onnx::NodeProto &n, int index) {
  std::string where = describeNode(n, index);
  std::vector<std::string> xs;
  std::string y;
  for (const auto &a : n.attribute()) {
    if (a.name() == "xs")
      xs.assign(a.strings().begin(), a.strings().end());
    else if (a.name() == "y")
      y = a.s();
    else
      return importError("{0}: attribute '{1}' of Gradient is not supported",
                         where, a.name());
  }
  if (xs.empty() || y.empty() || int(xs.size()) != n.output_size())
    return importError("{0}: Gradient needs attributes 'xs' and 'y' and one "
                       "output per x",
                       where);
  auto valueOf = [&](const std::string &name) -> Value * {
    ImportContext::Entry *e = ctx.lookup(name);
    return e ? ctx.materialize(name, *e) : nullptr;
  };
  Value *yv = valueOf(y);
  if (!yv)
    return importError("{0}: y '{1}' is not defined before the Gradient node",
                       where, y);
  std::vector<Value *> xv;
  for (const std::string &x : xs) {
    Value *v = valueOf(x);
    if (!v || !isFloat(v->type().dtype))
      return importError("{0}: x '{1}' is not a float value defined before "
                         "the Gradient node",
                         where, x);
    xv.push_back(v);
  }
  const auto &differentiate = ctx.options().differentiate;
  if (!differentiate)
    return importError("{0}: importing ONNX's Gradient op needs autodiff, "
                       "which the caller did not give the importer "
                       "(ImportOptions::differentiate)",
                       where);
  Graph &g = ctx.graph();
  size_t first = g.ops().size();
  auto grads = differentiate(g, yv, xv);
  if (!grads)
    return importError("{0}: {1}", where, llvm::toString(grads.takeError()));
  for (size_t i = first; i < g.ops().size(); ++i)
    g.ops()[i]->setPhase(Phase::B);
  for (int i = 0; i < n.output_size(); ++i)
    if (auto e = ctx.define(n, index, n.output(i), (*grads)[i]))
      return e;
  return llvm::Error::success();
}

std::vector<OpTranslation> trainingTranslations() {
  return {{"Gradient",
           kOpsetFirst,
           kOpsetLast,
           translateGradient,
           TranslationKind::Op,
           {},
           "ai.onnx.preview.training"}};
}

} // namespace cleave::frontend
