// Matrix products: MatMul (NumPy batching) and Gemm (alpha, beta and the
// transposes are attributes of the IR op as of ONNX's), both 1:1; Einsum
// decomposed into transposes, reshapes and a MatMul (frontend/Einsum.cpp).
#include "frontend/Decompose.h"
#include "frontend/translate/Translation.h"

namespace cleave::frontend {

std::vector<OpTranslation> matMulTranslations() {
  return {sameNamedOp("MatMul"),
          sameNamedOp("Gemm"),
          {"Einsum", kOpsetFirst, kOpsetLast, decomposeEinsum,
           TranslationKind::Op, {"equation"}}};
}

} // namespace cleave::frontend
