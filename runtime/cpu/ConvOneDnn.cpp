#include "runtime/cpu/ConvOneDnn.h"

#include "runtime/cpu/Blas.h"
#include "runtime/cpu/CpuKernels.h"

#include "llvm/Support/FormatVariadic.h"

#include <dlfcn.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <optional>
#include <memory>
#include <mutex>
#include <string_view>
#include <type_traits>
#include <vector>

// Only the types and constants come from the header (Debian's libdnnl-dev);
// the functions are looked up in the library at run time, so the runtime
// runs where libdnnl2 is missing (its convs are then cleave's own).
#if __has_include(<oneapi/dnnl/dnnl_types.h>)
#include <oneapi/dnnl/dnnl_types.h>
#define CLEAVE_ONEDNN_CONV 1
#endif

namespace cleave::runtime::cpu {

const char *convLibraryName(ConvLibrary library) {
  return library == ConvLibrary::OneDnn ? "onednn" : "own";
}

#ifdef CLEAVE_ONEDNN_CONV
namespace {

using Md = dnnl_memory_desc_t;
using Dims2 = const dnnl_dims_t;

// The C API functions cleave calls, from the loaded library.
struct Api {
  dnnl_status_t (*engineCreate)(dnnl_engine_t *, dnnl_engine_kind_t, size_t);
  dnnl_status_t (*streamCreate)(dnnl_stream_t *, dnnl_engine_t, unsigned);
  dnnl_status_t (*streamDestroy)(dnnl_stream_t);
  dnnl_status_t (*mdInit)(Md *, int, const dnnl_dims_t, dnnl_data_type_t,
                          dnnl_format_tag_t);
  int (*mdEqual)(const Md *, const Md *);
  size_t (*mdSize)(const Md *);
  dnnl_status_t (*convForward)(dnnl_convolution_desc_t *, dnnl_prop_kind_t,
                               dnnl_alg_kind_t, const Md *, const Md *,
                               const Md *, const Md *, Dims2, Dims2, Dims2,
                               Dims2);
  dnnl_status_t (*convData)(dnnl_convolution_desc_t *, dnnl_alg_kind_t,
                            const Md *, const Md *, const Md *, Dims2, Dims2,
                            Dims2, Dims2);
  dnnl_status_t (*convWeights)(dnnl_convolution_desc_t *, dnnl_alg_kind_t,
                               const Md *, const Md *, const Md *, const Md *,
                               Dims2, Dims2, Dims2, Dims2);
  dnnl_status_t (*attrCreate)(dnnl_primitive_attr_t *);
  dnnl_status_t (*attrScratchpad)(dnnl_primitive_attr_t,
                                  dnnl_scratchpad_mode_t);
  dnnl_status_t (*pdCreate)(dnnl_primitive_desc_t *, const_dnnl_op_desc_t,
                            const_dnnl_primitive_attr_t, dnnl_engine_t,
                            const_dnnl_primitive_desc_t);
  dnnl_status_t (*reorderPdCreate)(dnnl_primitive_desc_t *, const Md *,
                                   dnnl_engine_t, const Md *, dnnl_engine_t,
                                   const_dnnl_primitive_attr_t);
  dnnl_status_t (*pdDestroy)(dnnl_primitive_desc_t);
  const Md *(*pdQueryMd)(const_dnnl_primitive_desc_t, dnnl_query_t, int);
  dnnl_status_t (*primitiveCreate)(dnnl_primitive_t *,
                                   const_dnnl_primitive_desc_t);
  dnnl_status_t (*primitiveDestroy)(dnnl_primitive_t);
  dnnl_status_t (*execute)(const_dnnl_primitive_t, dnnl_stream_t, int,
                           const dnnl_exec_arg_t *);
  dnnl_status_t (*memoryCreate)(dnnl_memory_t *, const Md *, dnnl_engine_t,
                                void *);
  dnnl_status_t (*memoryDestroy)(dnnl_memory_t);
  dnnl_engine_t engine = nullptr;
  dnnl_primitive_attr_t userScratchpad = nullptr;
};

const Api *loadApi() {
  void *lib = oneDnnLibrary();
  if (!lib)
    return nullptr;
  static Api a;
  bool found = true;
  auto sym = [&](auto &fn, const char *name) {
    fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(
        dlsym(lib, name));
    found = found && fn;
  };
  sym(a.engineCreate, "dnnl_engine_create");
  sym(a.streamCreate, "dnnl_stream_create");
  sym(a.streamDestroy, "dnnl_stream_destroy");
  sym(a.mdInit, "dnnl_memory_desc_init_by_tag");
  sym(a.mdEqual, "dnnl_memory_desc_equal");
  sym(a.mdSize, "dnnl_memory_desc_get_size");
  sym(a.convForward, "dnnl_dilated_convolution_forward_desc_init");
  sym(a.convData, "dnnl_dilated_convolution_backward_data_desc_init");
  sym(a.convWeights, "dnnl_dilated_convolution_backward_weights_desc_init");
  sym(a.attrCreate, "dnnl_primitive_attr_create");
  sym(a.attrScratchpad, "dnnl_primitive_attr_set_scratchpad_mode");
  sym(a.pdCreate, "dnnl_primitive_desc_create");
  sym(a.reorderPdCreate, "dnnl_reorder_primitive_desc_create");
  sym(a.pdDestroy, "dnnl_primitive_desc_destroy");
  sym(a.pdQueryMd, "dnnl_primitive_desc_query_md");
  sym(a.primitiveCreate, "dnnl_primitive_create");
  sym(a.primitiveDestroy, "dnnl_primitive_destroy");
  sym(a.execute, "dnnl_primitive_execute");
  sym(a.memoryCreate, "dnnl_memory_create");
  sym(a.memoryDestroy, "dnnl_memory_destroy");
  if (!found || !oneDnnOneThreadHere())
    return nullptr;
  if (a.engineCreate(&a.engine, dnnl_cpu, 0) != dnnl_success ||
      a.attrCreate(&a.userScratchpad) != dnnl_success ||
      a.attrScratchpad(a.userScratchpad, dnnl_scratchpad_mode_user) !=
          dnnl_success)
    return nullptr;
  return &a;
}

const Api *api() {
  static const Api *a = loadApi();
  return a;
}

// The calling thread's stream, made at its first use and destroyed when
// the thread ends (the pool's threads come and go with --threads).
dnnl_stream_t streamHere() {
  struct Owned {
    dnnl_stream_t stream = nullptr;
    ~Owned() {
      if (stream)
        api()->streamDestroy(stream);
    }
  };
  static thread_local Owned owned;
  if (!owned.stream &&
      api()->streamCreate(&owned.stream, api()->engine,
                          dnnl_stream_default_flags) != dnnl_success)
    owned.stream = nullptr;
  return owned.stream;
}

enum class Pass { Forward, Data, Weights };

// One operand of a primitive: its plain layout (NCHW or OIHW, as cleave
// keeps it), the layout the primitive wants, and the reorder between them
// (user to wanted for inputs, back for the output) when they differ.
struct Operand {
  Md user, want;
  dnnl_primitive_t reorder = nullptr;
  size_t wantBytes = 0;
  bool same() const { return reorder == nullptr; }
};

// A primitive for one pass over one chunk shape. Forward: a = src,
// b = weights, out = dst. Data: a = diff_dst, b = weights, out = diff_src.
// Weights: a = src, b = diff_dst, out = diff_weights.
struct Entry {
  Pass pass;
  dnnl_primitive_t primitive = nullptr;
  Operand a, b, out;
  Md bias, scratch;

