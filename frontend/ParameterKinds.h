// Which float initializers of an imported model are trained (parameters)
// and which are held constant (buffers): as the producer declares them
// where it does (PyTorch's dynamo exporter records the exported program's
// signature), by naming rules and the graph's differentiable paths where it
// does not. Also refuses a dynamo export whose parameters the exporter
// folded into unnamed constants (its default optimize=True), which would
// train something other than the model.
#pragma once

#include "ir/Graph.h"

#include "llvm/ADT/StringRef.h"
#include "llvm/Support/Error.h"

#include <onnx/onnx_pb.h>

#include <map>
#include <set>
#include <string>
#include <vector>

namespace cleave::frontend {

// The producer's own list of parameters and buffers, when the model has it.
struct ExporterSignature {
  bool present = false;
  std::set<std::string> parameters;
  // Buffers and lifted constant tensors: never trained.
  std::set<std::string> buffers;
  // The buffers the module updates when it runs (BUFFER_MUTATION outputs):
  // a BatchNorm's running statistics appear here only when the module ran
  // in train() mode.
  std::set<std::string> mutated;
  // Parameters the module holds with requires_grad=False (a sinusoidal
  // position table): the model's metadata key cleave.frozen, one name a
  // line, as examples/pytorch/annotate_export.py writes it (no exporter
  // records requires_grad). Never trained, with or without a signature.
  std::set<std::string> frozen;
  // Every parameter name of the module (key cleave.parameters, one a line,
  // as annotate_export.py writes it): where the export has no signature
  // (the legacy exporter), these and only these are trained (less the
  // frozen ones) instead of guessing from names and sizes.
  bool listed = false;
  std::set<std::string> moduleParameters;
  // nn.Embedding weights with a padding_idx (key cleave.padding_idx, lines
  // "name index"): a row Gather of one of them leaves that row's gradient
  // zero. The legacy exporter drops padding_idx.
  std::map<std::string, int64_t> paddingIdx;
};

// Reads the signature from the graph's metadata and the frozen list from
// the model's (`path` names the model in errors); an error when it names parameters that the exporter folded away
// (into unnamed constants, or with a train()-mode BatchNorm it dropped).
llvm::Expected<ExporterSignature> readSignature(const onnx::ModelProto &model,
                                                const std::string &path);

// Leaf names of module buffers that models hold as float tensors and never
// train (used when the producer gives no signature).
bool isBufferName(llvm::StringRef name);

// Names exporters give the constants they lift into initializers, as
// opposed to module parameters: onnx::Mul_12, val_26, /m/Constant_output_0.
bool isExporterConstantName(llvm::StringRef name);

// Turns every declared Param of `g` that is not trained into a Buffer.
// Returns the one-element float initializers that a differentiable path
// reaches and that are named like module parameters but held because the
// export lists no parameters (the guess takes them for scales).
std::vector<std::string> classifyParameters(ir::Graph &g,
                                            const ExporterSignature &signature);

} // namespace cleave::frontend
