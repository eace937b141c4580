// Optimizer kernels for the CPU backend: SGD and AdamW, PyTorch's update
// rules (docs/design/training.md, "Optimizer"). Result k is the new value of
// state operand k; each element's arithmetic runs in double and reads all
// its operands before writing, so an executor may alias a result with its
// state operand.
#include "runtime/cpu/CpuKernels.h"

#include <cmath>
#include <cstring>
#include <type_traits>

namespace cleave::runtime::cpu {
namespace {

// The learning rate (and AdamW's step count) must be one value.
llvm::Error checkScalars(const KernelCall &call,
                         std::initializer_list<size_t> operands) {
  for (size_t i : operands)
    if (call.inputs[i].numElements() != 1)
      return kernelError(call, "operand {0} must be a scalar, got {1}", i,
                         ir::shapeStr(call.inputs[i].shape));
  return llvm::Error::success();
}

// Eight f32 elements of SGD at a time, each in double with the scalar
// loop's operations in its order (the same bits): loads, arithmetic, then
// stores, so a result may be its operand's bytes (the executor updates in
// place) and the loop still runs in vector lanes, which the compiler's
// own vectorizer gives up when the buffers overlap. Built for AVX2, where
// the CPU has it (at x86-64's baseline these lanes ran no faster than the
// scalar loop; with AVX2, 14 GB/s against 7 on 45 MB of parameters, one
// thread, Intel Xeon), in two vectors of four doubles (DoublePair: GCC
// keeps an eight-double vector in memory there): returns where the scalar
// loop goes on, b without it.
#if defined(__x86_64__) && defined(__GNUC__)
#define CLEAVE_AVX2_TARGET __attribute__((target("avx2")))
bool cpuHasAvx2() {
  static const bool has = __builtin_cpu_supports("avx2");
  return has;
}
#else
#define CLEAVE_AVX2_TARGET
bool cpuHasAvx2() { return false; }
#endif
CLEAVE_AVX2_TARGET int64_t sgdLanesAvx2(const float *p, const float *grad,
                                        const float *v, float *pOut,
                                        float *vOut, int64_t b, int64_t e,
                                        double scale, double decay, double lr,
                                        double momentum, bool nesterov) {
  auto load = [](const float *x) { return loadDouble8W<false>(x); };
  auto store = [](float *x, DoublePair d) { storeLanes8(x, d); };
  int64_t i = b;
  for (; i + 8 <= e; i += 8) {
    DoublePair param = load(p + i);
    DoublePair g = load(grad + i) * scale + decay * param;
    if (v) {
      DoublePair vNew = momentum * load(v + i) + g;
      g = nesterov ? g + momentum * vNew : vNew;
      store(vOut + i, vNew);
    }
    store(pOut + i, param - lr * g);
  }
  return i;
}
int64_t sgdLanes(const float *p, const float *grad, const float *v,
                 float *pOut, float *vOut, int64_t b, int64_t e, double scale,
                 double decay, double lr, double momentum, bool nesterov) {
  if (!cpuHasAvx2())
    return b;
  return sgdLanesAvx2(p, grad, v, pOut, vOut, b, e, scale, decay, lr,
                      momentum, nesterov);
}

// optimizer.lr is a float32 scalar; on float64 parameters it stands for the
// decimal the schedule wrote (ir::decimalWidened), as the attributes do.
template <typename T> double lrFor(const TensorRef &t) {
  double v = scalarAsDouble(t);
  return std::is_same_v<T, double> && t.dtype == ir::DType::F32
             ? ir::decimalWidened(float(v))
             : v;
}

// SGD(param, grad, lr[, velocity]) -> param'[, velocity']:
//   g = grad * grad_scale + weight_decay * param
//   with velocity: v' = momentum * v + g; g = nesterov ? g + momentum * v'
//                                                    : v'
//   param' = param - lr * g
template <typename T> llvm::Error sgd(const KernelCall &call) {
  bool hasVelocity = call.inputs.size() == 4;
  double momentum = call.getFloatFor<T>("momentum");
  if (momentum != 0 && !hasVelocity)
    return kernelError(call, "momentum {0} needs a velocity operand", momentum);
  if (auto e = checkScalars(call, {2}))
    return e;
  double scale = call.getFloat("grad_scale"),
         decay = call.getFloatFor<T>("weight_decay"),
         lr = lrFor<T>(call.inputs[2]);
  bool nesterov = call.getInt("nesterov");
  const T *p = call.inputs[0].as<T>(), *grad = call.inputs[1].as<T>();
  const T *v = hasVelocity ? call.inputs[3].as<T>() : nullptr;
  T *pOut = call.outputs[0].as<T>();
  T *vOut = hasVelocity ? call.outputs[1].as<T>() : nullptr;
  parallelFor(call.inputs[0].numElements(), kGrain, [&](int64_t b, int64_t e) {
    int64_t i = b;
    if constexpr (std::is_same_v<T, float>)
      i = sgdLanes(p, grad, v, pOut, vOut, b, e, scale, decay, lr, momentum,
                   nesterov);
    for (; i < e; ++i) {
      double param = p[i], g = grad[i] * scale + decay * param;
      if (hasVelocity) {
        double vNew = momentum * v[i] + g;
        g = nesterov ? g + momentum * vNew : vNew;
        vOut[i] = T(vNew);
      }
      pOut[i] = T(param - lr * g);
    }
  });
  return llvm::Error::success();
}

// AdamW(param, grad, lr, step, m, v) -> param', m', v', with t = step + 1:
//   g = grad * grad_scale; param *= 1 - lr * weight_decay
//   m' = beta1 * m + (1 - beta1) * g; v' = beta2 * v + (1 - beta2) * g^2
//   param' = param - lr / (1 - beta1^t) * m'
//                    / (sqrt(v') / sqrt(1 - beta2^t) + epsilon)
// (the order of operations of PyTorch's AdamW).
template <typename T> llvm::Error adamW(const KernelCall &call) {
  if (auto e = checkScalars(call, {2, 3}))
    return e;
  double scale = call.getFloat("grad_scale"),
         decay = call.getFloatFor<T>("weight_decay"),
         beta1 = call.getFloatFor<T>("beta1"),
         beta2 = call.getFloatFor<T>("beta2"),
         eps = call.getFloatFor<T>("epsilon");
  double lr = lrFor<T>(call.inputs[2]),
         t = scalarAsDouble(call.inputs[3]) + 1;
  double stepSize = lr / (1 - std::pow(beta1, t));
  double correction2Sqrt = std::sqrt(1 - std::pow(beta2, t));
  const T *p = call.inputs[0].as<T>(), *grad = call.inputs[1].as<T>(),
          *m = call.inputs[4].as<T>(), *v = call.inputs[5].as<T>();
  T *pOut = call.outputs[0].as<T>(), *mOut = call.outputs[1].as<T>(),
    *vOut = call.outputs[2].as<T>();
  parallelFor(call.inputs[0].numElements(), kGrain, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) {
      double g = grad[i] * scale;
      double param = p[i] * (1 - lr * decay);
      double mNew = beta1 * m[i] + (1 - beta1) * g;
      double vNew = beta2 * v[i] + (1 - beta2) * g * g;
      double denom = std::sqrt(vNew) / correction2Sqrt + eps;
      pOut[i] = T(param - stepSize * mNew / denom);
      mOut[i] = T(mNew);
      vOut[i] = T(vNew);
    }
  });
  return llvm::Error::success();
}

CLEAVE_FLOAT_DISPATCH(sgdKernel, sgd)
CLEAVE_FLOAT_DISPATCH(adamWKernel, adamW)

} // namespace

void registerOptimizerKernels(KernelTable &t) {
  t.add(ir::OpKind::SGD, sgdKernel, kFloatTypes);
  t.add(ir::OpKind::AdamW, adamWKernel, kFloatTypes);
}

} // namespace cleave::runtime::cpu
