// The cost model: how long each op of a training graph takes and how much
// memory its values need, which is what the partitioner balances.
//
// Three sources of op times (`--cost-model`):
//   analytic      FLOPs and bytes moved per op (from the op's kind and its
//                 operand and result shapes) against a device profile: the
//                 roofline max(FLOPs / peak FLOP/s, bytes / bandwidth) plus a
//                 fixed per-op overhead;
//   uniform       every layer's F, B and W take one unit (for studying
//                 schedules; the partitioner then balances layer counts);
//   profile:FILE  measured per-op times, keyed by op location and phase
//                 (the JSON format is in docs/design/partition.md).
// The device profiles (`cpu`, `h200`) and how their figures were obtained
// are documented in docs/design/partition.md.
#pragma once

#include "ir/Graph.h"

#include "llvm/ADT/StringMap.h"
#include "llvm/ADT/StringRef.h"
#include "llvm/Support/Error.h"

#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace cleave::passes {

// Work of one op: floating-point operations and bytes read plus written.
struct OpWork {
  double flops = 0;
  double bytes = 0;
};

// FLOPs from the op's kind and shapes: 2·M·N·K for the matrix products and
// convolutions (forward and each gradient part), a few per element for the
// rest; bytes are every operand read once and every result written once.
OpWork opWork(const ir::Op &op);

// A device, as the analytic model sees it.
struct DeviceProfile {
  std::string name;
  double peakFlops = 0;       // FLOP/s of f32 matrix products
  double memBandwidth = 0;    // bytes/s of streaming memory traffic
  double opOverhead = 0;      // s per op (dispatch, kernel launch)
  double linkBandwidth = 0;   // bytes/s between two pipeline stages
  double linkLatency = 0;     // s per message between two stages
  double peakFlops16 = 0;     // FLOP/s of bf16 matrix products (f32 sums)
  // bytes/s each way between device and host memory (activation offload);
  // 0: the device is the host (one memory, nothing to offload to).
  double hostBandwidth = 0;
  // FLOP/s of the fused attention kernels (FusedAttention and its
  // gradient, counted as opWork counts them); 0: the f32 products' peak.
  double attentionFlops = 0;
  // s the sending stage spends per message (the copy's fixed part, the
  // receiver's wake-up); 0 where the profile leaves it out.
  double sendOverhead = 0;
  // Times an op on the device itself, where the profile can: the tools'
  // "host" runs the runtime's own kernel on operands of the op's types
  // (tools/HostProfile.h). `stepBytes`: every value, parameter and input
  // of the op's step together (whether what the op reads is still in the
  // caches). Seconds, or nullopt for the formulas.
  std::function<std::optional<double>(const ir::Op &, double stepBytes)>
      timeOp;
  // The device's backend runs a gradient op split-backward keeps whole
  // (Ops.def's CLEAVE_GRAD_KEEP_WHOLE) as its two parts, one after the
  // other (the CUDA lowering), so the formulas count each part's traffic;
  // false where it has a kernel that shares the pass (the CPU backend).
  bool splitsKeptWholeGrads = false;
  bool canOffload() const { return hostBandwidth > 0; }
};

// The built-in profiles: "cpu" (this machine kind, measured), "h200" and
// "a100" (NVIDIA's published H200 SXM and A100 SXM4 80 GB figures), and
// those registered by the process (the tools' "host", measured when asked
// for: tools/HostProfile.h). Unknown names are an error that lists the
// known ones.
llvm::Expected<DeviceProfile> lookupDeviceProfile(llvm::StringRef name);

// Adds a profile lookupDeviceProfile finds by its name (replacing one
// registered before under that name).
void registerDeviceProfile(const DeviceProfile &profile);

// Predicted time of one op on a device, in seconds; `stepBytes` as
// DeviceProfile::timeOp takes it (0: unknown, no larger than the op's).
double predictOpTime(const ir::Op &op, const DeviceProfile &device,
                     double stepBytes = 0);

// Every value, parameter and input of a graph's step, in bytes.
double stepBytes(const ir::Graph &g);

enum class CostModelKind { Analytic, Uniform, Profile };

// What `--cost-model analytic|uniform|profile:FILE` asks for.
struct CostModelSpec {
  CostModelKind kind = CostModelKind::Analytic;
  std::string profilePath; // for Profile
};
llvm::Expected<CostModelSpec> parseCostModel(llvm::StringRef text);

// Measured op times: seconds per microbatch (per step for `opt` ops) of all
// ops that share a location and a phase.
class OpProfile {
public:
  // Reads the JSON text of a profile; `source` names it in errors.
  static llvm::Expected<OpProfile> parse(llvm::StringRef json,
                                         llvm::StringRef source);
  static llvm::Expected<OpProfile> load(const std::string &path);

  // The time of the ops at `loc` in `phase`, if the profile has one;
  // where sharesCores(), without the part they waited for a core (the
  // entry's "core_wait"), which the simulation of shared cores makes.
  std::optional<double> time(llvm::StringRef loc, ir::Phase phase) const;

