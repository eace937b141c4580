// The Plan executor (runtime/Executor.h) and the in-process Comm
// (runtime/Comm.h) on small Plans built by hand, run on the CPU backend.
//
// The main plan is a two-stage pipeline over x: f32[2] per microbatch:
//   stage 0  F: y = Relu(x); send y (tag 1); last_y <- y (forward update)
//            B: recv gy (tag 2); gy is summed into gy.acc
//   stage 1  F: recv y; z = Mul(y, w); loss = ReduceSum(z)
//            B: gy = Identity(w); send gy
//            W: gw = Identity(y); gw is summed into gw.acc
//            STEP: w.new = SGD(w, gw.acc, lr) with grad_scale 1/M; w <- w.new
// so loss_i = y_i . w, d loss / d w = y_i and d loss / d y = w, which the
// tests compute by hand.
#include "support/Checksum.h"
#include "runtime/comm/Comm.h"
#include "runtime/Executor.h"
#include "runtime/cuda/Lowering.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cctype>
#include <cmath>
#include <cstring>
#include <limits>
#include <thread>

namespace unit_runtime_executor {

using namespace cleave;
using namespace cleave::runtime;

namespace {

using ir::OpKind;

Slot makeSlot(const std::string &name, SlotKind kind,
              std::vector<int64_t> shape, int64_t offset = -1) {
  Slot s;
  s.name = name;
  s.kind = kind;
  s.shape = std::move(shape);
  int64_t n = 1;
  for (int64_t d : s.shape)
    n *= d;
  s.bytes = n * 4;
  s.offset = offset;
  return s;
}

int addBlob(Plan &p, const std::vector<float> &values) {
  Blob b;
  b.bytes.resize(values.size() * 4);
  std::memcpy(b.bytes.data(), values.data(), b.bytes.size());
  b.checksum = support::blockChecksum(b.bytes.data(), b.bytes.size());
  p.blobs.push_back(std::move(b));
  return int(p.blobs.size()) - 1;
}

Instr kernel(OpKind op, std::vector<int> ins, std::vector<int> outs,
             ir::AttrMap attrs = {}, std::string loc = "") {
  Instr i;
  i.kind = InstrKind::Kernel;
  i.op = op;
  i.inputs = std::move(ins);
  i.outputs = std::move(outs);
  i.attrs = std::move(attrs);
  i.loc = std::move(loc);
  return i;
}

Instr message(InstrKind kind, int slot, int peer, int64_t tag) {
  Instr i;
  i.kind = kind;
  (kind == InstrKind::Send ? i.inputs : i.outputs).push_back(slot);
  i.peer = peer;
  i.tag = tag;
  return i;
}

std::vector<Action> parseActions(const std::string &text) {
  // "F0 F1 B0 W0 BW1 S": kind letters then the microbatch; S is STEP.
  std::vector<Action> out;
  size_t i = 0;
  while (i < text.size()) {
    if (text[i] == ' ') {
      ++i;
      continue;
    }
    Action a;
    if (text.compare(i, 2, "BW") == 0) {
      a.kind = ActionKind::BW;
      i += 2;
    } else {
      char c = text[i++];
      a.kind = c == 'F'   ? ActionKind::F
               : c == 'B' ? ActionKind::B
               : c == 'W' ? ActionKind::W
                          : ActionKind::Step;
    }
    if (a.kind != ActionKind::Step) {
      a.microbatch = 0;
      while (i < text.size() && isdigit(text[i]))
        a.microbatch = a.microbatch * 10 + (text[i++] - '0');
    }
    out.push_back(a);
  }
  return out;
}

// Slot indices of the two-stage plan.
enum S0 { S0_x, S0_y, S0_gy, S0_gyAcc, S0_lastY };
enum S1 { S1_y, S1_w, S1_z, S1_loss, S1_gy, S1_gw, S1_gwAcc, S1_lr, S1_wNew };

Plan twoStagePlan(int M, const std::string &actions0,
                  const std::string &actions1) {
  Plan p;
  p.modelName = "two-stage";
  p.microbatches = M;
  p.optimizer = "sgd";
  p.lr = 0.1;
  p.inputs.push_back({"x", ir::DType::F32, {2}});
  p.stages.resize(2);

  StagePlan &s0 = p.stages[0];
  s0.index = 0;
  s0.slots = {makeSlot("x", SlotKind::Input, {2}, 0),
              makeSlot("y", SlotKind::MicroTemp, {2}, 8),
              makeSlot("gy", SlotKind::MicroTemp, {2}, 16),
              makeSlot("gy.acc", SlotKind::Accum, {2}),
              makeSlot("last_y", SlotKind::State, {2})};
  s0.slots[S0_gy].accum = S0_gyAcc;
  s0.slots[S0_lastY].blob = addBlob(p, {0, 0});
  s0.frameBytes = 24;
  s0.programs[int(Phase::F)] = {
      kernel(OpKind::Relu, {S0_x}, {S0_y}, {}, "relu0"),
      message(InstrKind::Send, S0_y, 1, 1)};
  s0.programs[int(Phase::B)] = {message(InstrKind::Recv, S0_gy, 1, 2)};
  s0.fwdUpdates = {{S0_lastY, S0_y}};
  s0.actions = parseActions(actions0);

  StagePlan &s1 = p.stages[1];
  s1.index = 1;
  s1.slots = {makeSlot("y", SlotKind::MicroTemp, {2}, 0),
              makeSlot("w", SlotKind::State, {2}),
              makeSlot("z", SlotKind::MicroTemp, {2}, 8),
              makeSlot("loss", SlotKind::MicroTemp, {}, 16),
              makeSlot("gy", SlotKind::MicroTemp, {2}, 24),
              makeSlot("gw", SlotKind::MicroTemp, {2}, 32),
              makeSlot("gw.acc", SlotKind::Accum, {2}),
              makeSlot("optimizer.lr", SlotKind::State, {}),
              makeSlot("w.new", SlotKind::StepTemp, {2}, 0)};
  s1.slots[S1_w].blob = addBlob(p, {0.5f, -1.0f});
  s1.slots[S1_w].trainable = true;
  s1.slots[S1_lr].blob = addBlob(p, {0.1f});
  s1.slots[S1_gw].accum = S1_gwAcc;
  s1.frameBytes = 40;
  s1.stepFrameBytes = 8;
  s1.lossSlot = S1_loss;
  s1.programs[int(Phase::F)] = {
      message(InstrKind::Recv, S1_y, 0, 1),
      kernel(OpKind::Mul, {S1_y, S1_w}, {S1_z}, {}, "mul"),
      kernel(OpKind::ReduceSum, {S1_z}, {S1_loss},
             {{"keepdims", ir::Attribute(int64_t(0))}}, "loss")};
  s1.programs[int(Phase::B)] = {
      kernel(OpKind::Identity, {S1_w}, {S1_gy}, {}, "dy"),
      message(InstrKind::Send, S1_gy, 0, 2)};
  s1.programs[int(Phase::W)] = {
      kernel(OpKind::Identity, {S1_y}, {S1_gw}, {}, "dw")};
  s1.programs[int(Phase::Step)] = {kernel(
      OpKind::SGD, {S1_w, S1_gwAcc, S1_lr}, {S1_wNew},
      {{"grad_scale", ir::Attribute(float(1.0 / M))}}, "sgd")};
  s1.stepUpdates = {{S1_w, S1_wNew}};
  s1.actions = parseActions(actions1);
  return p;
}

// x of microbatch mb: {1 + mb, 2 - 3 mb}, so y = Relu(x) = {1 + mb, mb ? 0 : 2}.
llvm::Error twoStageData(int mb, const std::string &name, void *dst,
                         size_t bytes) {
  if (name != "x" || bytes != 8)
    return llvm::createStringError(llvm::inconvertibleErrorCode(),
                                   "unexpected input " + name);
  float x[2] = {1.0f + mb, 2.0f - 3.0f * mb};
  std::memcpy(dst, x, 8);
  return llvm::Error::success();
}

std::vector<float> asFloats(const std::vector<uint8_t> &bytes) {
  std::vector<float> out(bytes.size() / 4);
  std::memcpy(out.data(), bytes.data(), bytes.size());
  return out;
}

std::vector<float> readFloats(StageExecutor &ex, const std::string &name) {
  auto bytes = ex.readSlot(name);
  EXPECT_TRUE(bool(bytes)) << (bytes ? "" : llvm::toString(bytes.takeError()));
  return bytes ? asFloats(*bytes) : std::vector<float>{};
}

// A pipeline: the comms, the executors, and the backend they share.
struct Pipeline {
  std::unique_ptr<Backend> backend = createCpuBackend(1);
  std::vector<std::unique_ptr<Comm>> comms;
  std::vector<std::unique_ptr<StageExecutor>> stages;

