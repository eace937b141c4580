#include "frontend/OnnxNode.h"

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

} // namespace cleave::frontend
