// The cost model: FLOPs of the matrix products and their gradient parts,
// the roofline time against a device profile, measured profiles (their
// JSON form and errors), and the flag values it parses.
#include "ir/Parser.h"
#include "passes/Cost.h"
#include "passes/Partition.h"
#include "tools/HostProfile.h"

#include <gtest/gtest.h>

namespace unit_cost_model {

using namespace cleave;
using namespace cleave::passes;

namespace {

std::unique_ptr<ir::Graph> parse(llvm::StringRef text) {
  auto g = ir::parseGraph(text, "test");
  EXPECT_TRUE(bool(g)) << llvm::toString(g.takeError());
  return g ? std::move(*g) : nullptr;
}

const char kProducts[] = R"(graph @products {
  input %a : f32[4,8]
  input %dy : f32[4,16]
  input %x : f32[2,3,8,8]
  input %dx : f32[2,5,8,8]
  param %b : f32[8,16] = splat<0.5>
  param %w : f32[5,3,3,3] = splat<0.5>
  fwd %y = MatMul(%a, %b) : f32[4,16] @"/fc/MatMul"
  fwd %g = Gemm(%a, %b) : f32[4,16] @"/fc/Gemm"
  fwd %c = Conv(%x, %w) {dilations = [1, 1], pads = [1, 1, 1, 1], strides = [1, 1]} : f32[2,5,8,8] @"/conv/Conv"
  B   %da = MatMulGradA(%dy, %b) {shape = [4, 8]} : f32[4,8] @"/fc/MatMul"
  W   %db = MatMulGradB(%a, %dy) {shape = [8, 16]} : f32[8,16] @"/fc/MatMul"
  B   %ga = GemmGradA(%dy, %b) {shape = [4, 8]} : f32[4,8] @"/fc/Gemm"
  W   %gb = GemmGradB(%a, %dy) {shape = [8, 16]} : f32[8,16] @"/fc/Gemm"
  B   %cx = ConvGradData(%dx, %w) {dilations = [1, 1], pads = [1, 1, 1, 1], shape = [2, 3, 8, 8], strides = [1, 1]} : f32[2,3,8,8] @"/conv/Conv"
  W   %cw = ConvGradFilter(%x, %dx) {dilations = [1, 1], pads = [1, 1, 1, 1], shape = [5, 3, 3, 3], strides = [1, 1]} : f32[5,3,3,3] @"/conv/Conv"
  fwd %r = Relu(%y) : f32[4,16] @"/relu"
  output %r
  output %g
  output %c
  output %da
  output %db
  output %ga
  output %gb
  output %cx
  output %cw
}
)";

double flopsOf(const ir::Graph &g, llvm::StringRef result) {
  return opWork(*g.lookup(result)->definingOp()).flops;
}

TEST(CostModel, ProductFlopsForwardAndGradientParts) {
  auto g = parse(kProducts);
  ASSERT_TRUE(g);
  // 2·M·N·K = 2·4·16·8 for the product and for each gradient part.
  EXPECT_EQ(flopsOf(*g, "y"), 1024);
  EXPECT_EQ(flopsOf(*g, "g"), 1024);
  EXPECT_EQ(flopsOf(*g, "da"), 1024);
  EXPECT_EQ(flopsOf(*g, "db"), 1024);
  EXPECT_EQ(flopsOf(*g, "ga"), 1024);
  EXPECT_EQ(flopsOf(*g, "gb"), 1024);
  // Conv: 2 · |Y| · (C_in · kh · kw) = 2 · 640 · 27, and so each part.
  EXPECT_EQ(flopsOf(*g, "c"), 2 * 640 * 27);
  EXPECT_EQ(flopsOf(*g, "cx"), 2 * 640 * 27);
  EXPECT_EQ(flopsOf(*g, "cw"), 2 * 640 * 27);
  // Relu: one per element; bytes: read 64 floats, write 64.
  OpWork relu = opWork(*g->lookup("r")->definingOp());
  EXPECT_EQ(relu.flops, 64);
  EXPECT_EQ(relu.bytes, 2 * 64 * 4);
}

