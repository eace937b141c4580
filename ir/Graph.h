// The cleave IR graph: values, ops, and the use-def links between them.
//
// A Graph is a straight-line SSA program over tensors. Values are graph
// inputs, parameters (trainable float tensors), buffers (float state that is
// not trained, such as running statistics and masks), constants, or op
// results. Every value has a unique name and a static TensorType. Ops are kept
// in program order; each remembers the ONNX node name it came from (`loc`) so
// errors can point at the user's model and later passes can group ops into
// layers. The graph owns everything; Value* and Op* stay valid until erased.
#pragma once

#include "ir/Attribute.h"
#include "ir/OpInfo.h"
#include "ir/TensorData.h"
#include "ir/Type.h"

#include "llvm/ADT/StringMap.h"

#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace cleave::ir {

class Op;
class Value;

enum class ValueKind { Input, Param, Buffer, Const, Result };
std::string_view valueKindName(ValueKind k);

// Which part of a training step an op belongs to: the forward pass, the
// input-gradient (B) or weight-gradient (W) half of the backward pass, or the
// optimizer update. Forward-only graphs are all Fwd.
enum class Phase : uint8_t { Fwd, B, W, Opt };
std::string_view phaseName(Phase p); // "fwd", "B", "W", "opt"
std::optional<Phase> parsePhase(std::string_view s);

// A state tensor (parameter, buffer) and the value that replaces it after a
// training step.
struct StateUpdate {
  Value *state;
  Value *value;
};

struct Use {
  Op *user;
  unsigned operandIndex;
};

class Value {
public:
  const std::string &name() const { return name_; }
  const TensorType &type() const { return type_; }
  ValueKind kind() const { return kind_; }
  // The op producing this value, or null for inputs and declared tensors.
  Op *definingOp() const { return def_; }
  unsigned resultIndex() const { return resultIndex_; }
  const std::vector<Use> &uses() const { return uses_; }
  bool hasUses() const { return !uses_.empty(); }
  // Data of a parameter, buffer or constant; null otherwise.
  const std::shared_ptr<TensorData> &data() const { return data_; }
  void setData(std::shared_ptr<TensorData> d) { data_ = std::move(d); }
  bool isDeclared() const { return kind_ != ValueKind::Result; }

private:
  friend class Graph;
  friend class Op;
  std::string name_;
  TensorType type_;
  ValueKind kind_ = ValueKind::Result;
  Op *def_ = nullptr;
  unsigned resultIndex_ = 0;
  std::vector<Use> uses_;
  std::shared_ptr<TensorData> data_;
};

class Op {
public:
  OpKind kind() const { return kind_; }
  const OpInfo &info() const { return opInfo(kind_); }
  std::string_view name() const { return info().name; }

  llvm::ArrayRef<Value *> operands() const { return operands_; }
  Value *operand(unsigned i) const { return operands_[i]; }
  unsigned numOperands() const { return operands_.size(); }
  void setOperand(unsigned i, Value *v);

  llvm::ArrayRef<Value *> results() const { return results_; }
  Value *result(unsigned i = 0) const { return results_[i]; }
  unsigned numResults() const { return results_.size(); }

  const AttrMap &attrs() const { return attrs_; }
  bool hasAttr(std::string_view n) const { return attrs_.count(n) != 0; }
  void setAttr(const std::string &n, Attribute a) {
    attrs_.insert_or_assign(n, std::move(a));
  }
  // Attribute value or the op's declared default.
  const Attribute &attr(std::string_view n) const;
  int64_t getInt(std::string_view n) const { return attr(n).getInt(); }
  float getFloat(std::string_view n) const { return attr(n).getFloat(); }
  const std::string &getString(std::string_view n) const {
    return attr(n).getString();
  }
  const std::vector<int64_t> &getInts(std::string_view n) const {
    return attr(n).getInts();
  }

  // The ONNX node name this op was imported from (may be empty).
  const std::string &loc() const { return loc_; }
  void setLoc(std::string l) { loc_ = std::move(l); }
  // "Gemm '/fc1/Gemm'" or "Gemm producing %x", for error messages.
  std::string describe() const;

  Phase phase() const { return phase_; }
  void setPhase(Phase p) { phase_ = p; }

  // The pipeline stage the `partition` pass put this op on; -1 before it
  // (passes/Planning.h). Printed as `[s]` before the phase.
  int stage() const { return stage_; }
  void setStage(int s) { stage_ = s; }

private:
  friend class Graph;
  OpKind kind_;
  std::vector<Value *> operands_;
  std::vector<Value *> results_;
  AttrMap attrs_;
  std::string loc_;
  Phase phase_ = Phase::Fwd;
  int stage_ = -1;
};

