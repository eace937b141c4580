// Device code of SGD and AdamW (DeviceCode.h).
#pragma once

#include "runtime/cuda/DeviceElements.h"

namespace cleave::runtime::cuda {

// --- optimizers ------------------------------------------------------------------

// SGD and AdamW, element by element, in double (runtime/cpu/Optimizers.cpp).
// lr and step are one-element tensors read in the kernel, so a changed
// learning rate needs no new launch parameters.
struct OptimizerStep {
  bool adamw = false;
  int64_t n = 0;
  const void *param = nullptr, *grad = nullptr, *lr = nullptr,
             *step = nullptr;
  Elem elem = Elem::F32, lrElem = Elem::F32, stepElem = Elem::F32;
  const void *m = nullptr, *v = nullptr; // SGD: m is the velocity (or null)
  void *paramOut = nullptr, *mOut = nullptr, *vOut = nullptr;
  Elem mElem = Elem::F32, vElem = Elem::F32;
  double gradScale = 1, momentum = 0, weightDecay = 0, beta1 = 0.9,
         beta2 = 0.999, epsilon = 1e-8;
  bool nesterov = false;
};

CLEAVE_HD void optimizerElement(const OptimizerStep &s, int64_t i) {
  double lr = load(s.lr, s.lrElem, 0);
  double g = double(load(s.grad, s.elem, i)) * s.gradScale;
  double p = load(s.param, s.elem, i);
  if (!s.adamw) {
    g += s.weightDecay * p;
    if (s.m) {
      double vNew = s.momentum * double(load(s.m, s.mElem, i)) + g;
      store(s.mOut, s.mElem, i, float(vNew));
      g = s.nesterov ? g + s.momentum * vNew : vNew;
    }
    store(s.paramOut, s.elem, i, float(p - lr * g));
    return;
  }
  double t = double(load(s.step, s.stepElem, 0)) + 1.0;
  double stepSize = lr / (1.0 - pow(s.beta1, t));
  double c2 = sqrt(1.0 - pow(s.beta2, t));
  p = p * (1.0 - lr * s.weightDecay);
  double mNew = s.beta1 * double(load(s.m, s.mElem, i)) + (1.0 - s.beta1) * g;
  double vNew =
      s.beta2 * double(load(s.v, s.vElem, i)) + (1.0 - s.beta2) * g * g;
  double denom = sqrt(vNew) / c2 + s.epsilon;
  store(s.paramOut, s.elem, i, float(p - stepSize * mNew / denom));
  store(s.mOut, s.mElem, i, float(mNew));
  store(s.vOut, s.vElem, i, float(vNew));
}

} // namespace cleave::runtime::cuda
