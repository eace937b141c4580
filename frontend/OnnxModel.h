// Reading an ONNX file into a ModelProto: the size and format checks that
// come before any import, the graph's input names, and the resolver that
// loads `onnx<"file", "initializer">` tensors referred to by .cir text.
#pragma once

#include "llvm/Support/Error.h"

#include <onnx/onnx_pb.h>

#include <memory>
#include <string>

namespace cleave::frontend {

// Reads `path` as an ONNX model (up to 2 GiB; larger models keep their
// weights as external data); one error line naming the file otherwise.
llvm::Expected<std::unique_ptr<onnx::ModelProto>>
readOnnxModel(const std::string &path);

} // namespace cleave::frontend
