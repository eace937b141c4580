// Helpers every lowering file shares (LoweringSupport.h): element types,
// indexers over shapes, the common strided maps, scratch requests.
#include "runtime/cuda/LoweringSupport.h"

#include "llvm/Support/FormatVariadic.h"

#include <algorithm>
#include <cassert>

namespace cleave::runtime::cuda {

using ir::DType;
using ir::OpKind;

llvm::Error fail(const KernelCall &call, const llvm::Twine &why) {
  return llvm::createStringError(llvm::inconvertibleErrorCode(),
                                 std::string(call.info().name) +
                                     " (cuda): " + why.str());
}

std::optional<Elem> elemOf(DType t) {
  switch (t) {
  case DType::F32: return Elem::F32;
  case DType::BF16: return Elem::BF16;
  case DType::I64: return Elem::I64;
  case DType::I32: return Elem::I32;
  case DType::Bool: return Elem::Bool;
  default: return std::nullopt;
  }
}

std::vector<int64_t> stridesOf(llvm::ArrayRef<int64_t> shape) {
  std::vector<int64_t> s(shape.size(), 1);
  for (size_t i = shape.size(); i-- > 1;)
    s[i - 1] = s[i] * shape[i];
  return s;
}

// An indexer over `dims` with the given strides and base, in the fewest
// dimensions that give the same offsets: dimensions of size 1 dropped, and
// a dimension merged into the one inside it where its stride continues
// that one's (a contiguous tensor is one dimension). The offsets of every
// index are the same (both wrap at the product of the dimensions); the
// device divides less.
Indexer indexer(llvm::ArrayRef<int64_t> dims, llvm::ArrayRef<int64_t> strides,
                int64_t base) {
  Indexer ix;
  for (size_t d = 0; d < dims.size(); ++d) {
    if (dims[d] == 1)
      continue;
    if (ix.rank > 0 && dims[d] != 0 &&
        ix.strides[ix.rank - 1] == strides[d] * dims[d] &&
        ix.dims[ix.rank - 1] != 0) {
      ix.dims[ix.rank - 1] *= dims[d];
      ix.strides[ix.rank - 1] = strides[d];
      continue;
    }
    assert(ix.rank < kMaxRank && "an indexer over more than kMaxRank dims");
    ix.dims[ix.rank] = dims[d];
    ix.strides[ix.rank] = strides[d];
    ++ix.rank;
  }
  ix.base = base;
  return ix;
}

Indexer contiguous(llvm::ArrayRef<int64_t> shape) {
  return indexer(shape, stridesOf(shape));
}

int64_t reduceChunk(int64_t outputs, int64_t count) {
  constexpr int64_t kMinChunk = 256, kOutputsBelow = 65536,
                    kMaxPartials = int64_t(1) << 21;
  if (outputs <= 0 || outputs >= kOutputsBelow)
    return 0;
  int64_t chunks = std::min(count / kMinChunk, kMaxPartials / outputs);
  if (chunks < 2)
    return 0;
  return (count + chunks - 1) / chunks;
}

// Reads `in` broadcast (NumPy rules, aligned at the right) over `out`.
Indexer broadcast(llvm::ArrayRef<int64_t> in, llvm::ArrayRef<int64_t> out) {
  std::vector<int64_t> s = stridesOf(in), strides(out.size(), 0);
  size_t lead = out.size() - in.size();
  for (size_t d = 0; d < in.size(); ++d)
    strides[lead + d] = in[d] == 1 ? 0 : s[d];
  return indexer(out, strides);
}

Operand operand(const TensorRef &t, Indexer at) {
  return Operand{t.data, *elemOf(t.dtype), at};
}

// A map writing `out` contiguously, each input broadcast to out's shape.
MapArgs mapOver(MapOp op, const TensorRef &out,
                std::initializer_list<const TensorRef *> ins) {
  MapArgs m;
  m.op = op;
  m.n = out.numElements();
  m.out = out.data;
  m.outElem = *elemOf(out.dtype);
  m.outAt = contiguous(out.shape);
  int i = 0;
  for (const TensorRef *t : ins)
    m.in[i++] = operand(*t, broadcast(t->shape, out.shape));
  return m;
}

// A raw copy of `n` elements of one type, from `from` to `to`.
MapArgs copy(const TensorRef &src, Indexer from, void *dst, Indexer to,
             int64_t n) {
  MapArgs m;
  m.op = MapOp::Copy;
  m.n = n;
  m.in[0] = operand(src, from);
  m.out = dst;
  m.outElem = *elemOf(src.dtype);
  m.outAt = to;
  return m;
}

MapArgs zero(const TensorRef &out) {
  MapArgs m;
  m.op = MapOp::Zero;
  m.n = out.numElements();
  m.out = out.data;
  m.outElem = *elemOf(out.dtype);
  m.outAt = contiguous(out.shape);
  return m;
}

llvm::Expected<int64_t> axisOf(const KernelCall &call, int64_t axis,
                               size_t rank) {
  int64_t a = axis < 0 ? axis + int64_t(rank) : axis;
  if (a < 0 || a >= int64_t(rank))
    return fail(call, llvm::formatv("axis {0} out of range for rank {1}", axis,
                                    rank));
  return a;
}

// Offsets a tensor view by `elements`.
TensorRef at(const TensorRef &t, int64_t elements) {
  TensorRef r = t;
  r.data = static_cast<char *>(t.data) + elements * ir::dtypeSize(t.dtype);
  return r;
}

double *doubles(const Scratch &scratch, int64_t n) {
  return static_cast<double *>(scratch(size_t(std::max<int64_t>(n, 1)) * 8));
}

// --- convolution, pooling, batch normalization ---------------------------

// The call's one scratch request, `bytes` long (none for 0 bytes).
llvm::Expected<char *> scratchBlock(const KernelCall &call,
                                    const Scratch &scratch, size_t bytes) {
  if (bytes == 0)
    return nullptr;
  auto *p = static_cast<char *>(scratch(bytes));
  if (!p)
    return fail(call, llvm::formatv("no scratch memory for {0} bytes", bytes));
  return p;
}

// The windows from input `in` to output `out` ([N, C, spatial...] both)
// with kernel dims `kernel`, and the call's strides, pads and (for the ops
// that have them) dilations.
llvm::Expected<Window> windowOf(const KernelCall &call,
                                llvm::ArrayRef<int64_t> in,
                                llvm::ArrayRef<int64_t> out,
                                llvm::ArrayRef<int64_t> kernel,
                                bool hasDilations) {
  size_t sp = in.size() > 2 ? in.size() - 2 : 0;
  if (sp == 0 || out.size() != in.size() || kernel.size() != sp ||
      out[0] != in[0])
    return fail(call, llvm::formatv("input {0}, output {1} and kernel {2} do "
                                    "not fit together",
                                    ir::shapeStr(in), ir::shapeStr(out),
                                    ir::shapeStr(kernel)));
  const auto &strides = call.getInts("strides"), &pads = call.getInts("pads");
  std::vector<int64_t> dilations(sp, 1);
  if (hasDilations)
    dilations = call.getInts("dilations");
  if (strides.size() != sp || pads.size() != 2 * sp || dilations.size() != sp)
    return fail(call, llvm::formatv("{0} spatial dims need {0} strides, {1} "
                                    "pads and {0} dilations",
                                    sp, 2 * sp));
  Window w;
  w.rank = int(sp);
  for (size_t d = 0; d < sp; ++d) {
    if (strides[d] <= 0 || dilations[d] <= 0)
      return fail(call, "strides and dilations must be positive");
    w.in[d] = in[d + 2];
    w.out[d] = out[d + 2];
    w.kernel[d] = kernel[d];
    w.strides[d] = strides[d];
    w.padBegin[d] = pads[d];
    w.padEnd[d] = pads[sp + d];
    w.dilations[d] = dilations[d];
    w.inSize *= w.in[d];
    w.outSize *= w.out[d];
    w.kernelSize *= w.kernel[d];
  }
  return w;
}

} // namespace cleave::runtime::cuda