class Graph {
public:
  Graph() = default;
  Graph(const Graph &) = delete;
  Graph &operator=(const Graph &) = delete;

  const std::string &name() const { return name_; }
  void setName(std::string n) { name_ = std::move(n); }

  // Declarations. Names must be unique; uniqueName() helps callers.
  Value *addInput(const std::string &name, TensorType type);
  Value *addDeclared(ValueKind kind, const std::string &name,
                     std::shared_ptr<TensorData> data);
  Value *addParam(const std::string &name, std::shared_ptr<TensorData> d) {
    return addDeclared(ValueKind::Param, name, std::move(d));
  }
  Value *addBuffer(const std::string &name, std::shared_ptr<TensorData> d) {
    return addDeclared(ValueKind::Buffer, name, std::move(d));
  }
  Value *addConst(const std::string &name, std::shared_ptr<TensorData> d) {
    return addDeclared(ValueKind::Const, name, std::move(d));
  }
  // Gives `v` a new name, which must be unused.
  void rename(Value *v, const std::string &name);
  // Changes a declared tensor between Param, Buffer and Const.
  void setKind(Value *v, ValueKind kind);

  // Appends an op at the end of the program. Result names may be empty (a
  // fresh name is made). Types are taken as given; the verifier checks them.
  Op *appendOp(OpKind kind, llvm::ArrayRef<Value *> operands,
               llvm::ArrayRef<TensorType> resultTypes,
               llvm::ArrayRef<std::string> resultNames = {},
               AttrMap attrs = {}, std::string loc = {});
  // Inserts a new op right before `before` (see appendOp).
  Op *insertOpBefore(Op *before, OpKind kind, llvm::ArrayRef<Value *> operands,
                     llvm::ArrayRef<TensorType> resultTypes,
                     llvm::ArrayRef<std::string> resultNames = {},
                     AttrMap attrs = {}, std::string loc = {});
  // Gives an existing op one more result (an optional result it did not
  // produce before, such as Dropout's mask).
  Value *appendResult(Op *op, TensorType type, const std::string &name);
  // Erases an op whose results have no uses.
  void eraseOp(Op *op);
  // Removes a declared value that has no uses and is not an output.
  void eraseDeclared(Value *v);
  // Replaces every use of `from` (including graph outputs) with `to`.
  void replaceAllUsesWith(Value *from, Value *to);

  void addOutput(Value *v) { outputs_.push_back(v); }
  void setOutputs(std::vector<Value *> outs) { outputs_ = std::move(outs); }

  // Values produced by fwd/B ops that W ops read: what a pipeline stage
  // keeps per microbatch until its W work has run (set by split-backward).
  llvm::ArrayRef<Value *> stash() const { return stash_; }
  void setStash(std::vector<Value *> s) { stash_ = std::move(s); }
  // State written back after each training step (set by the optimizer).
  llvm::ArrayRef<StateUpdate> updates() const { return updates_; }
  void addUpdate(Value *state, Value *value) {
    updates_.push_back({state, value});
  }
  void clearUpdates() { updates_.clear(); }
  // True when some op is not Fwd (the text form then tags every op).
  bool isTraining() const;
  // True when an output, update or stash entry refers to `v`.
  bool isPinned(const Value *v) const;

  llvm::ArrayRef<Value *> inputs() const { return inputs_; }
  // Parameters, buffers and constants, in declaration order.
  llvm::ArrayRef<Value *> declared() const { return declared_; }
  llvm::ArrayRef<Value *> outputs() const { return outputs_; }
  const std::vector<std::unique_ptr<Op>> &ops() const { return ops_; }
  bool isOutput(const Value *v) const;

  Value *lookup(llvm::StringRef name) const;
  // `base` if unused, otherwise `base.1`, `base.2`, ...
  std::string uniqueName(llvm::StringRef base) const;

private:
  Value *newValue(const std::string &name, TensorType type, ValueKind kind);

  std::string name_ = "main";
  std::vector<std::unique_ptr<Value>> values_;
  std::vector<Value *> inputs_, declared_, outputs_, stash_;
  std::vector<StateUpdate> updates_;
  std::vector<std::unique_ptr<Op>> ops_;
  llvm::StringMap<Value *> byName_;
  mutable unsigned nextTemp_ = 0;
};

} // namespace cleave::ir
