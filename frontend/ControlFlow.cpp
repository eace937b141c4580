// Control flow around static work, as PyTorch's legacy exporter writes it:
// a Loop whose trip count and condition fold to constants
// (torch.tensor_split becomes a Loop that fills a sequence with slices) and
// an If whose condition folds (a shape test). cleave's graphs are static:
// the Loop is unrolled and the If's taken branch inlined at import, every
// body node imported through importNode (so the folder evaluates what it
// can) with the body's values renamed per iteration. A trip count or
// condition known only at run time is refused in one line. Sequences
// (SequenceEmpty, SequenceInsert, SequenceConstruct) are lists of IR values
// at import, as SplitToSequence's are.
#include "frontend/ImportContext.h"

#include "frontend/OnnxNode.h"

#include <map>

namespace cleave::frontend {

using namespace cleave::ir;

// The most iterations an unrolled Loop may take.
static constexpr int64_t kMaxTrips = 4096;

static const onnx::GraphProto *subgraph(const onnx::NodeProto &n,
                                        llvm::StringRef name) {
  for (const auto &a : n.attribute())
    if (a.name() == name && a.type() == onnx::AttributeProto::GRAPH)
      return &a.g();
  return nullptr;
}

llvm::Error ImportContext::alias(const onnx::NodeProto &n, int index,
                                 const std::string &to,
                                 const std::string &from) {
  if (env_.count(to) || sequences_.count(to))
    return importError("{0}: output '{1}' is defined twice",
                       describeNode(n, index), to);
  if (const std::vector<Value *> *s = sequence(from)) {
    std::vector<Value *> copy = *s;
    defineSequence(to, std::move(copy));
    return llvm::Error::success();
  }
  Entry *e = lookup(from);
  if (!e)
    return importError("{0}: value '{1}' is not defined", describeNode(n, index),
                       from);
  Entry copy = *e;
  env_[to] = std::move(copy);
  return llvm::Error::success();
}

// The values a nested body reads from the body around it, renamed as
// `rename` says (its own nodes' inputs and its outputs, at every depth).
static void renameCaptures(onnx::GraphProto &g,
                           const std::map<std::string, std::string> &rename) {
  for (auto &node : *g.mutable_node()) {
    for (int k = 0; k < node.input_size(); ++k) {
      auto it = rename.find(node.input(k));
      if (it != rename.end())
        node.set_input(k, it->second);
    }
    for (auto &a : *node.mutable_attribute()) {
      if (a.type() == onnx::AttributeProto::GRAPH)
        renameCaptures(*a.mutable_g(), rename);
      else if (a.type() == onnx::AttributeProto::GRAPHS)
        for (auto &sub : *a.mutable_graphs())
          renameCaptures(sub, rename);
    }
  }
  for (auto &o : *g.mutable_output()) {
    auto it = rename.find(o.name());
    if (it != rename.end())
      o.set_name(it->second);
  }
}

llvm::Expected<std::vector<std::string>>
ImportContext::importSubgraph(const onnx::NodeProto &n, int index,
                              const onnx::GraphProto &body,
                              const std::vector<std::string> &bound,
                              const std::string &tag) {
  std::string where = describeNode(n, index);
  if (size_t(body.input_size()) != bound.size())
    return importError("{0}: its body takes {1} inputs, {2} given", where,
                       body.input_size(), bound.size());
  if (body.initializer_size() || body.sparse_initializer_size())
    return importError("{0}: a body with initializers is not supported",
                       where);
  std::map<std::string, std::string> rename;
  for (int i = 0; i < body.input_size(); ++i)
    rename[body.input(i).name()] = bound[i];
  for (int i = 0; i < body.node_size(); ++i) {
    onnx::NodeProto copy = body.node(i);
    // A nested body (an If inside the Loop: the dynamo export of
    // nn.EmbeddingBag) reads this body's values by name; ONNX's names are
    // unique across scopes, so its references take the same new names.
    for (auto &a : *copy.mutable_attribute()) {
      if (a.type() == onnx::AttributeProto::GRAPH)
        renameCaptures(*a.mutable_g(), rename);
      else if (a.type() == onnx::AttributeProto::GRAPHS)
        for (auto &g : *a.mutable_graphs())
          renameCaptures(g, rename);
    }
    for (int k = 0; k < copy.input_size(); ++k) {
      auto it = rename.find(copy.input(k));
      if (it != rename.end())
        copy.set_input(k, it->second);
    }
    for (int k = 0; k < copy.output_size(); ++k) {
      if (copy.output(k).empty())
        continue;
      std::string fresh = freshName(copy.output(k) + "@" + tag);
      rename[copy.output(k)] = fresh;
      copy.set_output(k, fresh);
    }
    if (auto e = importNode(copy, i))
      return std::move(e);
  }
  std::vector<std::string> outs;
  for (const auto &o : body.output()) {
    auto it = rename.find(o.name());
    outs.push_back(it != rename.end() ? it->second : o.name());
  }
  return outs;
}

llvm::Error ImportContext::unrollLoop(const onnx::NodeProto &n, int index) {
  std::string where = describeNode(n, index);
  const onnx::GraphProto *body = subgraph(n, "body");
  int carried = n.input_size() - 2;
  if (!body || carried < 0)
    return importError("{0}: a Loop needs its trip count and condition "
                       "inputs and a body",
                       where);
  int scans = body->output_size() - 1 - carried;
  if (scans < 0 || n.output_size() > carried + scans)
    return importError("{0}: its body's outputs do not match its inputs",
                       where);
  int64_t trips = -1;
  if (!n.input(0).empty()) {
    auto m = staticInts(n, index, 0, "the trip count");
    if (!m)
      return m.takeError();
    if (m->size() != 1)
      return importError("{0}: the trip count must be a scalar", where);
    trips = (*m)[0];
  }
  bool cond = true;
  if (!n.input(1).empty()) {
    auto c = staticInts(n, index, 1, "the loop condition");
    if (!c)
      return c.takeError();
    cond = !c->empty() && (*c)[0] != 0;
  } else if (trips < 0) {
    return importError("{0}: a Loop with neither a trip count nor a "
                       "condition never ends",
                       where);
  }
  if (trips > kMaxTrips)
    return importError("{0}: {1} iterations; cleave unrolls Loops of at most "
                       "{2}",
                       where, trips, kMaxTrips);
  std::vector<std::string> state(n.input().begin() + 2, n.input().end());
  for (const std::string &s : state)
    if (!lookup(s) && !sequence(s))
      return importError("{0}: input '{1}' is not defined by any earlier "
                         "node, input or initializer",
                         where, s);
  std::vector<std::vector<Value *>> scanned(scans);
  for (int64_t i = 0; (trips < 0 || i < trips) && cond; ++i) {
    if (i >= kMaxTrips)
      return importError("{0}: its condition is still true after {1} "
                         "iterations; cleave unrolls Loops of at most {1}",
                         where, kMaxTrips);
    std::string tag = (n.name().empty() ? "loop" : n.name()) + "." +
                      std::to_string(i);
    std::string iter = freshName(tag + ".i"), condIn = freshName(tag + ".c");
    defineConstant(iter, TensorData::fromInts(DType::I64, {}, {i}));
    defineConstant(condIn, TensorData::fromInts(DType::Bool, {}, {1}));
    std::vector<std::string> bound = {iter, condIn};
    bound.insert(bound.end(), state.begin(), state.end());
    auto outs = importSubgraph(n, index, *body, bound, tag);
    if (!outs)
      return outs.takeError();
    Entry *c = lookup((*outs)[0]);
    if (!c || !c->foldable || !c->data || c->type.numElements() != 1)
      return importError("{0}: its condition is computed at run time; cleave "
                         "unrolls Loops whose iterations are known at import",
                         where);
    cond = c->data->getInt(0) != 0;
    for (int k = 0; k < carried; ++k)
      state[k] = (*outs)[1 + k];
    for (int s = 0; s < scans; ++s) {
      const std::string &name = (*outs)[1 + carried + s];
      Entry *e = lookup(name);
      if (!e)
        return importError("{0}: scan output '{1}' is not a tensor", where,
                           name);
      scanned[s].push_back(materialize(name, *e));
    }
  }
  for (int k = 0; k < carried && k < n.output_size(); ++k)
    if (!n.output(k).empty())
      if (auto e = alias(n, index, n.output(k), state[k]))
        return e;
  for (int s = 0; s < scans && carried + s < n.output_size(); ++s) {
    const std::string &out = n.output(carried + s);
    if (out.empty())
      continue;
    if (scanned[s].empty())
      return importError("{0}: scan output '{1}' of a Loop that runs no "
                         "iteration has no shape",
                         where, out);
    // Scan outputs stack the iterations' values along a new first axis.
    std::vector<Value *> rows;
    for (Value *v : scanned[s]) {
      auto row = append(n, index, OpKind::Unsqueeze, {v},
                        {{"axes", Attribute(std::vector<int64_t>{0})}});
      if (!row)
        return row.takeError();
      rows.push_back(*row);
    }
    Value *stacked = rows.front();
    if (rows.size() > 1) {
      auto cat = append(n, index, OpKind::Concat, rows,
                        {{"axis", Attribute(int64_t(0))}});
      if (!cat)
        return cat.takeError();
      stacked = *cat;
    }
    if (auto e = define(n, index, out, stacked))
      return e;
  }
  return llvm::Error::success();
}

llvm::Error ImportContext::inlineIf(const onnx::NodeProto &n, int index) {
  auto c = staticInts(n, index, 0, "the If condition");
  if (!c)
    return c.takeError();
  bool taken = !c->empty() && (*c)[0] != 0;
  const onnx::GraphProto *branch =
      subgraph(n, taken ? "then_branch" : "else_branch");
  if (!branch)
    return importError("{0}: an If needs both branches",
                       describeNode(n, index));
  std::string tag = (n.name().empty() ? "if" : n.name()) +
                    (taken ? ".then" : ".else");
  auto outs = importSubgraph(n, index, *branch, {}, tag);
  if (!outs)
    return outs.takeError();
  if (outs->size() != size_t(n.output_size()))
    return importError("{0}: its branch gives {1} outputs, the node has {2}",
                       describeNode(n, index), outs->size(), n.output_size());
  for (int k = 0; k < n.output_size(); ++k)
    if (!n.output(k).empty())
      if (auto e = alias(n, index, n.output(k), (*outs)[k]))
        return e;
  return llvm::Error::success();
}

// SequenceEmpty, SequenceConstruct and SequenceInsert build the lists the
// importer keeps for sequences; SequenceAt (Decompose.cpp) reads them.
llvm::Error ImportContext::importSequenceOp(const onnx::NodeProto &n,
                                            int index) {
  std::string where = describeNode(n, index);
  if (n.output_size() != 1)
    return importError("{0}: expected one output", where);
  std::vector<Value *> elements;
  if (n.op_type() == "SequenceConstruct") {
    for (int k = 0; k < n.input_size(); ++k) {
      auto v = operand(n, index, k);
      if (!v)
        return v.takeError();
      elements.push_back(*v);
    }
  } else if (n.op_type() == "SequenceInsert") {
    const std::vector<Value *> *seq =
        sequence(n.input_size() ? n.input(0) : "");
    if (!seq)
      return importError("{0}: input '{1}' is not a sequence", where,
                         n.input_size() ? n.input(0) : "");
    elements = *seq;
    auto v = operand(n, index, 1);
    if (!v)
      return v.takeError();
    int64_t size = elements.size(), at = size;
    if (n.input_size() > 2 && !n.input(2).empty()) {
      auto pos = staticInts(n, index, 2, "position");
      if (!pos)
        return pos.takeError();
      at = pos->empty() ? size : (*pos)[0];
      if (at < 0)
        at += size;
      if (at < 0 || at > size)
        return importError("{0}: position {1} is outside a sequence of {2}",
                           where, (*pos)[0], size);
    }
    elements.insert(elements.begin() + at, *v);
  }
  if (env_.count(n.output(0)) || sequences_.count(n.output(0)))
    return importError("{0}: output '{1}' is defined twice", where,
                       n.output(0));
  defineSequence(n.output(0), std::move(elements));
  return llvm::Error::success();
}

} // namespace cleave::frontend
