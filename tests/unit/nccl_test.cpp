// NCCL's bootstrap and channels (runtime/cuda/Nccl.h). On any machine with
// the CUDA toolkit: the library loads, ncclGetUniqueId gives fresh ids
// (its bootstrap is sockets, no GPU), a plan's channels are its stage pairs
// that exchange messages, and making a communicator without a GPU fails in
// one line. Where a GPU is visible (tools/gpu-check.sh), a one-rank
// communicator opens and reports no error.
#ifdef CLEAVE_HAVE_CUDA
#include "runtime/cuda/CudaBackend.h"
#include "runtime/cuda/Nccl.h"
#include "tools/Compile.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <set>
#include <thread>

namespace unit_nccl {

using namespace cleave;
using namespace cleave::runtime::cuda;

TEST(Nccl, LibraryLoadsAndIdsAreFresh) {
  auto version = ncclLibraryVersion();
  ASSERT_TRUE(bool(version)) << llvm::toString(version.takeError());
  EXPECT_EQ(version->rfind("NCCL 2.", 0), 0u) << *version;
  auto a = newNcclId(), b = newNcclId();
  ASSERT_TRUE(bool(a)) << llvm::toString(a.takeError());
  ASSERT_TRUE(bool(b)) << llvm::toString(b.takeError());
  EXPECT_NE(a->bytes, NcclId().bytes);
  EXPECT_NE(a->bytes, b->bytes);
}

TEST(Nccl, CommunicatorOnTheGpuOrOneLineWithout) {
  auto id = newNcclId();
  ASSERT_TRUE(bool(id)) << llvm::toString(id.takeError());
  auto comm = openNcclCommunicator(*id, 0, 1, 0);
  if (!runtime::cudaDeviceCount()) {
    ASSERT_FALSE(bool(comm));
    std::string why = llvm::toString(comm.takeError());
    EXPECT_EQ(why.find('\n'), std::string::npos) << why;
    EXPECT_EQ(why.rfind("NCCL needs a GPU: no usable CUDA device (", 0), 0u)
        << why;
    return;
  }
  ASSERT_TRUE(bool(comm)) << llvm::toString(comm.takeError());
  EXPECT_EQ((*comm)->size(), 1);
  EXPECT_FALSE(bool((*comm)->asyncError()));
  auto bad = openNcclCommunicator(*id, 2, 1, 0);
  ASSERT_FALSE(bool(bad));
  llvm::consumeError(bad.takeError());
}

static llvm::Expected<runtime::Plan> threeStagePlan() {
  tools::CompileOptions o;
  o.model = std::string(CLEAVE_SOURCE_DIR) + "/examples/gpt/gpt-tiny.onnx";
  o.import.microbatchSize = 2;
  tools::PlanningRequest req;
  req.stages = 3;
  req.stagesGiven = true;
  req.microbatches = 4;
  req.microbatchesGiven = true;
  req.schedule = "1f1b";
  req.layerDepth = 2;
  o.planning = req;
  auto r = tools::compile(o);
  if (!r)
    return r.takeError();
  return tools::buildRunnablePlan(*r, o, {});
}

TEST(Nccl, ChannelsAreTheStagePairsThatExchangeMessages) {
  auto plan = threeStagePlan();
  ASSERT_TRUE(bool(plan)) << llvm::toString(plan.takeError());
  std::vector<std::pair<int, int>> pairs;
  for (const NcclChannel &c : ncclChannels(*plan)) {
    pairs.push_back({c.fromStage, c.toStage});
    // At least the forward activations or the gradients of 4 microbatches.
    EXPECT_GE(c.messagesPerStep, 4) << c.fromStage << "->" << c.toStage;
  }
  // Activations forward, gradients back, between neighbours only, in
  // (from, to) order.
  std::vector<std::pair<int, int>> want = {{0, 1}, {1, 0}, {1, 2}, {2, 1}};
  EXPECT_EQ(pairs, want);
}

// Under mpirun each process holds its stages' ends of the channels and
// agrees on each channel's id with the other end's process over the host
// comm (here threads with in-process comms standing for the processes).
// Both ends of a channel get the same id and the same verdict; a channel
// between two stages on one GPU stays on the host FIFO; a process with
// both ends of a channel decides alone.
static std::vector<std::vector<NcclChannelEnd>>
agreeAll(const runtime::Plan &plan, const std::vector<int> &stageRank,
         const std::vector<std::string> &placeOfStage) {
  int processes = *std::max_element(stageRank.begin(), stageRank.end()) + 1;
  auto comms = runtime::createInProcessComms(processes, 30);
  std::vector<std::vector<NcclChannelEnd>> out(static_cast<size_t>(processes));
  std::vector<std::string> errors(static_cast<size_t>(processes));
  std::vector<std::thread> threads;
  for (int p = 0; p < processes; ++p)
    threads.emplace_back([&, p] {
      std::vector<int> stages;
      std::vector<std::string> places;
      for (size_t s = 0; s < stageRank.size(); ++s)
        if (stageRank[s] == p) {
          stages.push_back(int(s));
          places.push_back(placeOfStage[s]);
        }
      auto ends = agreeNcclChannels(plan, stages, stageRank, places,
                                    *comms[size_t(p)],
                                    [] { return newNcclId(); });
      if (ends)
        out[size_t(p)] = *ends;
      else
        errors[size_t(p)] = llvm::toString(ends.takeError());
    });
  for (auto &t : threads)
    t.join();
  for (const std::string &e : errors)
    EXPECT_EQ(e, "");
  return out;
}

// The two ends of channel from -> to among every process's ends.
static std::pair<NcclChannelEnd, NcclChannelEnd>
endsOf(const std::vector<std::vector<NcclChannelEnd>> &all, int from, int to) {
  std::pair<NcclChannelEnd, NcclChannelEnd> out;
  int found = 0;
  for (const auto &ends : all)
    for (const NcclChannelEnd &e : ends)
      if (e.channel.fromStage == from && e.channel.toStage == to) {
        (e.member == 0 ? out.first : out.second) = e;
        ++found;
        EXPECT_EQ(e.stage, e.member == 0 ? from : to);
        EXPECT_EQ(e.peer, e.member == 0 ? to : from);
      }
  EXPECT_EQ(found, 2) << from << "->" << to;
  return out;
}

TEST(Nccl, ProcessesAgreeOnEachChannelsIdAndWhetherItIsNccls) {
  auto plan = threeStagePlan();
  ASSERT_TRUE(bool(plan)) << llvm::toString(plan.takeError());
  // A process a stage; stages 1 and 2 share a GPU.
  auto all = agreeAll(*plan, {0, 1, 2}, {"h:0", "h:1", "h:1"});
  ASSERT_EQ(all.size(), 3u);
  EXPECT_EQ(all[0].size(), 2u); // 0->1 and 1->0
  EXPECT_EQ(all[1].size(), 4u);
  EXPECT_EQ(all[2].size(), 2u);
  std::set<std::array<char, 128>> ids;
  for (auto [from, to] : {std::pair{0, 1}, std::pair{1, 0}}) {
    auto [a, b] = endsOf(all, from, to);
    EXPECT_TRUE(a.overNccl);
    EXPECT_TRUE(b.overNccl);
    EXPECT_EQ(a.id.bytes, b.id.bytes);
    EXPECT_NE(a.id.bytes, NcclId().bytes);
    ids.insert(a.id.bytes);
  }
  EXPECT_EQ(ids.size(), 2u); // a communicator a channel
  for (auto [from, to] : {std::pair{1, 2}, std::pair{2, 1}}) {
    auto [a, b] = endsOf(all, from, to);
    EXPECT_FALSE(a.overNccl);
    EXPECT_FALSE(b.overNccl);
  }
  // Stages 0 and 1 in one process on two GPUs, stage 2 on another host.
  all = agreeAll(*plan, {0, 0, 1}, {"h:0", "h:1", "g:1"});
  ASSERT_EQ(all.size(), 2u);
  EXPECT_EQ(all[0].size(), 6u);
  EXPECT_EQ(all[1].size(), 2u);
  for (auto [from, to] :
       {std::pair{0, 1}, std::pair{1, 0}, std::pair{1, 2}, std::pair{2, 1}}) {
    auto [a, b] = endsOf(all, from, to);
    EXPECT_TRUE(a.overNccl && b.overNccl) << from << "->" << to;
    EXPECT_EQ(a.id.bytes, b.id.bytes);
  }
}

TEST(Nccl, PlacesNameTheHostAndTheGpu) {
  std::string p = ncclPlace(3);
  EXPECT_GT(p.size(), 2u);
  EXPECT_EQ(p.substr(p.size() - 2), ":3");
  EXPECT_NE(ncclPlace(0), ncclPlace(1));
}

// The data-parallel sums' bootstrap (createNcclGroupComm under mpirun,
// threads standing for the processes; createNcclGroupComms for threads):
// replicas sharing a GPU keep their sums on the control comm, with no GPU
// needed; replicas on distinct GPUs get the group's rank-0 id and join a
// communicator, which without a GPU fails in one line on every member.
TEST(Nccl, ReplicaGroupsJoinOrStayOnTheirComm) {
  auto gpus = runtime::cudaDeviceCount();
  bool noGpu = !gpus;
  if (!gpus)
    llvm::consumeError(gpus.takeError());
  constexpr int n = 3;
  for (bool distinct : {false, true}) {
    SCOPED_TRACE(distinct ? "distinct GPUs" : "one GPU");
    auto comms = runtime::createInProcessComms(n, 30);
    std::vector<std::string> errors(n);
    std::vector<int> joined(n, -1);
    std::vector<std::thread> threads;
    for (int r = 0; r < n; ++r)
      threads.emplace_back([&, r] {
        auto g = createNcclGroupComm(*comms[r], distinct ? r : 0);
        if (g)
          joined[r] = *g ? 1 : 0;
        else
          errors[r] = llvm::toString(g.takeError());
      });
    for (auto &t : threads)
      t.join();
    for (int r = 0; r < n; ++r) {
      if (!distinct) {
        EXPECT_EQ(joined[r], 0) << "member " << r << ": " << errors[r];
      } else if (noGpu) {
        EXPECT_EQ(errors[r].rfind("NCCL needs a GPU: ", 0), 0u)
            << "member " << r << ": " << errors[r];
        EXPECT_EQ(errors[r].find('\n'), std::string::npos) << errors[r];
      }
    }
  }
  auto comms = runtime::createInProcessComms(2, 30);
  std::vector<runtime::Comm *> controls{comms[0].get(), comms[1].get()};
  auto shared = createNcclGroupComms(controls, {0, 0});
  ASSERT_TRUE(bool(shared)) << llvm::toString(shared.takeError());
  EXPECT_TRUE(!(*shared)[0] && !(*shared)[1]);
  if (noGpu) {
    auto apart = createNcclGroupComms(controls, {0, 1});
    ASSERT_FALSE(bool(apart));
    std::string why = llvm::toString(apart.takeError());
    EXPECT_EQ(why.rfind("NCCL needs a GPU: ", 0), 0u) << why;
  }
}

} // namespace unit_nccl
#endif