  llvm::Error build(const Plan &plan, double timeout = 30) {
    comms = createInProcessComms(int(plan.stages.size()), timeout);
    for (size_t s = 0; s < plan.stages.size(); ++s) {
      auto ex = StageExecutor::create(plan, int(s), *backend, *comms[s]);
      if (!ex)
        return ex.takeError();
      stages.push_back(std::move(*ex));
    }
    return llvm::Error::success();
  }
  std::vector<StageExecutor *> raw() {
    std::vector<StageExecutor *> out;
    for (auto &s : stages)
      out.push_back(s.get());
    return out;
  }
};

#define ASSERT_OK(expr)                                                        \
  do {                                                                         \
    if (llvm::Error err_ = (expr))                                             \
      FAIL() << llvm::toString(std::move(err_));                               \
  } while (0)

std::string errorOf(llvm::Error e) {
  return e ? llvm::toString(std::move(e)) : std::string("(success)");
}

// ---------------------------------------------------------------------------
// Comm.

TEST(CommTest, FifoPerKeyAndAnyOrderAcrossKeys) {
  auto comms = createInProcessComms(2, 10);
  int a = 1, b = 2, c = 3;
  ASSERT_OK(comms[0]->send(1, 7, 0, &a, 4));
  ASSERT_OK(comms[0]->send(1, 7, 0, &b, 4));
  ASSERT_OK(comms[0]->send(1, 7, 1, &c, 4));
  int got = 0;
  ASSERT_OK(comms[1]->recv(0, 7, 1, &got, 4)); // another key first
  EXPECT_EQ(got, 3);
  ASSERT_OK(comms[1]->recv(0, 7, 0, &got, 4));
  EXPECT_EQ(got, 1);
  ASSERT_OK(comms[1]->recv(0, 7, 0, &got, 4));
  EXPECT_EQ(got, 2);
  EXPECT_EQ(comms[1]->rank(), 1);
  EXPECT_EQ(comms[1]->size(), 2);
}

TEST(CommTest, RecvWaitsForALaterSend) {
  auto comms = createInProcessComms(2, 10);
  double sent = 2.5, got = 0;
  std::thread t([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    EXPECT_FALSE(bool(comms[1]->send(0, 3, -1, &sent, sizeof sent)));
  });
  ASSERT_OK(comms[0]->recv(1, 3, -1, &got, sizeof got));
  t.join();
  EXPECT_EQ(got, 2.5);
}

TEST(CommTest, SizeMismatchIsAnError) {
  auto comms = createInProcessComms(2, 10);
  int64_t v = 5;
  ASSERT_OK(comms[0]->send(1, 1, 0, &v, 8));
  int32_t small;
  std::string msg = errorOf(comms[1]->recv(0, 1, 0, &small, 4));
  EXPECT_NE(msg.find("8 bytes"), std::string::npos) << msg;
  EXPECT_NE(msg.find("tag 1"), std::string::npos) << msg;
}

TEST(CommTest, BadPeerIsAnError) {
  auto comms = createInProcessComms(2, 10);
  int v = 0;
  EXPECT_NE(errorOf(comms[0]->send(2, 1, 0, &v, 4)).find("no such peer"),
            std::string::npos);
  EXPECT_NE(errorOf(comms[0]->recv(0, 1, 0, &v, 4)).find("no such peer"),
            std::string::npos);
}

TEST(CommTest, TimeoutEndsAWait) {
  auto comms = createInProcessComms(2, 0.05);
  int v;
  std::string msg = errorOf(comms[0]->recv(1, 9, 2, &v, 4));
  EXPECT_EQ(msg, "rank 0: no message from rank 1 (tag 9, microbatch 2) "
                 "within 0.05 s (--comm-timeout)");
}

TEST(CommTest, AbortWakesEveryBlockedRecv) {
  auto comms = createInProcessComms(3, 30);
  std::vector<std::string> errors(2);
  std::vector<std::thread> threads;
  for (int r = 0; r < 2; ++r)
    threads.emplace_back([&, r] {
      int v;
      errors[r] = errorOf(comms[r]->recv(2, 1, 0, &v, 4));
    });
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  auto t0 = std::chrono::steady_clock::now();
  comms[2]->abort("stage 2 fell over");
  for (auto &t : threads)
    t.join();
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0)
                .count(),
            5.0);
  for (const std::string &e : errors)
    EXPECT_NE(e.find("aborted: stage 2 fell over"), std::string::npos) << e;
  EXPECT_TRUE(comms[0]->aborted());
  int v = 0;
  EXPECT_NE(errorOf(comms[0]->send(1, 1, 0, &v, 4)).find("aborted"),
            std::string::npos);
}

