// libFuzzer target: the ONNX importer (protobuf parse, opset check, ONNX
// checker and shape inference, cleave's import) on arbitrary bytes as a
// .onnx file, then the IR verifier on what it imported. Any outcome but a
// crash, sanitizer report, hang or huge allocation is fine.
#include "FuzzSupport.h"

#include "frontend/OnnxImporter.h"
#include "ir/Verifier.h"
#include "passes/Pass.h"

#include <unistd.h>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  std::string path = cleave::fuzz::writeInput("model.onnx", data, size);
  cleave::frontend::ImportOptions opts;
  opts.microbatchSize = 2; // binds symbolic leading dimensions
  opts.differentiate = cleave::passes::differentiate; // ONNX's Gradient op
  auto g = cleave::frontend::importOnnxFile(path, opts);
  if (!g)
    llvm::consumeError(g.takeError());
  else
    llvm::consumeError(cleave::ir::verifyGraph(**g));
  unlink(path.c_str());
  return 0;
}
