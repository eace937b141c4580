// Convolutions of small images as GEMMs over the whole batch.
//
// A conv whose output has few positions per image (the 8x8 to 1x1 maps of
// a CNN's last stages, where the channels are many) is, image by image, a
// GEMM only a few columns wide, which OpenBLAS runs at a few GFLOP/s; the
// tap-by-tap paths of ConvPool.cpp and GradientsConvPool.cpp make it one
// such GEMM per tap. Folding the batch puts the images' im2col matrices
// side by side, [R = Cg * prod(kernel), images * positions], so each
// group's three products are one wide GEMM each:
//   forward:          Y_g [Mg, NP] = W_g [Mg, R] * col [R, NP]
//   input gradient:   col = W_g^T * dY_g [Mg, NP], then col2im per image
//   filter gradient:  dW_g = sum over chunks of images of dY_g * col^T
// Kernel taps that meet only padding at every output position (8 of the
// 9 taps of a 3x3 conv on 1x1 maps) are left out of the products.
// Images go in chunks whose size is fixed by the shape (it bounds the
// scratch), the filter gradient adds its chunks in order, and every GEMM is
// cut by the shape alone (parallelGemm): the bits do not depend on the
// thread count.
#pragma once

#include "runtime/cpu/ConvGeometry.h"

namespace cleave::runtime::cpu {

// Whether convs of this shape run batch-folded: few output positions per
// image, and something to compute.
bool foldsBatch(const ConvDims &d);

// Y = Conv(X, W) + bias (bias may be null).
template <typename T>
void convForwardFolded(const ConvDims &d, const T *x, const T *w, const T *bias,
                       T *y);
// dX of Conv from dY and W.
template <typename T>
void convGradDataFolded(const ConvDims &d, const T *dy, const T *w, T *dx);
// dW of Conv from X and dY.
template <typename T>
void convGradFilterFolded(const ConvDims &d, const T *x, const T *dy, T *dw);

} // namespace cleave::runtime::cpu