TEST(CommTest, Barrier) {
  auto comms = createInProcessComms(3, 10);
  std::atomic<int> arrived{0};
  std::atomic<bool> early{false};
  std::vector<std::thread> threads;
  for (int r = 0; r < 3; ++r)
    threads.emplace_back([&, r] {
      for (int round = 0; round < 3; ++round) {
        ++arrived;
        EXPECT_FALSE(bool(comms[r]->barrier()));
        if (arrived.load() < 3 * (round + 1))
          early = true;
      }
    });
  for (auto &t : threads)
    t.join();
  EXPECT_FALSE(early.load());
  auto lonely = createInProcessComms(2, 0.05);
  EXPECT_NE(errorOf(lonely[0]->barrier()).find("not all 2 ranks"),
            std::string::npos);
}

// ---------------------------------------------------------------------------
// The executor.

TEST(ExecutorTest, TwoStagePipelineMatchesHandComputation) {
  const int M = 3;
  Plan plan = twoStagePlan(M, "F0 F1 B0 F2 B1 B2 S",
                           "F0 B0 W0 F1 B1 W1 F2 BW2 S");
  Pipeline pipe;
  ASSERT_OK(pipe.build(plan));
  StageExecutor &s0 = *pipe.stages[0], &s1 = *pipe.stages[1];
  EXPECT_FALSE(s0.hasLoss());
  ASSERT_TRUE(s1.hasLoss());

  ASSERT_OK(runPipelineThreads(pipe.raw(), 0, twoStageData));
  // y_0 = {1, 2}, y_1 = {2, 0}, y_2 = {3, 0}; w = {0.5, -1}.
  ASSERT_EQ(s1.lastLosses().size(), 3u);
  EXPECT_FLOAT_EQ(s1.lastLosses()[0], -1.5f);
  EXPECT_FLOAT_EQ(s1.lastLosses()[1], 1.0f);
  EXPECT_FLOAT_EQ(s1.lastLosses()[2], 1.5f);
  EXPECT_NEAR(s1.lastLoss(), 1.0 / 3, 1e-6);
  // Stage 0 received gy = w three times; its forward update kept y_2.
  EXPECT_EQ(readFloats(s0, "gy.acc"), (std::vector<float>{1.5f, -3.0f}));
  EXPECT_EQ(readFloats(s0, "last_y"), (std::vector<float>{3.0f, 0.0f}));
  // sum gw = {6, 2}; w' = w - 0.1 * sum / 3.
  EXPECT_EQ(readFloats(s1, "gw.acc"), (std::vector<float>{6.0f, 2.0f}));
  std::vector<float> w = readFloats(s1, "w");
  ASSERT_EQ(w.size(), 2u);
  EXPECT_NEAR(w[0], 0.5 - 0.1 * 2.0, 1e-6);
  EXPECT_NEAR(w[1], -1.0 - 0.1 * 2.0 / 3, 1e-6);

  // A second step trains from w'.
  ASSERT_OK(runPipelineThreads(pipe.raw(), 1, twoStageData));
  double expected = ((1 * w[0] + 2 * w[1]) + 2 * w[0] + 3 * w[0]) / 3;
  EXPECT_NEAR(s1.lastLoss(), expected, 1e-6);
  std::vector<float> gy = readFloats(s0, "gy.acc");
  EXPECT_NEAR(gy[0], 3 * w[0], 1e-6);
  EXPECT_NEAR(gy[1], 3 * w[1], 1e-6);

  // Stats: one busy time per action kind that ran, frames as planned.
  const StageStats &st = s1.stats();
  EXPECT_GT(st.busySeconds[size_t(ActionKind::F)], 0);
  EXPECT_GT(st.busySeconds[size_t(ActionKind::Step)], 0);
  EXPECT_EQ(st.maxFramesInFlight, 1); // each microbatch ends before the next
  EXPECT_EQ(st.persistentBytes, 8 + 8 + 4);
  EXPECT_EQ(st.peakBytes, 20 + 40 + 8);
  EXPECT_EQ(s0.stats().maxFramesInFlight, 2);
}

