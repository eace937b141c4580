// Tensor files that users feed to and get from cleave: ONNX TensorProto
// files (`input_0.pb`, the layout of ONNX's test_data_set folders), NumPy
// `.npy` files and `.npz` archives of them. Errors name the file.
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

llvm::Expected<std::shared_ptr<ir::TensorData>>
readNpyFile(const std::string &path);
llvm::Error writeNpyFile(const std::string &path, const ir::TensorData &t);

// Reads a NumPy `.npz` archive (numpy.savez; numpy.savez_compressed too when
// cleave is built with zlib): array name (member name without `.npy`) ->
// data. A truncated or corrupt archive is one error naming the file.
llvm::Expected<std::map<std::string, std::shared_ptr<ir::TensorData>>>
readNpzFile(const std::string &path);
// Whether readNpzFile reads deflated (savez_compressed) members.
bool canReadCompressedNpz();

} // namespace cleave::frontend
