// ONNX TensorProto files (`input_0.pb`, the layout of ONNX's test_data_set
// folders). NumPy files are runtime/data/NumpyFiles.h. Errors name the file.
#pragma once

#include "ir/TensorData.h"

#include "llvm/Support/Error.h"

#include <map>
#include <memory>
#include <string>

namespace cleave::frontend {

llvm::Expected<std::shared_ptr<ir::TensorData>>
readTensorProtoFile(const std::string &path);
llvm::Error writeTensorProtoFile(const std::string &path,
                                 const ir::TensorData &t,
                                 const std::string &name);

} // namespace cleave::frontend