// A gradient split-backward keeps whole (LayerNorm's) costs one pass on
// the CPU, whose kernel shares it, and its two parts' passes on the GPU
// profiles, whose backend runs the parts.
TEST(CostModel, KeptWholeGradientCostsItsPartsWhereTheBackendSplitsIt) {
  auto g = parse(R"(graph @ln {
  input %dy : f32[64,256]
  input %x : f32[64,256]
  input %s : f32[256]
  B   %dx, %ds = LayerNormalizationGrad(%dy, %x, %s) {axis = -1, epsilon = 1e-05} : f32[64,256], f32[256] @"/ln"
  B   %dx2 = LayerNormalizationGradData(%dy, %x, %s) {axis = -1, epsilon = 1e-05} : f32[64,256] @"/ln"
  W   %ds2 = LayerNormalizationGradParams(%dy, %x) {axis = -1, epsilon = 1e-05} : f32[256] @"/ln"
  output %dx
  output %ds
  output %dx2
  output %ds2
}
)");
  ASSERT_TRUE(g);
  const ir::Op &whole = *g->lookup("dx")->definingOp(),
               &data = *g->lookup("dx2")->definingOp(),
               &params = *g->lookup("ds2")->definingOp();
  for (const char *name : {"h200", "a100"}) {
    DeviceProfile d = llvm::cantFail(lookupDeviceProfile(name));
    EXPECT_TRUE(d.splitsKeptWholeGrads) << name;
    EXPECT_DOUBLE_EQ(predictOpTime(whole, d, 0),
                     predictOpTime(data, d, 0) + predictOpTime(params, d, 0))
        << name;
  }
  DeviceProfile cpu = llvm::cantFail(lookupDeviceProfile("cpu"));
  EXPECT_FALSE(cpu.splitsKeptWholeGrads);
  EXPECT_LT(predictOpTime(whole, cpu, 0),
            predictOpTime(data, cpu, 0) + predictOpTime(params, cpu, 0));
}

TEST(CostModel, RooflineTime) {
  auto g = parse(kProducts);
  ASSERT_TRUE(g);
  DeviceProfile d{"test", /*peakFlops=*/1024, /*memBandwidth=*/64,
                  /*opOverhead=*/0.5, 0, 0};
  // MatMul: 1024 FLOPs = 1 s; bytes (4·8 + 8·16 + 4·16)·4 = 896 = 14 s.
  EXPECT_DOUBLE_EQ(predictOpTime(*g->lookup("y")->definingOp(), d), 14.5);
  d.memBandwidth = 1e9; // now compute-bound
  EXPECT_DOUBLE_EQ(predictOpTime(*g->lookup("y")->definingOp(), d), 1.5);
}

// A product with bf16 operands (--precision bf16) runs at the profile's
// bf16 rate and moves half the bytes; other ops keep the f32 rate.
TEST(CostModel, Bf16ProductsUseTheBf16Peak) {
  auto g = parse(R"(graph @bf16 {
  input %a : bf16[4,8]
  param %b : bf16[8,16] = splat<0.5>
  %y = MatMul(%a, %b) : bf16[4,16] @"/fc/MatMul"
  %r = Relu(%y) : bf16[4,16] @"/relu"
  output %r
})");
  ASSERT_TRUE(g);
  DeviceProfile d{"test", /*peakFlops=*/1024, /*memBandwidth=*/1e9,
                  /*opOverhead=*/0.5, 0, 0, /*peakFlops16=*/4096};
  // 1024 FLOPs at 4096 FLOP/s.
  EXPECT_DOUBLE_EQ(predictOpTime(*g->lookup("y")->definingOp(), d), 0.75);
  d.memBandwidth = 1;
  // Bytes (4·8 + 8·16 + 4·16)·2 = 448.
  EXPECT_DOUBLE_EQ(predictOpTime(*g->lookup("y")->definingOp(), d), 448.5);
  d.memBandwidth = 1e9;
  d.peakFlops16 = 0; // a profile without a bf16 rate uses the f32 one
  EXPECT_DOUBLE_EQ(predictOpTime(*g->lookup("y")->definingOp(), d), 1.5);
  auto h200 = lookupDeviceProfile("h200");
  ASSERT_TRUE(bool(h200));
  EXPECT_EQ(h200->peakFlops16, 989e12);
}

