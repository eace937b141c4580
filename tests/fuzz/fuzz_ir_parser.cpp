// libFuzzer target: the IR text parser on arbitrary text, then the verifier
// on whatever parses, as cleave-opt does. Data referenced by path (raw files,
// onnx<...>) is loaded lazily and never by the parser or the verifier.
#include "ir/Parser.h"
#include "ir/Verifier.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  llvm::StringRef text(reinterpret_cast<const char *>(data), size);
  auto g = cleave::ir::parseGraph(text, "<fuzz>");
  if (!g) {
    llvm::consumeError(g.takeError());
    return 0;
  }
  llvm::consumeError(cleave::ir::verifyGraph(**g));
  return 0;
}
