// The batch layout of a broadcasting MatMul (MatMulLayout.h).
#include "runtime/MatMulLayout.h"

#include "ir/Type.h"

#include "llvm/Support/FormatVariadic.h"

#include <algorithm>

namespace cleave::runtime {

llvm::Expected<MatMulLayout> matMulLayout(llvm::ArrayRef<int64_t> a,
                                          llvm::ArrayRef<int64_t> b,
                                          llvm::ArrayRef<int64_t> y) {
  auto error = [](const std::string &msg) {
    return llvm::createStringError(llvm::inconvertibleErrorCode(), msg);
  };
  if (a.size() < 2 || b.size() < 2)
    return error(llvm::formatv("operands {0} and {1}: 1-D MatMul operands are "
                               "not supported (autodiff reshapes them to 2-D)",
                               ir::shapeStr(a), ir::shapeStr(b)));
  MatMulLayout l;
  l.m = a[a.size() - 2];
  l.k = a.back();
  l.n = b.back();
  size_t ra = a.size() - 2, rb = b.size() - 2, r = std::max(ra, rb);
  auto mismatch = [&] {
    return error(llvm::formatv("operands {0} x {1} do not give {2}",
                               ir::shapeStr(a), ir::shapeStr(b),
                               ir::shapeStr(y)));
  };
  if (b[rb] != l.k || y.size() != r + 2 || y[r] != l.m || y[r + 1] != l.n)
    return mismatch();
  // Per output batch dim, each operand's stride in matrices (0 where it
  // broadcasts).
  std::vector<int64_t> strideA(r, 0), strideB(r, 0);
  for (size_t i = r; i-- > 0;) {
    int64_t da = i >= r - ra ? a[i - (r - ra)] : 1;
    int64_t db = i >= r - rb ? b[i - (r - rb)] : 1;
    if ((da != 1 && da != y[i]) || (db != 1 && db != y[i]) ||
        (da == 1 && db == 1 && y[i] != 1))
      return mismatch();
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

} // namespace cleave::runtime
