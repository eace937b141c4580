// Elementwise kernels for the CPU backend: unary math, Clip and Cast, binary
// arithmetic / comparison / logic with NumPy broadcasting, variadic Max/Min,
// and Where.
//
// Every broadcasting op runs over one engine. The operand shapes are aligned
// to the output, output dims of size 1 are dropped and neighbouring dims that
// broadcast alike in every operand are merged. A same-shape op then is one
// contiguous row, and "scalar" or "row" broadcasts ([N,C] + [C], [N,C] +
// [N,1]) are rows whose inner loop reads each operand with stride 1 or 0.
// The flat output range, not the rows, is split across threads, so a single
// long row runs in parallel too.
//
// f16 and bf16 (raw 16-bit values) are computed in f32 and rounded back on
// store. Integer arithmetic wraps like two's complement hardware rather than
// hitting C++'s undefined signed overflow; integer division by zero is a
// kernel error.
#include "runtime/cpu/CpuKernels.h"
#include "runtime/cpu/VectorMath.h"

#include "llvm/ADT/SmallVector.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <type_traits>

namespace cleave::runtime::cpu {
namespace {

using ir::DType;
using ir::OpKind;

template <typename T> constexpr DType dtypeOf() {
  if constexpr (std::is_same_v<T, float>)
    return DType::F32;
  else if constexpr (std::is_same_v<T, double>)
    return DType::F64;
  else if constexpr (std::is_same_v<T, Half>)
    return DType::F16;
  else if constexpr (std::is_same_v<T, BFloat>)
    return DType::BF16;
  else if constexpr (std::is_same_v<T, int64_t>)
    return DType::I64;
  else if constexpr (std::is_same_v<T, int32_t>)
    return DType::I32;
  else if constexpr (std::is_same_v<T, int8_t>)
    return DType::I8;
  else
    return DType::Bool;
}

template <typename... Ts> struct Types {};
using FloatTypes = Types<float, double, Half, BFloat>;
using NumericTypes =
    Types<float, double, Half, BFloat, int64_t, int32_t, int8_t>;
using AllTypes =
    Types<float, double, Half, BFloat, int64_t, int32_t, int8_t, bool>;
using BitwiseTypes = Types<int64_t, int32_t, int8_t, bool>;

template <typename... Ts> std::vector<DType> dtypesOf(Types<Ts...>) {
  return {dtypeOf<Ts>()...};
}

// Calls f(T{}) for the T of the list whose dtype is `dt`. Registration keeps
// other dtypes away; the last type of the list is the fallback.
template <typename T, typename... Rest, typename F>
llvm::Error dispatch(DType dt, Types<T, Rest...>, F &&f) {
  if constexpr (sizeof...(Rest) == 0) {
    return f(T{});
  } else {
    if (dt == dtypeOf<T>())
      return f(T{});
    return dispatch(dt, Types<Rest...>{}, std::forward<F>(f));
  }
}

template <typename T>
constexpr bool kIsInt = std::is_integral_v<T> && !std::is_same_v<T, bool>;

// Integer +, -, *, negation in unsigned arithmetic: wraps, never undefined.
template <typename T> T wrapAdd(T a, T b) {
  if constexpr (kIsInt<T>) {
    using U = std::make_unsigned_t<T>;
    return T(U(U(a) + U(b)));
  } else {
    return a + b;
  }
}
template <typename T> T wrapSub(T a, T b) {
  if constexpr (kIsInt<T>) {
    using U = std::make_unsigned_t<T>;
    return T(U(U(a) - U(b)));
  } else {
    return a - b;
  }
}
template <typename T> T wrapMul(T a, T b) {
  if constexpr (kIsInt<T>) {
    using U = std::make_unsigned_t<T>;
    // uint32 * uint32 stays unsigned; narrower types promote to int, where
    // the product of two values below 2^16 cannot overflow.
    return T(U(U(a) * U(b)));
  } else {
    return a * b;
  }
}
template <typename T> T wrapNeg(T a) { return wrapSub(T(0), a); }

// Float to integer: truncates toward zero, saturates out-of-range values and
// maps NaN to 0 (ONNX leaves both undefined; C++ would too).
template <typename D, typename S> D saturatingTrunc(S s) {
  if (s != s)
    return 0;
  if (s <= S(std::numeric_limits<D>::lowest()))
    return std::numeric_limits<D>::lowest();
  if (s >= S(std::numeric_limits<D>::max()))
    return std::numeric_limits<D>::max();
  return D(s);
}

template <typename D, typename S> D convertElem(S s) {
  if constexpr (std::is_same_v<S, D>)
    return s;
  else if constexpr (std::is_same_v<S, Half> || std::is_same_v<S, BFloat>)
    return convertElem<D>(Elem<S>::load(s));
  else if constexpr (std::is_same_v<D, Half> || std::is_same_v<D, BFloat>)
    return Elem<D>::store(convertElem<float>(s));
  else if constexpr (std::is_same_v<D, bool>)
    return s != S(0);
  else if constexpr (kIsInt<D> && std::is_floating_point_v<S>)
    return saturatingTrunc<D>(s);
  else
    return static_cast<D>(s);
}

constexpr int64_t kMathGrain = 1 << 12; // transcendental elements per thread

// ---------------------------------------------------------------------------
// Broadcast engine.

// The output dims with size-1 dims dropped and neighbours that broadcast
// alike merged; per operand, its element stride in each of those dims (0
// where it broadcasts). The innermost stride is therefore 0 or 1.
struct BroadcastPlan {
  llvm::SmallVector<int64_t, 6> dims;
  llvm::SmallVector<llvm::SmallVector<int64_t, 6>, 3> strides;

