#include "frontend/TensorFiles.h"

#include "frontend/OnnxTensor.h"
#include "support/Errors.h"
#include "support/FileIO.h"

#include "llvm/ADT/StringExtras.h"
#include "llvm/Support/CRC.h"
#include "llvm/Support/FileSystem.h"
#include "llvm/Support/MemoryBuffer.h"
#include "llvm/Support/raw_ostream.h"

#include <onnx/onnx_pb.h>

#include <algorithm>

namespace cleave::frontend {

using namespace cleave::ir;

llvm::Expected<std::shared_ptr<TensorData>>
readTensorProtoFile(const std::string &path) {
  auto buf = support::readFile(path, "tensor file");
  if (!buf)
    return buf.takeError();
  onnx::TensorProto t;
  if ((*buf)->getBufferSize() > size_t(INT_MAX) ||
      !t.ParseFromArray((*buf)->getBufferStart(),
                        int((*buf)->getBufferSize())))
    return fail("'" + path + "' is not an ONNX TensorProto file");
  auto data = tensorFromOnnx(t, "", {});
  if (!data)
    return fail("'" + path + "': " + llvm::toString(data.takeError()));
  return *data;
}

llvm::Error writeTensorProtoFile(const std::string &path,
                                 const TensorData &d,
                                 const std::string &name) {
  onnx::TensorProto t;
  t.set_name(name);
  t.set_data_type(dtypeToOnnx(d.type().dtype));
  for (int64_t dim : d.type().shape)
    t.add_dims(dim);
  llvm::ArrayRef<uint8_t> b = d.bytes();
  t.set_raw_data(std::string(b.begin(), b.end()));
  std::string out;
  if (!t.SerializeToString(&out))
    return fail("cannot encode tensor '" + name + "'");
  return support::writeFileAtomically(path, out);
}

} // namespace cleave::frontend
