// Grouping ops into layers (Layers.h): scopes from ONNX node names, or cut
// points where names give none; then every non-forward op and declared
// tensor follows the forward op it belongs to.
#include "passes/Layers.h"

#include "llvm/ADT/StringMap.h"
#include "llvm/ADT/StringSet.h"
#include "llvm/ADT/StringRef.h"

#include <algorithm>

namespace cleave::passes {

std::string scopeOf(llvm::StringRef loc, unsigned depth) {
  llvm::SmallVector<llvm::StringRef, 8> parts;
  loc.split(parts, '/', -1, /*KeepEmpty=*/false);
  if (parts.size() < 2)
    return ""; // the node name alone: no scope
  parts.pop_back();
  std::string scope;
  unsigned taken = 0;
  for (size_t i = 0; i < parts.size() && taken < depth; ++i) {
    // `layers` followed by `layers.0` is a container (nn.Sequential,
    // nn.ModuleList inside a module): its children are the layers.
    if (i + 1 < parts.size() && parts[i + 1].startswith((parts[i] + ".").str()))
      continue;
    if (!scope.empty())
      scope += ".";
    scope += parts[i].str();
    ++taken;
  }
  return scope;
}

namespace {

// The forward ops and, for each, the index of the group it starts in.
struct ForwardGroups {
  std::vector<const ir::Op *> ops;
  std::vector<unsigned> group;
  std::vector<std::string> names;
};

// Scopes that enclose other scopes at this depth (`blocks.0` when
// `blocks.0.attn` exists at depth 2). A scope's name is a dotted module
// path, and module names hold dots themselves (`blocks.0`), so a scope
// encloses another when it is a prefix of it up to a dot.
llvm::StringSet<> enclosingScopes(llvm::ArrayRef<std::string> scopes) {
  llvm::StringSet<> all, parents;
  for (const std::string &s : scopes)
    if (!s.empty())
      all.insert(s);
  for (const auto &entry : all) {
    llvm::StringRef prefix = entry.getKey();
    for (size_t dot; (dot = prefix.rfind('.')) != llvm::StringRef::npos;) {
      prefix = prefix.take_front(dot);
      if (all.contains(prefix))
        parents.insert(prefix);
    }
  }
  return parents;
}

// Groups by scope. Ops outside any scope, and ops directly in a scope that
// encloses others (a residual Add in `blocks.0` beside `blocks.0/attn`),
// join the group before them (or the first group, before any scoped op).
// False when no op has a scope.
bool groupByScope(ForwardGroups &fg, unsigned depth) {
  std::vector<std::string> scopes;
  for (const ir::Op *op : fg.ops)
    scopes.push_back(scopeOf(op->loc(), depth));
  llvm::StringSet<> enclosing = enclosingScopes(scopes);
  llvm::StringMap<unsigned> groupOfScope;
  std::optional<unsigned> previous;
  for (size_t i = 0; i < fg.ops.size(); ++i) {
    const std::string &scope = scopes[i];
    if (scope.empty() || enclosing.contains(scope)) {
      fg.group[i] = previous.value_or(0);
      continue;
    }
    auto [it, fresh] = groupOfScope.try_emplace(scope, fg.names.size());
    if (fresh)
      fg.names.push_back(scope);
    fg.group[i] = it->second;
    previous = it->second;
  }
  return previous.has_value();
}

// Groups between cut points: positions where at most one value made by an
// earlier forward op is read by a later one (inputs and declared tensors
// reach every stage on their own, so they do not count).
void groupByCutPoints(ForwardGroups &fg) {
  llvm::DenseMap<const ir::Op *, size_t> index;
  for (size_t i = 0; i < fg.ops.size(); ++i)
    index[fg.ops[i]] = i;
  // live[c]: values crossing the boundary before op c, as a difference array.
  std::vector<int> live(fg.ops.size() + 1, 0);
  for (size_t i = 0; i < fg.ops.size(); ++i)
    for (const ir::Value *r : fg.ops[i]->results()) {
      size_t last = i;
      for (const ir::Use &u : r->uses())
        if (auto it = index.find(u.user); it != index.end())
          last = std::max(last, it->second);
      ++live[i + 1];
      --live[last + 1];
    }
  // A long chain of unnamed ops has a cut point at almost every op; the
  // partition's frame tables cost the square of the layer count times the
  // ops, so at most kMaxCutLayers groups are made, each at least
  // ops / kMaxCutLayers ops long (a cut point ends a group only then).
  constexpr size_t kMaxCutLayers = 256;
  size_t minOps = (fg.ops.size() + kMaxCutLayers - 1) / kMaxCutLayers;
  int crossing = 0;
  size_t groupOps = 0;
  fg.names.push_back("layer.0");
  for (size_t i = 0; i < fg.ops.size(); ++i) {
    crossing += live[i];
    if (i > 0 && crossing <= 1 && groupOps >= minOps) {
      fg.names.push_back("layer." + std::to_string(fg.names.size()));
      groupOps = 0;
    }
    fg.group[i] = fg.names.size() - 1;
    ++groupOps;
  }
}

// Merges groups so that no group reads a value a later group makes; returns
// the final layer of each group.
std::vector<unsigned> mergeOutOfOrder(const ForwardGroups &fg,
                                      const llvm::DenseMap<const ir::Op *,
                                                           unsigned> &groupOf) {
  size_t n = fg.names.size();
  std::vector<unsigned> reach(n);
  for (size_t g = 0; g < n; ++g)
    reach[g] = g;
  for (size_t i = 0; i < fg.ops.size(); ++i)
    for (const ir::Value *v : fg.ops[i]->operands())
      if (auto it = groupOf.find(v->definingOp()); it != groupOf.end())
        reach[fg.group[i]] = std::max(reach[fg.group[i]], it->second);
  std::vector<unsigned> layerOfGroup(n);
  unsigned layer = 0, end = 0;
  for (size_t g = 0; g < n; ++g) {
    end = std::max(end, reach[g]);
    layerOfGroup[g] = layer;
    if (g == end)
      ++layer;
  }
  return layerOfGroup;
}

} // namespace

std::optional<unsigned> Layering::find(llvm::StringRef name) const {
  for (size_t i = 0; i < layers.size(); ++i)
    if (layers[i].name == name)
      return i;
  return std::nullopt;
}

std::optional<unsigned> Layering::layerOf(const ir::Value *v) const {
  if (v->definingOp()) {
    if (auto it = layerOfOp.find(v->definingOp()); it != layerOfOp.end())
      return it->second;
    return std::nullopt;
  }
  if (auto it = layerOfDeclared.find(v); it != layerOfDeclared.end())
    return it->second;
  return std::nullopt;
}

// Makes the layers from the forward groups: merged groups take the name
// "first..last".
static Layering layersFromGroups(const ForwardGroups &fg) {
  llvm::DenseMap<const ir::Op *, unsigned> groupOf;
  for (size_t i = 0; i < fg.ops.size(); ++i)
    groupOf[fg.ops[i]] = fg.group[i];
  std::vector<unsigned> layerOfGroup = mergeOutOfOrder(fg, groupOf);
  Layering l;
  l.layers.resize(layerOfGroup.back() + 1);
  for (size_t g = 0; g < fg.names.size(); ++g) {
    bool firstOfLayer = g == 0 || layerOfGroup[g - 1] != layerOfGroup[g];
    bool lastOfLayer =
        g + 1 == fg.names.size() || layerOfGroup[g + 1] != layerOfGroup[g];
    std::string &name = l.layers[layerOfGroup[g]].name;
    if (firstOfLayer)
      name = fg.names[g];
    else if (lastOfLayer)
      name += ".." + fg.names[g];
  }
  for (size_t i = 0; i < fg.ops.size(); ++i)
    l.layerOfOp[fg.ops[i]] = layerOfGroup[fg.group[i]];
  return l;
}

// Declared tensors and inputs go to the first layer whose op (of the given
// phases) reads them.
static void placeSources(const ir::Graph &g, Layering &l, bool forwardOnly) {
  for (const auto &op : g.ops()) {
    if (forwardOnly && op->phase() != ir::Phase::Fwd)
      continue;
    auto layer = l.layerOfOp.find(op.get());
    if (layer == l.layerOfOp.end())
      continue;
    for (const ir::Value *v : op->operands())
      if (!v->definingOp())
        l.layerOfDeclared.try_emplace(v, layer->second);
  }
}

// The layer of a backward or optimizer op: that of the forward op with the
// same location, or of the parameter an optimizer op updates; otherwise
// (ops of unnamed nodes) the latest layer among the forward values and
// declared tensors it reads (the ones it differentiates through), then
// among all its operands' (the last layer when none has one).
static unsigned followerLayer(const ir::Graph &g, const ir::Op &op,
                              const llvm::StringMap<unsigned> &layerOfLoc,
                              const Layering &l) {
  if (auto it = layerOfLoc.find(op.loc()); it != layerOfLoc.end())
    return it->second;
  llvm::StringRef loc = op.loc();
  if (loc.consume_front("optimizer/"))
    if (const ir::Value *param = g.lookup(loc))
      if (auto layer = l.layerOf(param))
        return *layer;
  std::optional<unsigned> latest, latestForward;
  for (const ir::Value *v : op.operands())
    if (auto layer = l.layerOf(v)) {
      latest = std::max(latest.value_or(0), *layer);
      if (!v->definingOp() || v->definingOp()->phase() == ir::Phase::Fwd)
        latestForward = std::max(latestForward.value_or(0), *layer);
    }
  if (latestForward && op.phase() != ir::Phase::Opt)
    return *latestForward;
  return latest.value_or(l.layers.size() - 1);
}

// True when some two scopes are one path but for a trailing block index
// (`m.transformer.h.0` and `m.transformer.h.1`, `m.layer1.0` and
// `m.layer1.1`).
static bool hasRepeatedBlocks(const llvm::StringSet<> &scopes) {
  llvm::StringMap<unsigned> families;
  for (const auto &entry : scopes) {
    llvm::StringRef s = entry.getKey();
    size_t dot = s.rfind('.');
    if (dot == llvm::StringRef::npos)
      continue;
    llvm::StringRef index = s.substr(dot + 1);
    if (index.empty() ||
        index.find_first_not_of("0123456789") != llvm::StringRef::npos)
      continue;
    if (++families[s.take_front(dot)] >= 2)
      return true;
  }
  return false;
}

unsigned autoLayerDepth(const ir::Graph &g) {
  constexpr unsigned kMaxDepth = 12;
  std::optional<unsigned> several;
  for (unsigned depth = 1; depth <= kMaxDepth; ++depth) {
    llvm::StringSet<> scopes;
    for (const auto &op : g.ops())
      if (op->phase() == ir::Phase::Fwd) {
        std::string s = scopeOf(op->loc(), depth);
        if (!s.empty())
          scopes.insert(s);
      }
    if (scopes.empty())
      return several.value_or(depth == 1 ? 0 : depth - 1);
    if (hasRepeatedBlocks(scopes))
      return depth;
    if (!several && scopes.size() > 1)
      several = depth;
  }
  return several.value_or(1);
}

llvm::Expected<Layering> groupLayers(const ir::Graph &g,
                                     const LayerOptions &opts) {
  ForwardGroups fg;
  for (const auto &op : g.ops())
    if (op->phase() == ir::Phase::Fwd)
      fg.ops.push_back(op.get());
  if (fg.ops.empty())
    return llvm::createStringError(llvm::inconvertibleErrorCode(),
                                   "graph @" + g.name() +
                                       " has no forward ops to partition");
  fg.group.assign(fg.ops.size(), 0);
  unsigned depth = opts.depth ? *opts.depth : autoLayerDepth(g);
  if (depth == 0 || !groupByScope(fg, depth)) {
    fg.names.clear();
    fg.group.assign(fg.ops.size(), 0);
    groupByCutPoints(fg);
    depth = 0;
  }
  Layering l = layersFromGroups(fg);
  l.depth = depth;
  placeSources(g, l, /*forwardOnly=*/true);

  llvm::StringMap<unsigned> layerOfLoc;
  for (const ir::Op *op : fg.ops)
    if (!op->loc().empty())
      layerOfLoc.try_emplace(op->loc(), l.layerOfOp[op]);
  for (const auto &op : g.ops())
    if (op->phase() != ir::Phase::Fwd)
      l.layerOfOp[op.get()] = followerLayer(g, *op, layerOfLoc, l);
  placeSources(g, l, /*forwardOnly=*/false);
  for (const auto &op : g.ops())
    l.layers[l.layerOfOp[op.get()]].ops.push_back(op.get());
  return l;
}

} // namespace cleave::passes
