#include "frontend/OnnxNode.h"

#include "llvm/ADT/StringRef.h"

namespace cleave::frontend {

const onnx::AttributeProto *findAttr(const onnx::NodeProto &n,
                                     const std::string &name) {
  for (const auto &a : n.attribute())
    if (a.name() == name)
      return &a;
  return nullptr;
}

int64_t attrInt(const onnx::NodeProto &n, const std::string &name,
                int64_t def) {
  const auto *a = findAttr(n, name);
  return a ? a->i() : def;
}

float attrFloat(const onnx::NodeProto &n, const std::string &name,
                float def) {
  const auto *a = findAttr(n, name);
  return a ? a->f() : def;
}

std::string attrString(const onnx::NodeProto &n, const std::string &name,
                       const std::string &def) {
  const auto *a = findAttr(n, name);
  return a ? a->s() : def;
}

std::optional<std::vector<int64_t>> attrInts(const onnx::NodeProto &n,
                                             const std::string &name) {
  const auto *a = findAttr(n, name);
  if (!a)
    return std::nullopt;
  return std::vector<int64_t>(a->ints().begin(), a->ints().end());
}

std::string describeNode(const onnx::NodeProto &n, int index) {
  if (!n.name().empty())
    return n.op_type() + " node '" + n.name() + "'";
  return n.op_type() + " node #" + std::to_string(index);
}

// Splits "a, [b, c], d" at the commas outside brackets and braces.
static void splitTopLevel(llvm::StringRef text, std::vector<std::string> &out) {
  int depth = 0;
  size_t start = 0;
  for (size_t i = 0; i <= text.size(); ++i) {
    char c = i < text.size() ? text[i] : ',';
    if (c == '[' || c == '(' || c == '{')
      ++depth;
    else if (c == ']' || c == ')' || c == '}')
      --depth;
    else if (c == ',' && depth == 0) {
      llvm::StringRef item = text.slice(start, i).trim();
      if (!item.empty())
        out.push_back(item.str());
      start = i + 1;
    }
  }
}

// The text between `open` at `from` and its matching `close`.
static llvm::StringRef enclosed(llvm::StringRef text, size_t from, char open,
                                char close) {
  if (from >= text.size() || text[from] != open)
    return {};
  int depth = 0;
  for (size_t i = from; i < text.size(); ++i) {
    if (text[i] == open)
      ++depth;
    else if (text[i] == close && --depth == 0)
      return text.slice(from + 1, i);
  }
  return {};
}

std::optional<std::vector<std::string>> torchCallArgs(const onnx::NodeProto &n,
                                                      const std::string &atenOp) {
  for (const auto &p : n.metadata_props()) {
    if (p.key() != "pkg.torch.onnx.fx_node")
      continue;
    llvm::StringRef fx(p.value());
    std::string target = "[target=torch.ops." + atenOp + "]";
    size_t at = fx.find(target);
    if (at == llvm::StringRef::npos)
      return std::nullopt;
    llvm::StringRef rest = fx.substr(at + target.size());
    std::vector<std::string> args;
    size_t a = rest.find("args = ");
    if (a != llvm::StringRef::npos)
      splitTopLevel(enclosed(rest, a + 7, '(', ')'), args);
    size_t k = rest.find("kwargs = ");
    if (k != llvm::StringRef::npos) {
      std::vector<std::string> kwargs;
      splitTopLevel(enclosed(rest, k + 9, '{', '}'), kwargs);
      for (const std::string &kw : kwargs) {
        auto [name, value] = llvm::StringRef(kw).split(':');
        args.push_back(name.trim().str() + "=" + value.trim().str());
      }
    }
    return args;
  }
  return std::nullopt;
}

} // namespace cleave::frontend