TEST(CostModel, DeviceProfiles) {
  auto cpu = lookupDeviceProfile("cpu");
  ASSERT_TRUE(bool(cpu));
  EXPECT_GT(cpu->peakFlops, 1e9);
  auto h200 = lookupDeviceProfile("h200");
  ASSERT_TRUE(bool(h200));
  EXPECT_EQ(h200->memBandwidth, 4.8e12);
  auto bad = lookupDeviceProfile("tpu");
  ASSERT_FALSE(bool(bad));
  EXPECT_EQ(llvm::toString(bad.takeError()),
            "unknown device profile 'tpu' (known: cpu, host, h200, a100)");
}

TEST(CostModel, RegisteredProfilesAreFoundByName) {
  DeviceProfile p = *lookupDeviceProfile("cpu");
  p.name = "measured-here";
  p.peakFlops = 7e10;
  registerDeviceProfile(p);
  p.peakFlops = 8e10; // registering again replaces
  registerDeviceProfile(p);
  auto got = lookupDeviceProfile("measured-here");
  ASSERT_TRUE(bool(got));
  EXPECT_EQ(got->peakFlops, 8e10);
  EXPECT_EQ(lookupDeviceProfile("cpu")->peakFlops, 1.15e11);
}

TEST(CostModel, FusedAttentionRunsAtTheAttentionRate) {
  auto g = parse(R"(graph @attn {
  input %q : f32[1,2,8,4]
  input %k : f32[1,2,8,4]
  input %v : f32[1,2,8,4]
  input %kt : f32[1,2,4,8]
  %o, %l = FusedAttention(%q, %k, %v) {causal = 0, scale = 0.5} : f32[1,2,8,4], f32[1,2,8]
  %y = MatMul(%q, %kt) : f32[1,2,8,8]
  output %o
  output %y
})");
  ASSERT_TRUE(g);
  const ir::Op &attn = *g->lookup("o")->definingOp();
  const ir::Op &mm = *g->lookup("y")->definingOp();
  DeviceProfile d{"test", /*peakFlops=*/1024, /*memBandwidth=*/1e12,
                  /*opOverhead=*/0};
  // 2 products of 2 x (2 heads x 8 x 8 scores) x 4: 2048 FLOPs.
  EXPECT_DOUBLE_EQ(predictOpTime(attn, d), 2.0);
  d.attentionFlops = 256;
  EXPECT_DOUBLE_EQ(predictOpTime(attn, d), 8.0);
  // The scores' product: 2 x 128 x 4 FLOPs at the products' peak.
  EXPECT_DOUBLE_EQ(predictOpTime(mm, d), 1.0);
}

// A reshape-like op whose result has its operand's bytes is a view of
// them at run time (MemoryPlan.cpp; the executor skips it): it costs
// nothing, not even the profile's op overhead. A Transpose moves bytes.
TEST(CostModel, ViewsCostNothing) {
  auto g = parse(R"(graph @views {
  input %x : f32[4,6]
  fwd %r = Reshape(%x) {shape = [2, 12]} : f32[2,12] @"/r"
  fwd %f = Flatten(%r) {axis = 1} : f32[2,12] @"/f"
  fwd %u = Unsqueeze(%f) {axes = [0]} : f32[1,2,12] @"/u"
  fwd %s = Squeeze(%u) {axes = [0]} : f32[2,12] @"/s"
  fwd %t = Transpose(%x) {perm = [1, 0]} : f32[6,4] @"/t"
  output %s
  output %t
})");
  ASSERT_TRUE(g);
  DeviceProfile d = llvm::cantFail(lookupDeviceProfile("cpu"));
  ASSERT_GT(d.opOverhead, 0);
  for (llvm::StringRef view : {"r", "f", "u", "s"})
    EXPECT_EQ(predictOpTime(*g->lookup(view)->definingOp(), d), 0.0)
        << view.str();
  EXPECT_GE(predictOpTime(*g->lookup("t")->definingOp(), d), d.opOverhead);
}

