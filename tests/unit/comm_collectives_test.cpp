// The collectives of the Comm interface (runtime/comm/Comm.h), in their
// default form over send/recv: an ordered all-reduce whose sum is rank 0's
// + rank 1's + ... on every rank (checked bit for bit against that order
// in float, where another order rounds differently), the buffers reached
// through a DeviceAccess; and any-true.
#include "runtime/comm/Comm.h"

#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <functional>
#include <thread>

namespace unit_comm_collectives {

using namespace cleave::runtime;

namespace {

// Per rank, values whose float sum depends on the order of addition.
std::vector<float> valuesOf(int rank) {
  return {rank == 0 ? 1e8f : 1.0f, 0.1f * float(rank + 1),
          rank == 2 ? -1e8f : 3.0f};
}

// Rank 0's values + rank 1's + ..., in that order.
std::vector<float> rankOrderSum(int ranks) {
  std::vector<float> sum = valuesOf(0);
  for (int r = 1; r < ranks; ++r)
    for (size_t i = 0; i < sum.size(); ++i)
      sum[i] += valuesOf(r)[i];
  return sum;
}

// A DeviceAccess's addInto over `n` floats of host memory, counting calls.
std::function<llvm::Error(void *, const void *)> addFloats(size_t n,
                                                           int &adds) {
  return [n, &adds](void *acc, const void *other) {
    auto *a = static_cast<float *>(acc);
    auto *o = static_cast<const float *>(other);
    for (size_t i = 0; i < n; ++i)
      a[i] += o[i];
    ++adds;
    return llvm::Error::success();
  };
}

// Every rank holds the rank-order sum, bit for bit, and said no error.
void expectSumEverywhere(const std::vector<std::vector<float>> &data,
                         const std::vector<std::string> &errors) {
  std::vector<float> expected = rankOrderSum(int(data.size()));
  for (size_t r = 0; r < data.size(); ++r) {
    EXPECT_EQ(errors[r], "") << r;
    ASSERT_EQ(data[r].size(), expected.size());
    EXPECT_EQ(std::memcmp(data[r].data(), expected.data(),
                          expected.size() * sizeof(float)),
              0)
        << "rank " << r;
  }
}

} // namespace

TEST(CommCollectives, AllReduceOrderedSumsInRankOrderOnEveryRank) {
  constexpr int kRanks = 3;
  auto comms = createInProcessComms(kRanks, 10.0);
  std::vector<std::vector<float>> data(kRanks);
  std::vector<std::string> errors(kRanks);
  std::vector<std::thread> threads;
  for (int r = 0; r < kRanks; ++r)
    threads.emplace_back([&, r] {
      data[r] = valuesOf(r);
      std::vector<float> scratch(data[r].size());
      size_t bytes = data[r].size() * sizeof(float);
      int adds = 0;
      DeviceAccess access{
          [](void *h, const void *d, size_t n) { std::memcpy(h, d, n); },
          [](void *d, const void *h, size_t n) { std::memcpy(d, h, n); },
          addFloats(scratch.size(), adds), scratch.data(), nullptr};
      if (auto e = comms[r]->allReduceOrdered(data[r].data(), bytes, 7,
                                              access))
        errors[r] = llvm::toString(std::move(e));
      if (r != 0 && adds)
        errors[r] = "a replica other than rank 0 added";
    });
  for (auto &t : threads)
    t.join();
  expectSumEverywhere(data, errors);
  std::vector<float> expected = rankOrderSum(kRanks);
  // The order matters for these values: summed from the last rank down,
  // -1e8 + 3 + 3 rounds the threes away.
  float reversed = (valuesOf(2)[2] + valuesOf(1)[2]) + valuesOf(0)[2];
  EXPECT_NE(reversed, expected[2]);
}

TEST(CommCollectives, AnyTrueIsTrueOnEveryRankWhenOneSaysSo) {
  constexpr int kRanks = 4;
  for (int truthful : {-1, 0, 3}) {
    auto comms = createInProcessComms(kRanks, 10.0);
    std::vector<int> answers(kRanks, -1);
    std::vector<std::thread> threads;
    for (int r = 0; r < kRanks; ++r)
      threads.emplace_back([&, r] {
        auto any = comms[r]->anyTrue(r == truthful, 11);
        answers[r] = any ? int(*any) : (llvm::consumeError(any.takeError()), -2);
      });
    for (auto &t : threads)
      t.join();
    for (int r = 0; r < kRanks; ++r)
      EXPECT_EQ(answers[r], truthful >= 0 ? 1 : 0)
          << "rank " << r << ", true on " << truthful;
  }
}

namespace {

// A link that moves the bytes straight from the buffers it is given, as
// NCCL reads device memory, with no staging copy: here over a comm's
// send/recv, the buffers being host memory.
class DirectLink final : public DeviceLink {
public:
  explicit DirectLink(Comm &comm) : comm_(comm) {}
  llvm::Error send(int peer, const void *data, size_t bytes) override {
    return comm_.send(peer, 11, -1, data, bytes);
  }
  llvm::Error recv(int peer, void *data, size_t bytes) override {
    return comm_.recv(peer, 11, -1, data, bytes);
  }

private:
  Comm &comm_;
};

} // namespace

// allReduceOrderedOver any link gives the default's bits: the order of the
// additions is the function's, not the link's; and the backend's work is
// waited for (settle) before the link touches the memory.
TEST(CommCollectives, AnyLinkGivesTheOrderedSumsBits) {
  constexpr int kRanks = 3;
  auto comms = createInProcessComms(kRanks, 10.0);
  std::vector<std::vector<float>> data(kRanks);
  std::vector<std::string> errors(kRanks);
  std::vector<int> settles(kRanks, 0);
  std::vector<std::thread> threads;
  for (int r = 0; r < kRanks; ++r)
    threads.emplace_back([&, r] {
      data[r] = valuesOf(r);
      std::vector<float> scratch(data[r].size());
      int adds = 0;
      DeviceAccess access{
          nullptr, nullptr, // a direct link copies nothing to or from a host
          addFloats(scratch.size(), adds), scratch.data(), nullptr,
          [&] { ++settles[r]; }};
      DirectLink link(*comms[r]);
      if (auto e = allReduceOrderedOver(link, r, kRanks, data[r].data(),
                                        data[r].size() * sizeof(float), access))
        errors[r] = llvm::toString(std::move(e));
    });
  for (auto &t : threads)
    t.join();
  expectSumEverywhere(data, errors);
  for (int r = 0; r < kRanks; ++r)
    EXPECT_GT(settles[r], 0) << "rank " << r << " never waited for its backend";
}

// The in-process comm times its receives: a receive that waited counts the
// time from its message's send to the receiver running again; one whose
// message was already there counts as received only; taking the figures
// clears them.
TEST(CommDelays, InProcessReceivesThatWaitedAreTimedFromTheSend) {
  auto comms = createInProcessComms(2, /*timeout=*/10);
  int value = 7, got = 0;
  ASSERT_FALSE(bool(comms[0]->send(1, 3, 0, &value, sizeof value)));
  ASSERT_FALSE(bool(comms[1]->recv(0, 3, 0, &got, sizeof got))); // there
  MessageDelays ready = comms[1]->takeMessageDelays();
  EXPECT_EQ(ready.received, 1);
  EXPECT_EQ(ready.waited, 0);
  EXPECT_EQ(ready.seconds, 0);

  // The receiver is waiting before the send (it has had 100 ms to start;
  // tried again where a loaded machine started it later): the wait is what
  // is timed, and it starts at the send, not at the receive's call.
  MessageDelays waited;
  double bound = 0;
  for (int attempt = 0; attempt < 3 && waited.waited == 0; ++attempt) {
    std::thread receiver([&] {
      int in = 0;
      EXPECT_FALSE(bool(comms[1]->recv(0, 4, attempt, &in, sizeof in)));
      EXPECT_EQ(in, 9);
    });
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    auto sent = std::chrono::steady_clock::now();
    int nine = 9;
    ASSERT_FALSE(bool(comms[0]->send(1, 4, attempt, &nine, sizeof nine)));
    receiver.join();
    bound = std::chrono::duration<double>(std::chrono::steady_clock::now() -
                                          sent)
                .count();
    waited = comms[1]->takeMessageDelays();
    EXPECT_EQ(waited.received, 1);
  }
  EXPECT_EQ(waited.waited, 1);
  EXPECT_GE(waited.seconds, 0);
  EXPECT_LE(waited.seconds, bound); // not the 100 ms the receive waited
  EXPECT_EQ(comms[1]->takeMessageDelays().received, 0);
  EXPECT_EQ(comms[0]->takeMessageDelays().received, 0); // rank 0's own
}

} // namespace unit_comm_collectives
