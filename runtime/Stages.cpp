#include "runtime/Stages.h"

#include "runtime/comm/ChannelComm.h"
#include "runtime/comm/ParcelComm.h"
#include "runtime/comm/StageComm.h"
#include "runtime/cuda/Lowering.h"
#include "support/Errors.h"
#ifdef CLEAVE_HAVE_CUDA
#include "runtime/cuda/CudaBackend.h"
#include "runtime/cuda/Nccl.h"
#endif

#include <algorithm>
#include <system_error>
#include <thread>

namespace cleave::runtime {

int64_t threadsPerStage(int64_t asked, int stagesOnHost) {
  if (asked > 0)
    return asked;
  return std::max<int64_t>(1, int64_t(std::thread::hardware_concurrency()) /
                                  std::max(stagesOnHost, 1));
}

llvm::Expected<std::unique_ptr<Backend>>
createBackend(const std::string &device, int64_t threads, int index) {
  if (device == "cpu") {
    try {
      return createCpuBackend(int(threads));
    } catch (const std::system_error &e) {
      return fail("cannot start " + std::to_string(threads) +
                  " kernel threads for a stage: " + e.what());
    }
  }
  if (device == "cuda-emulated")
    return cuda::createCudaEmulatedBackend();
  if (device != "cuda")
    return fail("unknown device '" + device +
                "' (cpu, cuda or cuda-emulated)");
#ifdef CLEAVE_HAVE_CUDA
  auto count = cudaDeviceCount();
  if (!count)
    return fail("--device cuda: " + llvm::toString(count.takeError()));
  return createCudaBackend(index % *count);
#else
  (void)index;
  return fail("--device cuda: this cleave-run was built without the CUDA "
              "backend (no nvcc at build time)");
#endif
}

llvm::Expected<std::vector<int>> ncclStageGpus(const Plan &plan, int replica,
                                               const std::vector<int> &stages,
                                               const StageOptions &options) {
  if (options.device != "cuda")
    return fail("--comm=nccl carries messages between GPUs: it needs "
                "--device cuda");
#ifdef CLEAVE_HAVE_CUDA
  auto count = cudaDeviceCount();
  if (!count)
    return fail("--comm=nccl: " + llvm::toString(count.takeError()));
  std::vector<int> out;
  for (int s : stages) // createBackend's index, over the GPUs visible
    out.push_back((replica * int(plan.stages.size()) + s) % *count);
  return out;
#else
  (void)plan, (void)replica, (void)stages;
  return fail("--comm=nccl: this cleave-run was built without the CUDA "
              "backend (no nvcc at build time)");
#endif
}

llvm::Expected<LocalStage> createLocalStage(const Plan &plan, int replica,
                                            int stage,
                                            const StageOptions &options,
                                            Comm &pipe, Comm *group) {
  std::string replicaText =
      plan.dataParallel > 1 ? "replica " + std::to_string(replica) + " "
                            : std::string();
  LocalStage out;
  out.replica = replica;
  out.stage = stage;
  auto backend =
      createBackend(options.device, options.threads,
                    replica * int(plan.stages.size()) + stage);
  if (!backend) // the same on every stage: said once, without one
    return backend.takeError();
  out.backend = std::move(*backend);
  auto ex = StageExecutor::create(plan, stage, *out.backend, pipe);
  if (!ex) // the executor's errors name the stage
    return fail(replicaText + llvm::toString(ex.takeError()));
  out.executor = std::move(*ex);
  pipe.setTimeout(options.commTimeoutSeconds);
  if (group) {
    group->setTimeout(options.commTimeoutSeconds);
    out.executor->setDataParallel(group);
  }
  out.executor->setNonFinitePolicy(options.nonFinite);
  out.executor->setBatchW(options.batchW);
  if (auto e = out.executor->setGraphs(options.graphs))
    return std::move(e);
  // The plan's shape decides whether it can clip: the same line from
  // every stage.
  if (auto e = out.executor->setClipGradNorm(options.clipGradNorm))
    return std::move(e);
  return out;
}

llvm::Expected<std::vector<std::unique_ptr<Comm>>>
createRankPipes(const Plan &plan, int replica, const std::vector<int> &stages,
                Comm &pipe, Comm &fifo, const StageOptions &options) {
  int p = int(plan.stages.size());
  std::vector<int> stageRank = plan.stageRank;
  if (stageRank.empty()) // one stage a process: stage s is rank s
    for (int s = 0; s < p; ++s)
      stageRank.push_back(s);
  std::vector<std::unique_ptr<ChannelTransport>> transports;
  for (int s : stages)
    transports.push_back(createHostChannelTransport(
        std::make_unique<StageComm>(fifo, s, stageRank)));
  if (options.comm == "nccl") {
    auto devices = ncclStageGpus(plan, replica, stages, options);
    if (!devices)
      return devices.takeError();
#ifdef CLEAVE_HAVE_CUDA
    auto nccl = cuda::createNcclRankTransports(plan, stages, *devices,
                                               stageRank, pipe,
                                               std::move(transports),
                                               options.commTimeoutSeconds);
    if (!nccl)
      return fail("--comm=nccl: " + llvm::toString(nccl.takeError()));
    transports = std::move(*nccl);
#endif // without CUDA, ncclStageGpus said so
  } else if (options.comm != "ordered") {
    return fail("--comm must be 'ordered' or 'nccl' for channels, not '" +
                options.comm + "'");
  }
  std::vector<std::unique_ptr<Comm>> out;
  for (size_t k = 0; k < stages.size(); ++k)
    out.push_back(createChannelComm(
        plan, stages[k], std::move(transports[k]),
        std::make_unique<StageComm>(pipe, stages[k], stageRank)));
  return std::move(out);
}

llvm::Expected<std::unique_ptr<ThreadedPipeline>>
createThreadedPipeline(const Plan &plan, const StageOptions &options) {
  int p = int(plan.stages.size()), d = plan.dataParallel;
  auto run = std::make_unique<ThreadedPipeline>();
  std::vector<int> allStages;
  for (int s = 0; s < p; ++s)
    allStages.push_back(s);
  std::vector<std::vector<int>> gpus; // --comm nccl: [replica][stage]
  for (int r = 0; r < d; ++r) {
    auto pipe = createInProcessComms(p, options.commTimeoutSeconds);
    if (options.comm == "ordered") {
      // The plan's messages over order-matched channels, the rest over
      // the keyed comm (runtime/comm/ChannelComm.h).
      auto fifo = createInProcessComms(p, options.commTimeoutSeconds);
      for (int s = 0; s < p; ++s)
        pipe[s] = createChannelComm(
            plan, s,
            createHostChannelTransport(std::move(fifo[s]), /*oneProcess=*/true),
            std::move(pipe[s]));
    } else if (options.comm == "nccl") {
      auto devices = ncclStageGpus(plan, r, allStages, options);
      if (!devices)
        return devices.takeError();
      gpus.push_back(*devices);
#ifdef CLEAVE_HAVE_CUDA
      auto transports = cuda::createNcclTransports(
          plan, *devices, options.commTimeoutSeconds);
      if (!transports)
        return fail("--comm=nccl: " + llvm::toString(transports.takeError()));
      for (int s = 0; s < p; ++s)
        pipe[s] = createChannelComm(plan, s, std::move((*transports)[s]),
                                    std::move(pipe[s]));
#endif // without CUDA, ncclStageGpus said so
    } else if (options.comm != "keyed") {
      return fail("--comm must be 'keyed', 'ordered' or 'nccl', not '" +
                  options.comm + "'");
    } else if (options.device != "cpu") {
      // One process: a device backend's messages go as parcels, device to
      // device (runtime/comm/ParcelComm.h).
      for (int s = 0; s < p; ++s)
        pipe[s] = createParcelComm(plan, s, std::move(pipe[s]));
    }
    run->pipes.push_back(std::move(pipe));
  }
  for (int s = 0; s < p; ++s)
    run->groups.push_back(createInProcessComms(d, options.commTimeoutSeconds));
#ifdef CLEAVE_HAVE_CUDA
  if (options.comm == "nccl" && d > 1) {
    // Each stage's replicas sum over NCCL where they are on distinct GPUs.
    for (int s = 0; s < p; ++s) {
      std::vector<Comm *> controls;
      std::vector<int> devices;
      for (int r = 0; r < d; ++r) {
        controls.push_back(run->groups[s][r].get());
        devices.push_back(gpus[r][s]);
      }
      auto g = cuda::createNcclGroupComms(controls, devices);
      if (!g)
        return fail("--comm=nccl: " + llvm::toString(g.takeError()));
      run->ncclGroups.push_back(std::move(*g));
    }
  }
#endif
  auto groupOf = [&](int s, int r) -> Comm * {
    if (d <= 1)
      return nullptr;
    if (!run->ncclGroups.empty() && run->ncclGroups[s][r])
      return run->ncclGroups[s][r].get();
    return run->groups[s][r].get();
  };
  for (int r = 0; r < d; ++r)
    for (int s = 0; s < p; ++s) {
      auto st = createLocalStage(plan, r, s, options, *run->pipes[r][s],
                                 groupOf(s, r));
      if (!st)
        return st.takeError();
      run->stages.push_back(std::move(*st));
    }
  return run;
}

} // namespace cleave::runtime