TEST(CostModel, ParsesCostModelFlag) {
  EXPECT_EQ(parseCostModel("analytic")->kind, CostModelKind::Analytic);
  EXPECT_EQ(parseCostModel("uniform")->kind, CostModelKind::Uniform);
  auto p = parseCostModel("profile:/tmp/p.json");
  ASSERT_TRUE(bool(p));
  EXPECT_EQ(p->kind, CostModelKind::Profile);
  EXPECT_EQ(p->profilePath, "/tmp/p.json");
  for (const char *bad : {"profile:", "roofline"}) {
    auto e = parseCostModel(bad);
    ASSERT_FALSE(bool(e));
    EXPECT_EQ(llvm::toString(e.takeError()),
              std::string("--cost-model must be analytic, uniform or "
                          "profile:FILE, not '") + bad + "'");
  }
}

TEST(CostModel, ProfileSharesAGroupsTimeAmongItsOps) {
  auto g = parse(kProducts);
  ASSERT_TRUE(g);
  auto profile = OpProfile::parse(R"({"time_unit": "s", "ops": [
    {"loc": "/fc/MatMul", "phase": "fwd", "time": 3.0},
    {"loc": "/fc/MatMul", "phase": "B", "time": 1.0},
    {"loc": "/fc/MatMul", "phase": "B", "time": 1.0}]})", "p.json");
  ASSERT_TRUE(bool(profile)) << llvm::toString(profile.takeError());
  EXPECT_EQ(profile->time("/fc/MatMul", ir::Phase::Fwd), 3.0);
  EXPECT_EQ(profile->time("/fc/MatMul", ir::Phase::B), 2.0); // entries add
  EXPECT_FALSE(profile->time("/fc/MatMul", ir::Phase::W));
}

// The executor's own time per action (cleave-run --profile's "actions"):
// the mean over the profiled stages, per action kind.
TEST(CostModel, ProfileActionOverheadIsTheMeanOverStages) {
  auto profile = OpProfile::parse(R"({"time_unit": "s", "ops": [],
    "actions": [{"stage": 0, "action": "F", "overhead": 1e-5},
                {"stage": 1, "action": "F", "overhead": 3e-5},
                {"stage": 1, "action": "W", "overhead": 2e-6},
                {"stage": 0, "action": "STEP", "overhead": 4e-3}]})", "p.json");
  ASSERT_TRUE(bool(profile)) << llvm::toString(profile.takeError());
  EXPECT_DOUBLE_EQ(profile->actionOverhead("F"), 2e-5);
  EXPECT_DOUBLE_EQ(profile->actionOverhead("W"), 2e-6);
  EXPECT_EQ(profile->actionOverhead("B"), 0);
  EXPECT_DOUBLE_EQ(profile->actionOverhead("STEP"), 4e-3);
  auto bad = OpProfile::parse(R"({"ops": [], "actions": [{"action": "X",
                                            "overhead": 1}]})", "p.json");
  ASSERT_FALSE(bool(bad));
  EXPECT_EQ(llvm::toString(bad.takeError()),
            "profile 'p.json': actions[0] needs \"action\" (F, B, W, BW or "
            "STEP) and \"overhead\" (seconds, >= 0)");
}

// The delay of the messages a stage waited for (cleave-run --profile's
// "messages"): per receiving stage, and the mean over all the receives that
// waited.
TEST(CostModel, ProfileMessageLatencyPerStageAndOverAll) {
  auto profile = OpProfile::parse(R"({"time_unit": "s", "ops": [],
    "messages": [{"stage": 0, "latency": 1e-4, "waited": 30, "received": 80},
                 {"stage": 1, "latency": 1e-3, "waited": 10, "received": 80}]})",
                                  "p.json");
  ASSERT_TRUE(bool(profile)) << llvm::toString(profile.takeError());
  EXPECT_DOUBLE_EQ(*profile->messageLatency(0), 1e-4);
  EXPECT_DOUBLE_EQ(*profile->messageLatency(1), 1e-3);
  EXPECT_FALSE(profile->messageLatency(2));
  EXPECT_DOUBLE_EQ(*profile->messageLatency(), (30 * 1e-4 + 10 * 1e-3) / 40);
  // One wait in 429 receives is no mean to go by: the stage gets none of
  // its own (the caller takes the mean over all stages).
  auto rare = OpProfile::parse(R"({"ops": [],
    "messages": [{"stage": 0, "latency": 6e-4, "waited": 1, "received": 429},
                 {"stage": 1, "latency": 2e-5, "waited": 78, "received": 507}]})",
                               "p.json");
  ASSERT_TRUE(bool(rare)) << llvm::toString(rare.takeError());
  EXPECT_FALSE(rare->messageLatency(0));
  EXPECT_DOUBLE_EQ(*rare->messageLatency(1), 2e-5);
  EXPECT_DOUBLE_EQ(*rare->messageLatency(), (6e-4 + 78 * 2e-5) / 79);
  auto none = OpProfile::parse(R"({"ops": []})", "p.json");
  ASSERT_TRUE(bool(none));
  EXPECT_FALSE(none->messageLatency());
  auto bad = OpProfile::parse(R"({"ops": [], "messages": [{"stage": 0,
                                   "latency": -1, "waited": 3}]})", "p.json");
  ASSERT_FALSE(bool(bad));
  EXPECT_EQ(llvm::toString(bad.takeError()),
            "profile 'p.json': messages[0] needs \"stage\" (>= 0), "
            "\"latency\" (seconds, >= 0) and \"waited\" (>= 1)");
}