  Entry() = default;
  Entry(const Entry &) = delete;
  Entry &operator=(const Entry &) = delete;
  // The cache's entries go at exit, before the library's own globals
  // (made when it was loaded, after the process's start).
  ~Entry() {
    for (dnnl_primitive_t p : {primitive, a.reorder, b.reorder, out.reorder})
      if (p)
        api()->primitiveDestroy(p);
  }
};

// The conv geometry of a chunk of `images` images, and the pass: the key
// of the primitive cache (the output size follows from the rest).
using Key = std::array<int64_t, 17>;

Key keyOf(Pass pass, const ConvDims &d, int64_t images, bool bias) {
  const WindowGeometry &g = d.g;
  return {int64_t(pass), images,       d.c,            d.m,
          g.in[0],       g.in[1],      g.kernel[0],    g.kernel[1],
          g.strides[0],  g.strides[1], g.dilations[0], g.dilations[1],
          g.padBegin[0], g.padBegin[1], g.padEnd[0],    g.padEnd[1],
          int64_t(bias)};
}

bool initMd(Md &md, std::initializer_list<int64_t> dims,
            dnnl_format_tag_t tag) {
  dnnl_dims_t v{};
  int n = 0;
  for (int64_t x : dims)
    v[n++] = x;
  return api()->mdInit(&md, n, v, dnnl_f32, tag) == dnnl_success;
}

// Fills op's wanted layout from the primitive and makes the reorder.
bool prepareOperand(const dnnl_primitive_desc_t pd, dnnl_query_t query,
                    bool input, Operand &op) {
  const Api &a = *api();
  const Md *want = a.pdQueryMd(pd, query, 0);
  if (!want)
    return false;
  op.want = *want;
  op.wantBytes = a.mdSize(&op.want);
  if (a.mdEqual(&op.user, &op.want))
    return true;
  dnnl_primitive_desc_t rpd;
  const Md &from = input ? op.user : op.want, &to = input ? op.want : op.user;
  if (a.reorderPdCreate(&rpd, &from, a.engine, &to, a.engine, nullptr) !=
      dnnl_success)
    return false;
  bool ok = a.primitiveCreate(&op.reorder, rpd) == dnnl_success;
  a.pdDestroy(rpd);
  return ok;
}

// Builds the primitive of `pass` for chunks of `images` images; null when
// oneDNN has no implementation for the shape.
std::unique_ptr<Entry> build(Pass pass, const ConvDims &d, int64_t images,
                             bool withBias) {
  const Api &a = *api();
  const WindowGeometry &g = d.g;
  auto e = std::make_unique<Entry>();
  e->pass = pass;
  Md src, weights, dst, srcAny, weightsAny, dstAny;
  bool ok =
      initMd(src, {images, d.c, g.in[0], g.in[1]}, dnnl_nchw) &&
      initMd(weights, {d.m, d.c, g.kernel[0], g.kernel[1]}, dnnl_oihw) &&
      initMd(dst, {images, d.m, g.out[0], g.out[1]}, dnnl_nchw) &&
      initMd(srcAny, {images, d.c, g.in[0], g.in[1]}, dnnl_format_tag_any) &&
      initMd(weightsAny, {d.m, d.c, g.kernel[0], g.kernel[1]},
             dnnl_format_tag_any) &&
      initMd(dstAny, {images, d.m, g.out[0], g.out[1]}, dnnl_format_tag_any) &&
      initMd(e->bias, {d.m}, dnnl_x);
  if (!ok)
    return nullptr;
  dnnl_dims_t strides{g.strides[0], g.strides[1]};
  dnnl_dims_t dilates{g.dilations[0] - 1, g.dilations[1] - 1};
  dnnl_dims_t padL{g.padBegin[0], g.padBegin[1]};
  dnnl_dims_t padR{g.padEnd[0], g.padEnd[1]};
  // The forward primitive: the one run (Forward) or the gradients' hint.
  dnnl_convolution_desc_t fwd;
  if (a.convForward(&fwd, dnnl_forward_training, dnnl_convolution_direct,
                    &srcAny, &weightsAny,
                    pass == Pass::Forward && withBias ? &e->bias : nullptr,
                    &dstAny, strides, dilates, padL, padR) != dnnl_success)
    return nullptr;
  dnnl_primitive_desc_t hint;
  if (a.pdCreate(&hint, &fwd, a.userScratchpad, a.engine, nullptr) !=
      dnnl_success)
    return nullptr;
  dnnl_primitive_desc_t pd = hint;
  if (pass != Pass::Forward) {
    dnnl_convolution_desc_t bwd;
    dnnl_status_t s =
        pass == Pass::Data
            ? a.convData(&bwd, dnnl_convolution_direct, &srcAny, &weightsAny,
                         &dstAny, strides, dilates, padL, padR)
            : a.convWeights(&bwd, dnnl_convolution_direct, &srcAny,
                            &weightsAny, nullptr, &dstAny, strides, dilates,
                            padL, padR);
    if (s != dnnl_success ||
        a.pdCreate(&pd, &bwd, a.userScratchpad, a.engine, hint) !=
            dnnl_success) {
      a.pdDestroy(hint);
      return nullptr;
    }
  }
  switch (pass) {
  case Pass::Forward:
    e->a.user = src, e->b.user = weights, e->out.user = dst;
    ok = prepareOperand(pd, dnnl_query_src_md, true, e->a) &&
         prepareOperand(pd, dnnl_query_weights_md, true, e->b) &&
         prepareOperand(pd, dnnl_query_dst_md, false, e->out);
    break;
  case Pass::Data:
    e->a.user = dst, e->b.user = weights, e->out.user = src;
    ok = prepareOperand(pd, dnnl_query_diff_dst_md, true, e->a) &&
         prepareOperand(pd, dnnl_query_weights_md, true, e->b) &&
         prepareOperand(pd, dnnl_query_diff_src_md, false, e->out);
    break;
  case Pass::Weights:
    e->a.user = src, e->b.user = dst, e->out.user = weights;
    ok = prepareOperand(pd, dnnl_query_src_md, true, e->a) &&
         prepareOperand(pd, dnnl_query_diff_dst_md, true, e->b) &&
         prepareOperand(pd, dnnl_query_diff_weights_md, false, e->out);
    break;
  }
  if (ok) {
    const Md *scratch = a.pdQueryMd(pd, dnnl_query_scratchpad_md, 0);
    ok = scratch != nullptr;
    if (ok)
      e->scratch = *scratch;
    ok = ok && a.primitiveCreate(&e->primitive, pd) == dnnl_success;
  }
  if (pd != hint)
    a.pdDestroy(pd);
  a.pdDestroy(hint);
  return ok ? std::move(e) : nullptr;
}

// The primitives made so far, kept for the process (as oneDNN's own cache
// keeps them); a shape oneDNN has no implementation for is remembered as
// null.
const Entry *entryFor(Pass pass, const ConvDims &d, int64_t images,
                      bool bias) {
  static std::mutex mu;
  static std::map<Key, std::unique_ptr<Entry>> cache;
  Key key = keyOf(pass, d, images, bias);
  std::lock_guard<std::mutex> lock(mu);
  auto it = cache.find(key);
  if (it == cache.end()) {
    oneDnnOneThreadHere();
    it = cache.emplace(key, build(pass, d, images, bias)).first;
  }
  return it->second.get();
}

// A chunk's multiply-adds should be about this many: enough that a
// primitive call's fixed costs stay small, few enough that a batch of 16
// small images still makes a task per thread.
constexpr int64_t kChunkMacs = int64_t(1) << 23;

// Images per chunk: by the shape alone, so the chunks, and the bits, are
// the same on any number of threads; a divisor of the batch, so every
// chunk runs one primitive (and the weight gradient's partial sums share
// one layout).
int64_t chunkImages(const ConvDims &d) {
  int64_t perImage =
      std::max<int64_t>(1, d.m * d.c * d.g.kernelSize * d.g.outSize);
  int64_t images = std::clamp<int64_t>(ceilDiv(kChunkMacs, perImage), 1, d.n);
  while (d.n % images)
    --images;
  return images;
}

// A growing 64-byte aligned buffer per thread and purpose, kept between
// calls (fresh megabytes per call would be fresh pages each time).
struct Buffer {
  void *data = nullptr;
  size_t size = 0;
  Buffer() = default;
  Buffer(const Buffer &) = delete;
  Buffer &operator=(const Buffer &) = delete;
  ~Buffer() { std::free(data); }
  void *get(size_t bytes) {
    if (bytes > size) {
      std::free(data);
      size = (bytes + 63) / 64 * 64;
      data = std::aligned_alloc(64, size);
    }
    return data;
  }
};

// A dnnl_memory_t over a pointer, destroyed at scope end.
struct Memory {
  dnnl_memory_t m = nullptr;
  Memory(const Md &md, const void *p) {
    if (api()->memoryCreate(&m, &md, api()->engine, const_cast<void *>(p)) !=
        dnnl_success)
      m = nullptr;
  }
  ~Memory() {
    if (m)
      api()->memoryDestroy(m);
  }
  Memory(const Memory &) = delete;
  Memory &operator=(const Memory &) = delete;
};

bool reorder(dnnl_primitive_t r, const Md &fromMd, const void *from,
             const Md &toMd, void *to) {
  Memory src(fromMd, from), dst(toMd, to);
  if (!src.m || !dst.m)
    return false;
  dnnl_exec_arg_t args[2] = {{DNNL_ARG_FROM, src.m}, {DNNL_ARG_TO, dst.m}};
  return api()->execute(r, streamHere(), 2, args) == dnnl_success;
}

// An input operand in the wanted layout: the user's bytes, or the reorder
// of them into `buffer`.
const void *wanted(const Operand &op, const void *user, Buffer &buffer,
                   bool &ok) {
  if (op.same())
    return user;
  void *p = buffer.get(op.wantBytes);
  ok = ok && reorder(op.reorder, op.user, user, op.want, p);
  return p;
}

struct ChunkPlan {
  int64_t images, count;
  const Entry *entry;
};

std::optional<ChunkPlan> chunkPlan(Pass pass, const ConvDims &d, bool bias) {
  if (!api())
    return std::nullopt;
  int64_t images = chunkImages(d);
  const Entry *e = entryFor(pass, d, images, bias);
  if (!e)
    return std::nullopt;
  return ChunkPlan{images, d.n / images, e};
}

llvm::Error failure(const char *what, const ConvDims &d) {
  return llvm::createStringError(
      llvm::inconvertibleErrorCode(),
      llvm::formatv("oneDNN's {0} convolution failed on input [{1}, {2}, {3}, "
                    "{4}] with {5} filters; CLEAVE_CONV=own runs cleave's own "
                    "kernels",
                    what, d.n, d.c, d.g.in[0], d.g.in[1], d.m)
          .str());
}

// The primitive's arguments: a, b and out by the pass (see Entry).
bool execute(const Entry &e, const void *a, const void *b, void *out,
             const float *bias, void *scratch) {
  static constexpr int kArgs[3][3] = {
      {DNNL_ARG_SRC, DNNL_ARG_WEIGHTS, DNNL_ARG_DST},
      {DNNL_ARG_DIFF_DST, DNNL_ARG_WEIGHTS, DNNL_ARG_DIFF_SRC},
      {DNNL_ARG_SRC, DNNL_ARG_DIFF_DST, DNNL_ARG_DIFF_WEIGHTS}};
  const int *arg = kArgs[int(e.pass)];
  Memory am(e.a.want, a), bm(e.b.want, b), om(e.out.want, out),
      sm(e.scratch, scratch), biasm(e.bias, bias);
  if (!am.m || !bm.m || !om.m || !sm.m)
    return false;
  dnnl_exec_arg_t args[5] = {{arg[0], am.m},
                             {arg[1], bm.m},
                             {arg[2], om.m},
                             {DNNL_ARG_SCRATCHPAD, sm.m},
                             {DNNL_ARG_BIAS, biasm.m}};
  int count = e.pass == Pass::Forward && bias && biasm.m ? 5 : 4;
  return api()->execute(e.primitive, streamHere(), count, args) ==
         dnnl_success;
}

// Runs the chunks on the pool. aOf(first) and bOf(first) are the user
// pointers of the chunk starting at image `first`; with sharedB, b is the
// weights, the same for every chunk, reordered once per entry before the
// loop. outOf(chunk, first) is where the chunk's output goes: in the user's
// layout (reordered there when the primitive wants another), or with
// outWanted in the primitive's own (the weight gradient's partial sums).
template <typename AOf, typename BOf, typename OutOf>
bool runChunks(const ChunkPlan &p, const float *bias, bool sharedB,
               bool outWanted, AOf aOf, BOf bOf, OutOf outOf) {
  const Entry &e = *p.entry;
  static thread_local Buffer weights;
  const void *shared = nullptr;
  bool ok = true;
  if (sharedB) {
    oneDnnOneThreadHere();
    shared = wanted(e.b, bOf(0), weights, ok);
  }
  if (!ok)
    return false;
  std::atomic<bool> allOk{true};
  parallelTasks(p.count, [&](int64_t chunk) {
    oneDnnOneThreadHere();
    static thread_local Buffer aBuf, bBuf, outBuf, scratch;
    int64_t first = chunk * p.images;
    bool fine = true;
    const void *a = wanted(e.a, aOf(first), aBuf, fine);
    const void *b = sharedB ? shared : wanted(e.b, bOf(first), bBuf, fine);
    void *user = outOf(chunk, first);
    void *out = outWanted || e.out.same() ? user : outBuf.get(e.out.wantBytes);
    fine = fine && execute(e, a, b, out, bias,
                           scratch.get(api()->mdSize(&e.scratch) + 64));
    if (fine && out != user)
      fine = reorder(e.out.reorder, e.out.want, out, e.out.user, user);
    if (!fine)
      allOk.store(false, std::memory_order_relaxed);
  });
  return allOk.load();
}

bool takes(const ConvDims &d) {
  const WindowGeometry &g = d.g;
  if (convLibrary() != ConvLibrary::OneDnn || g.rank() != 2 ||
      d.groups != 1 || d.n <= 0 || d.c <= 0 || d.m <= 0 || g.outSize < 16)
    return false;
  // Every tap reads inside the input somewhere: the first and last of
  // each dim (the taps between lie between them).
  for (size_t k = 0; k < 2; ++k)
    for (int64_t tap : {int64_t(0), g.kernel[k] - 1}) {
      auto [lo, hi] = insideRange(tap * g.dilations[k] - g.padBegin[k],
                                  g.strides[k], g.out[k], g.in[k]);
      if (lo >= hi)
        return false;
    }
  return true;
}

} // namespace

bool oneDnnTakesConv(const ConvDims &d) {
  // The three passes' primitives are made here, so a shape oneDNN cannot
  // run stays on cleave's kernels for all of them.
  return takes(d) && chunkPlan(Pass::Forward, d, false) &&
         chunkPlan(Pass::Data, d, false) && chunkPlan(Pass::Weights, d, false);
}

namespace {
// Forward and backward-data: `in` (x or dy) and `out` (y or dx) cut into
// chunks of images, the weights shared by every chunk.
llvm::Error runSharedWeights(Pass pass, const ConvDims &d, const float *in,
                             int64_t inImage, const float *w,
                             const float *bias, float *out, int64_t outImage,
                             const char *what) {
  auto p = chunkPlan(pass, d, bias != nullptr);
  if (!p || !runChunks(
                *p, bias, /*sharedB=*/true, /*outWanted=*/false,
                [&](int64_t first) { return in + first * inImage; },
                [&](int64_t) { return w; },
                [&](int64_t, int64_t first) { return out + first * outImage; }))
    return failure(what, d);
  return llvm::Error::success();
}
} // namespace

llvm::Error oneDnnConvForward(const ConvDims &d, const float *x,
                              const float *w, const float *bias, float *y) {
  return runSharedWeights(Pass::Forward, d, x, d.c * d.g.inSize, w, bias, y,
                          d.m * d.g.outSize, "forward");
}

llvm::Error oneDnnConvGradData(const ConvDims &d, const float *dy,
                               const float *w, float *dx) {
  return runSharedWeights(Pass::Data, d, dy, d.m * d.g.outSize, w, nullptr,
                          dx, d.c * d.g.inSize, "backward-data");
}

llvm::Error oneDnnConvGradFilter(const ConvDims &d, const float *x,
                                 const float *dy, float *dw) {
  auto p = chunkPlan(Pass::Weights, d, false);
  if (!p)
    return failure("backward-weights", d);
  // Each chunk's gradient in the primitive's layout, side by side.
  const Operand &out = p->entry->out;
  size_t slot = (out.wantBytes + 63) / 64 * 64;
  static thread_local Buffer partials;
  auto *base = static_cast<uint8_t *>(partials.get(slot * size_t(p->count)));
  int64_t xImage = d.c * d.g.inSize, yImage = d.m * d.g.outSize;
  if (!runChunks(
          *p, nullptr, /*sharedB=*/false, /*outWanted=*/true,
          [&](int64_t first) { return x + first * xImage; },
          [&](int64_t first) { return dy + first * yImage; },
          [&](int64_t chunk, int64_t) { return base + slot * size_t(chunk); }))
    return failure("backward-weights", d);
  // The chunks' sums in chunk order, element by element (the same bits on
  // any number of threads), then into the user's layout.
  auto *sum = reinterpret_cast<float *>(base);
  int64_t count = int64_t(out.wantBytes / sizeof(float));
  parallelFor(count, 1 << 14, [&](int64_t b, int64_t e) {
    for (int64_t c = 1; c < p->count; ++c) {
      const auto *part =
          reinterpret_cast<const float *>(base + slot * size_t(c));
      for (int64_t i = b; i < e; ++i)
        sum[i] += part[i];
    }
  });
  if (out.same())
    std::memcpy(dw, sum, out.wantBytes);
  else if (!reorder(out.reorder, out.want, sum, out.user, dw))
    return failure("backward-weights", d);
  return llvm::Error::success();
}

ConvLibrary defaultConvLibrary() {
  static const ConvLibrary library = [] {
    const char *env = std::getenv("CLEAVE_CONV");
    std::string_view want = env ? env : "auto";
    if (want == "own")
      return ConvLibrary::Own;
    if (want == "onednn") {
      if (api())
        return ConvLibrary::OneDnn;
      std::fprintf(stderr,
                   "cleave: error: CLEAVE_CONV=onednn, but libdnnl.so.2 "
                   "cannot be loaded; install the Debian package libdnnl2 "
                   "or unset CLEAVE_CONV\n");
      std::exit(1);
    }
    if (want != "auto") {
      std::fprintf(stderr,
                   "cleave: error: CLEAVE_CONV=%s: expected own, onednn or "
                   "auto\n",
                   env);
      std::exit(1);
    }
    return cpuHasAvx512Core() && api() ? ConvLibrary::OneDnn
                                       : ConvLibrary::Own;
  }();
  return library;
}

static std::atomic<ConvLibrary> &chosenConvLibrary() {
  static std::atomic<ConvLibrary> chosen = defaultConvLibrary();
  return chosen;
}

ConvLibrary convLibrary() { return chosenConvLibrary().load(); }

bool setConvLibrary(ConvLibrary library) {
  if (library == ConvLibrary::OneDnn && !api())
    return false;
  chosenConvLibrary().store(library);
  return true;
}

#else // no oneDNN header at build time: cleave's own kernels only

ConvLibrary defaultConvLibrary() { return ConvLibrary::Own; }
ConvLibrary convLibrary() { return ConvLibrary::Own; }
bool setConvLibrary(ConvLibrary library) { return library == ConvLibrary::Own; }
bool oneDnnTakesConv(const ConvDims &) { return false; }
static llvm::Error unavailable() {
  return llvm::createStringError(llvm::inconvertibleErrorCode(),
                                 "this build has no oneDNN convolutions");
}
llvm::Error oneDnnConvForward(const ConvDims &, const float *, const float *,
                              const float *, float *) {
  return unavailable();
}
llvm::Error oneDnnConvGradData(const ConvDims &, const float *, const float *,
                               float *) {
  return unavailable();
}
llvm::Error oneDnnConvGradFilter(const ConvDims &, const float *,
                                 const float *, float *) {
  return unavailable();
}

#endif

} // namespace cleave::runtime::cpu
