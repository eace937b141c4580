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

TEST(Nccl, ChannelsAreTheStagePairsThatExchangeMessages) {
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
  ASSERT_TRUE(bool(r)) << llvm::toString(r.takeError());
  auto plan = tools::buildRunnablePlan(*r, o, {});
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
#endif
