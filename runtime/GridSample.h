// GridSample (torch.nn.functional.grid_sample; ONNX GridSample) and its two
// gradients in two spatial dims, written once for both backends: the CPU
// kernels (runtime/cpu/GridSample.cpp) and the CUDA device code
// (runtime/cuda/DeviceGridSample.h) call these per-element functions, so
// the emulated CUDA backend and the CPU give the same bits.
//
// X is [N, C, H, W]; the grid [N, Ho, Wo, 2] holds, per output position,
// (x, y) in [-1, 1] (x indexes W, y indexes H); Y is [N, C, Ho, Wo]. The
// formulas are PyTorch's (its grid sampler's documented semantics):
//   - unnormalize: align_corners maps -1 and 1 to the centres of the corner
//     pixels, x = (g + 1) / 2 * (size - 1); otherwise to their outer edges,
//     x = ((g + 1) * size - 1) / 2;
//   - padding: zeros reads 0 outside; border clamps the coordinate into
//     [0, size - 1]; reflection reflects it at the centres (align_corners)
//     or edges of the border pixels, then clamps;
//   - linear: the four neighbours floor(x), floor(x) + 1 (and y), each
//     weighed by the opposite area, added north-west, north-east,
//     south-west, south-east; nearest: the pixel at x rounded half to even.
// The gradients: dX adds each output gradient times its corner weights
// into the pixels it read, outputs in row-major order, one (n, c) plane at
// a time; dGrid sums over the channels the derivative of the bilinear form
// times the output gradient, times d(coordinate)/d(g) (the unnormalize
// scale, 0 where the padding clamped, -1 where it reflected an odd number
// of times). Nearest has dGrid = 0. Both are sums in a fixed order, so the
// bits do not depend on how threads split the planes or the positions.
#pragma once

#include <cstdint>
#include <math.h>

#ifdef __CUDACC__
#define CLEAVE_GRID_FN __host__ __device__ inline
#else
#define CLEAVE_GRID_FN inline
#endif