// How much of the machine the profiled run had ("cores", written by
// cleave-run --profile): read back for cleavec's note; optional, and
// checked like the rest of the file.
TEST(CostModel, ProfileKeepsHowTheCoresWereShared) {
  auto profile = OpProfile::parse(R"({"ops": [], "cores": {"cores": 2,
    "other_cores": 0.91, "core_wait": [{"stage": 0, "seconds": 0.0029},
                                       {"stage": 1, "seconds": 0.0039}]}})",
                                  "p.json");
  ASSERT_TRUE(bool(profile)) << llvm::toString(profile.takeError());
  ASSERT_TRUE(profile->sharing().has_value());
  EXPECT_EQ(profile->sharing()->cores, 2);
  EXPECT_DOUBLE_EQ(*profile->sharing()->otherCores, 0.91);
  EXPECT_DOUBLE_EQ(profile->sharing()->coreWait.at(1), 0.0039);
  // A run of several processes knows no other processes' share.
  auto mpi = OpProfile::parse(R"({"ops": [], "cores": {"cores": 8,
    "core_wait": []}})", "p.json");
  ASSERT_TRUE(bool(mpi));
  EXPECT_FALSE(mpi->sharing()->otherCores.has_value());
  auto none = OpProfile::parse(R"({"ops": []})", "p.json");
  ASSERT_TRUE(bool(none));
  EXPECT_FALSE(none->sharing().has_value());
  auto bad = OpProfile::parse(R"({"ops": [], "cores": {"cores": 2,
    "core_wait": [{"stage": 0, "seconds": -1}]}})", "p.json");
  ASSERT_FALSE(bool(bad));
  EXPECT_EQ(llvm::toString(bad.takeError()),
            "profile 'p.json': cores.core_wait[0] needs \"stage\" (>= 0) and "
            "\"seconds\" (>= 0)");
  // What other processes wanted: their runnable threads where the run
  // sampled them (a busy neighbour that got two thirds of a core still
  // wants the whole core), else the cores they kept busy.
  auto wanted = OpProfile::parse(R"({"ops": [], "cores": {"cores": 2,
    "other_cores": 0.67, "other_runnable": 1.0, "core_wait": []}})", "p.json");
  ASSERT_TRUE(bool(wanted)) << llvm::toString(wanted.takeError());
  EXPECT_DOUBLE_EQ(*wanted->sharing()->otherRunnable, 1.0);
  EXPECT_DOUBLE_EQ(*wanted->otherCoresWanted(), 1.0);
  EXPECT_DOUBLE_EQ(wanted->coresLeft(), 1.0);
  EXPECT_DOUBLE_EQ(*profile->otherCoresWanted(), 0.91);
  EXPECT_FALSE(mpi->otherCoresWanted().has_value());
  auto many = OpProfile::parse(R"({"ops": [], "cores": {"cores": 2,
    "other_cores": 2.0, "other_runnable": 5.0}})", "p.json");
  ASSERT_TRUE(bool(many));
  EXPECT_DOUBLE_EQ(*many->otherCoresWanted(), 2.0); // at most the cores
  EXPECT_DOUBLE_EQ(many->coresLeft(), 0.25);
  // What they took lies between what they got and what they wanted, by
  // how much of the ops' time was a wait for a core against an even share
  // (2 cores among as many ranks and one busy thread: a third). Kernels
  // sliced as evenly as that: what the others got is what they took.
  auto sliced = OpProfile::parse(R"({"ops": [{"loc": "/a", "phase": "fwd",
    "time": 3e-3, "core_wait": 1e-3}], "cores": {"cores": 2,
    "other_cores": 0.8, "other_runnable": 1.0}})", "p.json");
  ASSERT_TRUE(bool(sliced)) << llvm::toString(sliced.takeError());
  EXPECT_NEAR(sliced->kernelWaitShare(), 1.0 / 3, 1e-12);
  EXPECT_NEAR(sliced->coresLeft(), 1.2, 1e-12);
  // Kernels that hardly waited (the ranks lost their core at hand-offs):
  // the others took what they wanted.
  auto turns = OpProfile::parse(R"({"ops": [{"loc": "/a", "phase": "fwd",
    "time": 3e-3}], "cores": {"cores": 2, "other_cores": 0.8,
    "other_runnable": 1.0}})", "p.json");
  ASSERT_TRUE(bool(turns));
  EXPECT_DOUBLE_EQ(turns->kernelWaitShare(), 0.0);
  EXPECT_NEAR(turns->coresLeft(), 1.0, 1e-12);
  // Half the even share's waits: half way.
  auto between = OpProfile::parse(R"({"ops": [{"loc": "/a", "phase": "fwd",
    "time": 6e-3, "core_wait": 1e-3}], "cores": {"cores": 2,
    "other_cores": 0.8, "other_runnable": 1.0}})", "p.json");
  ASSERT_TRUE(bool(between));
  EXPECT_NEAR(between->coresLeft(), 1.1, 1e-12);
  auto badRunnable = OpProfile::parse(R"({"ops": [], "cores": {"cores": 2,
    "other_runnable": -1}})", "p.json");
  ASSERT_FALSE(bool(badRunnable));
  EXPECT_EQ(llvm::toString(badRunnable.takeError()),
            "profile 'p.json': cores.other_runnable must be a number >= 0");
  auto noCores = OpProfile::parse(R"({"ops": [], "cores": {}})", "p.json");
  ASSERT_FALSE(bool(noCores));
  EXPECT_EQ(llvm::toString(noCores.takeError()),
            "profile 'p.json': cores needs \"cores\" (>= 1)");
}

