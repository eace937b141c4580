// slice-packed-views: a Gather of one constant index, reading a value
// through Transposes and reshapes, picks a block of rows and columns out
// of the value the views start from. nn.MultiheadAttention's packed
// in-projection is the case that matters: PyTorch exports
//
//   P = x @ W_in^T + b                      [T, B, 3E]
//   Gather(Squeeze(Transpose(Unsqueeze(Reshape(P, [T, B, 3, E])),
//          perm [3, 1, 2, 0, 4])), i)       [T, B, E]   i = 0, 1, 2
//
// which moves all of P once to put Q, K and V first, copies each out, and
// in the backward zeroes three P-sized buffers, scatters into them, sums
// them and moves the sum back. Each Gather here is Slice(Reshape(P,
// [T*B, 3E]), columns [i*E, (i+1)*E)), reshaped to the Gather's shape;
// where the Slices of one value tile its columns exactly they become one
// Split, whose gradient is one Concat.
//
// How a Gather is read: the views from P to the Gather, applied to P's
// row-major strides (a Transpose permutes them, a reshape-like op regroups
// them where the grouped axes are contiguous), give the Gather's element
// (i0, i1, ...) at P's flat offset off + i0*s0 + i1*s1 + .... Merging the
// axes that are contiguous with each other leaves [(L, 1)] (a run of L
// elements) or [(O, S), (L, 1)] (O rows of S elements, L of each): both a
// Slice of P viewed as [N / S, S]. Anything else (a Gather of several
// indices, strided columns, more blocks) stays as it is. Values are the
// same bits: every op involved only moves elements.
#include "passes/Pass.h"

#include "ir/OpInfo.h"
#include "ir/TypeRules.h"

#include <map>
#include <optional>