// A backend that counts what it allocates, around the CPU backend.
class CountingBackend : public Backend {
public:
  std::unique_ptr<Backend> inner = createCpuBackend(1);
  int allocations = 0;
  std::string_view name() const override { return "counting"; }
  void *allocate(size_t bytes) override {
    ++allocations;
    return inner->allocate(bytes);
  }
  void release(void *p) override { inner->release(p); }
  void copyToDevice(void *d, const void *s, size_t n) override {
    inner->copyToDevice(d, s, n);
  }
  void copyToHost(void *d, const void *s, size_t n) override {
    inner->copyToHost(d, s, n);
  }
  bool supports(ir::OpKind op, ir::DType t) const override {
    return inner->supports(op, t);
  }
  llvm::Error run(const KernelCall &call) override { return inner->run(call); }
};

// Frames, the step frame and every persistent slot come from the backend
// in the first step; later steps allocate nothing (the CUDA backend's
// arena requirement: no allocation in the steady state).
TEST(ExecutorTest, TheSteadyStateAllocatesNothing) {
  const int M = 3;
  Plan plan = twoStagePlan(M, "F0 F1 B0 F2 B1 B2 S",
                           "F0 B0 W0 F1 B1 W1 F2 BW2 S");
  auto comms = createInProcessComms(2, 30);
  CountingBackend b0, b1;
  auto s0 = StageExecutor::create(plan, 0, b0, *comms[0]);
  auto s1 = StageExecutor::create(plan, 1, b1, *comms[1]);
  ASSERT_TRUE(s0 && s1);
  std::vector<StageExecutor *> raw = {s0->get(), s1->get()};
  ASSERT_OK(runPipelineThreads(raw, 0, twoStageData));
  int after = b0.allocations + b1.allocations;
  EXPECT_GT(after, 0);
  for (int step = 1; step < 4; ++step)
    ASSERT_OK(runPipelineThreads(raw, step, twoStageData));
  EXPECT_EQ(b0.allocations + b1.allocations, after);
}

// A backend that counts the copies (Identity kernels) it runs.
class CopyCountingBackend : public CountingBackend {
public:
  int copies = 0;
  llvm::Error run(const KernelCall &call) override {
    copies += call.op == OpKind::Identity;
    return inner->run(call);
  }
};

// The optimizer writes the new parameter into the parameter's own bytes
// (no copy of every parameter after the step) unless a later instruction
// of the Step program still reads the old value; either way w' is right.
TEST(ExecutorTest, UpdatesWriteInPlaceUnlessTheOldValueIsReadAfter) {
  for (bool readAfter : {false, true}) {
    SCOPED_TRACE(readAfter ? "w read after the update" : "in place");
    Plan plan = twoStagePlan(1, "F0 B0 S", "F0 BW0 S");
    StagePlan &s1 = plan.stages[1];
    if (readAfter) {
      s1.slots.push_back(makeSlot("w.seen", SlotKind::StepTemp, {2}, 8));
      s1.stepFrameBytes = 16;
      s1.programs[int(Phase::Step)].push_back(
          kernel(OpKind::Identity, {S1_w}, {int(s1.slots.size()) - 1}, {},
                 "seen"));
    }
    auto comms = createInProcessComms(2, 30);
    CountingBackend b0;
    CopyCountingBackend b1;
    auto e0 = StageExecutor::create(plan, 0, b0, *comms[0]);
    auto e1 = StageExecutor::create(plan, 1, b1, *comms[1]);
    ASSERT_TRUE(e0 && e1);
    std::vector<StageExecutor *> raw = {e0->get(), e1->get()};
    ASSERT_OK(runPipelineThreads(raw, 0, twoStageData));
    // B's dy, W's dw and its copy into the accumulator (an Identity is a
    // view, so it is not written there directly); then the update's copy
    // and the Step program's own read when there is one.
    EXPECT_EQ(b1.copies, readAfter ? 5 : 3);
    // y_0 = {1, 2}: w' = w - 0.1 * {1, 2}.
    std::vector<float> w = readFloats(**e1, "w");
    ASSERT_EQ(w.size(), 2u);
    EXPECT_FLOAT_EQ(w[0], 0.5f - 0.1f);
    EXPECT_FLOAT_EQ(w[1], -1.0f - 0.2f);
  }
}

