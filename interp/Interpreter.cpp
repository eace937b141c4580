#include "interp/Interpreter.h"

#include "passes/MemoryPlan.h"
#include "support/Errors.h"

#include "llvm/Support/FormatVariadic.h"

#include <algorithm>
#include <cstdint>

namespace cleave::interp {

using namespace cleave::ir;

// Memory for `what`, or an error saying how much could not be had: sizes
// here come from the graph's types, which the input file chose.
static llvm::Expected<void *> allocateFor(runtime::Backend &backend,
                                          uint64_t bytes,
                                          const std::string &what) {
  void *p = bytes <= uint64_t(PTRDIFF_MAX) ? backend.allocate(size_t(bytes))
                                           : nullptr;
  if (!p)
    return fail(llvm::formatv("cannot allocate {0} bytes for {1}", bytes,
                              what));
  return p;
}


Interpreter::~Interpreter() {
  for (void *p : owned_)
    backend_.release(p);
  if (arena_)
    backend_.release(arena_);
}

llvm::Expected<std::unique_ptr<Interpreter>>
Interpreter::create(const Graph &g, runtime::Backend &backend) {
  std::unique_ptr<Interpreter> in(new Interpreter(g, backend));
  if (auto e = in->prepare())
    return std::move(e);
  return in;
}

llvm::Error Interpreter::prepare() {
  // Declared tensors: load and copy into backend memory once.
  for (const Value *v : g_.declared()) {
    if (auto e = v->data()->load())
      return fail(std::string(valueKindName(v->kind())) + " %" + v->name() +
                  ": " + llvm::toString(std::move(e)));
    llvm::ArrayRef<uint8_t> bytes = v->data()->bytes();
    auto p = allocateFor(backend_, bytes.size(),
                         std::string(valueKindName(v->kind())) + " %" +
                             v->name());
    if (!p)
      return p.takeError();
    backend_.copyToDevice(*p, bytes.data(), bytes.size());
    owned_.push_back(*p);
    where_[v] = *p;
  }
  // Kernels must exist for every op and its element type.
  for (const auto &op : g_.ops()) {
    DType dt = op->numOperands() ? op->operand(0)->type().dtype : DType::F32;
    if (!backend_.supports(op->kind(), dt))
      return fail(llvm::formatv("{0}: the {1} backend has no kernel for "
                                "{2} on {3}",
                                op->describe(), backend_.name(), op->name(),
                                dtypeName(dt))
                      .str());
  }
  // Lifetimes in op indices: inputs live from -1, results from their op;
  // both until their last use (graph outputs until the end).
  const auto &ops = g_.ops();
  int64_t end = int64_t(ops.size());
  std::vector<const Value *> values;
  std::vector<passes::Lifetime> lifetimes;
  llvm::DenseMap<const Op *, int64_t> index;
  for (int64_t i = 0; i < end; ++i)
    index[ops[i].get()] = i;
  auto lastUse = [&](const Value *v, int64_t from) {
    int64_t last = from;
    for (const Use &u : v->uses())
      last = std::max(last, index[u.user]);
    if (g_.isOutput(v))
      last = end;
    return last;
  };
  auto add = [&](const Value *v, int64_t from) {
    values.push_back(v);
    lifetimes.push_back({from, lastUse(v, from), v->type().byteSize()});
  };
  for (const Value *v : g_.inputs())
    add(v, -1);
  for (int64_t i = 0; i < end; ++i)
    for (const Value *r : ops[i]->results())
      add(r, i);
  // The memory planner codegen uses too (passes/MemoryPlan.h).
  passes::ArenaLayout layout = passes::placeLifetimes(lifetimes);
  for (size_t k = 0; k < values.size(); ++k)
    offset_[values[k]] = layout.offsets[k];
  arenaBytes_ = layout.size;
  auto arena = allocateFor(backend_, uint64_t(arenaBytes_),
                           "the interpreter's arena (every intermediate "
                           "value of the graph)");
  if (!arena)
    return arena.takeError();
  arena_ = *arena;
  for (auto &[v, off] : offset_)
    where_[v] = static_cast<char *>(arena_) + off;
  return llvm::Error::success();
}

llvm::Expected<std::vector<Tensor>>
Interpreter::run(llvm::ArrayRef<Tensor> inputs, uint64_t seed) {
  if (inputs.size() != g_.inputs().size())
    return fail(llvm::formatv("the graph has {0} inputs, {1} given",
                              g_.inputs().size(), inputs.size())
                    .str());
  for (size_t i = 0; i < inputs.size(); ++i) {
    const Value *v = g_.inputs()[i];
    if (inputs[i]->type() != v->type())
      return fail("input '" + v->name() + "' must be " + v->type().str() +
                  ", got " + inputs[i]->type().str());
    if (auto e = inputs[i]->load())
      return fail("input '" + v->name() + "': " + llvm::toString(std::move(e)));
    llvm::ArrayRef<uint8_t> b = inputs[i]->bytes();
    backend_.copyToDevice(where_[v], b.data(), b.size());
  }
  std::vector<runtime::TensorRef> ins, outs;
  const auto &ops = g_.ops();
  for (size_t i = 0; i < ops.size(); ++i) {
    const Op &op = *ops[i];
    ins.clear();
    outs.clear();
    for (const Value *v : op.operands())
      ins.push_back({v->type().dtype, v->type().shape, where_[v]});
    for (const Value *v : op.results())
      outs.push_back({v->type().dtype, v->type().shape, where_[v]});
    runtime::KernelCall call{op.kind(), op.attrs(), ins, outs,
                             seed * 0x9e3779b97f4a7c15ull + i};
    if (auto e = backend_.run(call))
      return fail(op.describe() + ": " + llvm::toString(std::move(e)));
  }
  std::vector<Tensor> results;
  for (const Value *v : g_.outputs()) {
    std::string bytes(v->type().byteSize(), '\0');
    backend_.copyToHost(bytes.data(), where_[v], bytes.size());
    results.push_back(std::make_shared<TensorData>(v->type(), std::move(bytes)));
  }
  return results;
}

} // namespace cleave::interp
