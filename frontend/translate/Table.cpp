// The translation table (Translation.h) assembled from its families, its
// look-ups, the generic 1:1 translation, and the list of supported ONNX ops
// that `cleavec --list-ops` prints, derived from the table.
#include "frontend/translate/Translation.h"

#include "frontend/OnnxImporter.h"

#include "llvm/ADT/StringMap.h"

#include <cassert>
#include <set>

namespace cleave::frontend {

using namespace cleave::ir;

static bool isDefaultDomain(llvm::StringRef domain) {
  return domain.empty() || domain == "ai.onnx";
}

llvm::ArrayRef<OpTranslation> allTranslations() {
  static const std::vector<OpTranslation> table = [] {
    std::vector<OpTranslation> t;
    for (auto family :
         {elementwiseTranslations, matMulTranslations, resizeTranslations,
          normalizationTranslations, reduceTranslations, shapeTranslations,
          convTranslations, functionOpTranslations, trainingTranslations})
      for (OpTranslation &entry : family())
        t.push_back(std::move(entry));
    return t;
  }();
  return table;
}

// Entries by ONNX name (default domain) or "name@domain" (others). The
// opset ranges of one op do not overlap (onnx_translation_table_test).
static const llvm::StringMap<std::vector<const OpTranslation *>> &byName() {
  static const auto index = [] {
    llvm::StringMap<std::vector<const OpTranslation *>> m;
    for (const OpTranslation &t : allTranslations()) {
      std::string key =
          isDefaultDomain(t.domain) ? t.onnxName : t.onnxName + "@" + t.domain;
      m[key].push_back(&t);
    }
    return m;
  }();
  return index;
}

const OpTranslation *findTranslation(llvm::StringRef domain, llvm::StringRef op,
                                     int64_t version) {
  std::string key =
      isDefaultDomain(domain) ? op.str() : (op + "@" + domain).str();
  auto it = byName().find(key);
  if (it == byName().end())
    return nullptr;
  for (const OpTranslation *t : it->second)
    if (version >= t->minOpset && version <= t->maxOpset)
      return t;
  return nullptr;
}

bool consumesAttr(llvm::StringRef op, llvm::StringRef attr) {
  auto it = byName().find(op);
  if (it == byName().end())
    return false;
  for (const OpTranslation *t : it->second)
    for (const std::string &a : t->consumedAttrs)
      if (a == attr)
        return true;
  return false;
}

OpKind irOpOf(const onnx::NodeProto &n) {
  auto kind = lookupOp(n.op_type());
  assert(kind && "a translation entry names an op the IR lacks");
  return *kind;
}

llvm::Error translateSameNamedOp(ImportContext &ctx, const onnx::NodeProto &n,
                                 int index) {
  OpKind kind = irOpOf(n);
  auto operands = ctx.tensorOperands(n, index, kind);
  if (!operands)
    return operands.takeError();
  return ctx.emit(n, index, kind, std::move(*operands), {});
}

OpTranslation sameNamedOp(const char *onnxName) {
  assert(lookupOp(onnxName) && !isTrainingOp(*lookupOp(onnxName)) &&
         "a generic entry needs a forward IR op of the same name");
  return {onnxName, kOpsetFirst, kOpsetLast, translateSameNamedOp};
}

std::vector<std::string> supportedOnnxOps(std::vector<std::string> *foldedOnly,
                                          std::vector<std::string> *expanded,
                                          std::vector<std::string> *unrolled) {
  // Loop and If come before the table (Importer::importNode).
  std::set<std::string> ops = {"If", "Loop"}, folded, bodies;
  if (unrolled)
    *unrolled = {"If", "Loop"};
  for (const OpTranslation &t : allTranslations()) {
    std::string name = isDefaultDomain(t.domain)
                           ? t.onnxName
                           : t.onnxName + " (" + t.domain + ")";
    ops.insert(name);
    if (t.kind == TranslationKind::FoldOnly)
      folded.insert(name);
    if (t.kind == TranslationKind::FunctionBody)
      bodies.insert(name);
  }
  if (foldedOnly)
    foldedOnly->assign(folded.begin(), folded.end());
  if (expanded)
    expanded->assign(bodies.begin(), bodies.end());
  return {ops.begin(), ops.end()};
}

} // namespace cleave::frontend