TEST(ExecutorTest, LearningRateOverrideAndSlotAccess) {
  Plan plan = twoStagePlan(1, "F0 B0 S", "F0 BW0 S");
  Pipeline pipe;
  ASSERT_OK(pipe.build(plan));
  StageExecutor &s1 = *pipe.stages[1];
  float lr = 1.0f;
  std::vector<uint8_t> bytes(4);
  std::memcpy(bytes.data(), &lr, 4);
  ASSERT_OK(s1.writeSlot("optimizer.lr", bytes));
  ASSERT_OK(runPipelineThreads(pipe.raw(), 0, twoStageData));
  // y_0 = {1, 2}: w' = {0.5 - 1, -1 - 2}.
  EXPECT_EQ(readFloats(s1, "w"), (std::vector<float>{-0.5f, -3.0f}));

  EXPECT_NE(errorOf(s1.writeSlot("optimizer.lr", {1, 2})).find("has 4 bytes"),
            std::string::npos);
  EXPECT_NE(errorOf(s1.writeSlot("gw.acc", std::vector<uint8_t>(8)))
                .find("only state slots"),
            std::string::npos);
  EXPECT_NE(errorOf(s1.writeSlot("nope", bytes)).find("no slot named 'nope'"),
            std::string::npos);
  auto micro = s1.readSlot("z");
  ASSERT_FALSE(bool(micro));
  EXPECT_NE(llvm::toString(micro.takeError()).find("micro slot"),
            std::string::npos);
  EXPECT_EQ(s1.findSlot("w"), S1_w);
}

TEST(ExecutorTest, ProfilingTimesEachInstructionByLocAndPhase) {
  const int M = 2;
  Plan plan = twoStagePlan(M, "F0 F1 B0 B1 S", "F0 B0 W0 F1 B1 W1 S");
  Pipeline pipe;
  ASSERT_OK(pipe.build(plan));
  pipe.stages[1]->setProfiling(true);
  ASSERT_OK(runPipelineThreads(pipe.raw(), 0, twoStageData));
  const ProfileMap &prof = pipe.stages[1]->profile();
  auto calls = [&](const std::string &loc, Phase p) -> int64_t {
    auto it = prof.find({loc, p});
    return it == prof.end() ? -1 : it->second.calls;
  };
  EXPECT_EQ(calls("mul", Phase::F), M);
  // Messages are not timed: their time is mostly waiting for the peer.
  EXPECT_EQ(calls("recv y", Phase::F), -1);
  EXPECT_EQ(calls("send gy", Phase::B), -1);
  EXPECT_EQ(calls("dw", Phase::W), M);
  EXPECT_EQ(calls("sgd", Phase::Step), 1);
  EXPECT_TRUE(pipe.stages[0]->profile().empty()); // off by default
  pipe.stages[1]->clearProfile();
  EXPECT_TRUE(pipe.stages[1]->profile().empty());
}

// One stage, v = Identity(x) summed into acc; inputs 1e8, 1, -1e8 sum to 0
// in f32 only in microbatch order ((1e8 + 1) - 1e8: the 1 is lost).
Plan accumPlan(const std::string &actions, ActionKind writerPhase = ActionKind::F) {
  Plan p;
  p.microbatches = 3;
  p.stages.resize(1);
  StagePlan &s = p.stages[0];
  s.slots = {makeSlot("x", SlotKind::Input, {1}, 0),
             makeSlot("v", SlotKind::MicroTemp, {1}, 4),
             makeSlot("acc", SlotKind::Accum, {1})};
  s.slots[1].accum = 2;
  s.frameBytes = 8;
  Phase ph = writerPhase == ActionKind::F ? Phase::F
             : writerPhase == ActionKind::B ? Phase::B
                                            : Phase::W;
  s.programs[int(ph)] = {kernel(OpKind::Identity, {0}, {1})};
  s.actions = parseActions(actions);
  return p;
}

llvm::Error accumData(int mb, const std::string &, void *dst, size_t) {
  const float v[3] = {1e8f, 1.0f, -1e8f};
  std::memcpy(dst, &v[mb], 4);
  return llvm::Error::success();
}

TEST(ExecutorTest, AccumulationSumsInMicrobatchOrder) {
  for (const char *order : {"F0 F1 F2 S", "F0 B0 F1 F2 B2 B1 S"}) {
    Plan plan = accumPlan(order);
    Pipeline pipe;
    ASSERT_OK(pipe.build(plan));
    ASSERT_OK(pipe.stages[0]->runStep(0, accumData));
    EXPECT_EQ(readFloats(*pipe.stages[0], "acc"), (std::vector<float>{0.0f}))
        << order;
    // Every step starts the sum afresh.
    ASSERT_OK(pipe.stages[0]->runStep(1, accumData));
    EXPECT_EQ(readFloats(*pipe.stages[0], "acc"), (std::vector<float>{0.0f}));
  }
  // Written in W: any F order, W in microbatch order (BW counts as W).
  Plan plan = accumPlan("F2 F0 F1 W0 BW1 W2 S", ActionKind::W);
  Pipeline pipe;
  ASSERT_OK(pipe.build(plan));
  ASSERT_OK(pipe.stages[0]->runStep(0, accumData));
  EXPECT_EQ(readFloats(*pipe.stages[0], "acc"), (std::vector<float>{0.0f}));
}

TEST(ExecutorTest, OutOfOrderAccumulationIsRejected) {
  Pipeline pipe;
  std::string msg =
      errorOf(pipe.build(accumPlan("F0 F1 F2 W0 W2 W1 S", ActionKind::W)));
  EXPECT_EQ(msg, "stage 0: action 4 (W of microbatch 2): sums 'v' into 'acc' "
                 "out of microbatch order (microbatch 1 is next)");
  Pipeline early;
  msg = errorOf(early.build(accumPlan("F0 F1 W0 W1 S F2 W2", ActionKind::W)));
  EXPECT_NE(msg.find("action 4 (STEP): accumulator 'acc' has 2 of 3"),
            std::string::npos)
      << msg;
}

