// Helpers shared by the gradient and optimizer kernel files
// (Gradients*.cpp, Optimizers.cpp): element counts, float tensors of any
// float type read as doubles, and scalar operands.
#pragma once

#include "runtime/cpu/CpuKernels.h"

#include <vector>

namespace cleave::runtime::cpu {

inline int64_t elementCount(llvm::ArrayRef<int64_t> shape) {
  int64_t n = 1;
  for (int64_t d : shape)
    n *= d;
  return n;
}

// Element i of a float tensor of any float type.
inline double loadDouble(const TensorRef &t, int64_t i) {
  switch (t.dtype) {
  case ir::DType::F64:
    return t.as<double>()[i];
  case ir::DType::F16:
    return ir::halfToFloat(t.as<uint16_t>()[i]);
  case ir::DType::BF16:
    return ir::bf16ToFloat(t.as<uint16_t>()[i]);
  default:
    return t.as<float>()[i];
  }
}

// Parameter-like operands (scale, running statistics, class weights) may be
// another float type than the data in ONNX, so kernels read them as doubles.
inline std::vector<double> readDoubles(const TensorRef &t) {
  std::vector<double> v(t.numElements());
  for (int64_t i = 0; i < int64_t(v.size()); ++i)
    v[i] = loadDouble(t, i);
  return v;
}

inline void storeDouble(const TensorRef &t, int64_t i, double v) {
  switch (t.dtype) {
  case ir::DType::F64:
    t.as<double>()[i] = v;
    break;
  case ir::DType::F16:
    t.as<uint16_t>()[i] = ir::floatToHalf(float(v));
    break;
  case ir::DType::BF16:
    t.as<uint16_t>()[i] = ir::floatToBf16(float(v));
    break;
  default:
    t.as<float>()[i] = float(v);
  }
}

// The value of a one-element tensor of any numeric type (a learning rate, a
// step count).
inline double scalarAsDouble(const TensorRef &t) {
  if (t.dtype == ir::DType::F16 || t.dtype == ir::DType::BF16)
    return loadDouble(t, 0);
  return dispatchType(t.dtype, [&](auto v) {
    return double(t.as<decltype(v)>()[0]);
  });
}

} // namespace cleave::runtime::cpu