  int64_t inner() const { return dims.empty() ? 1 : dims.back(); }
  int64_t innerStride(size_t k) const {
    return dims.empty() ? 0 : strides[k].back();
  }
};

BroadcastPlan planBroadcast(llvm::ArrayRef<int64_t> out,
                            llvm::ArrayRef<TensorRef> ins) {
  size_t r = out.size(), n = ins.size();
  BroadcastPlan p;
  p.strides.resize(n);
  llvm::SmallVector<llvm::SmallVector<bool, 6>, 3> bcast(n);
  llvm::SmallVector<bool, 3> prev, cur(n);
  for (size_t d = 0; d < r; ++d) {
    if (out[d] == 1)
      continue;
    for (size_t k = 0; k < n; ++k) {
      size_t lead = r - ins[k].rank();
      cur[k] = d < lead || ins[k].shape[d - lead] == 1;
    }
    if (!p.dims.empty() && cur == prev) {
      p.dims.back() *= out[d];
    } else {
      p.dims.push_back(out[d]);
      for (size_t k = 0; k < n; ++k)
        bcast[k].push_back(cur[k]);
    }
    prev = cur;
  }
  for (size_t k = 0; k < n; ++k) {
    p.strides[k].resize(p.dims.size());
    int64_t run = 1;
    for (size_t d = p.dims.size(); d-- > 0;) {
      p.strides[k][d] = bcast[k][d] ? 0 : run;
      if (!bcast[k][d])
        run *= p.dims[d];
    }
  }
  return p;
}

// Calls row(outOffset, operandOffsets, length) for runs of the innermost
// plan dim covering [0, total), in parallel. Within a run operand k is read
// at operandOffsets[k] + j * p.innerStride(k).
template <typename RowFn>
void forEachRow(const BroadcastPlan &p, int64_t total, RowFn &&row) {
  size_t n = p.strides.size();
  int64_t outerRank = int64_t(p.dims.size()) - 1;
  int64_t inner = p.inner();
  parallelFor(total, kGrain, [&](int64_t begin, int64_t end) {
    // Odometer over the outer dims, started at begin's row.
    llvm::SmallVector<int64_t, 6> idx(std::max<int64_t>(outerRank, 0));
    llvm::SmallVector<int64_t, 3> base(n, 0), off(n);
    int64_t rowIdx = begin / inner;
    for (int64_t d = outerRank - 1; d >= 0; --d) {
      idx[d] = rowIdx % p.dims[d];
      rowIdx /= p.dims[d];
      for (size_t k = 0; k < n; ++k)
        base[k] += idx[d] * p.strides[k][d];
    }
    int64_t col = begin % inner;
    for (int64_t i = begin; i < end;) {
      int64_t len = std::min(inner - col, end - i);
      for (size_t k = 0; k < n; ++k)
        off[k] = base[k] + col * p.innerStride(k);
      row(i, llvm::ArrayRef<int64_t>(off), len);
      i += len;
      col = 0;
      for (int64_t d = outerRank - 1; d >= 0; --d) {
        for (size_t k = 0; k < n; ++k)
          base[k] += p.strides[k][d];
        if (++idx[d] < p.dims[d])
          break;
        for (size_t k = 0; k < n; ++k)
          base[k] -= p.strides[k][d] * p.dims[d];
        idx[d] = 0;
      }
    }
  });
}

// o = f(a, b) with broadcasting; A, B, O are storage types and f works on
// their Compute types. `o` may be the same buffer as `a` when shapes match.
template <typename A, typename B, typename O, typename F>
void binaryMap(const TensorRef &a, const TensorRef &b, const TensorRef &o,
               F f) {
  using CO = typename Elem<O>::Compute;
  const A *pa = a.as<A>();
  const B *pb = b.as<B>();
  O *po = o.as<O>();
  auto apply = [&](auto x, auto y) {
    return Elem<O>::store(static_cast<CO>(f(x, y)));
  };
  int64_t total = o.numElements();
  if (total == 0)
    return;
  if (a.numElements() == total && b.numElements() == total) {
    parallelFor(total, kGrain, [&](int64_t s, int64_t e) {
      for (int64_t i = s; i < e; ++i)
        po[i] = apply(Elem<A>::load(pa[i]), Elem<B>::load(pb[i]));
    });
    return;
  }
  TensorRef ins[] = {a, b};
  BroadcastPlan p = planBroadcast(o.shape, ins);
  bool sa = p.innerStride(0), sb = p.innerStride(1);
  forEachRow(p, total, [&](int64_t oi, llvm::ArrayRef<int64_t> off,
                           int64_t len) {
    const A *x = pa + off[0];
    const B *y = pb + off[1];
    O *z = po + oi;
    if (sa && sb) {
      for (int64_t j = 0; j < len; ++j)
        z[j] = apply(Elem<A>::load(x[j]), Elem<B>::load(y[j]));
    } else if (sa) {
      auto yv = Elem<B>::load(y[0]);
      for (int64_t j = 0; j < len; ++j)
        z[j] = apply(Elem<A>::load(x[j]), yv);
    } else if (sb) {
      auto xv = Elem<A>::load(x[0]);
      for (int64_t j = 0; j < len; ++j)
        z[j] = apply(xv, Elem<B>::load(y[j]));
    } else {
      O v = apply(Elem<A>::load(x[0]), Elem<B>::load(y[0]));
      std::fill(z, z + len, v);
    }
  });
}

// ---------------------------------------------------------------------------
// Kernel bodies.

template <typename T, typename F>
void unaryMap(const TensorRef &in, const TensorRef &out, F f) {
  using C = typename Elem<T>::Compute;
  const T *x = in.as<T>();
  T *y = out.as<T>();
  parallelFor(in.numElements(), kMathGrain, [&](int64_t s, int64_t e) {
    for (int64_t i = s; i < e; ++i)
      y[i] = Elem<T>::store(static_cast<C>(f(Elem<T>::load(x[i]))));
  });
}

// f32 and f64 through an array function of VectorMath.h, f(in, n, out)
// per chunk; false (nothing done) for the other element types.
template <typename F> bool vectorMath(const KernelCall &c, F f) {
  const TensorRef &in = c.inputs[0], &out = c.outputs[0];
  if (in.dtype != ir::DType::F32 && in.dtype != ir::DType::F64)
    return false;
  parallelFor(in.numElements(), kMathGrain, [&](int64_t s, int64_t e) {
    if (in.dtype == ir::DType::F32)
      f(in.as<float>() + s, e - s, out.as<float>() + s);
    else
      f(in.as<double>() + s, e - s, out.as<double>() + s);
  });
  return true;
}

template <typename Ts, typename F>
llvm::Error unary(const KernelCall &c, F f) {
  return dispatch(c.inputs[0].dtype, Ts{}, [&](auto tag) {
    unaryMap<decltype(tag)>(c.inputs[0], c.outputs[0], f);
    return llvm::Error::success();
  });
}

// Same-type binary op: arithmetic (O = T) or comparison (O = bool).
template <typename Ts, bool BoolOut = false, typename F>
llvm::Error binary(const KernelCall &c, F f) {
  return dispatch(c.inputs[0].dtype, Ts{}, [&](auto tag) {
    using T = decltype(tag);
    using O = std::conditional_t<BoolOut, bool, T>;
    binaryMap<T, T, O>(c.inputs[0], c.inputs[1], c.outputs[0], f);
    return llvm::Error::success();
  });
}

llvm::Error copyKernel(const KernelCall &c) {
  const TensorRef &in = c.inputs[0], &out = c.outputs[0];
  size_t bytes = size_t(in.numElements()) * ir::dtypeSize(in.dtype);
  if (bytes && in.data != out.data)
    std::memcpy(out.data, in.data, bytes);
  return llvm::Error::success();
}

// Bound of Clip in the element's compute type (saturated for integers).
template <typename C> C clipBound(float v) {
  if constexpr (kIsInt<C>)
    return saturatingTrunc<C>(double(v));
  else
    return C(v);
}

llvm::Error clip(const KernelCall &c) {
  float lo = c.getFloat("min"), hi = c.getFloat("max");
  return dispatch(c.inputs[0].dtype, NumericTypes{}, [&](auto tag) {
    using T = decltype(tag);
    using C = typename Elem<T>::Compute;
    C l = clipBound<C>(lo), h = clipBound<C>(hi);
    // Min(max, Max(x, min)): with min > max every value becomes max; NaN
    // stays NaN.
    unaryMap<T>(c.inputs[0], c.outputs[0], [l, h](C x) {
      C y = x < l ? l : x;
      return y > h ? h : y;
    });
    return llvm::Error::success();
  });
}

llvm::Error cast(const KernelCall &c) {
  const TensorRef &in = c.inputs[0], &out = c.outputs[0];
  if (in.dtype == out.dtype)
    return copyKernel(c);
  return dispatch(in.dtype, AllTypes{}, [&](auto s) {
    using S = decltype(s);
    return dispatch(out.dtype, AllTypes{}, [&](auto d) {
      using D = decltype(d);
      const S *x = in.as<S>();
      D *y = out.as<D>();
      parallelFor(in.numElements(), kGrain, [&](int64_t b, int64_t e) {
        for (int64_t i = b; i < e; ++i)
          y[i] = convertElem<D>(x[i]);
      });
      return llvm::Error::success();
    });
  });
}

llvm::Error divide(const KernelCall &c) {
  return dispatch(c.inputs[0].dtype, NumericTypes{},
                  [&](auto tag) -> llvm::Error {
    using T = decltype(tag);
    const TensorRef &a = c.inputs[0], &b = c.inputs[1];
    if constexpr (kIsInt<T>) {
      const T *pb = b.as<T>();
      const T *end = pb + b.numElements();
      if (std::find(pb, end, T(0)) != end)
        return kernelError(c, "integer division by zero (input 1 holds a 0)");
      // Truncates like C; x / -1 is negation so that lowest / -1 wraps
      // instead of trapping.
      binaryMap<T, T, T>(a, b, c.outputs[0], [](T x, T y) {
        return y == T(-1) ? wrapNeg(x) : T(x / y);
      });
    } else {
      binaryMap<T, T, T>(a, b, c.outputs[0],
                         [](auto x, auto y) { return x / y; });
    }
    return llvm::Error::success();
  });
}

// Mod (ONNX): fmod 1 is C's remainder (the dividend's sign: std::fmod, and
// % for integers); fmod 0, integers only, takes the divisor's sign, as
// Python's %. An integer 0 divisor is an error, as in Div.
llvm::Error modulo(const KernelCall &c) {
  bool fmod = c.getInt("fmod") == 1;
  return dispatch(c.inputs[0].dtype, NumericTypes{},
                  [&](auto tag) -> llvm::Error {
    using T = decltype(tag);
    const TensorRef &a = c.inputs[0], &b = c.inputs[1];
    if constexpr (kIsInt<T>) {
      const T *pb = b.as<T>();
      const T *end = pb + b.numElements();
      if (std::find(pb, end, T(0)) != end)
        return kernelError(c, "integer modulo by zero (input 1 holds a 0)");
      // x % -1 is 0 (lowest % -1 would trap).
      binaryMap<T, T, T>(a, b, c.outputs[0], [fmod](T x, T y) {
        if (y == T(-1))
          return T(0);
        T r = T(x % y);
        if (!fmod && r != 0 && ((r < 0) != (y < 0)))
          r = T(r + y);
        return r;
      });
    } else {
      if (!fmod)
        return kernelError(c, "float operands need fmod = 1");
      binaryMap<T, T, T>(a, b, c.outputs[0],
                         [](auto x, auto y) { return std::fmod(x, y); });
    }
    return llvm::Error::success();
  });
}

// Gelu-20 in the element's compute type: x * Phi(x), Phi through erf
// ("none") or the tanh approximation ("tanh").
template <typename C> C geluValue(C x, bool tanhForm) {
  if (tanhForm) {
    const C beta = C(0.7978845608028654); // sqrt(2 / pi)
    const C kappa = C(0.044715);
    return C(0.5) * x * (C(1) + std::tanh(beta * (x + kappa * x * x * x)));
  }
  return C(0.5) * x * (C(1) + std::erf(x * C(0.7071067811865476)));
}

// A bool result per float element (IsNaN, IsInf).
template <typename F> llvm::Error floatPredicate(const KernelCall &c, F f) {
  return dispatch(c.inputs[0].dtype, FloatTypes{}, [&](auto tag) {
    using T = decltype(tag);
    const T *x = c.inputs[0].as<T>();
    bool *y = c.outputs[0].as<bool>();
    parallelFor(c.inputs[0].numElements(), kMathGrain,
                [&](int64_t s, int64_t e) {
                  for (int64_t i = s; i < e; ++i)
                    y[i] = f(Elem<T>::load(x[i]));
                });
    return llvm::Error::success();
  });
}

// x^n for integers by squaring, wrapping on overflow. A negative n gives
// the truncated value of 1 / x^|n|.
template <typename T, typename E> T intPow(T x, E n) {
  if (n < 0) {
    if (x == 1)
      return 1;
    if (x == -1)
      return (n % 2) ? T(-1) : T(1);
    return 0;
  }
  T result = 1;
  while (n) {
    if (n & 1)
      result = wrapMul(result, x);
    x = wrapMul(x, x);
    n >>= 1;
  }
  return result;
}

template <typename CA, typename CB> CA powValue(CA a, CB b) {
  if constexpr (kIsInt<CA> && kIsInt<CB>)
    return intPow(a, int64_t(b));
  else if constexpr (kIsInt<CA>)
    return saturatingTrunc<CA>(std::pow(double(a), double(b)));
  else if constexpr (std::is_same_v<CA, float> && std::is_same_v<CB, float>)
    return std::pow(a, b);
  else
    return CA(std::pow(double(a), double(b)));
}

// Pow's result has the base's type; the exponent may have any numeric type.
// An exponent of another type is widened to f64 first (exact for every
// integer exponent that could matter), which keeps the instantiations down
// to one per base type and one per same-typed pair.
llvm::Error power(const KernelCall &c) {
  const TensorRef &a = c.inputs[0], &b = c.inputs[1], &o = c.outputs[0];
  return dispatch(a.dtype, NumericTypes{}, [&](auto baseTag) {
    using A = decltype(baseTag);
    using CA = typename Elem<A>::Compute;
    auto run = [&](const TensorRef &exp, auto expTag) -> llvm::Error {
      using B = decltype(expTag);
      using CB = typename Elem<B>::Compute;
      // x^2 is common (variance, squared error) and much cheaper as x*x;
      // x^1 is its gradient's power (2 x^(2-1)), and x exactly. Both are
      // the exact results pow rounds to (x*x one rounding, x none); libm's
      // pow took 11 ns an element.
      if constexpr (!kIsInt<CA>) {
        if (exp.numElements() == 1 && Elem<B>::load(*exp.as<B>()) == CB(2)) {
          binaryMap<A, B, A>(a, exp, o, [](CA x, CB) { return x * x; });
          return llvm::Error::success();
        }
        if (exp.numElements() == 1 && Elem<B>::load(*exp.as<B>()) == CB(1)) {
          binaryMap<A, B, A>(a, exp, o, [](CA x, CB) { return x; });
          return llvm::Error::success();
        }
      }
      binaryMap<A, B, A>(a, exp, o,
                         [](CA x, CB y) { return powValue<CA, CB>(x, y); });
      return llvm::Error::success();
    };
    if (b.dtype == a.dtype)
      return run(b, A{});
    std::vector<double> wide(b.numElements());
    if (auto e = dispatch(b.dtype, NumericTypes{}, [&](auto expTag) {
          using B = decltype(expTag);
          const B *pb = b.as<B>();
          for (size_t i = 0; i < wide.size(); ++i)
            wide[i] = double(Elem<B>::load(pb[i]));
          return llvm::Error::success();
        }))
      return e;
    TensorRef wideRef{DType::F64, b.shape, wide.data()};
    return run(wideRef, double{});
  });
}

// Max/Min over 1..N broadcast inputs; NaN wins, as in numpy.maximum.
template <bool IsMax> llvm::Error minMax(const KernelCall &c) {
  if (c.inputs.size() == 1)
    return copyKernel(c);
  const TensorRef &o = c.outputs[0];
  return dispatch(o.dtype, NumericTypes{}, [&](auto tag) {
    using T = decltype(tag);
    using C = typename Elem<T>::Compute;
    auto pick = [](C a, C b) -> C {
      if constexpr (IsMax)
        return (a > b || a != a) ? a : b;
      else
        return (a < b || a != a) ? a : b;
    };
    binaryMap<T, T, T>(c.inputs[0], c.inputs[1], o, pick);
    for (size_t i = 2; i < c.inputs.size(); ++i)
      binaryMap<T, T, T>(o, c.inputs[i], o, pick);
    return llvm::Error::success();
  });
}

// Where over elements of any type, copied as unsigned integers of their
// width; the condition is read as bytes (nonzero = true).
template <typename U> void whereTyped(const KernelCall &c) {
  const TensorRef &o = c.outputs[0];
  int64_t total = o.numElements();
  if (total == 0)
    return;
  BroadcastPlan p = planBroadcast(o.shape, c.inputs);
  const uint8_t *cond = c.inputs[0].as<uint8_t>();
  const U *x = c.inputs[1].as<U>(), *y = c.inputs[2].as<U>();
  U *z = o.as<U>();
  // Inner strides are 0 or 1 (planBroadcast): one loop for each of the
  // eight cases, so each compiles to a select over contiguous or repeated
  // elements (a masked_fill's causal mask and -inf scalar ran at a
  // nanosecond an element through multiplied strides).
  auto rows = [&](auto sc, auto sx, auto sy) {
    forEachRow(p, total, [&](int64_t oi, llvm::ArrayRef<int64_t> off,
                             int64_t len) {
      const uint8_t *cr = cond + off[0];
      const U *xr = x + off[1], *yr = y + off[2];
      U *zr = z + oi;
      for (int64_t j = 0; j < len; ++j)
        zr[j] = cr[sc ? j : 0] ? xr[sx ? j : 0] : yr[sy ? j : 0];
    });
  };
  using T = std::true_type;
  using F = std::false_type;
  auto withY = [&](auto sc, auto sx) {
    p.innerStride(2) ? rows(sc, sx, T{}) : rows(sc, sx, F{});
  };
  auto withX = [&](auto sc) {
    p.innerStride(1) ? withY(sc, T{}) : withY(sc, F{});
  };
  p.innerStride(0) ? withX(T{}) : withX(F{});
}

llvm::Error where(const KernelCall &c) {
  switch (ir::dtypeSize(c.inputs[1].dtype)) {
  case 1:
    whereTyped<uint8_t>(c);
    break;
  case 2:
    whereTyped<uint16_t>(c);
    break;
  case 4:
    whereTyped<uint32_t>(c);
    break;
  default:
    whereTyped<uint64_t>(c);
    break;
  }
  return llvm::Error::success();
}

} // namespace

void registerElementwiseKernels(KernelTable &t) {
  const auto floats = dtypesOf(FloatTypes{});
  const auto numeric = dtypesOf(NumericTypes{});
  const auto all = dtypesOf(AllTypes{});
  const std::vector<DType> boolOnly = {DType::Bool};
  const auto bitwise = dtypesOf(BitwiseTypes{});
  using E = llvm::Error;
  using KC = const KernelCall &;

  // Unary.
  t.add(OpKind::Abs, [](KC c) -> E {
    return unary<NumericTypes>(c, [](auto x) { return x < 0 ? wrapNeg(x) : x; });
  }, numeric);
  t.add(OpKind::Neg, [](KC c) -> E {
    return unary<NumericTypes>(c, [](auto x) { return wrapNeg(x); });
  }, numeric);
  t.add(OpKind::Relu, [](KC c) -> E {
    return unary<NumericTypes>(
        c, [](auto x) { return x < 0 ? decltype(x)(0) : x; });
  }, numeric);
  t.add(OpKind::LeakyRelu, [](KC c) -> E {
    float alpha = c.getFloat("alpha");
    double alpha64 = ir::decimalWidened(alpha);
    return unary<FloatTypes>(c, [alpha, alpha64](auto x) {
      using C = decltype(x);
      C a = std::is_same_v<C, double> ? C(alpha64) : C(alpha);
      return x < 0 ? x * a : x;
    });
  }, floats);
  t.add(OpKind::Exp, [](KC c) -> E {
    if (vectorMath(c, [](auto *x, int64_t n, auto *y) {
          expShifted(x, n, 0.0, 1.0, y);
        }))
      return llvm::Error::success();
    return unary<FloatTypes>(c, [](auto x) { return std::exp(x); });
  }, floats);
  t.add(OpKind::Log, [](KC c) -> E {
    return unary<FloatTypes>(c, [](auto x) { return std::log(x); });
  }, floats);
  t.add(OpKind::Sqrt, [](KC c) -> E {
    return unary<FloatTypes>(c, [](auto x) { return std::sqrt(x); });
  }, floats);
  t.add(OpKind::Tanh, [](KC c) -> E {
    if (vectorMath(c, [](auto *x, int64_t n, auto *y) { tanhArray(x, n, y); }))
      return llvm::Error::success();
    return unary<FloatTypes>(c, [](auto x) { return std::tanh(x); });
  }, floats);
  t.add(OpKind::Erf, [](KC c) -> E {
    if (vectorMath(c, [](auto *x, int64_t n, auto *y) { erfArray(x, n, y); }))
      return llvm::Error::success();
    return unary<FloatTypes>(c, [](auto x) { return std::erf(x); });
  }, floats);
  t.add(OpKind::Reciprocal, [](KC c) -> E {
    return unary<FloatTypes>(c, [](auto x) { return decltype(x)(1) / x; });
  }, floats);
  t.add(OpKind::Sigmoid, [](KC c) -> E {
    if (vectorMath(c,
                   [](auto *x, int64_t n, auto *y) { sigmoidArray(x, n, y); }))
      return llvm::Error::success();
    // exp of a non-positive argument only, so large |x| cannot overflow.
    return unary<FloatTypes>(c, [](auto x) {
      using C = decltype(x);
      if (x >= 0)
        return C(1) / (C(1) + std::exp(-x));
      C e = std::exp(x);
      return e / (C(1) + e);
    });
  }, floats);
  // x * sigmoid(x), the bits of Sigmoid then Mul (VectorMath.h).
  t.add(OpKind::Silu, [](KC c) -> E {
    if (vectorMath(c, [](auto *x, int64_t n, auto *y) { siluArray(x, n, y); }))
      return llvm::Error::success();
    return unary<FloatTypes>(c, [](auto x) {
      using C = decltype(x);
      C s = x >= 0 ? C(1) / (C(1) + std::exp(-x))
                   : std::exp(x) / (C(1) + std::exp(x));
      return C(x * s);
    });
  }, floats);
  // The trigonometric and hyperbolic functions: libm's, in the compute
  // type.
#define CLEAVE_LIBM_UNARY(Op, fn)                                              \
  t.add(OpKind::Op, [](KC c) -> E {                                            \
    return unary<FloatTypes>(c, [](auto x) { return std::fn(x); });            \
  }, floats);
  CLEAVE_LIBM_UNARY(Sin, sin)
  CLEAVE_LIBM_UNARY(Cos, cos)
  CLEAVE_LIBM_UNARY(Tan, tan)
  CLEAVE_LIBM_UNARY(Asin, asin)
  CLEAVE_LIBM_UNARY(Acos, acos)
  CLEAVE_LIBM_UNARY(Atan, atan)
  CLEAVE_LIBM_UNARY(Sinh, sinh)
  CLEAVE_LIBM_UNARY(Cosh, cosh)
  CLEAVE_LIBM_UNARY(Asinh, asinh)
  CLEAVE_LIBM_UNARY(Acosh, acosh)
  CLEAVE_LIBM_UNARY(Atanh, atanh)
#undef CLEAVE_LIBM_UNARY
  t.add(OpKind::Gelu, [](KC c) -> E {
    bool tanhForm = c.getString("approximate") == "tanh";
    if (!tanhForm && c.getString("approximate") != "none")
      return kernelError(c, "approximate must be \"none\" or \"tanh\", not "
                            "\"{0}\"", c.getString("approximate"));
    // f32 through VectorMath (erf to 1e-7, a float's rounding); f64 keeps
    // libm's erf and tanh.
    if (c.inputs[0].dtype == DType::F32 &&
        vectorMath(c, [tanhForm](auto *x, int64_t n, auto *y) {
          geluArray(x, n, tanhForm, y);
        }))
      return llvm::Error::success();
    return unary<FloatTypes>(
        c, [tanhForm](auto x) { return geluValue(x, tanhForm); });
  }, floats);
  t.add(OpKind::Floor, [](KC c) -> E {
    return unary<FloatTypes>(c, [](auto x) { return std::floor(x); });
  }, floats);
  t.add(OpKind::Ceil, [](KC c) -> E {
    return unary<FloatTypes>(c, [](auto x) { return std::ceil(x); });
  }, floats);
  // Halves to even (the default rounding mode), as ONNX and torch.round.
  t.add(OpKind::Round, [](KC c) -> E {
    return unary<FloatTypes>(c, [](auto x) { return std::nearbyint(x); });
  }, floats);
  // -1, 0 or 1; NaN stays NaN.
  t.add(OpKind::Sign, [](KC c) -> E {
    return unary<NumericTypes>(c, [](auto x) {
      using C = decltype(x);
      if (x != x)
        return x;
      return C(int(x > C(0)) - int(x < C(0)));
    });
  }, numeric);
  t.add(OpKind::HardSigmoid, [](KC c) -> E {
    float alpha = c.getFloat("alpha"), beta = c.getFloat("beta");
    if (isPyTorchHardSigmoid(alpha, beta))
      return unary<FloatTypes>(c, [](auto x) {
        using C = decltype(x);
        return std::min(std::max(x + C(3), C(0)), C(6)) / C(6);
      });
    return unary<FloatTypes>(c, [alpha, beta](auto x) {
      using C = decltype(x);
      return std::max(C(0), std::min(C(1), C(alpha) * x + C(beta)));
    });
  }, floats);
  // PyTorch's F.hardswish: x * min(max(x + 3, 0), 6) / 6.
  t.add(OpKind::HardSwish, [](KC c) -> E {
    return unary<FloatTypes>(c, [](auto x) {
      using C = decltype(x);
      return x * std::min(std::max(x + C(3), C(0)), C(6)) / C(6);
    });
  }, floats);
  t.add(OpKind::IsNaN, [](KC c) -> E {
    return floatPredicate(c, [](auto x) { return std::isnan(x); });
  }, floats);
  t.add(OpKind::IsInf, [](KC c) -> E {
    bool neg = c.getInt("detect_negative"), pos = c.getInt("detect_positive");
    return floatPredicate(c, [=](auto x) {
      return std::isinf(x) && (x > 0 ? pos : neg);
    });
  }, floats);
  // Not, And, Or, Xor: logical on bool, bitwise on integers.
  t.add(OpKind::Not, [](KC c) -> E {
    return unary<BitwiseTypes>(c, [](auto x) {
      if constexpr (std::is_same_v<decltype(x), bool>)
        return !x;
      else
        return decltype(x)(~x);
    });
  }, bitwise);
  t.add(OpKind::Identity, copyKernel, all);
  t.add(OpKind::StopGradient, copyKernel, all);
  t.add(OpKind::Clip, clip, numeric);
  t.add(OpKind::Cast, cast, all);

  // Binary and variadic.
  t.add(OpKind::Add, [](KC c) -> E {
    return binary<NumericTypes>(c, [](auto a, auto b) { return wrapAdd(a, b); });
  }, numeric);
  t.add(OpKind::Sub, [](KC c) -> E {
    return binary<NumericTypes>(c, [](auto a, auto b) { return wrapSub(a, b); });
  }, numeric);
  t.add(OpKind::Mul, [](KC c) -> E {
    return binary<NumericTypes>(c, [](auto a, auto b) { return wrapMul(a, b); });
  }, numeric);
  t.add(OpKind::Div, divide, numeric);
  t.add(OpKind::Pow, power, numeric);
  t.add(OpKind::Max, minMax<true>, numeric);
  t.add(OpKind::Min, minMax<false>, numeric);
  t.add(OpKind::Equal, [](KC c) -> E {
    return binary<AllTypes, true>(c, [](auto a, auto b) { return a == b; });
  }, all);
  t.add(OpKind::Greater, [](KC c) -> E {
    return binary<NumericTypes, true>(c, [](auto a, auto b) { return a > b; });
  }, numeric);
  t.add(OpKind::Less, [](KC c) -> E {
    return binary<NumericTypes, true>(c, [](auto a, auto b) { return a < b; });
  }, numeric);
  t.add(OpKind::GreaterOrEqual, [](KC c) -> E {
    return binary<NumericTypes, true>(c, [](auto a, auto b) { return a >= b; });
  }, numeric);
  t.add(OpKind::LessOrEqual, [](KC c) -> E {
    return binary<NumericTypes, true>(c, [](auto a, auto b) { return a <= b; });
  }, numeric);
  t.add(OpKind::Mod, modulo, numeric);
  t.add(OpKind::And, [](KC c) -> E {
    return binary<BitwiseTypes>(
        c, [](auto a, auto b) { return decltype(a)(a & b); });
  }, bitwise);
  t.add(OpKind::Or, [](KC c) -> E {
    return binary<BitwiseTypes>(
        c, [](auto a, auto b) { return decltype(a)(a | b); });
  }, bitwise);
  t.add(OpKind::Xor, [](KC c) -> E {
    return binary<BitwiseTypes>(
        c, [](auto a, auto b) { return decltype(a)(a ^ b); });
  }, bitwise);
  // The dispatch dtype is input 0's: Where's condition, always bool.
  t.add(OpKind::Where, where, boolOnly);
}

} // namespace cleave::runtime::cpu