  // What one action of `kind` ("F", "B", "W", "BW") took beyond its
  // kernels and waits, the mean over the profiled stages (the profile's
  // "actions"; 0 if it has none): the executor's own time per action.
  // Where sharesCores(), without the part its thread waited for a core (the
  // entry's "core_wait"), which the simulation of shared cores makes.
  double actionOverhead(llvm::StringRef kind) const;

  // How long a message took to reach a stage that was already waiting for
  // it (from the send to the receiver running again): the profile's
  // "messages", when the run's comm timed them (stages of one process).
  // Beside a busy process a woken stage can wait milliseconds for a core;
  // the simulator adds these to the messages. Per receiving stage, and over
  // all of them (weighted by the receives that waited); nothing where the
  // profile has none.
  // Where sharesCores(), without the receiver's wait for a core after the
  // message came ("core_wait"). Per stage: nothing where under a tenth of
  // the stage's receives waited (a mean of a few samples).
  std::optional<double> messageLatency() const;
  std::optional<double> messageLatency(int stage) const;

  // How much of the machine the profiled run had (the profile's "cores",
  // runtime/trace/Profile.h): the cores it could use, the cores other
  // processes kept busy on average and what they wanted (their threads
  // running or waiting for a core, on average; both unknown in a run of several processes), and per stage
  // its rank's wait for a core a step.
  struct Sharing {
    int cores = 0;
    std::optional<double> otherCores;
    std::optional<double> otherRunnable;
    std::map<int, double> coreWait; // by stage, seconds a step
  };
  const std::optional<Sharing> &sharing() const { return sharing_; }
  // The cores other processes wanted while the profile was measured: the
  // cores they kept busy or, where more, their threads that stayed ready
  // to run (a busy neighbour wants its core whether the ranks left it all
  // of it or not: beside gpt-tiny's 2 x 2 stages one busy process got 0.67
  // to 1.02 of a core, run to run, and simulated on what that left the
  // steps came out 1.01 to 1.25 of the simulation, on 1.0 left 1.01 to
  // 1.04); at most the cores. nullopt where unknown.
  std::optional<double> otherCoresWanted() const;
  // Whether other processes wanted a quarter of a core or more while the
  // profile was measured: then its ranks are simulated on the cores left
  // (coresLeft()), and its times, overheads and delays are taken without
  // their waits for a core.
  bool sharesCores() const;
  // The part of the ops' measured time that was a wait for a core.
  double kernelWaitShare() const;
  // The cores the ranks are simulated on: the cores less what the other
  // processes took, at least a quarter. What they took lies between what
  // they got (other_cores) and what they wanted, by how the kernel shared
  // the cores in the profiled run. Where the ranks' kernels waited for a
  // core about as much as an even share among the ranks and the others'
  // threads makes them (HF Qwen3, 2 stages, millisecond kernels beside one
  // busy process: 31% of their time, an even share 33%), the kernel sliced
  // the cores evenly, and what the others got is what they took (0.80 of a
  // core; on the 1.2 cores left the predicted step was within 1.5% of the
  // measured one, on 1.0 it was 16% long). Where the kernels hardly waited (gpt-tiny's 10 to 100 us
  // kernels: 2 to 7%) the ranks lost their core at the hand-offs instead,
  // to a neighbour that kept its own (the ranks took turns on the other):
  // what it wanted is what it took (2 x 2 stages 1.00 to 1.03 of
  // simulated; on what it got 1.00 to 1.06, and 1.01 to 1.25 measured from
  // the run's start). In between, in proportion.
  double coresLeft() const;

private:
  static std::string key(llvm::StringRef loc, ir::Phase phase);
  llvm::StringMap<double> times_;
  llvm::StringMap<double> opCoreWaits_; // of times_
  llvm::StringMap<std::vector<double>> overheads_; // by action kind
  llvm::StringMap<std::vector<double>> overheadCoreWaits_; // of those
  struct Messages {
    double latency = 0;
    int64_t waited = 0;
    double coreWait = 0; // of latency
    int64_t received = 0; // receives in all, waited or not
  };
  std::map<int, Messages> messages_; // by receiving stage
  std::optional<Sharing> sharing_;
};

// The predicted time of every op of `g`, in program order, in seconds:
// analytic from `device`, or from `profile` (each (location, phase) group's
// measured time shared evenly by its ops; an op the profile does not cover
// is an error naming it). Not for the uniform model, which has no op times.
llvm::Expected<std::vector<double>>
predictOpTimes(const ir::Graph &g, const CostModelSpec &spec,
               const DeviceProfile &device);

// Bytes a declared tensor keeps on its stage for the whole step: a
// parameter twice (the value and its gradient, summed over microbatches),
// buffers (optimizer state among them: `<param>.momentum`, `.adam_m`,
// `.adam_v`) and constants once.
int64_t staticBytes(const ir::Value &declared);

} // namespace cleave::passes
