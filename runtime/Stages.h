// The stage executors a process runs, on the backend chosen for them: the
// threaded run makes all P x D of a plan in one process, wired with
// in-process comms (createThreadedPipeline); under mpirun each process makes
// its own one over MPI (createLocalStage).
#pragma once

#include "runtime/Executor.h"
#include "runtime/Kernel.h"
#include "runtime/Plan.h"
#include "runtime/comm/Comm.h"

#include "llvm/Support/Error.h"

#include <memory>
#include <string>
#include <vector>

namespace cleave::runtime {

struct StageOptions {
  std::string device = "cpu"; // cpu | cuda | cuda-emulated
  int64_t threads = 1;        // CPU kernel threads per stage
  StageExecutor::NonFinitePolicy nonFinite =
      StageExecutor::NonFinitePolicy::Stop;
  bool batchW = false;
  // Runs of kernels recorded and launched as graphs (--cuda-graphs;
  // StageExecutor::setGraphs).
  bool graphs = false;
  // Gradient clipping by global norm (StageExecutor::setClipGradNorm);
  // 0: off.
  double clipGradNorm = 0;
  // Every receive, barrier and collective of the stage's comms fails after
  // waiting this long (0: forever); the default is PyTorch's NCCL watchdog's.
  double commTimeoutSeconds = 600;
  // How the stages exchange messages (threads or mpirun): "keyed" (matched by
  // tag and microbatch, runtime/comm/Comm.h), "ordered" (one FIFO per
  // stage pair matched by order alone, as NCCL matches;
  // runtime/comm/ChannelComm.h) or "nccl" (those channels over NCCL
  // between GPUs, runtime/cuda/Nccl.h).
  std::string comm = "keyed";
};

// One stage of one replica, with the backend it runs on.
struct LocalStage {
  int replica = 0, stage = 0;
  std::unique_ptr<Backend> backend;
  std::unique_ptr<StageExecutor> executor;
};

// Kernel threads per stage: `asked`, or by default the cores shared by the
// `stagesOnHost` stages (at least 1).
int64_t threadsPerStage(int64_t asked, int stagesOnHost);

// The backend executor `index` (replica * P + stage) runs on: the CPU with
// `threads` kernel threads, the emulated CUDA backend, or CUDA device
// index mod the devices visible.
llvm::Expected<std::unique_ptr<Backend>>
createBackend(const std::string &device, int64_t threads, int index);

// Stage `stage` of replica `replica` over `pipe` (its replica's pipeline
// group) and, with replicas, `group` (the stage's data-parallel group).
// The executor's errors name the stage, and the replica where there are
// several; the backend's are the same on every stage and name neither.
llvm::Expected<LocalStage> createLocalStage(const Plan &plan, int replica,
                                            int stage,
                                            const StageOptions &options,
                                            Comm &pipe, Comm *group);

// --comm nccl: the GPU of each of `stages` of replica `replica` (the one
// createBackend gives it), or why there is none (the run needs --device
// cuda and a GPU).
llvm::Expected<std::vector<int>> ncclStageGpus(const Plan &plan, int replica,
                                               const std::vector<int> &stages,
                                               const StageOptions &options);

// Under mpirun, with --comm ordered or nccl: the Comm each of this
// process's `stages` (of replica `replica`) trains through. The plan's
// messages go over channels (runtime/comm/ChannelComm.h): NCCL between
// stages on different GPUs (--comm nccl), otherwise host FIFOs over `fifo`,
// a second group of the same processes as `pipe` (the replica's pipeline
// group, ranks = plan ranks) so that the two never take each other's
// messages; the rest (the non-finite vote, clipping, barriers) over `pipe`,
// through a view that names the stage. Both groups must outlive the Comms.
// The NCCL channels' ids travel over `pipe`: a collective of the processes.
llvm::Expected<std::vector<std::unique_ptr<Comm>>>
createRankPipes(const Plan &plan, int replica, const std::vector<int> &stages,
                Comm &pipe, Comm &fifo, const StageOptions &options);

// Every stage of every replica in this process: element r * P + s is stage
// s of replica r. Declared after the comms, so destroyed before them.
struct ThreadedPipeline {
  std::vector<std::vector<std::unique_ptr<Comm>>> pipes;  // [replica][stage]
  std::vector<std::vector<std::unique_ptr<Comm>>> groups; // [stage][replica]
  // --comm nccl with replicas on distinct GPUs: the groups' sums over NCCL
  // (cuda::createNcclGroupComms), null where a group stays on its comm.
  std::vector<std::vector<std::unique_ptr<Comm>>> ncclGroups;
  std::vector<LocalStage> stages;

  // The stages as a Trainer takes them (runtime/Trainer.h).
  std::vector<LocalStage *> locals() {
    std::vector<LocalStage *> out;
    for (LocalStage &st : stages)
      out.push_back(&st);
    return out;
  }
};
llvm::Expected<std::unique_ptr<ThreadedPipeline>>
createThreadedPipeline(const Plan &plan, const StageOptions &options);

} // namespace cleave::runtime