TEST(ExecutorTest, ActionListChecks) {
  Pipeline a, b, c, d;
  EXPECT_NE(errorOf(a.build(accumPlan("F0 W1 F1 F2 S"))).find(
                "action 1 (W of microbatch 1): comes before the microbatch's F"),
            std::string::npos);
  EXPECT_NE(errorOf(b.build(accumPlan("F0 F1"))).find(
                "microbatch 2 has no F action"),
            std::string::npos);
  EXPECT_NE(errorOf(c.build(accumPlan("F0 F1 F2 F3 S"))).find(
                "microbatch out of range"),
            std::string::npos);
  EXPECT_NE(errorOf(d.build(accumPlan("F0 F1 F1 F2 S"))).find(
                "a second F of the microbatch"),
            std::string::npos);
}

TEST(ExecutorTest, ChecksumMismatchNamesTheSlot) {
  Plan plan = twoStagePlan(1, "F0 B0 S", "F0 BW0 S");
  plan.blobs[plan.stages[1].slots[S1_w].blob].bytes[0] ^= 1;
  Pipeline pipe;
  std::string msg = errorOf(pipe.build(plan));
  EXPECT_EQ(msg.find("stage 1: slot 'w' (state): blob"), 0u) << msg;
  EXPECT_NE(msg.find("checksum"), std::string::npos) << msg;
  EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;
}

TEST(ExecutorTest, UnsupportedKernelAndBadSlotsAreRejected) {
  {
    Plan plan = twoStagePlan(1, "F0 B0 S", "F0 BW0 S");
    plan.stages[1].slots[S1_lr].dtype = ir::DType::I32; // still 4 bytes
    plan.stages[1].slots[S1_w].dtype = ir::DType::I32;
    plan.stages[1].slots[S1_gwAcc].dtype = ir::DType::I32;
    plan.stages[1].slots[S1_gw].dtype = ir::DType::I32;
    plan.stages[1].slots[S1_wNew].dtype = ir::DType::I32;
    Pipeline pipe;
    std::string msg = errorOf(pipe.build(plan));
    EXPECT_NE(msg.find("STEP instr 0 ('sgd'): the cpu backend has no kernel "
                       "for SGD on i32"),
              std::string::npos)
        << msg;
  }
  {
    Plan plan = twoStagePlan(1, "F0 B0 S", "F0 BW0 S");
    plan.stages[1].slots[S1_gw].offset = 36; // runs past the 40-byte frame
    Pipeline pipe;
    std::string msg = errorOf(pipe.build(plan));
    EXPECT_NE(msg.find("slot 'gw' (micro): bytes [36, 44) outside"),
              std::string::npos)
        << msg;
  }
  {
    Plan plan = twoStagePlan(1, "F0 B0 S", "F0 BW0 S");
    plan.stages[0].programs[int(Phase::F)][1].peer = 0; // sends to itself
    Pipeline pipe;
    std::string msg = errorOf(pipe.build(plan));
    EXPECT_NE(msg.find("stage 0: F instr 1: peer stage 0 is not another stage"),
              std::string::npos)
        << msg;
  }
}

TEST(ExecutorTest, DataErrorOnOneStageStopsThePipeline) {
  Plan plan = twoStagePlan(3, "F0 F1 B0 F2 B1 B2 S",
                           "F0 B0 W0 F1 B1 W1 F2 BW2 S");
  // Stage 1 also reads a graph input, whose data fails.
  StagePlan &s1 = plan.stages[1];
  s1.slots.push_back(makeSlot("label", SlotKind::Input, {1}, 40));
  s1.frameBytes = 44;
  Pipeline pipe;
  ASSERT_OK(pipe.build(plan, /*timeout=*/60));
  auto data = [](int mb, const std::string &name, void *dst,
                 size_t bytes) -> llvm::Error {
    if (name == "label")
      return llvm::createStringError(llvm::inconvertibleErrorCode(),
                                     "labels.bin: no such file");
    return twoStageData(mb, name, dst, bytes);
  };
  auto t0 = std::chrono::steady_clock::now();
  std::string msg = errorOf(runPipelineThreads(pipe.raw(), 0, data));
  double secs =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0)
          .count();
  EXPECT_EQ(msg, "stage 1: F of microbatch 0: input 'label': labels.bin: no "
                 "such file");
  EXPECT_LT(secs, 5.0); // stage 0 was woken, not timed out
  EXPECT_TRUE(pipe.comms[0]->aborted());
}

TEST(ExecutorTest, KernelErrorOnOneStageStopsThePipeline) {
  Plan plan = twoStagePlan(2, "F0 F1 B0 B1 S", "F0 B0 W0 F1 B1 W1 S");
  // SGD with momentum but no velocity operand: the kernel refuses it at run
  // time (create() only checks that a kernel exists).
  StagePlan &s1 = plan.stages[1];
  s1.programs[int(Phase::B)].insert(
      s1.programs[int(Phase::B)].begin(),
      kernel(OpKind::SGD, {S1_w, S1_y, S1_lr}, {S1_gy},
             {{"momentum", ir::Attribute(0.9f)}}, "bad_sgd"));
  Pipeline pipe;
  ASSERT_OK(pipe.build(plan, /*timeout=*/60));
  auto t0 = std::chrono::steady_clock::now();
  std::string msg = errorOf(runPipelineThreads(pipe.raw(), 0, twoStageData));
  double secs =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0)
          .count();
  EXPECT_EQ(msg.find("stage 1: B of microbatch 0: B instr 0 (SGD 'bad_sgd'): "),
            0u)
      << msg;
  EXPECT_NE(msg.find("velocity"), std::string::npos) << msg;
  EXPECT_LT(secs, 5.0);
}

