// NumPy `.npy` files and `.npz` archives of them: what users feed to
// cleave-run (--data) and get from its tools. Errors name the file.
#pragma once

#include "ir/TensorData.h"

#include "llvm/Support/Error.h"

#include <map>
#include <memory>
#include <string>

namespace cleave::runtime {

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

} // namespace cleave::runtime