// The part of an op's time, an action's overhead and a message's latency
// that the thread spent ready without a core ("core_wait"): left out of a
// profile measured while other processes kept cores busy (sharesCores),
// whose simulation shares the cores left and so makes those waits itself;
// kept in any other.
TEST(CostModel, SharedProfilesComeWithoutTheirCoreWaits) {
  const char *body = R"("ops": [{"loc": "/a", "phase": "fwd", "time": 1e-3, "core_wait": 4e-4}],
    "actions": [{"stage": 1, "action": "B", "overhead": 6e-4, "core_wait": 5e-4},
                {"stage": 0, "action": "F", "overhead": 2e-5}],
    "messages": [{"stage": 0, "latency": 3e-4, "waited": 10, "core_wait": 2.5e-4},
                 {"stage": 1, "latency": 1e-4, "waited": 30}])";
  auto shared = OpProfile::parse(std::string("{") + body +
                                     R"(, "cores": {"cores": 2, "other_cores": 1.0}})",
                                 "p.json");
  ASSERT_TRUE(bool(shared)) << llvm::toString(shared.takeError());
  EXPECT_TRUE(shared->sharesCores());
  EXPECT_DOUBLE_EQ(shared->coresLeft(), 1.0);
  EXPECT_NEAR(*shared->time("/a", ir::Phase::Fwd), 6e-4, 1e-15);
  EXPECT_NEAR(shared->actionOverhead("B"), 1e-4, 1e-15);
  EXPECT_DOUBLE_EQ(shared->actionOverhead("F"), 2e-5); // none given
  EXPECT_NEAR(*shared->messageLatency(0), 5e-5, 1e-15);
  EXPECT_DOUBLE_EQ(*shared->messageLatency(1), 1e-4);
  EXPECT_NEAR(*shared->messageLatency(), (10 * 5e-5 + 30 * 1e-4) / 40, 1e-15);
  // A fifth of a core is noise: the figures as measured, no shared cores.
  auto quiet = OpProfile::parse(std::string("{") + body +
                                    R"(, "cores": {"cores": 2, "other_cores": 0.2}})",
                                "p.json");
  ASSERT_TRUE(bool(quiet)) << llvm::toString(quiet.takeError());
  EXPECT_FALSE(quiet->sharesCores());
  EXPECT_EQ(quiet->coresLeft(), 0.0);
  EXPECT_DOUBLE_EQ(*quiet->time("/a", ir::Phase::Fwd), 1e-3);
  EXPECT_DOUBLE_EQ(quiet->actionOverhead("B"), 6e-4);
  EXPECT_DOUBLE_EQ(*quiet->messageLatency(0), 3e-4);
  auto bad = OpProfile::parse(R"({"ops": [], "actions": [{"stage": 0,
    "action": "B", "overhead": 1e-4, "core_wait": 2e-4}]})", "p.json");
  ASSERT_FALSE(bool(bad));
  EXPECT_EQ(llvm::toString(bad.takeError()),
            "profile 'p.json': actions[0]: \"core_wait\" must be seconds from "
            "0 to its \"overhead\"");
}

