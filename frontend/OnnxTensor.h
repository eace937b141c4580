// Conversion between ONNX TensorProto and cleave TensorData, including
// external data files (confined to the model's folder).
#pragma once

#include "ir/TensorData.h"

#include "llvm/Support/Error.h"

#include <memory>
#include <string>

namespace onnx {
class TensorProto;
}

namespace cleave::frontend {

// Maps an ONNX element type (TensorProto::DataType) to a cleave one; error
// names the type when cleave has no equivalent.
llvm::Expected<ir::DType> dtypeFromOnnx(int onnxType);
const char *onnxTypeName(int onnxType);
// The ONNX element type of a cleave one.
int dtypeToOnnx(ir::DType dtype);

// Reads a tensor's bytes. `modelDir` is the folder external data paths are
// relative to; `origin` is recorded so the printer can refer to the data.
// When `adoptRaw` points at the tensor's own raw_data, its buffer is moved
// into the result instead of copied (the proto is left without it). With
// `loadExternal` false, a tensor in external data is checked (its file and
// byte range) but not read: its data is a RawFile origin, read on first use
// (TensorData::load), so weights stay on disk.
llvm::Expected<std::shared_ptr<ir::TensorData>>
tensorFromOnnx(const onnx::TensorProto &t, const std::string &modelDir,
               ir::DataOrigin origin, std::string *adoptRaw = nullptr,
               bool loadExternal = true);

// Where an external tensor's bytes are: its `location` resolved inside
// `modelDir` (absolute paths and anything leaving the folder, symlinks
// included, are refused), `offset`, and `length` (-1 when not given).
struct ExternalData {
  std::string location, path;
  int64_t offset = 0, length = -1;
};
llvm::Expected<ExternalData> externalDataOf(const onnx::TensorProto &t,
                                            const std::string &modelDir);

} // namespace cleave::frontend
