// Matrix products: MatMul (NumPy batching) and Gemm (alpha, beta and the
// transposes are attributes of the IR op as of ONNX's), both 1:1.
#include "frontend/translate/Translation.h"

namespace cleave::frontend {

std::vector<OpTranslation> matMulTranslations() {
  return {sameNamedOp("MatMul"), sameNamedOp("Gemm")};
}

} // namespace cleave::frontend