TEST(CostModel, ProfileErrorsAreOneLine) {
  auto bad = OpProfile::parse(R"({"ops": [{"loc": "/a", "phase": "X",
                                            "time": 1}]})", "p.json");
  ASSERT_FALSE(bool(bad));
  EXPECT_EQ(llvm::toString(bad.takeError()),
            "profile 'p.json': ops[0] needs \"loc\" (string), \"phase\" (fwd, "
            "B, W or opt) and \"time\" (seconds, >= 0)");
  auto unit = OpProfile::parse(R"({"time_unit": "ms", "ops": []})", "p.json");
  ASSERT_FALSE(bool(unit));
  EXPECT_EQ(llvm::toString(unit.takeError()),
            "profile 'p.json': time_unit must be \"s\", not \"ms\"");
}

TEST(CostModel, ProfileMissingAnOpNamesIt) {
  auto g = parse(kProducts);
  ASSERT_TRUE(g);
  CostModelSpec spec{CostModelKind::Profile, "/nonexistent/profile.json"};
  auto times = predictOpTimes(*g, spec, *lookupDeviceProfile("cpu"));
  ASSERT_FALSE(bool(times));
  EXPECT_NE(llvm::toString(times.takeError())
                .find("cannot open '/nonexistent/profile.json'"),
            std::string::npos);
}

TEST(CostModel, StaticBytesCountGradientsOfParameters) {
  auto g = parse(kProducts);
  ASSERT_TRUE(g);
  EXPECT_EQ(staticBytes(*g->lookup("b")), 2 * 8 * 16 * 4);
}

TEST(CostModel, ByteSizes) {
  EXPECT_EQ(*parseByteSize("2GiB"), int64_t(2) << 30);
  EXPECT_EQ(*parseByteSize("512MiB"), int64_t(512) << 20);
  EXPECT_EQ(*parseByteSize("1.5GB"), 1500000000);
  EXPECT_EQ(*parseByteSize("1000"), 1000);
  EXPECT_EQ(*parseByteSize("64KB"), 64000);
  auto bad = parseByteSize("2 gigs");
  ASSERT_FALSE(bool(bad));
  EXPECT_EQ(llvm::toString(bad.takeError()),
            "expected a byte size such as 2GiB, 512MiB, 1.5GB or 1000000, not "
            "'2 gigs'");
  EXPECT_EQ(formatBytes(400), "400 B");
  EXPECT_EQ(formatBytes(int64_t(3) << 29), "1.50 GiB");
}

} // namespace