namespace cleave::passes {
namespace {

using ir::Op;
using ir::OpKind;
using ir::Value;

// A strided view of a row-major value: element (i0, i1, ...) is at
// offset + sum(i_d * strides[d]).
struct View {
  int64_t offset = 0;
  std::vector<int64_t> shape, strides;
};

View contiguous(const ir::Shape &shape) {
  View v;
  v.shape.assign(shape.begin(), shape.end());
  v.strides.resize(shape.size());
  int64_t s = 1;
  for (size_t d = shape.size(); d-- > 0;) {
    v.strides[d] = s;
    s *= shape[d];
  }
  return v;
}

// The axes of size above 1, contiguous neighbours merged: (size, stride)
// from the innermost out.
std::vector<std::pair<int64_t, int64_t>> blocks(const View &v) {
  std::vector<std::pair<int64_t, int64_t>> out;
  for (size_t d = v.shape.size(); d-- > 0;) {
    if (v.shape[d] == 1)
      continue;
    if (!out.empty() && v.strides[d] == out.back().first * out.back().second)
      out.back().first *= v.shape[d];
    else
      out.push_back({v.shape[d], v.strides[d]});
  }
  return out;
}

// v with its elements regrouped into `shape` in row-major order, when each
// new axis lies inside one contiguous block of v.
std::optional<View> reshaped(const View &v, llvm::ArrayRef<int64_t> shape) {
  auto b = blocks(v);
  View out;
  out.offset = v.offset;
  out.shape.assign(shape.begin(), shape.end());
  out.strides.assign(shape.size(), 0);
  size_t j = 0;
  int64_t used = 1; // the part of block j the inner new axes took
  for (size_t d = shape.size(); d-- > 0;) {
    if (shape[d] == 1)
      continue;
    if (j == b.size() || b[j].first % (used * shape[d]) != 0)
      return std::nullopt;
    out.strides[d] = b[j].second * used;
    used *= shape[d];
    if (used == b[j].first) {
      ++j;
      used = 1;
    }
  }
  if (j != b.size())
    return std::nullopt;
  return out;
}

std::optional<View> transposed(const View &v, llvm::ArrayRef<int64_t> perm) {
  if (perm.size() != v.shape.size())
    return std::nullopt;
  View out;
  out.offset = v.offset;
  for (int64_t p : perm) {
    if (p < 0 || p >= int64_t(v.shape.size()))
      return std::nullopt;
    out.shape.push_back(v.shape[p]);
    out.strides.push_back(v.strides[p]);
  }
  return out;
}

bool isView(const Op &op) {
  return op.numOperands() == 1 && op.numResults() == 1 &&
         (op.kind() == OpKind::Transpose ||
          ir::opInfo(op.kind()).has(ir::optrait::LayoutOnly));
}

// The constant index of a Gather of one element, or nothing.
std::optional<int64_t> constantIndex(const Value *v) {
  if (v->kind() != ir::ValueKind::Const || v->type().numElements() != 1 ||
      ir::isFloat(v->type().dtype) || !v->data() || v->type().rank() > 1)
    return std::nullopt;
  if (llvm::Error e = v->data()->load()) {
    llvm::consumeError(std::move(e));
    return std::nullopt;
  }
  return v->data()->getInt(0);
}

// A Gather read as a block of its source: rows [row, row + rows) and
// columns [col, col + cols) of source viewed as [N / width, width].
struct Block {
  Op *gather;
  Value *source;
  int64_t width, row, rows, col, cols;
};

std::optional<Block> readGather(const ir::Graph &g, Op *gather) {
  Value *data = gather->operand(0);
  std::optional<int64_t> index = constantIndex(gather->operand(1));
  if (!index || g.isPinned(data))
    return std::nullopt;
  // The views from the source down to the Gather.
  std::vector<Op *> chain;
  Value *source = data;
  while (Op *def = source->definingOp()) {
    if (!isView(*def))
      break;
    chain.push_back(def);
    source = def->operand(0);
    if (g.isPinned(source))
      break;
  }
  if (chain.empty() || source->type().numElements() == 0)
    return std::nullopt; // (an empty value has no block to slice)
  View v = contiguous(source->type().shape);
  for (auto it = chain.rbegin(); it != chain.rend(); ++it) {
    std::optional<View> next =
        (*it)->kind() == OpKind::Transpose
            ? transposed(v, (*it)->getInts("perm"))
            : reshaped(v, (*it)->result()->type().shape);
    if (!next)
      return std::nullopt;
    v = std::move(*next);
  }
  auto axis = ir::normalizeAxis(gather->getInt("axis"), v.shape.size());
  if (!axis) {
    llvm::consumeError(axis.takeError());
    return std::nullopt;
  }
  int64_t dim = v.shape[*axis], i = *index < 0 ? *index + dim : *index;
  if (i < 0 || i >= dim)
    return std::nullopt;
  v.offset += i * v.strides[*axis];
  v.shape[*axis] = 1;

  auto b = blocks(v);
  const int64_t n = source->type().numElements();
  if (b.empty())
    b.push_back({1, 1});
  if (b[0].second != 1 || b.size() > 2)
    return std::nullopt;
  Block out{gather, source, n, 0, 1, v.offset, b[0].first};
  if (b.size() == 2) {
    out.width = b[1].second;
    out.rows = b[1].first;
    out.row = v.offset / out.width;
    out.col = v.offset % out.width;
  }
  if (out.width < out.cols || n % out.width != 0 ||
      out.col + out.cols > out.width || out.row + out.rows > n / out.width)
    return std::nullopt;
  return out;
}

std::vector<int64_t> shapeVector(const ir::Shape &s) {
  return std::vector<int64_t>(s.begin(), s.end());
}

} // namespace

llvm::Expected<bool> slicePackedViews(ir::Graph &g, const PassContext &) {
  std::map<const Op *, size_t> position;
  std::vector<Block> found;
  for (const auto &op : g.ops()) {
    position[op.get()] = position.size();
    if (op->kind() == OpKind::Gather)
      if (std::optional<Block> b = readGather(g, op.get()))
        found.push_back(*b);
  }
  // One group per source viewed at one width, in the order found.
  std::map<std::pair<Value *, int64_t>, std::vector<Block>> groups;
  std::vector<std::pair<Value *, int64_t>> order;
  for (const Block &b : found) {
    auto key = std::make_pair(b.source, b.width);
    if (!groups.count(key))
      order.push_back(key);
    groups[key].push_back(b);
  }
  for (const auto &key : order) {
    std::vector<Block> &group = groups[key];
    size_t earliest = 0;
    for (size_t i = 1; i < group.size(); ++i)
      if (position[group[i].gather] < position[group[earliest].gather])
        earliest = i;
    Op *first = group[earliest].gather;
    Value *source = key.first;
    const int64_t width = key.second,
                  height = source->type().numElements() / width;
    const ir::DType dt = source->type().dtype;
    Value *matrix = source;
    if (source->type().shape != ir::Shape{height, width})
      matrix = g.insertOpBefore(first, OpKind::Reshape, {source},
                                {ir::TensorType{dt, {height, width}}},
                                {g.uniqueName(source->name() + ".columns")},
                                {{"shape", std::vector<int64_t>{height, width}}},
                                first->loc())
                   ->result();
    std::vector<Value *> slices;
    for (const Block &b : group) {
      Value *out = b.gather->result();
      std::string name = out->name();
      Value *slice =
          g.insertOpBefore(
               b.gather, OpKind::Slice, {matrix},
               {ir::TensorType{dt, {b.rows, b.cols}}},
               {g.uniqueName(name + ".block")},
               {{"axes", std::vector<int64_t>{0, 1}},
                {"starts", std::vector<int64_t>{b.row, b.col}},
                {"ends", std::vector<int64_t>{b.row + b.rows, b.col + b.cols}},
                {"steps", std::vector<int64_t>{1, 1}}},
               b.gather->loc())
              ->result();
      slices.push_back(slice);
      Value *result = slice;
      if (out->type().shape != slice->type().shape)
        result = g.insertOpBefore(b.gather, OpKind::Reshape, {slice},
                                  {out->type()}, {},
                                  {{"shape", shapeVector(out->type().shape)}},
                                  b.gather->loc())
                     ->result();
      g.replaceAllUsesWith(out, result);
      g.eraseOp(b.gather);
      g.rename(result, name);
    }
    // Whole rows whose column ranges tile the width once each: one Split.
    std::map<int64_t, size_t> byColumn;
    bool tiles = group.size() > 1;
    for (size_t i = 0; i < group.size() && tiles; ++i)
      tiles = group[i].row == 0 && group[i].rows == height &&
              byColumn.emplace(group[i].col, i).second;
    int64_t next = 0;
    for (auto &[col, i] : byColumn) {
      tiles = tiles && col == next;
      next += group[i].cols;
    }
    if (!tiles || next != width)
      continue;
    Op *firstSlice = slices[earliest]->definingOp();
    std::vector<ir::TensorType> types;
    std::vector<std::string> names;
    std::vector<int64_t> sizes;
    for (auto &[col, i] : byColumn) {
      types.push_back(slices[i]->type());
      names.push_back(g.uniqueName(slices[i]->name() + ".part"));
      sizes.push_back(group[i].cols);
    }
    Op *split = g.insertOpBefore(firstSlice, OpKind::Split, {matrix}, types,
                                 names, {{"axis", int64_t(1)}, {"split", sizes}},
                                 firstSlice->loc());
    size_t part = 0;
    for (auto &[col, i] : byColumn) {
      Op *slice = slices[i]->definingOp();
      std::string name = slices[i]->name();
      Value *result = split->result(part++);
      g.replaceAllUsesWith(slices[i], result);
      g.eraseOp(slice);
      g.rename(result, name);
    }
  }
  return !found.empty();
}

} // namespace cleave::passes
