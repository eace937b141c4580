// ParcelComm (runtime/comm/ParcelComm.h): the plan's messages between two
// stages of one process go as parcels of the sending backend's (here the
// emulated CUDA backend, whose parcels are the CUDA backend's logic done
// at once), their descriptors through the in-process comm; the rest passes
// through as host bytes.
#include "runtime/comm/ParcelComm.h"

#include "runtime/Kernel.h"
#include "runtime/cuda/Lowering.h"

#include <gtest/gtest.h>

#include <cstring>

namespace unit_parcel_comm {

using namespace cleave::runtime;

namespace {

// Stage 0 sends tag 3 to stage 1 in its F program.
Plan twoStagePlan() {
  Plan plan;
  plan.stages.resize(2);
  Instr send;
  send.kind = InstrKind::Send;
  send.peer = 1;
  send.tag = 3;
  plan.stages[0].programs[int(Phase::F)].push_back(send);
  Instr recv;
  recv.kind = InstrKind::Recv;
  recv.peer = 0;
  recv.tag = 3;
  plan.stages[1].programs[int(Phase::F)].push_back(recv);
  return plan;
}

struct TwoStages {
  Plan plan = twoStagePlan();
  std::unique_ptr<Backend> backends[2] = {cuda::createCudaEmulatedBackend(),
                                          cuda::createCudaEmulatedBackend()};
  std::unique_ptr<Comm> comms[2];
  TwoStages() {
    auto inner = createInProcessComms(2, 5.0);
    for (int s = 0; s < 2; ++s) {
      comms[s] = createParcelComm(plan, s, std::move(inner[size_t(s)]));
      comms[s]->bindBackend(*backends[s]);
    }
  }
};

TEST(ParcelComm, PlanMessagesGoAsParcelsTheRestAsBytes) {
  TwoStages t;
  EXPECT_TRUE(t.comms[0]->direct(1, 3, /*send=*/true));
  EXPECT_TRUE(t.comms[1]->direct(0, 3, /*send=*/false));
  EXPECT_FALSE(t.comms[0]->direct(1, 3, /*send=*/false));
  EXPECT_FALSE(t.comms[0]->direct(1, 4, /*send=*/true)); // not the plan's
  const size_t n = 64;
  void *src = t.backends[0]->allocate(n), *dst = t.backends[1]->allocate(n);
  // Several messages in flight at once, then taken in order: each parcel
  // keeps its own bytes though the sender's slot changes at once.
  for (int mb = 0; mb < 3; ++mb) {
    std::memset(src, 10 + mb, n);
    ASSERT_FALSE(bool(t.comms[0]->send(1, 3, mb, src, n)));
  }
  std::memset(src, 0, n);
  for (int round = 0; round < 2; ++round)
    for (int mb = 0; mb < 3; ++mb) {
      if (round == 1) { // parcels handed back are used again
        std::memset(src, 20 + mb, n);
        ASSERT_FALSE(bool(t.comms[0]->send(1, 3, mb, src, n)));
      }
      ASSERT_FALSE(bool(t.comms[1]->recv(0, 3, mb, dst, n)));
      for (size_t i = 0; i < n; ++i)
        ASSERT_EQ(static_cast<uint8_t *>(dst)[i], (round ? 20 : 10) + mb);
    }
  // A message of another tag is host bytes, as the inner comm carries it.
  int vote = 7, got = 0;
  ASSERT_FALSE(bool(t.comms[0]->send(1, 99, -1, &vote, sizeof vote)));
  ASSERT_FALSE(bool(t.comms[1]->recv(0, 99, -1, &got, sizeof got)));
  EXPECT_EQ(got, 7);
  t.backends[0]->release(src);
  t.backends[1]->release(dst);
}

TEST(ParcelComm, ASizeTheSenderDidNotSendIsOneLine) {
  TwoStages t;
  std::vector<uint8_t> a(32, 1);
  void *src = t.backends[0]->allocate(32), *dst = t.backends[1]->allocate(64);
  std::memcpy(src, a.data(), 32);
  ASSERT_FALSE(bool(t.comms[0]->send(1, 3, 0, src, 32)));
  llvm::Error e = t.comms[1]->recv(0, 3, 0, dst, 64);
  ASSERT_TRUE(bool(e));
  EXPECT_EQ(llvm::toString(std::move(e)),
            "stage 1 receives 64 bytes from stage 0 (tag 3, microbatch 0), "
            "which it sent as 32");
  t.backends[0]->release(src);
  t.backends[1]->release(dst);
}

TEST(ParcelComm, UnboundOrOnTheHostItCarriesBytes) {
  Plan plan = twoStagePlan();
  auto inner = createInProcessComms(2);
  auto comm = createParcelComm(plan, 0, std::move(inner[0]));
  EXPECT_FALSE(comm->direct(1, 3, true));
  auto cpu = createCpuBackend(1);
  comm->bindBackend(*cpu); // host memory: no parcels
  EXPECT_FALSE(comm->direct(1, 3, true));
}

} // namespace

} // namespace unit_parcel_comm