// One stage, F writes t, B reads it: frames in flight follow the schedule.
Plan framePlan(int M, const std::string &actions) {
  Plan p;
  p.microbatches = M;
  p.stages.resize(1);
  StagePlan &s = p.stages[0];
  s.slots = {makeSlot("x", SlotKind::Input, {4}, 0),
             makeSlot("t", SlotKind::MicroTemp, {4}, 16),
             makeSlot("g", SlotKind::MicroTemp, {4}, 32),
             makeSlot("g.acc", SlotKind::Accum, {4})};
  s.slots[2].accum = 3;
  s.frameBytes = 48;
  s.programs[int(Phase::F)] = {kernel(OpKind::Relu, {0}, {1})};
  s.programs[int(Phase::B)] = {kernel(OpKind::Neg, {1}, {2})};
  s.actions = parseActions(actions);
  return p;
}

llvm::Error frameData(int mb, const std::string &, void *dst, size_t bytes) {
  std::vector<float> v(bytes / 4, float(mb + 1));
  std::memcpy(dst, v.data(), bytes);
  return llvm::Error::success();
}

TEST(ExecutorTest, FramesAreRecycledAfterTheLastBackwardAction) {
  struct Case {
    const char *actions;
    int frames;
  } cases[] = {
      {"F0 F1 F2 F3 B0 B1 B2 B3 S", 4}, // GPipe: all forwards first
      {"F0 F1 B0 F2 B1 F3 B2 B3 S", 2}, // 1F1B with two in flight
      {"F0 B0 F1 B1 F2 B2 F3 B3 S", 1},
  };
  for (const Case &c : cases) {
    Pipeline pipe;
    ASSERT_OK(pipe.build(framePlan(4, c.actions)));
    StageExecutor &ex = *pipe.stages[0];
    for (int step = 0; step < 2; ++step) {
      ASSERT_OK(ex.runStep(step, frameData));
      // g = -relu(x) summed: -(1 + 2 + 3 + 4) whatever the order.
      EXPECT_EQ(readFloats(ex, "g.acc"), std::vector<float>(4, -10.0f))
          << c.actions;
    }
    EXPECT_EQ(ex.stats().maxFramesInFlight, c.frames) << c.actions;
    EXPECT_EQ(ex.stats().framesAllocated, c.frames) << c.actions;
    EXPECT_EQ(ex.stats().peakBytes, 16 + c.frames * 48) << c.actions;
  }
  // With no backward action a microbatch's frame goes back after its F.
  Plan fOnly = framePlan(4, "F0 F1 F2 F3");
  fOnly.stages[0].programs[int(Phase::B)].clear();
  fOnly.stages[0].slots[2].accum = -1;
  Pipeline pipe;
  ASSERT_OK(pipe.build(fOnly));
  ASSERT_OK(pipe.stages[0]->runStep(0, frameData));
  EXPECT_EQ(pipe.stages[0]->stats().maxFramesInFlight, 1);
}

TEST(ExecutorTest, SeedsDependOnStepMicrobatchAndSalt) {
  uint64_t s = kernelSeed(3, 1, 42);
  EXPECT_EQ(s, kernelSeed(3, 1, 42));
  EXPECT_NE(s, kernelSeed(4, 1, 42));
  EXPECT_NE(s, kernelSeed(3, 2, 42));
  EXPECT_NE(s, kernelSeed(3, -1, 42));
  EXPECT_NE(s, kernelSeed(3, 1, 43));
}

// Backend::fusesGemmGelu: a Gemm with a bias and the tanh Gelu of its
// result become one call on a backend that fuses them (the emulated CUDA
// one here), with the bits of the pair apart; a Gelu whose output bytes
// overlap one of the Gemm's inputs (which may die at the Gemm, so the
// memory plan may put the Gelu's output there) stays apart.
Plan gemmGeluPlan(int64_t yOffset) {
  Plan p;
  p.microbatches = 1;
  p.stages.resize(1);
  StagePlan &s = p.stages[0];
  s.slots = {makeSlot("x", SlotKind::Input, {2, 3}, 0),
             makeSlot("w", SlotKind::Const, {3, 4}),
             makeSlot("b", SlotKind::Const, {4}),
             makeSlot("h", SlotKind::MicroTemp, {2, 4}, 24),
             makeSlot("y", SlotKind::MicroTemp, {2, 4}, yOffset),
             makeSlot("y.acc", SlotKind::Accum, {2, 4})};
  s.slots[4].accum = 5; // readable after the step
  s.slots[1].blob = addBlob(p, {0.5f, -1.0f, 0.25f, 2.0f, 1.5f, 0.75f, -0.5f,
                                1.0f, -2.0f, 0.125f, 0.5f, -1.5f});
  s.slots[2].blob = addBlob(p, {0.1f, -0.2f, 0.3f, -0.4f});
  s.frameBytes = std::max<int64_t>(56, yOffset + 32);
  ir::AttrMap tanh{{"approximate", ir::Attribute(std::string("tanh"))}};
  s.programs[int(Phase::F)] = {kernel(OpKind::Gemm, {0, 1, 2}, {3}),
                               kernel(OpKind::Gelu, {3}, {4}, tanh)};
  s.actions = parseActions("F0 S");
  return p;
}

