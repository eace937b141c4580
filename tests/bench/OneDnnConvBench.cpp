// cleave's CPU convolution kernels against oneDNN's (Debian's libdnnl, what
// PyTorch's CPU convolutions run on) on the layer shapes of torchvision
// ResNet-18 and MobileNetV2 at 32x32, batch 16: forward, backward-data and
// backward-weights, median of 20 runs each after 3, f32, on the same
// number of threads (cleave's pool; oneDNN's OpenMP). It also runs each
// oneDNN primitive on 1 thread and compares the bits with the threaded
// run: cleave's training promise (bits independent of the thread count)
// is what decides whether a oneDNN primitive could be a default
// (docs/design/cpu-backend.md).
//   build/tests/cleave-bench-onednn-conv [THREADS]
#include "runtime/Kernel.h"

#include <dnnl.hpp>
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <random>
#include <vector>

using namespace cleave;
using Clock = std::chrono::steady_clock;
using Ints = std::vector<int64_t>;

namespace {

struct Shape {
  const char *name;
  Ints x, w;
  int64_t stride, pad, group;
  Ints y() const {
    Ints s{x[0], w[0]};
    for (size_t d = 2; d < 4; ++d)
      s.push_back((x[d] + 2 * pad - w[d]) / stride + 1);
    return s;
  }
};

const Shape kShapes[] = {
    {"resnet stem 7x7/2 3->64 @32", {16, 3, 32, 32}, {64, 3, 7, 7}, 2, 3, 1},
    {"resnet 3x3 64 @8", {16, 64, 8, 8}, {64, 64, 3, 3}, 1, 1, 1},
    {"resnet 3x3/2 64->128 @8", {16, 64, 8, 8}, {128, 64, 3, 3}, 2, 1, 1},
    {"resnet 3x3 256 @2", {16, 256, 2, 2}, {256, 256, 3, 3}, 1, 1, 1},
    {"resnet 3x3 512 @1", {16, 512, 1, 1}, {512, 512, 3, 3}, 1, 1, 1},
    {"resnet 1x1/2 256->512 @2", {16, 256, 2, 2}, {512, 256, 1, 1}, 2, 0, 1},
    {"mobilenet dw 3x3 96 @16", {16, 96, 16, 16}, {96, 1, 3, 3}, 1, 1, 96},
    {"mobilenet 1x1 96->24 @16", {16, 96, 16, 16}, {24, 96, 1, 1}, 1, 0, 1},
};

int64_t count(const Ints &s) {
  int64_t n = 1;
  for (int64_t d : s)
    n *= d;
  return n;
}

std::vector<float> random(const Ints &s, unsigned seed) {
  std::vector<float> v(size_t(count(s)));
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(-1, 1);
  for (float &x : v)
    x = u(rng);
  return v;
}

double medianMs(const std::function<void()> &f) {
  for (int i = 0; i < 3; ++i)
    f();
  std::vector<double> t;
  for (int i = 0; i < 20; ++i) {
    auto start = Clock::now();
    f();
    t.push_back(
        std::chrono::duration<double, std::milli>(Clock::now() - start).count());
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

// cleave: the three kernels through the backend's kernel interface.
struct Cleave {
  runtime::Backend &backend;
  const Shape &s;
  std::vector<float> x, w, dy, y, dx, dw;

  void run(ir::OpKind op, bool withShape, const Ints &shape, float *a,
           const Ints &as, float *b, const Ints &bs, float *out,
           const Ints &os) {
    ir::AttrMap attrs{{"strides", Ints{s.stride, s.stride}},
                      {"pads", Ints{s.pad, s.pad, s.pad, s.pad}},
                      {"dilations", Ints{1, 1}},
                      {"group", s.group}};
    if (withShape)
      attrs.insert_or_assign("shape", shape);
    runtime::TensorRef ins[2] = {{ir::DType::F32, as, a},
                                 {ir::DType::F32, bs, b}};
    runtime::TensorRef outs[1] = {{ir::DType::F32, os, out}};
    runtime::KernelCall call{op, attrs, ins, outs, 0};
    if (llvm::Error e = backend.run(call)) {
      std::fprintf(stderr, "cleave: %s\n", llvm::toString(std::move(e)).c_str());
      std::exit(1);
    }
  }
  void forward() {
    run(ir::OpKind::Conv, false, {}, x.data(), s.x, w.data(), s.w, y.data(),
        s.y());
  }
  void backwardData() {
    run(ir::OpKind::ConvGradData, true, s.x, dy.data(), s.y(), w.data(), s.w,
        dx.data(), s.x);
  }
  void backwardWeights() {
    run(ir::OpKind::ConvGradFilter, true, s.w, x.data(), s.x, dy.data(),
        s.y(), dw.data(), s.w);
  }
};

// oneDNN: the three primitives on plain NCHW / OIHW (or GOIHW) memory, as
// PyTorch hands them its tensors, letting oneDNN pick its layouts (the
// reorders into them are timed with the primitive, as in PyTorch eager).
struct OneDnn {
  dnnl::engine eng{dnnl::engine::kind::cpu, 0};
  dnnl::stream strm{eng};
  const Shape &s;
  std::vector<float> &x, &w, &dy;
  std::vector<float> y, dx, dw;

  using tag = dnnl::memory::format_tag;
  using dt = dnnl::memory::data_type;

  dnnl::memory::dims weightDims() const {
    if (s.group == 1)
      return {s.w[0], s.w[1], s.w[2], s.w[3]};
    return {s.group, s.w[0] / s.group, s.w[1], s.w[2], s.w[3]};
  }
  tag weightTag() const { return s.group == 1 ? tag::oihw : tag::goihw; }

  OneDnn(const Shape &shape, std::vector<float> &x, std::vector<float> &w,
         std::vector<float> &dy)
      : s(shape), x(x), w(w), dy(dy), y(size_t(count(shape.y()))),
        dx(x.size()), dw(w.size()) {}

  dnnl::memory::desc any(const Ints &d) const {
    return dnnl::memory::desc(dnnl::memory::dims(d.begin(), d.end()), dt::f32,
                              tag::any);
  }
  dnnl::memory user(const Ints &d, std::vector<float> &v) {
    return dnnl::memory({dnnl::memory::dims(d.begin(), d.end()), dt::f32,
                         tag::nchw},
                        eng, v.data());
  }
  dnnl::memory userWeights(std::vector<float> &v) {
    return dnnl::memory({weightDims(), dt::f32, weightTag()}, eng, v.data());
  }
  dnnl::convolution_forward::desc forwardDesc() const {
    dnnl::memory::desc wd(weightDims(), dt::f32, tag::any);
    return dnnl::convolution_forward::desc(
        dnnl::prop_kind::forward_training, dnnl::algorithm::convolution_direct,
        any(s.x), wd, any(s.y()), {s.stride, s.stride}, {s.pad, s.pad},
        {s.pad, s.pad});
  }
  // Runs `prim` after reordering each (user memory, wanted desc) operand
  // into place, then reorders the output back.
  void execute(const dnnl::primitive &prim,
               std::vector<std::pair<int, std::pair<dnnl::memory,
                                                    dnnl::memory::desc>>>
                   ins,
               int outArg, dnnl::memory out, dnnl::memory::desc outDesc) {
    std::unordered_map<int, dnnl::memory> args;
    for (auto &[arg, pair] : ins) {
      auto &[mem, desc] = pair;
      if (mem.get_desc() == desc) {
        args[arg] = mem;
        continue;
      }
      dnnl::memory m(desc, eng);
      dnnl::reorder(mem, m).execute(strm, mem, m);
      args[arg] = m;
    }
    dnnl::memory o = out.get_desc() == outDesc ? out : dnnl::memory(outDesc, eng);
    args[outArg] = o;
    prim.execute(strm, args);
    if (o != out)
      dnnl::reorder(o, out).execute(strm, o, out);
    strm.wait();
  }
  void forward() {
    dnnl::convolution_forward::primitive_desc pd(forwardDesc(), eng);
    execute(dnnl::convolution_forward(pd),
            {{DNNL_ARG_SRC, {user(s.x, x), pd.src_desc()}},
             {DNNL_ARG_WEIGHTS, {userWeights(w), pd.weights_desc()}}},
            DNNL_ARG_DST, user(s.y(), y), pd.dst_desc());
  }
  void backwardData() {
    dnnl::convolution_forward::primitive_desc hint(forwardDesc(), eng);
    dnnl::memory::desc wd(weightDims(), dt::f32, tag::any);
    dnnl::convolution_backward_data::primitive_desc pd(
        {dnnl::algorithm::convolution_direct, any(s.x), wd, any(s.y()),
         {s.stride, s.stride}, {s.pad, s.pad}, {s.pad, s.pad}},
        eng, hint);
    execute(dnnl::convolution_backward_data(pd),
            {{DNNL_ARG_DIFF_DST, {user(s.y(), dy), pd.diff_dst_desc()}},
             {DNNL_ARG_WEIGHTS, {userWeights(w), pd.weights_desc()}}},
            DNNL_ARG_DIFF_SRC, user(s.x, dx), pd.diff_src_desc());
  }
  void backwardWeights() {
    dnnl::convolution_forward::primitive_desc hint(forwardDesc(), eng);
    dnnl::memory::desc wd(weightDims(), dt::f32, tag::any);
    dnnl::convolution_backward_weights::primitive_desc pd(
        {dnnl::algorithm::convolution_direct, any(s.x), wd, any(s.y()),
         {s.stride, s.stride}, {s.pad, s.pad}, {s.pad, s.pad}},
        eng, hint);
    execute(dnnl::convolution_backward_weights(pd),
            {{DNNL_ARG_SRC, {user(s.x, x), pd.src_desc()}},
             {DNNL_ARG_DIFF_DST, {user(s.y(), dy), pd.diff_dst_desc()}}},
            DNNL_ARG_DIFF_WEIGHTS, userWeights(dw), pd.diff_weights_desc());
  }
};

bool same(const std::vector<float> &a, const std::vector<float> &b) {
  return std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

} // namespace

int main(int argc, char **argv) {
  int threads = argc > 1 ? std::atoi(argv[1]) : 2;
  auto backend = runtime::createCpuBackend(threads);
  std::printf("f32, %d threads, median ms of 20 runs; oneDNN %d.%d "
              "(1t = its result on 1 thread has the same bits)\n",
              threads, dnnl_version()->major, dnnl_version()->minor);
  std::printf("%-30s %8s %8s %8s %8s %8s %8s   oneDNN 1t bits (fwd/bwd-d/bwd-w)\n",
              "shape", "cl fwd", "dnnl", "cl B", "dnnl", "cl W", "dnnl");
  for (const Shape &s : kShapes) {
    std::vector<float> x = random(s.x, 1), w = random(s.w, 2),
                       dy = random(s.y(), 3);
    Cleave c{*backend, s, x, w, dy, std::vector<float>(dy.size()),
             std::vector<float>(x.size()), std::vector<float>(w.size())};
    OneDnn d(s, x, w, dy);
    omp_set_num_threads(threads);
    double t[6] = {medianMs([&] { c.forward(); }), medianMs([&] { d.forward(); }),
                   medianMs([&] { c.backwardData(); }),
                   medianMs([&] { d.backwardData(); }),
                   medianMs([&] { c.backwardWeights(); }),
                   medianMs([&] { d.backwardWeights(); })};
    std::vector<float> y = d.y, dx = d.dx, dw = d.dw;
    omp_set_num_threads(1);
    d.forward();
    d.backwardData();
    d.backwardWeights();
    std::printf("%-30s %8.3f %8.3f %8.3f %8.3f %8.3f %8.3f   %s/%s/%s\n",
                s.name, t[0], t[1], t[2], t[3], t[4], t[5],
                same(y, d.y) ? "same" : "DIFF", same(dx, d.dx) ? "same" : "DIFF",
                same(dw, d.dw) ? "same" : "DIFF");
  }
}