namespace cleave::runtime::grid {

enum class Padding : uint8_t { Zeros, Border, Reflection };

struct Geometry {
  int64_t n = 0, c = 0, h = 0, w = 0; // X
  int64_t ho = 0, wo = 0;             // the grid's positions
  bool nearest = false, alignCorners = false;
  Padding padding = Padding::Zeros;
};

// The source coordinates of one output position and their derivatives
// with respect to the grid's x and y.
template <typename T> struct Point {
  T x, y, dx, dy;
};

// Clamps v into [0, size - 1]; *d is 1 inside, 0 where it clamped.
template <typename T> CLEAVE_GRID_FN T clipCoord(T v, int64_t size, T *d) {
  if (v <= T(0)) {
    *d = T(0);
    return T(0);
  }
  T hi = T(size - 1);
  if (v >= hi) {
    *d = T(0);
    return hi;
  }
  *d = T(1);
  return v;
}

// Reflects v into [twiceLow / 2, twiceHigh / 2]; *d is +-1.
template <typename T>
CLEAVE_GRID_FN T reflectCoord(T v, int64_t twiceLow, int64_t twiceHigh, T *d) {
  if (twiceLow == twiceHigh) {
    *d = T(0);
    return T(0);
  }
  T lo = T(twiceLow) / T(2), span = T(twiceHigh - twiceLow) / T(2);
  v = v - lo;
  T sign = T(1);
  if (v < T(0)) {
    sign = T(-1);
    v = -v;
  }
  T extra = T(fmod(v, span));
  int64_t flips = int64_t(floor(v / span));
  if (flips % 2 == 0) {
    *d = sign;
    return extra + lo;
  }
  *d = -sign;
  return span - extra + lo;
}

// The source coordinate of grid value v along an axis of `size` pixels.
template <typename T>
CLEAVE_GRID_FN T sourceCoord(const Geometry &g, T v, int64_t size, T *d) {
  T x, scale;
  if (g.alignCorners) {
    x = (v + T(1)) / T(2) * T(size - 1);
    scale = T(size - 1) / T(2);
  } else {
    x = ((v + T(1)) * T(size) - T(1)) / T(2);
    scale = T(size) / T(2);
  }
  T m = T(1);
  if (g.padding == Padding::Border) {
    x = clipCoord(x, size, &m);
  } else if (g.padding == Padding::Reflection) {
    T r, c;
    x = g.alignCorners ? reflectCoord(x, 0, 2 * (size - 1), &r)
                       : reflectCoord(x, -1, 2 * size - 1, &r);
    x = clipCoord(x, size, &c);
    m = r * c;
  }
  *d = scale * m;
  return x;
}

// Output position q (over N * Ho * Wo) of image n = q / (Ho * Wo).
template <typename T>
CLEAVE_GRID_FN Point<T> sourcePoint(const Geometry &g, const T *grid,
                                    int64_t q) {
  Point<T> p;
  p.x = sourceCoord(g, grid[2 * q], g.w, &p.dx);
  p.y = sourceCoord(g, grid[2 * q + 1], g.h, &p.dy);
  return p;
}

CLEAVE_GRID_FN bool inside(const Geometry &g, int64_t y, int64_t x) {
  return y >= 0 && y < g.h && x >= 0 && x < g.w;
}

// Linear's corners: pixel (y0, x0) and the three after it, and the
// weights north-west, north-east, south-west, south-east.
template <typename T> struct Corners {
  int64_t x0, y0;
  T nw, ne, sw, se;
};
template <typename T> CLEAVE_GRID_FN Corners<T> cornersOf(const Point<T> &p) {
  Corners<T> k;
  T fx = T(floor(p.x)), fy = T(floor(p.y));
  k.x0 = int64_t(fx);
  k.y0 = int64_t(fy);
  T x1 = fx + T(1), y1 = fy + T(1);
  k.nw = (x1 - p.x) * (y1 - p.y);
  k.ne = (p.x - fx) * (y1 - p.y);
  k.sw = (x1 - p.x) * (p.y - fy);
  k.se = (p.x - fx) * (p.y - fy);
  return k;
}

// Nearest's pixel, or false when it lies outside (or the point is NaN).
template <typename T>
CLEAVE_GRID_FN bool nearestOf(const Geometry &g, const Point<T> &p,
                              int64_t *y, int64_t *x) {
  T rx = T(rint(p.x)), ry = T(rint(p.y));
  if (!(rx >= T(0) && rx < T(g.w) && ry >= T(0) && ry < T(g.h)))
    return false;
  *x = int64_t(rx);
  *y = int64_t(ry);
  return true;
}

// A linear point whose corners cannot be indexed (NaN or far outside):
// it reads nothing, as every corner lies outside.
template <typename T> CLEAVE_GRID_FN bool indexable(const Point<T> &p) {
  const T limit = T(1e15);
  return (p.x > -limit) && (p.x < limit) && (p.y > -limit) && (p.y < limit);
}

// Y element e (over N * C * Ho * Wo).
template <typename T>
CLEAVE_GRID_FN void forwardElement(const Geometry &g, const T *x,
                                   const T *grid, T *y, int64_t e) {
  int64_t positions = g.ho * g.wo;
  int64_t pos = e % positions, plane = e / positions;
  int64_t n = plane / g.c;
  Point<T> p = sourcePoint(g, grid, n * positions + pos);
  const T *src = x + plane * g.h * g.w;
  if (g.nearest) {
    int64_t iy, ix;
    y[e] = nearestOf(g, p, &iy, &ix) ? src[iy * g.w + ix] : T(0);
    return;
  }
  T out = T(0);
  if (indexable(p)) {
    Corners<T> k = cornersOf(p);
    int64_t x1 = k.x0 + 1, y1 = k.y0 + 1;
    if (inside(g, k.y0, k.x0))
      out += src[k.y0 * g.w + k.x0] * k.nw;
    if (inside(g, k.y0, x1))
      out += src[k.y0 * g.w + x1] * k.ne;
    if (inside(g, y1, k.x0))
      out += src[y1 * g.w + k.x0] * k.sw;
    if (inside(g, y1, x1))
      out += src[y1 * g.w + x1] * k.se;
  }
  y[e] = out;
}

// dX plane `plane` (over N * C): zeroed, then every output gradient of the
// plane added to the pixels it read, outputs in row-major order.
template <typename T>
CLEAVE_GRID_FN void gradDataPlane(const Geometry &g, const T *dy,
                                  const T *grid, T *dx, int64_t plane) {
  int64_t positions = g.ho * g.wo, pixels = g.h * g.w;
  int64_t n = plane / g.c;
  T *dst = dx + plane * pixels;
  for (int64_t i = 0; i < pixels; ++i)
    dst[i] = T(0);
  const T *grad = dy + plane * positions;
  for (int64_t pos = 0; pos < positions; ++pos) {
    Point<T> p = sourcePoint(g, grid, n * positions + pos);
    T gv = grad[pos];
    if (g.nearest) {
      int64_t iy, ix;
      if (nearestOf(g, p, &iy, &ix))
        dst[iy * g.w + ix] += gv;
      continue;
    }
    if (!indexable(p))
      continue;
    Corners<T> k = cornersOf(p);
    int64_t x1 = k.x0 + 1, y1 = k.y0 + 1;
    if (inside(g, k.y0, k.x0))
      dst[k.y0 * g.w + k.x0] += k.nw * gv;
    if (inside(g, k.y0, x1))
      dst[k.y0 * g.w + x1] += k.ne * gv;
    if (inside(g, y1, k.x0))
      dst[y1 * g.w + k.x0] += k.sw * gv;
    if (inside(g, y1, x1))
      dst[y1 * g.w + x1] += k.se * gv;
  }
}

// dGrid at output position q (over N * Ho * Wo): its x and y.
template <typename T>
CLEAVE_GRID_FN void gradGridPoint(const Geometry &g, const T *dy, const T *x,
                                  const T *grid, T *dgrid, int64_t q) {
  if (g.nearest) {
    dgrid[2 * q] = T(0);
    dgrid[2 * q + 1] = T(0);
    return;
  }
  int64_t positions = g.ho * g.wo, pixels = g.h * g.w;
  int64_t n = q / positions, pos = q % positions;
  Point<T> p = sourcePoint(g, grid, q);
  T gx = T(0), gy = T(0);
  if (indexable(p)) {
    Corners<T> k = cornersOf(p);
    int64_t x1 = k.x0 + 1, y1 = k.y0 + 1;
    T fx = T(k.x0), fy = T(k.y0);
    // Distances to the far sides: x1 - x, y1 - y; to the near ones: x -
    // x0, y - y0.
    T ex = fx + T(1) - p.x, ey = fy + T(1) - p.y, nx = p.x - fx,
      ny = p.y - fy;
    bool inNW = inside(g, k.y0, k.x0), inNE = inside(g, k.y0, x1),
         inSW = inside(g, y1, k.x0), inSE = inside(g, y1, x1);
    for (int64_t c = 0; c < g.c; ++c) {
      const T *src = x + (n * g.c + c) * pixels;
      T go = dy[(n * g.c + c) * positions + pos];
      if (inNW) {
        T v = src[k.y0 * g.w + k.x0];
        gx -= v * ey * go;
        gy -= v * ex * go;
      }
      if (inNE) {
        T v = src[k.y0 * g.w + x1];
        gx += v * ey * go;
        gy -= v * nx * go;
      }
      if (inSW) {
        T v = src[y1 * g.w + k.x0];
        gx -= v * ny * go;
        gy += v * ex * go;
      }
      if (inSE) {
        T v = src[y1 * g.w + x1];
        gx += v * ny * go;
        gy += v * nx * go;
      }
    }
  }
  dgrid[2 * q] = p.dx * gx;
  dgrid[2 * q + 1] = p.dy * gy;
}

} // namespace cleave::runtime::grid
