// `--run`: executes a graph on a backend (`device`: cpu, cuda-emulated or
// cuda, as cleave-run's --device) with inputs from a folder and writes
// its outputs to another, in ONNX TensorProto (`input_K.pb` /
// `output_K.pb`) or NumPy (`<name>.npy`) form — whichever the inputs use.
#pragma once

#include "ir/Graph.h"

#include "llvm/Support/Error.h"
#include "llvm/Support/raw_ostream.h"

#include <string>

namespace cleave::tools {

llvm::Error runGraphOnFiles(const ir::Graph &g, const std::string &inputDir,
                            const std::string &outputDir,
                            const std::string &device, llvm::raw_ostream &log);

} // namespace cleave::tools