// `host` times each distinct op with the runtime's kernel and predicts
// with that: a product, an elementwise op and the optimizer's (the last
// with the non-finite check's read of its gradient on top). Views, ops
// whose values decide their time (an index operand) and a device without
// the timer keep the formulas.
TEST(CostModel, HostTimesOpsWithTheirKernels) {
  auto g = parse(R"(graph @timed {
  input %x : f32[2,3,8,8]
  input %ids : i64[4]
  input %lr : f32[]
  param %w : f32[5,3,3,3] = splat<0.5>
  param %table : f32[10,4] = splat<0.5>
  fwd %c = Conv(%x, %w) {dilations = [1, 1], pads = [1, 1, 1, 1], strides = [1, 1]} : f32[2,5,8,8] @"/conv/Conv"
  fwd %c2 = Conv(%x, %w) {dilations = [1, 1], pads = [1, 1, 1, 1], strides = [1, 1]} : f32[2,5,8,8] @"/conv2/Conv"
  fwd %r = Relu(%c) : f32[2,5,8,8] @"/relu"
  fwd %f = Reshape(%r) {shape = [2, 320]} : f32[2,320] @"/flat"
  fwd %e = Gather(%table, %ids) : f32[4,4] @"/emb"
  input %sizes : i64[2]
  fwd %t = Tile(%table, %sizes) : f32[20,4] @"/tile"
  input %q : f32[1,2,8,4]
  input %mask : f32[1,1,8,8]
  fwd %o, %l = FusedAttention(%q, %q, %q, %mask) {causal = 0, scale = 0.5} : f32[1,2,8,4], f32[1,2,8] @"/attn"
  input %keep : bool[1,1,8,8]
  fwd %ob, %lb = FusedAttention(%q, %q, %q, %keep) {causal = 0, scale = 0.5} : f32[1,2,8,4], f32[1,2,8] @"/attn_bool"
  opt %w2 = SGD(%w, %w, %lr) : f32[5,3,3,3] @"w"
  output %c2
  output %f
  output %e
  output %t
  output %o
  output %ob
  output %w2
}
)");
  ASSERT_TRUE(g);
  // The "cpu" figures with the host's timer (measureHostProfile's GEMM
  // and triad would take long under the sanitizers).
  DeviceProfile host = llvm::cantFail(lookupDeviceProfile("cpu"));
  host.timeOp = tools::hostOpTimer(1, host.peakFlops);
  ASSERT_TRUE(bool(host.timeOp));
  DeviceProfile formulas = host;
  formulas.timeOp = nullptr;
  auto op = [&](llvm::StringRef result) -> const ir::Op & {
    return *g->lookup(result)->definingOp();
  };
  int asked = 0;
  DeviceProfile counting = host;
  counting.timeOp = [&](const ir::Op &o, double bytes) {
    ++asked;
    return host.timeOp(o, bytes);
  };
  // The attention with an additive mask too (the timer's values hide no
  // tile: the whole product, as the formula counts it).
  for (llvm::StringRef timed : {"c", "r", "o", "w2"}) {
    std::optional<double> t = host.timeOp(op(timed), 0);
    ASSERT_TRUE(t.has_value()) << timed.str();
    EXPECT_GT(*t, 0);
    double expected = *t;
    if (timed == "w2") // the check reads the gradient: 405 bytes more
      expected += 5 * 3 * 3 * 3 * 4 / host.memBandwidth;
    EXPECT_DOUBLE_EQ(predictOpTime(op(timed), host), expected) << timed.str();
  }
  // The same kind, attributes and types: timed once, the same answer.
  EXPECT_EQ(host.timeOp(op("c"), 0), host.timeOp(op("c2"), 0));
  // A view: nothing, the timer not asked.
  EXPECT_EQ(predictOpTime(op("f"), counting), 0.0);
  EXPECT_EQ(asked, 0);
  // A copy that indexes (a gather: cost class Free, an i64 operand) is
  // timed, its indices zeros (in range of any table); so is the attention
  // with a boolean mask (a causal triangle: the tiles it hides skipped).
  for (llvm::StringRef timed : {"e", "ob"}) {
    std::optional<double> t = host.timeOp(op(timed), 0);
    ASSERT_TRUE(t.has_value()) << timed.str();
    EXPECT_DOUBLE_EQ(predictOpTime(op(timed), host), *t) << timed.str();
  }
  // An integer operand that is a count (Tile's repeats) is not an index: a
  // zero there is not what the op will get, so the formula stays.
  EXPECT_FALSE(host.timeOp(op("t"), 0).has_value());
  EXPECT_DOUBLE_EQ(predictOpTime(op("t"), host),
                   predictOpTime(op("t"), formulas));
}

} // namespace unit_cost_model
