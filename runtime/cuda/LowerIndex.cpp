// The lowering of the index ops (DeviceIndex.h): CumSum, ArgMax/ArgMin,
// TopKIndices and Trilu as lanes, GatherElements and ScatterElements with
// their gradients, ScatterND with its gradients (links in scratch), and
// Tile as a strided copy. Each checks what the CPU kernel checks at the
// plan's shapes; index values it cannot see (they are in device memory).
#include "runtime/cuda/LoweringSupport.h"

#include "llvm/Support/FormatVariadic.h"

#include <optional>

namespace cleave::runtime::cuda {
namespace {

// A step reading x (and indices, where given) into out; with `dims`, the
// dims and row-major strides of that shape.
IndexStep stepOver(const TensorRef &x, const TensorRef *idx,
                   const TensorRef &out,
                   std::optional<llvm::ArrayRef<int64_t>> dims = {}) {
  IndexStep s;
  s.x = x.data;
  s.xElem = *elemOf(x.dtype);
  if (idx) {
    s.idx = idx->data;
    s.idxElem = *elemOf(idx->dtype);
  }
  s.out = out.data;
  s.outElem = *elemOf(out.dtype);
  if (dims) {
    s.rank = int(dims->size());
    std::vector<int64_t> strides = stridesOf(*dims);
    for (int d = 0; d < s.rank; ++d) {
      s.dims[d] = (*dims)[d];
      s.strides[d] = strides[d];
    }
  }
  return s;
}

IndexStep laneStep(IndexOp op, const TensorRef &x, const TensorRef &out,
                   int64_t axis) {
  IndexStep s = stepOver(x, nullptr, out);
  s.op = op;
  s.len = x.shape[axis];
  for (int64_t d = 0; d < axis; ++d)
    s.outer *= x.shape[d];
  for (size_t d = axis + 1; d < x.rank(); ++d)
    s.inner *= x.shape[d];
  return s;
}

llvm::Expected<Steps> lowerLanes(const KernelCall &call) {
  const TensorRef &x = call.inputs[0], &out = call.outputs[0];
  if (call.op == OpKind::Trilu) {
    if (x.rank() < 2)
      return fail(call, "operand " + ir::shapeStr(x.shape) + " has rank < 2");
    IndexStep s = laneStep(IndexOp::Trilu, x, out, x.rank() - 2);
    s.k = call.getInt("k");
    s.upper = call.getInt("upper") != 0;
    s.threads = x.numElements();
    return Steps{s};
  }
  auto axis = axisOf(call, call.getInt("axis"), x.rank());
  if (!axis)
    return axis.takeError();
  switch (call.op) {
  case OpKind::CumSum: {
    IndexStep s = laneStep(IndexOp::CumSum, x, out, *axis);
    s.exclusive = call.getInt("exclusive") != 0;
    s.reverse = call.getInt("reverse") != 0;
    s.threads = s.outer * s.inner;
    return Steps{s};
  }
  case OpKind::ArgMax:
  case OpKind::ArgMin: {
    IndexStep s = laneStep(call.op == OpKind::ArgMax ? IndexOp::ArgMax
                                                     : IndexOp::ArgMin,
                           x, out, *axis);
    if (s.len == 0 && s.outer * s.inner > 0)
      return fail(call, llvm::formatv("axis {0} has no elements", *axis));
    s.last = call.getInt("select_last_index") != 0;
    s.threads = s.outer * s.inner;
    return Steps{s};
  }
  default: { // TopKIndices
    IndexStep s = laneStep(IndexOp::TopK, x, out, *axis);
    s.k = call.getInt("k");
    if (s.k < 0 || s.k > s.len)
      return fail(call, llvm::formatv("k {0} is not within the {1} elements "
                                      "of axis {2}",
                                      s.k, s.len, *axis));
    s.largest = call.getInt("largest") != 0;
    s.threads = s.outer * s.len * s.inner;
    return Steps{s};
  }
  }
}

std::optional<ScatterReduce> scatterReduce(llvm::StringRef r) {
  if (r == "none")
    return ScatterReduce::None;
  if (r == "add")
    return ScatterReduce::Add;
  if (r == "mul")
    return ScatterReduce::Mul;
  if (r == "max")
    return ScatterReduce::Max;
  if (r == "min")
    return ScatterReduce::Min;
  return std::nullopt;
}

// The call's reduction, refused where the CPU refuses it (16-bit floats and
// bool take none only).
llvm::Expected<ScatterReduce> reductionOf(const KernelCall &call, DType t) {
  const std::string &r = call.getString("reduction");
  auto red = scatterReduce(r);
  if (!red)
    return fail(call, "unknown reduction '" + r + "'");
  if (*red != ScatterReduce::None && (t == DType::BF16 || t == DType::Bool))
    return fail(call, "reduction '" + r + "' is not supported for " +
                          std::string(ir::dtypeName(t)));
  return *red;
}

llvm::Error checkIndices(const KernelCall &call, const TensorRef &idx) {
  if (idx.dtype != DType::I64 && idx.dtype != DType::I32)
    return fail(call, "indices must be i64 or i32, not " +
                          std::string(ir::dtypeName(idx.dtype)));
  return llvm::Error::success();
}

// GatherElements (data, indices), ScatterElements (data, indices,
// updates) and their gradients (dY, indices): `shape` is the data's (or
// dY's, or dX's for GatherElementsGrad).
llvm::Expected<Steps> lowerElements(const KernelCall &call) {
  const TensorRef &x = call.inputs[0], &idx = call.inputs[1],
                  &out = call.outputs[0];
  if (auto e = checkIndices(call, idx))
    return std::move(e);
  bool gatherGrad = call.op == OpKind::GatherElementsGrad;
  llvm::ArrayRef<int64_t> shape = gatherGrad ? out.shape : x.shape;
  auto axis = axisOf(call, call.getInt("axis"), shape.size());
  if (!axis)
    return axis.takeError();
  if (idx.rank() != shape.size())
    return fail(call, "indices " + ir::shapeStr(idx.shape) +
                          " must have the rank of data " +
                          ir::shapeStr(shape));
  for (size_t d = 0; d < shape.size(); ++d)
    if (int64_t(d) != *axis && idx.shape[d] > shape[d])
      return fail(call, "indices " + ir::shapeStr(idx.shape) +
                            " are larger than data " + ir::shapeStr(shape));
  IndexStep s = stepOver(x, &idx, out, shape);
  s.axis = int(*axis);
  std::vector<int64_t> idxStrides = stridesOf(idx.shape);
  for (int d = 0; d < s.rank; ++d) {
    s.idxDims[d] = idx.shape[d];
    s.idxStrides[d] = idxStrides[d];
  }
  switch (call.op) {
  case OpKind::GatherElements:
    s.op = IndexOp::GatherElements;
    break;
  case OpKind::GatherElementsGrad:
    if (x.shape != idx.shape)
      return fail(call, "gradient " + ir::shapeStr(x.shape) +
                            " and indices " + ir::shapeStr(idx.shape) +
                            " differ");
    s.op = IndexOp::GatherElementsGrad;
    break;
  case OpKind::ScatterElements: {
    const TensorRef &upd = call.inputs[2];
    if (upd.dtype != x.dtype || upd.shape != idx.shape)
      return fail(call, "updates " + ir::shapeStr(upd.shape) +
                            " do not match indices " +
                            ir::shapeStr(idx.shape));
    auto red = reductionOf(call, x.dtype);
    if (!red)
      return red.takeError();
    s.op = IndexOp::ScatterElements;
    s.upd = upd.data;
    s.reduce = *red;
    break;
  }
  case OpKind::ScatterElementsGradData:
    s.op = IndexOp::ScatterElementsGradData;
    break;
  default:
    s.op = IndexOp::ScatterElementsGradUpdates;
    break;
  }
  s.threads = s.op == IndexOp::GatherElements ||
                      s.op == IndexOp::ScatterElementsGradUpdates
                  ? idx.numElements()
                  : out.numElements();
  return Steps{s};
}

// ScatterND (data, indices, updates) and its gradients (dY, indices): the
// links in scratch, then (but for GradData) the elements of the slices.
llvm::Expected<Steps> lowerScatterND(const KernelCall &call,
                                     const Scratch &scratch) {
  const TensorRef &x = call.inputs[0], &idx = call.inputs[1],
                  &out = call.outputs[0];
  if (auto e = checkIndices(call, idx))
    return std::move(e);
  if (idx.rank() < 1 || idx.shape.back() < 1 ||
      idx.shape.back() > int64_t(x.rank()))
    return fail(call, "indices " + ir::shapeStr(idx.shape) +
                          " do not address data " + ir::shapeStr(x.shape));
  IndexStep s = stepOver(x, &idx, out, x.shape);
  s.width = idx.shape.back();
  s.tuples = idx.numElements() / s.width;
  s.slice = 1;
  for (size_t d = s.width; d < x.rank(); ++d)
    s.slice *= x.shape[d];
  Steps steps;
  switch (call.op) {
  case OpKind::ScatterND: {
    const TensorRef &upd = call.inputs[2];
    if (upd.numElements() != s.tuples * s.slice || upd.dtype != x.dtype)
      return fail(call, "updates " + ir::shapeStr(upd.shape) +
                            " do not match indices " +
                            ir::shapeStr(idx.shape) + " into data " +
                            ir::shapeStr(x.shape));
    auto red = reductionOf(call, x.dtype);
    if (!red)
      return red.takeError();
    s.op = IndexOp::ScatterND;
    s.upd = upd.data;
    s.reduce = *red;
    if (out.data != x.data)
      steps.push_back(copy(x, contiguous(x.shape), out.data,
                           contiguous(x.shape), x.numElements()));
    break;
  }
  case OpKind::ScatterNDGradData:
    s.op = IndexOp::ScatterNDGradData;
    if (out.data != x.data)
      steps.push_back(copy(x, contiguous(x.shape), out.data,
                           contiguous(x.shape), x.numElements()));
    break;
  default:
    if (out.numElements() != s.tuples * s.slice)
      return fail(call, "updates " + ir::shapeStr(out.shape) +
                            " do not match indices " +
                            ir::shapeStr(idx.shape) + " into " +
                            ir::shapeStr(x.shape));
    s.op = IndexOp::ScatterNDGradUpdates;
    break;
  }
  if (s.tuples * s.slice == 0)
    return steps;
  auto links = scratchBlock(call, scratch,
                            size_t(3 * s.tuples) * sizeof(int64_t));
  if (!links)
    return links.takeError();
  s.links = reinterpret_cast<int64_t *>(*links);
  IndexStep link = s;
  link.op = IndexOp::ScatterNDLinks;
  link.threads = s.tuples;
  s.threads = s.tuples * s.slice;
  steps.push_back(link);
  steps.push_back(s);
  return steps;
}

// DFT (complex x [outer, n, inner, 2]): the twiddles into scratch, then
// one thread an output point.
llvm::Expected<Steps> lowerDft(const KernelCall &call, const Scratch &scratch) {
  const TensorRef &x = call.inputs[0], &out = call.outputs[0];
  int64_t rank = x.rank();
  if (rank < 2 || x.shape.back() != 2)
    return fail(call, "input " + ir::shapeStr(x.shape) +
                          " is not complex (a last dim of 2)");
  auto axis = axisOf(call, call.getInt("axis"), rank);
  if (!axis)
    return axis.takeError();
  if (*axis >= rank - 1)
    return fail(call, llvm::formatv("axis {0} is out of range for shape {1}",
                                    call.getInt("axis"),
                                    ir::shapeStr(x.shape)));
  IndexStep s = laneStep(IndexOp::Dft, x, out, *axis);
  s.inner /= 2; // the complex pair
  s.inverse = call.getInt("inverse") != 0;
  s.scale = call.getInt("normalized") != 0 && s.len ? 1.0 / double(s.len) : 1.0;
  s.threads = s.outer * s.len * s.inner;
  if (s.threads == 0)
    return Steps{};
  auto table = scratchBlock(call, scratch, size_t(2 * s.len) * sizeof(double));
  if (!table)
    return table.takeError();
  s.table = reinterpret_cast<double *>(*table);
  IndexStep twiddles = s;
  twiddles.op = IndexOp::DftTwiddles;
  twiddles.threads = s.len;
  return Steps{twiddles, s};
}

} // namespace

llvm::Expected<Steps> lowerIndex(const KernelCall &call,
                                 const Scratch &scratch) {
  switch (call.op) {
  case OpKind::DFT:
    return lowerDft(call, scratch);
  case OpKind::ScatterND:
  case OpKind::ScatterNDGradData:
  case OpKind::ScatterNDGradUpdates:
    return lowerScatterND(call, scratch);
  case OpKind::GatherElements:
  case OpKind::GatherElementsGrad:
  case OpKind::ScatterElements:
  case OpKind::ScatterElementsGradData:
  case OpKind::ScatterElementsGradUpdates:
    return lowerElements(call);
  default:
    return lowerLanes(call);
  }
}

// Tile: output dim d is r_d copies of the input's n_d, so the output read
// row-major over [r_0, n_0, r_1, n_1, ...] is the input at strides [0,
// s_0, 0, s_1, ...]: one strided copy (dims not repeated stay single).
llvm::Expected<Steps> lowerTile(const KernelCall &call) {
  const TensorRef &x = call.inputs[0], &y = call.outputs[0];
  std::vector<int64_t> strides = stridesOf(x.shape), dims, at;
  for (size_t d = 0; d < x.rank(); ++d) {
    int64_t r = x.shape[d] ? y.shape[d] / x.shape[d] : 1;
    if (r != 1) {
      dims.push_back(r);
      at.push_back(0);
    }
    dims.push_back(x.shape[d]);
    at.push_back(strides[d]);
  }
  if (dims.size() > size_t(kMaxRank))
    return fail(call, llvm::formatv("{0} repeated dims of {1} (the CUDA "
                                    "copy takes rank <= {2} with each "
                                    "repeated dim counted twice)",
                                    dims.size() - x.rank(),
                                    ir::shapeStr(x.shape), kMaxRank));
  int64_t n = y.numElements();
  if (n == 0)
    return Steps{};
  return Steps{copy(x, indexer(dims, at), y.data, contiguous(y.shape), n)};
}

} // namespace cleave::runtime::cuda
