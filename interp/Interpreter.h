// The reference interpreter: runs an IR graph forward on a backend.
//
// Used by tests (run before and after a pass, compare), by the conformance
// suite and by `cleave-opt --run`. At creation it loads every declared
// tensor into backend memory, checks that the backend has a kernel for each
// op, and plans one memory arena for all op results from their lifetimes
// (a value's slot is reused once its last user has run). Each run copies the
// inputs in, walks the ops in program order and copies the outputs out.
//
// It lives outside runtime/ because it reads the IR; the runtime proper will
// execute Plans and never see a graph.
#pragma once

#include "ir/Graph.h"
#include "runtime/Kernel.h"

#include "llvm/ADT/DenseMap.h"
#include "llvm/Support/Error.h"

#include <memory>
#include <vector>

namespace cleave::interp {

using Tensor = std::shared_ptr<ir::TensorData>;

class Interpreter {
public:
  static llvm::Expected<std::unique_ptr<Interpreter>>
  create(const ir::Graph &g, runtime::Backend &backend);
  ~Interpreter();

  // `inputs` in graph-input order, each of exactly the input's type. Returns
  // the graph outputs in order. `seed` feeds random ops (Dropout).
  llvm::Expected<std::vector<Tensor>> run(llvm::ArrayRef<Tensor> inputs,
                                          uint64_t seed = 0);

  // Bytes of the result arena (the peak of live op results and inputs).
  int64_t arenaBytes() const { return arenaBytes_; }

private:
  Interpreter(const ir::Graph &g, runtime::Backend &b) : g_(g), backend_(b) {}
  llvm::Error prepare();

  const ir::Graph &g_;
  runtime::Backend &backend_;
  std::vector<void *> owned_;                  // backend allocations
  llvm::DenseMap<const ir::Value *, void *> where_; // every value's buffer
  llvm::DenseMap<const ir::Value *, int64_t> offset_; // arena offsets
  void *arena_ = nullptr;
  int64_t arenaBytes_ = 0;
};

} // namespace cleave::interp
