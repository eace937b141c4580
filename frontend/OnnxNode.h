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

// The arguments of the PyTorch call a dynamo-exported node translates, as
// its `pkg.torch.onnx.fx_node` metadata prints them, when that call is
// `atenOp` ("aten.embedding.default"): `args = (%x, %t, None, 1, 0.1)`
// gives {"%x", "%t", "None", "1", "0.1"} (a bracketed list stays one
// argument), then `kwargs = {name: value}` as "name=value". nullopt for
// another call or a node without the metadata (other exporters). The
// exporter's translation can drop an argument ONNX has no attribute for;
// this is how the importer sees what PyTorch computes there.
std::optional<std::vector<std::string>> torchCallArgs(const onnx::NodeProto &n,
                                                      const std::string &atenOp);

} // namespace cleave::frontend
