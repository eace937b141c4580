// TensorType: an element type and a static shape.
//
// cleave IR has static shapes only: the frontend binds or folds every
// symbolic dimension before a graph exists. Text form: `f32[8,128]`, and
// `f32[]` for a scalar.
#pragma once

#include "ir/DType.h"
#include "support/ShapeMath.h"

#include "llvm/ADT/ArrayRef.h"
#include "llvm/ADT/SmallVector.h"

#include <cstdint>
#include <string>

namespace cleave::ir {

using Shape = llvm::SmallVector<int64_t, 4>;

struct TensorType {
  DType dtype = DType::F32;
  Shape shape;

  TensorType() = default;
  TensorType(DType d, Shape s) : dtype(d), shape(std::move(s)) {}

  size_t rank() const { return shape.size(); }
  // Number of elements; 1 for a scalar.
  int64_t numElements() const;
  // Bytes needed to hold the tensor densely.
  int64_t byteSize() const { return numElements() * int64_t(dtypeSize(dtype)); }
  std::string str() const;

  bool operator==(const TensorType &o) const {
    return dtype == o.dtype && shape == o.shape;
  }
  bool operator!=(const TensorType &o) const { return !(*this == o); }
};

using support::shapeStr; // "[2,3]" (support/ShapeMath.h)

} // namespace cleave::ir
