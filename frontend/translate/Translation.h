// The table of ONNX op translations, in the manner of MLIR's conversion
// patterns: one entry per (ONNX op, opset range), each naming the function
// that turns such a node into IR ops through the ImportContext. The
// importer looks a node up here after constants and shape arithmetic have
// been folded; an op without an entry is expanded through its ONNX function
// body when it has one, and refused by name otherwise. `cleavec --list-ops`
// prints the table.
//
// Entries are grouped by family, one file each (Elementwise, Shape, Conv,
// Reduce, Normalization, MatMul, FunctionOps, Training); the decompositions
// they point to for ops without an IR op of their own are in
// frontend/Decompose.h. To add an ONNX op, add its entry to its family's
// list (a generic entry when an IR op of the same name models it exactly)
// and, when it needs one, its translation function beside it.
#pragma once

#include "frontend/ImportContext.h"

#include "llvm/ADT/ArrayRef.h"
#include "llvm/ADT/StringRef.h"
#include "llvm/Support/Error.h"

#include <cstdint>
#include <string>
#include <vector>

namespace cleave::frontend {

// Turns node `n` (the `index`th of its graph or function body) into IR
// ops and records its outputs in the context.
using TranslateFn = llvm::Error (*)(ImportContext &ctx,
                                    const onnx::NodeProto &n, int index);

// How an entry's op is listed by `cleavec --list-ops`.
enum class TranslationKind {
  Op,           // imported as IR ops
  FoldOnly,     // accepted only when it folds to a constant (Shape, Range)
  FunctionBody, // imported through its ONNX function body (tested)
};

// Opset bounds of an entry that holds for every version. The model's
// default-domain opset is gated to kMinOpset..kMaxOpset (OnnxImporter.h),
// but a function body may be written for another one.
constexpr int64_t kOpsetFirst = 0;
constexpr int64_t kOpsetLast = INT64_MAX;

struct OpTranslation {
  std::string onnxName;
  // The opset versions of the op's domain this entry covers, inclusive.
  int64_t minOpset, maxOpset;
  TranslateFn translate;
  TranslationKind kind = TranslationKind::Op;
  // ONNX attributes the translation reads itself (or that carry no meaning
  // for cleave), beyond the ones the IR op declares and takes as they are.
  std::vector<std::string> consumedAttrs = {};
  // The op's domain: "" for the default ONNX domain.
  std::string domain = "";
};

// The entry for `op` of `domain` ("" or "ai.onnx": the default one) at
// opset `version`, or null.
const OpTranslation *findTranslation(llvm::StringRef domain, llvm::StringRef op,
                                     int64_t version);

// Every entry, in family order.
llvm::ArrayRef<OpTranslation> allTranslations();

// True when some translation of `op` consumes its attribute `attr`.
bool consumesAttr(llvm::StringRef op, llvm::StringRef attr);

// A generic entry: the ONNX op maps 1:1 to the IR op of the same name, its
// tensor inputs becoming operands and its attributes the IR op's.
OpTranslation sameNamedOp(const char *onnxName);
llvm::Error translateSameNamedOp(ImportContext &ctx, const onnx::NodeProto &n,
                                 int index);

// Expands the node into its ONNX function body, or refuses it as an
// unsupported op when it has none: the path of every op without an entry.
llvm::Error translateThroughFunctionBody(ImportContext &ctx,
                                         const onnx::NodeProto &n, int index);

// The IR op of the node's own name (an entry's function shared by several
// ONNX ops reads which one it is translating).
ir::OpKind irOpOf(const onnx::NodeProto &n);

// The families, one file each under frontend/translate/.
std::vector<OpTranslation> elementwiseTranslations();
std::vector<OpTranslation> matMulTranslations();
std::vector<OpTranslation> resizeTranslations();
std::vector<OpTranslation> normalizationTranslations();
std::vector<OpTranslation> reduceTranslations();
std::vector<OpTranslation> shapeTranslations();
std::vector<OpTranslation> convTranslations();
std::vector<OpTranslation> functionOpTranslations();
std::vector<OpTranslation> trainingTranslations();

} // namespace cleave::frontend
