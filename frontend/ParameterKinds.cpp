// Parameters versus buffers (ParameterKinds.h): the exporter's signature,
// the folded-export check, and the naming rules used without a signature.
#include "frontend/ParameterKinds.h"

#include "frontend/ImportContext.h"
#include "frontend/OnnxTensor.h"

#include "llvm/ADT/DenseSet.h"
#include "llvm/ADT/SmallVector.h"
#include "llvm/Support/FormatVariadic.h"

#include <map>
#include <vector>

namespace cleave::frontend {

using namespace cleave::ir;

// PyTorch's dynamo exporter records the exported program's signature in
// the graph's metadata, one lifted input a line:
//   p_m_l_weight: PARAMETER target='m.l.weight'
//   b_m_inv_freq: BUFFER target='m.inv_freq' persistent=False
// With optimize=False each target is an initializer of that name. The
// default optimize=True folds most parameters into anonymous constants;
// training such a file would train constants and lose the names, so it is
// refused.
static const char kSignatureKey[] =
    "pkg.torch.export.ExportedProgram.graph_signature";

// What annotate_export.py records of the module (ParameterKinds.h).
static const char kFrozenKey[] = "cleave.frozen";
static const char kPaddingKey[] = "cleave.padding_idx";
static const char kParametersKey[] = "cleave.parameters";

llvm::Expected<ExporterSignature> readSignature(const onnx::ModelProto &model,
                                                const std::string &path) {
  ExporterSignature sig;
  for (const auto &p : model.metadata_props()) {
    if (p.key() != kFrozenKey && p.key() != kPaddingKey &&
        p.key() != kParametersKey)
      continue;
    sig.listed |= p.key() == kParametersKey;
    llvm::SmallVector<llvm::StringRef> lines;
    llvm::StringRef(p.value()).split(lines, '\n', -1, false);
    for (llvm::StringRef line : lines) {
      line = line.trim();
      if (line.empty())
        continue;
      if (p.key() == kFrozenKey) {
        sig.frozen.insert(line.str());
        continue;
      }
      if (p.key() == kParametersKey) {
        sig.moduleParameters.insert(line.str());
        continue;
      }
      auto [name, idx] = line.rsplit(' ');
      int64_t row = -1;
      if (name.empty() || idx.trim().getAsInteger(10, row) || row < 0)
        return importError("'{0}': metadata {1} line '{2}' is not "
                           "'<parameter> <row>'",
                           path, kPaddingKey, line);
      sig.paddingIdx[name.trim().str()] = row;
    }
  }
  const std::string *text = nullptr;
  for (const auto &p : model.graph().metadata_props())
    if (p.key() == kSignatureKey)
      text = &p.value();
  if (!text)
    return sig;
  sig.present = true;
  llvm::SmallVector<llvm::StringRef> lines;
  llvm::StringRef(*text).split(lines, '\n');
  for (llvm::StringRef line : lines) {
    for (auto [kind, set] :
         {std::pair{"PARAMETER", &sig.parameters},
          std::pair{"BUFFER", &sig.buffers},
          std::pair{"CONSTANT_TENSOR", &sig.buffers},
          std::pair{"BUFFER_MUTATION", &sig.mutated}}) {
      std::string marker = std::string(": ") + kind + " target='";
      size_t at = line.find(marker);
      if (at == llvm::StringRef::npos)
        continue;
      llvm::StringRef rest = line.substr(at + marker.size());
      set->insert(rest.take_until([](char c) { return c == '\''; }).str());
    }
  }
  // A parameter the signature names may be missing because the exporter
  // kept one initializer for tied parameters (GPT-2's lm_head.weight and
  // wte.weight). It is missing because it was folded when float
  // initializers the signature does not name hold its values instead.
  std::set<std::string> names, named(sig.parameters);
  named.insert(sig.buffers.begin(), sig.buffers.end());
  for (const auto &in : model.graph().input())
    names.insert(in.name());
  std::string anonymous;
  for (const auto &t : model.graph().initializer()) {
    names.insert(t.name());
    auto dt = dtypeFromOnnx(t.data_type());
    if (!dt)
      llvm::consumeError(dt.takeError());
    else if (isFloat(*dt) && !named.count(t.name()) && anonymous.empty())
      anonymous = t.name();
  }
  int missing = 0;
  std::string first;
  for (const std::string &p : sig.parameters)
    if (!names.count(p) && missing++ == 0)
      first = p;
  if (missing && !anonymous.empty())
    return importError(
        "'{0}': {1} of its {2} parameters (such as '{3}') are not among its "
        "initializers, which hold unnamed constants such as '{4}': the "
        "exporter folded them; export for training with "
        "torch.onnx.export(..., dynamo=True, optimize=False)",
        path, missing, sig.parameters.size(), first, anonymous);
  // A module whose parameters are all gone and whose updated statistics are
  // gone too was folded away, not tied: the default optimize=True drops a
  // train()-mode BatchNorm with its weight, bias and running statistics
  // and leaves the convolution's names as they were.
  auto moduleOf = [](llvm::StringRef target) {
    return target.rsplit('.').first.str();
  };
  std::map<std::string, std::vector<std::string>> lostParams;
  std::set<std::string> keptParamModules;
  for (const std::string &p : sig.parameters) {
    if (!names.count(p))
      lostParams[moduleOf(p)].push_back(p);
    else
      keptParamModules.insert(moduleOf(p));
  }
  std::vector<std::string> folded;
  std::string example;
  for (const std::string &b : sig.mutated) {
    std::string module = moduleOf(b);
    if (names.count(b) || !lostParams.count(module) ||
        keptParamModules.count(module) ||
        (!folded.empty() && folded.back() == module))
      continue;
    if (folded.empty())
      example = llvm::formatv("'{0}' ({1} and the statistic '{2}')", module,
                              lostParams[module].front(), b)
                    .str();
    folded.push_back(module);
  }
  if (!folded.empty())
    return importError(
        "'{0}': {1} module(s) such as {2} are missing from the graph "
        "although the exporter recorded them: the exporter folded them away "
        "(the default optimize=True drops train()-mode BatchNorms); export "
        "for training with torch.onnx.export(..., dynamo=True, "
        "optimize=False)",
        path, folded.size(), example);
  return sig;
}

bool isBufferName(llvm::StringRef name) {
  llvm::StringRef leaf =
      name.rsplit('.').second.empty() ? name : name.rsplit('.').second;
  static const std::set<std::string> kLeaves = {
      "running_mean", "running_var",       "num_batches_tracked",
      "inv_freq",     "position_ids",      "token_type_ids",
      "masked_bias",  "original_inv_freq", "cos_cached",
      "sin_cached",   "cos_cache",         "sin_cache",
      // transformers' encoder-decoders (BART, Marian, Pegasus, ...)
      // register it as a zero buffer added to the logits.
      "final_logits_bias",
      // Swin V2's continuous position bias input (torchvision and
      // transformers register it as a buffer).
      "relative_coords_table"};
  return kLeaves.count(leaf.str()) != 0;
}

bool isExporterConstantName(llvm::StringRef name) {
  if (name.startswith("onnx::") || name.startswith("/") ||
      name.startswith("_v_"))
    return true;
  if (name.consume_front("val_") || name.consume_front("const_"))
    return !name.empty() &&
           name.find_first_not_of("0123456789_") == llvm::StringRef::npos;
  return !name.empty() &&
         name.find_first_not_of("0123456789") == llvm::StringRef::npos;
}

// With the producer's signature, its PARAMETERs are trained (buffers and
// lifted constants are held constant); without one, the module's parameter
// names annotate_export.py recorded (cleave.parameters). Without either,
// an initializer is trained when it is named like a module parameter (not an exporter's
// constant, not a known buffer such as running_mean or inv_freq), holds
// more than one element (a scalar initializer is an epsilon or a scale,
// not a weight) and a differentiable path leads from it to a float graph
// output. Everything else is a buffer: kept, never trained, and so is a
// parameter the model's cleave.frozen metadata lists (requires_grad=False
// in the module). --trainable and --freeze refine the choice later.
std::vector<std::string> classifyParameters(Graph &g,
                                            const ExporterSignature &signature) {
  std::vector<std::string> guessed;
  llvm::DenseSet<const Value *> relevant;
  for (const Value *v : g.outputs())
    if (isFloat(v->type().dtype))
      relevant.insert(v);
  const auto &ops = g.ops();
  for (auto it = ops.rbegin(); it != ops.rend(); ++it) {
    const Op &op = **it;
    bool live = false;
    for (const Value *r : op.results())
      live |= relevant.count(r) != 0;
    if (!live)
      continue;
    for (unsigned i = 0; i < op.numOperands(); ++i)
      if (op.info().isDifferentiableOperand(i) &&
          isFloat(op.operand(i)->type().dtype))
        relevant.insert(op.operand(i));
  }
  for (Value *v : g.declared()) {
    if (v->kind() != ValueKind::Param)
      continue;
    bool trained = relevant.count(v) != 0 && !signature.frozen.count(v->name());
    if (signature.present)
      trained &= signature.parameters.count(v->name()) != 0;
    else if (signature.listed)
      trained &= signature.moduleParameters.count(v->name()) != 0;
    else {
      bool named = !isBufferName(v->name()) &&
                   !isExporterConstantName(v->name());
      if (trained && named && v->type().numElements() == 1 &&
          llvm::StringRef(v->name()).contains('.'))
        guessed.push_back(v->name());
      trained &= named && v->type().numElements() > 1;
    }
    if (!trained)
      g.setKind(v, ValueKind::Buffer);
  }
  return guessed;
}

} // namespace cleave::frontend