TEST(ExecutorTest, GemmAndTanhGeluAsOneCallWhereTheBytesAllow) {
  auto data = [](int, const std::string &, void *dst, size_t bytes) {
    const float x[6] = {1.0f, -0.5f, 2.0f, 0.25f, -1.0f, 0.75f};
    std::memcpy(dst, x, std::min(bytes, sizeof x));
    return llvm::Error::success();
  };
  auto run = [&](int64_t yOffset, int *fused) {
    Plan plan = gemmGeluPlan(yOffset);
    auto backend = cuda::createCudaEmulatedBackend();
    auto comms = createInProcessComms(1);
    auto ex = StageExecutor::create(plan, 0, *backend, *comms[0]);
    EXPECT_TRUE(bool(ex));
    if (!ex) {
      llvm::consumeError(ex.takeError());
      return std::vector<float>{};
    }
    *fused = (*ex)->fusedEpilogues();
    EXPECT_FALSE(bool((*ex)->runStep(0, data)));
    return readFloats(**ex, "y.acc");
  };
  int fused = -1, apart = -1;
  std::vector<float> one = run(56, &fused);
  std::vector<float> two = run(0, &apart); // y over x: kept apart
  EXPECT_EQ(fused, 1);
  EXPECT_EQ(apart, 0);
  ASSERT_EQ(one.size(), 8u);
  EXPECT_EQ(one, two);
  // The tanh Gelu of the product and bias, as the CPU computes it.
  float h0 = 1.0f * 0.5f + -0.5f * 1.5f + 2.0f * -2.0f + 0.1f;
  float g0 = 0.5f * h0 *
             (1.0f + std::tanh(0.7978845608f * (h0 + 0.044715f * h0 * h0 * h0)));
  EXPECT_NEAR(one[0], g0, 1e-5f);
}

} // namespace

// The non-finite check before each update: the host scan and the CPU
// backend's in-place one over its threads agree, find one NaN or infinity
// anywhere (the first, the last, an odd tail) and pass the largest finite
// values; types other than f32 and f64 are not checked.
TEST(NonFiniteCheck, FindsEveryKindAnywhere) {
  auto backend = cleave::runtime::createCpuBackend(2);
  const int64_t n = 300001; // several of the pool's blocks, an odd tail
  std::vector<float> f(size_t(n), 1.5f);
  f[7] = -std::numeric_limits<float>::max();
  f[8] = std::numeric_limits<float>::denorm_min();
  auto both = [&](ir::DType t, const void *p, int64_t count) {
    bool host = runtime::allFiniteOnHost(t, p, count);
    EXPECT_EQ(backend->allFinite(t, p, count), host);
    return host;
  };
  EXPECT_TRUE(both(ir::DType::F32, f.data(), n));
  for (int64_t at : {int64_t(0), n / 2, n - 1})
    for (float bad : {std::numeric_limits<float>::infinity(),
                      -std::numeric_limits<float>::infinity(),
                      std::numeric_limits<float>::quiet_NaN()}) {
      float keep = f[size_t(at)];
      f[size_t(at)] = bad;
      EXPECT_FALSE(both(ir::DType::F32, f.data(), n)) << at << " " << bad;
      f[size_t(at)] = keep;
    }
  std::vector<double> d(1001, -2.0);
  d[3] = std::numeric_limits<double>::max();
  EXPECT_TRUE(both(ir::DType::F64, d.data(), int64_t(d.size())));
  d[1000] = std::numeric_limits<double>::infinity();
  EXPECT_FALSE(both(ir::DType::F64, d.data(), int64_t(d.size())));
  EXPECT_TRUE(both(ir::DType::F32, f.data(), 0));
  std::vector<uint16_t> h(8, 0x7fc0); // bf16 NaNs: not checked
  EXPECT_TRUE(both(ir::DType::BF16, h.data(), 8));
}

// A step's gradients checked in one call: the CPU backend's range over all
// of them, cut in blocks that span buffers, agrees with each buffer's own
// check wherever the bad value sits (a buffer's first or last element, a
// block's edge, after empty and unchecked buffers, in an f64 one).
TEST(NonFiniteCheck, AllBuffersAtOnceAgreeWithEachAlone) {
  auto backend = cleave::runtime::createCpuBackend(2);
  using Check = runtime::Backend::FiniteCheck;
  std::vector<float> a(70000, 0.25f), b(3, -1.0f), c(200003, 2.0f);
  std::vector<double> d(65536, 1.0);
  std::vector<uint16_t> h(16, 0x7fc0); // bf16 NaNs: not checked
  std::vector<Check> all = {{ir::DType::F32, a.data(), int64_t(a.size())},
                            {ir::DType::F32, b.data(), 0},
                            {ir::DType::BF16, h.data(), int64_t(h.size())},
                            {ir::DType::F32, b.data(), int64_t(b.size())},
                            {ir::DType::F64, d.data(), int64_t(d.size())},
                            {ir::DType::F32, c.data(), int64_t(c.size())}};
  EXPECT_TRUE(backend->allBuffersFinite(all));
  EXPECT_TRUE(backend->allBuffersFinite({}));
  auto spoil = [&](auto &v, size_t at) {
    using T = std::decay_t<decltype(v[0])>;
    T keep = v[at];
    v[at] = std::numeric_limits<T>::quiet_NaN();
    EXPECT_FALSE(backend->allBuffersFinite(all)) << at;
    v[at] = -std::numeric_limits<T>::infinity();
    EXPECT_FALSE(backend->allBuffersFinite(all)) << at;
    v[at] = keep;
  };
  for (size_t at : {size_t(0), size_t(65535), size_t(65536), a.size() - 1})
    spoil(a, at);
  for (size_t at : {size_t(0), size_t(2)})
    spoil(b, at);
  for (size_t at : {size_t(0), size_t(61), d.size() - 1})
    spoil(d, at);
  for (size_t at : {size_t(0), size_t(131072 - 70003), c.size() - 1})
    spoil(c, at);
  EXPECT_TRUE(backend->allBuffersFinite(all));
}

} // namespace unit_runtime_executor
