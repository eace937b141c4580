// Small helpers for reading ONNX NodeProto attributes and naming nodes in
// error messages.
#pragma once

#include <onnx/onnx_pb.h>

#include <optional>
#include <string>
#include <vector>

namespace cleave::frontend {

const onnx::AttributeProto *findAttr(const onnx::NodeProto &n,
                                     const std::string &name);
int64_t attrInt(const onnx::NodeProto &n, const std::string &name,
                int64_t def);
float attrFloat(const onnx::NodeProto &n, const std::string &name, float def);
std::string attrString(const onnx::NodeProto &n, const std::string &name,
                       const std::string &def);
std::optional<std::vector<int64_t>> attrInts(const onnx::NodeProto &n,
                                             const std::string &name);

// "Reshape node '/h.0/Reshape'" (or "Reshape node #12" when unnamed).
std::string describeNode(const onnx::NodeProto &n, int index);

} // namespace cleave::frontend
