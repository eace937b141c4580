// Device code of the ops that walk windows (DeviceCode.h): im2col and
// col2im for convolution, pooling and its gradients, and Pad.
#pragma once

#include "runtime/cuda/DeviceElements.h"

namespace cleave::runtime::cuda {

// --- convolution and pooling windows -----------------------------------------

constexpr int kMaxSpatial = kMaxRank - 2;

// The windows of a conv or pool over `rank` spatial dims (NCHW-style
// layouts, one plane per (image, channel)), as runtime/cpu/ConvGeometry.h:
// output position o's window starts at o * stride - padBegin per dim, and
// its tap k reads input coordinate start + k * dilation. Positions and taps
// are flat, row-major over the spatial dims.
struct Window {
  int rank = 0;
  int64_t in[kMaxSpatial] = {}, out[kMaxSpatial] = {},
          kernel[kMaxSpatial] = {};
  int64_t strides[kMaxSpatial] = {}, padBegin[kMaxSpatial] = {},
          padEnd[kMaxSpatial] = {}, dilations[kMaxSpatial] = {};
  int64_t inSize = 1, outSize = 1, kernelSize = 1;
};

// The input position tap t of output position o reads, or -1 where it
// lands in the padding.
CLEAVE_HD int64_t windowInput(const Window &w, int64_t o, int64_t t) {
  int64_t q = 0, step = 1;
  for (int d = w.rank - 1; d >= 0; --d) {
    int64_t od = o % w.out[d], kd = t % w.kernel[d];
    o /= w.out[d];
    t /= w.kernel[d];
    int64_t i = od * w.strides[d] + kd * w.dilations[d] - w.padBegin[d];
    if (i < 0 || i >= w.in[d])
      return -1;
    q += i * step;
    step *= w.in[d];
  }
  return q;
}

// The output position whose tap t reads input position q, or -1 for none
// (each tap of each window reads one input, so there is at most one).
// Taps in decreasing order give those outputs in increasing order.
CLEAVE_HD int64_t windowOutput(const Window &w, int64_t q, int64_t t) {
  int64_t o = 0, step = 1;
  for (int d = w.rank - 1; d >= 0; --d) {
    int64_t qd = q % w.in[d], kd = t % w.kernel[d];
    q /= w.in[d];
    t /= w.kernel[d];
    int64_t at = qd + w.padBegin[d] - kd * w.dilations[d];
    if (at < 0 || at % w.strides[d] != 0 || at / w.strides[d] >= w.out[d])
      return -1;
    o += at / w.strides[d] * step;
    step *= w.out[d];
  }
  return o;
}

// im2col and its adjoint, col2im. Image n's column matrix holds, at
// n * imageStride + row * rowStride + o with row = c * kernelSize + t, the
// input of channel c that tap t of output position o reads, 0 in the
// padding: conv's right-hand operand (group g's rows are its channels').
//   im2col:  one thread per column entry (n, row, o), copied bit for bit
//            from `in` (the images) to `out` (the columns);
//   col2im:  one thread per image element (n, c, q) of `out`, which is
//            the sum of the column entries read from q, in f32 and in
//            increasing tap order as the CPU's col2im adds them: a gather,
//            so deterministic without atomics.
struct Im2colStep {
  bool adjoint = false; // col2im
  Window w;
  int64_t images = 0, channels = 0;
  int64_t imageStride = 0, rowStride = 0; // of the column matrices
  const void *in = nullptr;
  Elem inElem = Elem::F32;
  void *out = nullptr;
  Elem outElem = Elem::F32;
};

CLEAVE_HD int64_t im2colCount(const Im2colStep &s) {
  int64_t perImage = s.adjoint ? s.w.inSize : s.w.kernelSize * s.w.outSize;
  return s.images * s.channels * perImage;
}

CLEAVE_HD void im2colElement(const Im2colStep &s, int64_t i) {
  const Window &w = s.w;
  int64_t rows = s.channels * w.kernelSize;
  if (!s.adjoint) {
    int64_t o = i % w.outSize, row = i / w.outSize % rows,
            n = i / (w.outSize * rows);
    int64_t q = windowInput(w, o, row % w.kernelSize);
    int64_t dst = n * s.imageStride + row * s.rowStride + o;
    if (q < 0)
      store(s.out, s.outElem, dst, 0.0f);
    else
      mapCopyElement(s.in, (n * s.channels + row / w.kernelSize) * w.inSize + q,
                     s.out, dst, elemSize(s.outElem));
    return;
  }
  int64_t q = i % w.inSize, c = i / w.inSize % s.channels,
          n = i / (w.inSize * s.channels);
  float acc = 0.0f;
  for (int64_t t = 0; t < w.kernelSize; ++t) {
    int64_t o = windowOutput(w, q, t);
    if (o >= 0)
      acc += load(s.in, s.inElem,
                  n * s.imageStride + (c * w.kernelSize + t) * s.rowStride + o);
  }
  store(s.out, s.outElem, i, acc);
}

// Pooling, runtime/cpu/ConvPool.cpp and GradientsConvPool.cpp:
//   Max:         y = the window's first maximum (-inf for a window wholly
//                in the padding); `indices`, when asked, its flat index
//                over the whole input (ONNX's), -1 for none;
//   Average:     y = the sum of the taps inside the input (in double) over
//                the window's divisor (windowDivisor);
//   MaxGrad:     dX[q] = the sum of dY over the windows whose first maximum
//                is q (X is the forward input);
//   AverageGrad: dX[q] = the sum of dY / count over the windows that read q.
// The forward kinds take one thread per output element, the gradients one
// per input element, which gathers its windows' shares in increasing output
// order, in f32, the order the CPU adds them: no scatter, no atomics.
enum class PoolKind : uint8_t { Max, Average, MaxGrad, AverageGrad };

struct PoolStep {
  PoolKind kind = PoolKind::Max;
  Window w;
  int64_t planes = 0; // images * channels
  const void *x = nullptr; // X (Max, Average, MaxGrad)
  Elem xElem = Elem::F32;
  const void *dy = nullptr; // dY (the gradients)
  Elem dyElem = Elem::F32;
  void *out = nullptr; // Y or dX
  Elem outElem = Elem::F32;
  int64_t *indices = nullptr; // MaxPool's optional second result
  bool includePad = false;    // AveragePool's count_include_pad
};

CLEAVE_HD int64_t poolCount(const PoolStep &s) {
  bool grad = s.kind == PoolKind::MaxGrad || s.kind == PoolKind::AverageGrad;
  return s.planes * (grad ? s.w.inSize : s.w.outSize);
}

// The tap PyTorch's max pooling picks in output o's window over `plane`:
// the first maximum, or the last NaN (a NaN takes the window from any
// value, so it propagates), as an input position; -1 when no tap lands
// inside the input. The CPU's rule (cpu::takesMax).
CLEAVE_HD int64_t windowArgmax(const PoolStep &s, int64_t plane, int64_t o) {
  int64_t at = -1;
  float best = -INFINITY;
  for (int64_t t = 0; t < s.w.kernelSize; ++t) {
    int64_t q = windowInput(s.w, o, t);
    if (q < 0)
      continue;
    float v = load(s.x, s.xElem, plane * s.w.inSize + q);
    if (at < 0 || v > best || v != v) {
      best = v;
      at = q;
    }
  }
  return at;
}

// AveragePool's divisor for output o: its taps inside the input, or with
// count_include_pad those inside the padded input (the cells a ceil_mode
// window reaches past the end padding never count).
CLEAVE_HD int64_t windowDivisor(const PoolStep &s, int64_t o) {
  const Window &w = s.w;
  int64_t count = 0;
  if (!s.includePad) {
    for (int64_t t = 0; t < w.kernelSize; ++t)
      count += windowInput(w, o, t) >= 0 ? 1 : 0;
    return count;
  }
  count = 1;
  for (int d = w.rank - 1; d >= 0; --d) {
    int64_t start = o % w.out[d] * w.strides[d]; // from the padding's start
    o /= w.out[d];
    int64_t room = w.in[d] + w.padBegin[d] + w.padEnd[d] - start;
    count *= room <= 0 ? 0 : room < w.kernel[d] ? room : w.kernel[d];
  }
  return count;
}

CLEAVE_HD void poolElement(const PoolStep &s, int64_t i) {
  const Window &w = s.w;
  if (s.kind == PoolKind::Max || s.kind == PoolKind::Average) {
    int64_t o = i % w.outSize, plane = i / w.outSize;
    if (s.kind == PoolKind::Max) {
      int64_t at = windowArgmax(s, plane, o);
      store(s.out, s.outElem, i,
            at < 0 ? -INFINITY : load(s.x, s.xElem, plane * w.inSize + at));
      if (s.indices)
        s.indices[i] = at < 0 ? -1 : plane * w.inSize + at;
      return;
    }
    double sum = 0;
    for (int64_t t = 0; t < w.kernelSize; ++t) {
      int64_t q = windowInput(w, o, t);
      if (q >= 0)
        sum += load(s.x, s.xElem, plane * w.inSize + q);
    }
    int64_t count = windowDivisor(s, o);
    store(s.out, s.outElem, i, count ? float(sum / double(count)) : 0.0f);
    return;
  }
  int64_t q = i % w.inSize, plane = i / w.inSize;
  float acc = 0.0f;
  for (int64_t t = w.kernelSize - 1; t >= 0; --t) {
    int64_t o = windowOutput(w, q, t);
    if (o < 0)
      continue;
    float g = load(s.dy, s.dyElem, plane * w.outSize + o);
    if (s.kind == PoolKind::MaxGrad) {
      if (windowArgmax(s, plane, o) == q)
        acc += g;
      continue;
    }
    int64_t count = windowDivisor(s, o);
    if (count)
      acc += float(double(g) / double(count));
  }
  store(s.out, s.outElem, i, acc);
}

// --- padding ---------------------------------------------------------------------

// Pad, runtime/cpu/DataMovement.cpp: output coordinate o of dim d reads
// input coordinate o - padBegin[d] when inside; outside, constant mode
// writes `value` (the raw bits of the element), edge clamps, reflect
// mirrors without repeating the edge (periodic with 2 (n - 1)), wrap
// takes the coordinate modulo n (ir/PadIndex.h, the same rule).
enum class PadMode : uint8_t { Constant, Edge, Reflect, Wrap };

struct PadStep {
  PadMode mode = PadMode::Constant;
  int rank = 0;
  int64_t in[kMaxRank] = {}, out[kMaxRank] = {}, padBegin[kMaxRank] = {};
  const void *src = nullptr;
  void *dst = nullptr;
  int size = 4; // element bytes
  uint64_t value = 0;
  int64_t n = 0; // output elements
};

CLEAVE_HD void padElement(const PadStep &s, int64_t i) {
  int64_t rest = i, q = 0, step = 1;
  bool inside = true;
  for (int d = s.rank - 1; d >= 0; --d) {
    int64_t o = rest % s.out[d], n = s.in[d];
    rest /= s.out[d];
    int64_t c = o - s.padBegin[d];
    if (c < 0 || c >= n) {
      if (s.mode == PadMode::Constant) {
        inside = false;
      } else if (s.mode == PadMode::Wrap) {
        c = ((c % n) + n) % n;
      } else if (s.mode == PadMode::Edge || n == 1) {
        c = c < 0 ? 0 : n - 1;
      } else {
        int64_t period = 2 * (n - 1), m = ((c % period) + period) % period;
        c = m < n ? m : period - m;
      }
    }
    q += c * step;
    step *= n;
  }
  if (inside) {
    mapCopyElement(s.src, q, s.dst, i, s.size);
    return;
  }
  switch (s.size) {
  case 1: static_cast<uint8_t *>(s.dst)[i] = uint8_t(s.value); return;
  case 2: static_cast<uint16_t *>(s.dst)[i] = uint16_t(s.value); return;
  case 4: static_cast<uint32_t *>(s.dst)[i] = uint32_t(s.value); return;
  default: static_cast<uint64_t *>(s.dst)[i] = s.value; return;
  }
}

} // namespace cleave::runtime::cuda
