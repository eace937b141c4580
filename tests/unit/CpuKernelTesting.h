// Helpers shared by the CPU kernel tests (tests/unit/cpu_*_test.cpp): the
// backend they run on, and host tensors in two styles.
//
//   untyped::Host    raw 8-byte-aligned storage plus a dtype; values are
//                    copied in and out by element type (elementwise,
//                    reduction and data movement tests, which mix types).
//   typed::Host<T>   a std::vector<T> with a shape (linalg, conv/pool and
//                    normalization tests, which compare against references
//                    computed in double).
//
// A test file picks one style with `using namespace`.
#ifndef CLEAVE_TESTS_UNIT_CPUKERNELTESTING_H
#define CLEAVE_TESTS_UNIT_CPUKERNELTESTING_H

#include "ir/DType.h"
#include "runtime/Kernel.h"

#include "llvm/ADT/ArrayRef.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <random>
#include <type_traits>
#include <vector>

namespace cleave::testsupport {

// The CPU backend every kernel test runs on (two threads, so the parallel
// paths are taken).
inline runtime::Backend &cpu() {
  static std::unique_ptr<runtime::Backend> backend =
      runtime::createCpuBackend(2);
  return *backend;
}

namespace untyped {

using runtime::TensorRef;
using ir::DType;
using ir::OpKind;

// A host tensor a test owns; values are copied in and out by element type.
struct Host {
  DType dtype;
  std::vector<int64_t> shape;
  std::vector<uint64_t> storage; // 8-byte aligned

  int64_t numElements() const {
    int64_t n = 1;
    for (int64_t d : shape)
      n *= d;
    return n;
  }
  TensorRef ref() const {
    return {dtype, shape, const_cast<uint64_t *>(storage.data())};
  }
  template <typename V> std::vector<V> values() const {
    std::vector<V> v(numElements());
    if (!v.empty())
      std::memcpy(v.data(), storage.data(), v.size() * sizeof(V));
    return v;
  }
};

inline Host empty(DType dt, std::vector<int64_t> shape) {
  Host h{dt, std::move(shape), {}};
  // Garbage, so an element a kernel forgets to write shows up.
  h.storage.assign((h.numElements() * ir::dtypeSize(dt) + 7) / 8 + 1,
                   0xcdcdcdcdcdcdcdcdull);
  return h;
}

template <typename V>
Host make(DType dt, std::vector<int64_t> shape, std::vector<V> vals) {
  Host h = empty(dt, std::move(shape));
  EXPECT_EQ(int64_t(vals.size()), h.numElements());
  if (!vals.empty())
    std::memcpy(h.storage.data(), vals.data(), vals.size() * sizeof(V));
  return h;
}

inline runtime::Backend &backend() { return cpu(); }

} // namespace untyped

namespace typed {

using runtime::TensorRef;
using testsupport::cpu;
using Ints = std::vector<int64_t>;

inline int64_t numElements(llvm::ArrayRef<int64_t> shape) {
  int64_t n = 1;
  for (int64_t d : shape)
    n *= d;
  return n;
}

template <typename T> ir::DType dtypeOf() {
  if constexpr (std::is_same_v<T, float>)
    return ir::DType::F32;
  else if constexpr (std::is_same_v<T, double>)
    return ir::DType::F64;
  else if constexpr (std::is_same_v<T, int64_t>)
    return ir::DType::I64;
  else if constexpr (std::is_same_v<T, int32_t>)
    return ir::DType::I32;
  else if constexpr (std::is_same_v<T, int8_t>)
    return ir::DType::I8;
  else
    return ir::DType::Bool;
}

// A dense host tensor; the CPU backend works on host memory directly.
template <typename T> struct Host {
  Ints shape;
  std::vector<T> data;
  explicit Host(Ints s, std::vector<T> d = {})
      : shape(std::move(s)), data(std::move(d)) {
    if (data.empty())
      data.resize(numElements(shape));
  }
  TensorRef ref() { return {dtypeOf<T>(), shape, data.data()}; }
  std::vector<double> asDouble() const {
    return std::vector<double>(data.begin(), data.end());
  }
};

// Random values: uniform in [lo, hi) for floating types, integers in
// [-5, 5] otherwise.
template <typename T>
Host<T> randomHost(Ints shape, unsigned seed, double lo = -1, double hi = 1) {
  Host<T> h(std::move(shape));
  std::mt19937 rng(seed);
  for (T &v : h.data) {
    if constexpr (std::is_floating_point_v<T>)
      v = T(std::uniform_real_distribution<double>(lo, hi)(rng));
    else
      v = T(std::uniform_int_distribution<int>(-5, 5)(rng));
  }
  return h;
}

inline llvm::Error run(ir::OpKind op, const ir::AttrMap &attrs,
                       std::vector<TensorRef> ins,
                       std::vector<TensorRef> outs, uint64_t seed = 0) {
  runtime::KernelCall call{op, attrs, ins, outs, seed};
  return cpu().run(call);
}

// Every element within tol * (1 + |want|) of the reference.
template <typename T>
void expectClose(const std::vector<T> &got, const std::vector<double> &want,
                 double tol) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i)
    if (!(std::abs(double(got[i]) - want[i]) <=
          tol * (1 + std::abs(want[i])))) {
      ADD_FAILURE() << "element " << i << ": got " << double(got[i])
                    << ", want " << want[i];
      return;
    }
}

} // namespace typed

} // namespace cleave::testsupport

#endif // CLEAVE_TESTS_UNIT_CPUKERNELTESTING_H
