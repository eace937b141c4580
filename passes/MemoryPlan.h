// The memory planner: lifetimes of values placed in one arena, and the
// frames of a stage graph laid out that way. Codegen takes a stage's
// frames from planStageFrames, the interpreter places its values with
// placeLifetimes, and the plan-memory pass (passes/Planning.h) reports both
// frames and each rank's peak under the schedule from the same call
// (docs/design/memory-count.md).
#pragma once

#include "ir/Graph.h"

#include "llvm/ADT/ArrayRef.h"
#include "llvm/ADT/DenseMap.h"
#include "llvm/ADT/DenseSet.h"

#include <cstdint>
#include <vector>

namespace cleave::passes {

// Buffers start on 64-byte boundaries and take at least 64 bytes.
inline int64_t alignArena(int64_t n) {
  return ((n < 1 ? 1 : n) + 63) / 64 * 64;
}

// A buffer live from position `from` to `to` (both included).
struct Lifetime {
  int64_t from = 0, to = 0, bytes = 0;
};

struct ArenaLayout {
  std::vector<int64_t> offsets; // one per lifetime, in the order given
  int64_t size = 0;             // the arena's bytes
  int64_t livePeak = 0; // the most aligned bytes live at one position: a
                        // lower bound on `size`
};

// Greedy by size: the largest first (ties: the earlier start, then the
// order given), each at the lowest offset where it overlaps no placed
// buffer live at the same time. First fit in start order had left frames
// 15 to 22% above their live peak; by size they come within a few percent.
ArenaLayout placeLifetimes(llvm::ArrayRef<Lifetime> lifetimes);

// The two frames of a stage graph (a training graph or one stage of it).
// Programs F, B, W run in that order for one microbatch over the fwd, B and
// W ops in program order; the step program runs the opt ops. A value lives
// from the op that makes it to its last reader, an input from the start; a
// value the step sums (read by an opt op), a state update's value and the
// loss live to the end of their program (they are read after it). The
// result of a layout-only op (Reshape, Flatten, Squeeze, Unsqueeze,
// Identity) with its operand's bytes, in the same frame, shares its
// operand's buffer.
struct StageFrames {
  // Every frame value's offset in its frame: graph inputs and results of
  // fwd/B/W ops in the microbatch frame, results of opt ops in the step
  // frame. A value sharing its operand's buffer has the same offset.
  llvm::DenseMap<const ir::Value *, int64_t> offset;
  // Values that share the buffer of another (their operand, or its root).
  llvm::DenseMap<const ir::Value *, const ir::Value *> sharesWith;
  ArenaLayout micro, step;
  // Offloaded values (results of Offload ops, passes/Recompute.h) in the
  // microbatch's host frame: a second arena per microbatch in host memory,
  // whose lifetimes run from the Offload to the value's last Fetch.
  ArenaLayout host;
  llvm::DenseSet<const ir::Value *> inHost; // values with host offsets
  // Step updates the executor writes into their state's own bytes
  // (updatedInPlace): no room in the step frame (offset 0, not laid out).
  llvm::DenseSet<const ir::Value *> inPlace;
  // Parameters, buffers, constants, and one sum per per-microbatch value
  // the step reads: what lives for the whole run.
  int64_t persistentBytes = 0;
};

StageFrames planStageFrames(const ir::Graph &g, const ir::Value *loss);

// A reshape-like op (LayoutOnly: Reshape, Flatten, Squeeze, Unsqueeze,
// Identity) of one operand whose result has the operand's bytes: the plan
// places the result on the operand's buffer where both live in one frame,
// and the executor then skips the op.
bool isViewOp(const ir::Op &op);

// The operand whose bytes `op`'s result may take when the operand is read
// by nothing after it (planStageFrames), or -1: the scatters and their
// data gradients, and GatherGrad and SliceGrad with a sum operand (Ops.def),
// whose kernels copy the operand to the result unless the two are one
// buffer and then write (or add) the scattered elements, and whose result
// has the operand's type. A loop that fills a matrix a row at a time (the
// gated delta rule's chunks) is a chain of such ops, each of which copied
// the whole matrix, and its gradient a chain of such sums.
int inPlaceOperand(const ir::Op &op);

// The state updates whose new value the executor writes into the state's
// own bytes, as runtime::stepUpdatesInPlace (runtime/Plan.h) finds them in
// the plan codegen makes of `g`: made by an SGD or AdamW op of the step,
// and no step op after it reads the state. The update's value is then no
// step-frame value: an SGD step's frame held a copy of every parameter
// (ResNet-18: 44.7 of its 186.8 MB planned peak), AdamW's three (the
// parameter and both moments).
llvm::DenseSet<const ir::Value *> updatedInPlace(const ir::Graph &g);

// The program an op of phase `p` runs in: 0 F, 1 B, 2 W, 3 the step.
int programOf(ir::Phase p);

} // namespace cleave::passes
