// Depthwise 2-D convolutions (one input and one output channel per group:
// MobileNet's and EfficientNet's 3x3 and 5x5 layers) by direct loops.
//
// As GEMMs, each (image, channel) of a depthwise conv is a product one row
// high and prod(kernel) deep: thousands of calls too small for BLAS, and
// an im2col copy prod(kernel) times the input for each. Walked directly,
// the work is a multiply-add per tap and output element along rows that
// the compiler vectorizes. Forward and input gradient go one (image,
// channel) plane per task; the filter gradient one channel per task, its
// taps summed over the images and rows in order, so the bits do not depend
// on the thread count.
#pragma once

#include "runtime/cpu/ConvGeometry.h"

namespace cleave::runtime::cpu {

// Whether the conv is 2-D depthwise with one output channel per group.
bool isDepthwise2d(const ConvDims &d);

// Y = Conv(X, W) + bias (bias may be null).
template <typename T>
void depthwiseForward(const ConvDims &d, const T *x, const T *w, const T *bias,
                      T *y);
// dX of Conv from dY and W.
template <typename T>
void depthwiseGradData(const ConvDims &d, const T *dy, const T *w, T *dx);
// dW of Conv from X and dY.
template <typename T>
void depthwiseGradFilter(const ConvDims &d, const T *x, const T *dy, T *dw);

} // namespace cleave::runtime::cpu
