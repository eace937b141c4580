// The chain partitioner against brute force: random chains of up to 12
// layers (skip connections, held activations, links with latency), every
// split of them evaluated from the chain itself, not from the solver's
// table; then the memory cap, the smallest-cap error, and the time a
// 96-layer, 16-stage search takes.
#include "passes/Partition.h"

#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <random>

namespace unit_partition_solver {

using namespace cleave;
using namespace cleave::passes;

namespace {

bool contains(const std::vector<int> &layers, int first, int end) {
  for (int l : layers)
    if (l >= first && l < end)
      return true;
  return false;
}

// A stage's time and peak memory straight from the chain's definition.
struct NaiveStage {
  double time = 0;
  int64_t peak = 0;
};

NaiveStage naiveStage(const LayerChain &chain, const LinkModel &link,
                      int first, int end, int64_t held) {
  NaiveStage s;
  int64_t activations = 0, statics = 0;
  for (int l = first; l < end; ++l) {
    const LayerCost &c = chain.layers[l];
    s.time += c.f + c.b + c.w;
    statics += c.staticBytes;
  }
  for (const ChainValue &v : chain.values) {
    if (contains(v.holders, first, end))
      activations += v.bytes;
    if (v.producer < 0)
      continue;
    // Received, and its gradient sent back from the stage's B.
    if (v.producer < first && contains(v.readers, first, end))
      s.time += link.messageTime(v.bytes) + (v.gradBytes ? link.sendSeconds : 0);
    // Sent on from the stage's F, and its gradient received back.
    bool readLater = !v.readers.empty() && v.readers.back() >= end;
    if (v.producer >= first && v.producer < end && readLater)
      s.time += link.sendSeconds +
                (v.gradBytes ? link.messageTime(v.gradBytes) : 0);
  }
  s.peak = statics + held * activations;
  return s;
}

// The best step time over every split, or none when no split fits.
std::optional<double> bruteForce(const LayerChain &chain,
                                 const LinkModel &link,
                                 const SolverOptions &opts) {
  int n = int(chain.layers.size()), p = opts.stages;
  std::optional<double> best;
  // Each subset of the n - 1 cut positions with p - 1 members is a split.
  for (uint32_t mask = 0; mask < (1u << (n - 1)); ++mask) {
    if (__builtin_popcount(mask) != p - 1)
      continue;
    std::vector<int> starts = {0};
    for (int c = 1; c < n; ++c)
      if (mask & (1u << (c - 1)))
        starts.push_back(c);
    double sum = 0, slowest = 0;
    bool fits = true;
    for (int s = 0; s < p; ++s) {
      int end = s + 1 < p ? starts[s + 1] : n;
      NaiveStage st = naiveStage(chain, link, starts[s], end,
                                 heldMicrobatches(opts, s));
      fits &= !opts.memCap || st.peak <= *opts.memCap;
      sum += st.time;
      slowest = std::max(slowest, st.time);
    }
    double step = sum + double(opts.microbatches - 1) * slowest;
    if (fits && (!best || step < *best))
      best = step;
  }
  return best;
}

LayerChain randomChain(std::mt19937 &rng, int n) {
  std::uniform_int_distribution<int> small(1, 4);
  std::uniform_real_distribution<double> unit(0.1, 2.0);
  std::bernoulli_distribution coin(0.5);
  LayerChain chain;
  for (int l = 0; l < n; ++l) {
    chain.names.push_back("layer" + std::to_string(l));
    LayerCost c;
    // Whole numbers half the time, so that ties between splits occur.
    bool whole = coin(rng);
    c.f = whole ? small(rng) : unit(rng);
    c.b = whole ? small(rng) : unit(rng);
    c.w = whole ? small(rng) : unit(rng);
    c.staticBytes = 100 * small(rng);
    c.paramBytes = c.staticBytes / 2;
    chain.layers.push_back(c);
  }
  // Per layer: its output read by the next layer (and, now and then, by a
  // later one: a skip connection), kept by its own backward and sometimes
  // by the next layer's; and a graph input read somewhere.
  for (int l = 0; l < n; ++l) {
    ChainValue v;
    v.producer = l;
    if (l + 1 < n)
      v.readers.push_back(l + 1);
    std::uniform_int_distribution<int> later(l + 1, n - 1);
    if (l + 2 < n && coin(rng))
      v.readers.push_back(std::max(l + 2, later(rng)));
    v.holders.push_back(l);
    if (l + 1 < n && coin(rng))
      v.holders.push_back(l + 1);
    v.bytes = 10 * small(rng);
    v.gradBytes = coin(rng) ? v.bytes : 0;
    chain.values.push_back(v);
  }
  ChainValue input;
  input.producer = -1;
  input.readers = {0};
  input.holders = {std::uniform_int_distribution<int>(0, n - 1)(rng)};
  input.bytes = 25;
  chain.values.push_back(input);
  return chain;
}

TEST(PartitionSolver, RandomChainsMatchBruteForce) {
  std::mt19937 rng(20261129);
  int compared = 0, infeasible = 0;
  for (int trial = 0; trial < 600; ++trial) {
    int n = std::uniform_int_distribution<int>(1, 12)(rng);
    LayerChain chain = randomChain(rng, n);
    LinkModel link;
    if (trial % 3)
      link = {0.05 * (trial % 5), 40.0 + trial % 7, 0.02 * (trial % 4)};
    SolverOptions opts;
    opts.stages = std::uniform_int_distribution<int>(1, n)(rng);
    opts.microbatches = std::uniform_int_distribution<int>(1, 8)(rng);
    if (trial % 2)
      opts.memCap = std::uniform_int_distribution<int64_t>(300, 3000)(rng);
    if (trial % 7 == 0)
      opts.heldMicrobatches = {3, 1, 2};
    StageCostTable table(chain, link);
    std::optional<double> expected = bruteForce(chain, link, opts);
    auto split = solveChain(table, opts);
    SCOPED_TRACE("trial " + std::to_string(trial));
    if (!expected) {
      ASSERT_FALSE(bool(split));
      llvm::consumeError(split.takeError());
      ++infeasible;
      continue;
    }
    ASSERT_TRUE(bool(split)) << llvm::toString(split.takeError());
    EXPECT_NEAR(split->stepTime, *expected, 1e-9 * *expected);
    ASSERT_EQ(split->starts.size(), size_t(opts.stages));
    EXPECT_EQ(split->starts[0], 0);
    ++compared;
  }
  std::printf("compared %d chains with brute force, %d had no split within "
              "the cap\n", compared, infeasible);
  EXPECT_GT(compared, 300);
  EXPECT_GT(infeasible, 10);
}

// Eight equal layers, 100 bytes of activations each, no static memory:
// under 1F1B with 4 stages and 8 microbatches stage s holds 4 - s of them.
LayerChain evenChain() {
  LayerChain chain;
  for (int l = 0; l < 8; ++l) {
    chain.names.push_back("layer" + std::to_string(l));
    chain.layers.push_back({1, 1, 1, 0, 0});
    ChainValue v;
    v.producer = l;
    v.holders = {l};
    v.bytes = 100;
    chain.values.push_back(v);
  }
  return chain;
}

std::vector<int> stageSizes(const std::vector<int> &starts, int n) {
  std::vector<int> sizes;
  for (size_t s = 0; s < starts.size(); ++s)
    sizes.push_back((s + 1 < starts.size() ? starts[s + 1] : n) - starts[s]);
  return sizes;
}

TEST(PartitionSolver, TighterCapMovesLayersOffEarlyStages) {
  LayerChain chain = evenChain();
  StageCostTable table(chain, {});
  SolverOptions opts;
  opts.stages = 4;
  opts.microbatches = 8;
  auto free = solveChain(table, opts);
  ASSERT_TRUE(bool(free)) << llvm::toString(free.takeError());
  EXPECT_EQ(stageSizes(free->starts, 8), (std::vector<int>{2, 2, 2, 2}));

  // 700 bytes: stage 0 (4 microbatches held) fits one layer, stage 1 (3)
  // two, stage 2 (2) three; the slowest stage then has 3 layers.
  opts.memCap = 700;
  auto capped = solveChain(table, opts);
  ASSERT_TRUE(bool(capped)) << llvm::toString(capped.takeError());
  std::vector<int> sizes = stageSizes(capped->starts, 8);
  EXPECT_EQ(sizes[0], 1);
  EXPECT_LE(sizes[1], 2);
  EXPECT_EQ(*std::max_element(sizes.begin(), sizes.end()), 3);
  for (int s = 0; s < 4; ++s) {
    int end = s + 1 < 4 ? capped->starts[s + 1] : 8;
    EXPECT_LE(table.peakBytes(capped->starts[s], end,
                              heldMicrobatches(opts, s)),
              700);
  }
  EXPECT_GT(capped->stepTime, free->stepTime);
}

// A parameter owned by layer 1 and also read by layers 3 and 5 (a tied
// weight): a stage with a reader but not the owner holds a replica.
TEST(PartitionSolver, SharedParametersCostAReplicaPerStage) {
  LayerChain chain = evenChain();
  chain.shared.push_back({1, {3, 5}, 1000});
  StageCostTable table(chain, {});
  StageCostTable plain(evenChain(), {});
  auto extra = [&](int first, int end) {
    return table.staticBytes(first, end) - plain.staticBytes(first, end);
  };
  EXPECT_EQ(extra(0, 8), 0);    // owner and readers together
  EXPECT_EQ(extra(0, 2), 0);    // the owner alone
  EXPECT_EQ(extra(2, 8), 1000); // both readers, one replica
  EXPECT_EQ(extra(3, 4), 1000);
  EXPECT_EQ(extra(4, 5), 0);    // no reader
  EXPECT_EQ(extra(4, 6), 1000);
  EXPECT_EQ(extra(0, 4), 0);    // readers with the owner
  EXPECT_EQ(extra(6, 8), 0);
  // Readers before the owner: a stage with the reader but not the owner.
  LayerChain back = evenChain();
  back.shared.push_back({5, {1}, 10});
  StageCostTable t2(back, {});
  StageCostTable p2(evenChain(), {});
  EXPECT_EQ(t2.staticBytes(0, 5) - p2.staticBytes(0, 5), 10);
  EXPECT_EQ(t2.staticBytes(0, 6) - p2.staticBytes(0, 6), 0);
  EXPECT_EQ(t2.staticBytes(1, 2) - p2.staticBytes(1, 2), 10);
  EXPECT_EQ(t2.staticBytes(2, 8) - p2.staticBytes(2, 8), 0);
}

TEST(PartitionSolver, LongerLifetimesNeedMoreMemory) {
  LayerChain chain = evenChain();
  StageCostTable table(chain, {});
  SolverOptions opts;
  opts.stages = 4;
  opts.microbatches = 8;
  EXPECT_EQ(smallestFittingCap(table, opts), 400); // 1F1B: 4, 3, 2, 1
  // A schedule that holds more: the best is 1, 2, 2, 3 layers (700, 1200,
  // 1000, 1200 bytes); a cap of 1000 fits only 1, 1, 2, 2 = 6 layers.
  opts.heldMicrobatches = {7, 6, 5, 4};
  EXPECT_EQ(smallestFittingCap(table, opts), 1200);
}

TEST(PartitionSolver, NoFitNamesTheSmallestCap) {
  LayerChain chain = evenChain();
  StageCostTable table(chain, {});
  SolverOptions opts;
  opts.stages = 4;
  opts.microbatches = 8;
  opts.memCap = 300;
  auto split = solveChain(table, opts);
  ASSERT_FALSE(bool(split));
  EXPECT_EQ(llvm::toString(split.takeError()),
            "no split of 8 layers into 4 stages fits the memory cap of 300 B "
            "per stage; the smallest cap that fits is 400 B (400 bytes)");
  opts.memCap = 400;
  EXPECT_TRUE(bool(solveChain(table, opts)));
}

// The messages a stage sends per microbatch: each value it makes that a
// later stage reads goes on from its F (once, however many later layers
// read it), and each value it receives with a gradient sends that gradient
// back from its B; the sender's time per message (LinkModel::sendSeconds)
// is part of the stage's communication.
TEST(PartitionSolver, StagesCountTheMessagesTheySend) {
  LayerChain chain;
  for (int l = 0; l < 4; ++l) {
    chain.names.push_back("layer" + std::to_string(l));
    chain.layers.push_back(LayerCost{});
  }
  auto value = [&](int producer, std::vector<int> readers, int64_t grad) {
    ChainValue v;
    v.producer = producer;
    v.readers = std::move(readers);
    v.bytes = 100;
    v.gradBytes = grad;
    chain.values.push_back(v);
  };
  value(0, {1}, 100);    // an activation and its gradient
  value(0, {2, 3}, 0);   // a mask read two layers on, no gradient
  value(1, {2}, 100);
  value(-1, {0}, 0);     // a graph input: never a message
  LinkModel link{0, 1e30, 1.0}; // bytes cost nothing, each message 1 s
  StageCostTable table(chain, link);
  // [0, 1): sends both of layer 0's values on; receives nothing.
  EXPECT_EQ(table.fSends(0, 1), 2);
  EXPECT_EQ(table.bSends(0, 1), 0);
  // [1, 2): receives layer 0's activation (gradient back), sends its own
  // on; the mask passes it by.
  EXPECT_EQ(table.fSends(1, 2), 1);
  EXPECT_EQ(table.bSends(1, 2), 1);
  // [2, 4): receives the mask (no gradient) and layer 1's value.
  EXPECT_EQ(table.fSends(2, 4), 0);
  EXPECT_EQ(table.bSends(2, 4), 1);
  // [0, 4): one stage, no messages.
  EXPECT_EQ(table.fSends(0, 4), 0);
  EXPECT_EQ(table.bSends(0, 4), 0);
  // Free bandwidth leaves only the senders' time: a second a message.
  EXPECT_DOUBLE_EQ(table.commTime(0, 1), 2.0);
  EXPECT_DOUBLE_EQ(table.commTime(1, 2), 2.0);
  EXPECT_DOUBLE_EQ(table.commTime(2, 4), 1.0);
}

TEST(PartitionSolver, MoreStagesThanLayers) {
  LayerChain chain = evenChain();
  StageCostTable table(chain, {});
  SolverOptions opts;
  opts.stages = 9;
  auto split = solveChain(table, opts);
  ASSERT_FALSE(bool(split));
  EXPECT_EQ(llvm::toString(split.takeError()),
            "cannot cut 8 layers into 9 stages: use at most 8 stages, or a "
            "larger --layer-depth for more layers");
}

// The bar: 96 layers into 16 stages under a cap within a second (the time
// is printed; the search itself takes milliseconds).
TEST(PartitionSolver, NinetySixLayersSixteenStagesUnderASecond) {
  std::mt19937 rng(96);
  LayerChain chain = randomChain(rng, 96);
  LinkModel link{0.01, 1000};
  SolverOptions opts;
  opts.stages = 16;
  opts.microbatches = 32;
  auto start = std::chrono::steady_clock::now();
  StageCostTable table(chain, link);
  // A cap 10% above the least that fits, so the cap binds.
  opts.memCap = smallestFittingCap(table, opts) * 11 / 10;
  auto split = solveChain(table, opts);
  double seconds = std::chrono::duration<double>(
                       std::chrono::steady_clock::now() - start)
                       .count();
  ASSERT_TRUE(bool(split)) << llvm::toString(split.takeError());
  std::printf("96 layers into 16 stages under a cap: %.1f ms\n",
              seconds * 1e3);
  EXPECT_LT(seconds, 1.0);
}

} // namespace

} // namespace unit_partition_solver
