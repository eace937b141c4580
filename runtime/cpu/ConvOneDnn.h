// Convolutions on oneDNN's primitives (Debian's libdnnl2, loaded at run
// time like its sgemm, Blas.h): forward, backward-data and backward-weights
// of f32 2-D convs with one group, where its direct kernels beat cleave's
// im2col and GEMM (docs/design/cpu-backend.md, "Convolutions on oneDNN").
//
// Bits independent of the thread count: the batch is cut into chunks of
// images by the shape alone, each chunk runs one primitive on one thread
// (oneDNN's OpenMP limit is 1 on every pool thread), and backward-weights
// adds the chunks' partial gradients in chunk order.
#pragma once

#include "runtime/cpu/ConvGeometry.h"

#include "llvm/Support/Error.h"

namespace cleave::runtime::cpu {

enum class ConvLibrary { Own, OneDnn };

const char *convLibraryName(ConvLibrary library);
// CLEAVE_CONV (own, onednn or auto, the default: oneDNN where it loads and
// the CPU has AVX-512, as for GEMM). An unknown value or onednn without the
// library is one error line and exit 1.
ConvLibrary defaultConvLibrary();
ConvLibrary convLibrary();
// For tests and benchmarks; false (and no change) when oneDNN is asked for
// but cannot be loaded.
bool setConvLibrary(ConvLibrary library);

// Whether oneDNN runs this f32 conv: the library chosen, 2-D, one group,
// every kernel tap reads inside the input at some output position, and at
// least 4 output positions per image (on smaller maps cleave's batch-folded
// GEMMs over the live taps win, docs/benchmarks.md).
bool oneDnnTakesConv(const ConvDims &d);

llvm::Error oneDnnConvForward(const ConvDims &d, const float *x,
                              const float *w, const float *bias, float *y);
llvm::Error oneDnnConvGradData(const ConvDims &d, const float *dy,
                               const float *w, float *dx);
llvm::Error oneDnnConvGradFilter(const ConvDims &d, const float *x,
                                 const float *dy, float *dw);

} // namespace cleave::runtime::cpu
