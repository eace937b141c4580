// Saving trained weights: an ONNX model written as a copy of the source model
// with the data of chosen initializers replaced (the result of training),
// loadable by ONNX tools (onnx.load, onnx.checker, onnxruntime) and by cleave.
#pragma once

#include "ir/TensorData.h"

#include "llvm/Support/Error.h"

#include <cstdint>
#include <map>
#include <memory>
#include <string>

namespace cleave::frontend {

// Protobuf cannot encode a message of 2 GiB or more: a model whose encoding
// would be larger keeps its tensor data in a side file.
constexpr uint64_t kMaxInlineOnnxBytes = (uint64_t(1) << 31) - 1;

// Reads `sourceModel` (external data files included, confined to its
// folder), replaces the data of each initializer named in `values` (dtype and
// shape must match the initializer's; every name must be an initializer) and
// writes the model to `outPath` through a temporary file renamed into place,
// so a failure leaves no file behind.
//
// Tensor data is written inline (raw_data). If the encoded model would be
// larger than `maxInlineBytes`, every initializer of 1 KiB or more goes to
// `<outPath>.data` in the same folder instead, referenced as ONNX external
// data by its file name. (Tests lower the limit to exercise that layout.)
//
// Errors are one line naming the file and, where there is one, the
// initializer at fault.
llvm::Error writeTrainedOnnx(
    const std::string &sourceModel,
    const std::map<std::string, std::shared_ptr<ir::TensorData>> &values,
    const std::string &outPath, uint64_t maxInlineBytes = kMaxInlineOnnxBytes);

} // namespace cleave::frontend
