// Partitioning real training graphs: layers from ONNX scopes (and cut
// points without them), backward and optimizer ops on their forward op's
// stage, the 12-layer GPT bar (imbalance and brute force), memory within
// the cap, --split-at and its errors, and the report.
#include "frontend/OnnxImporter.h"
#include "ir/Parser.h"
#include "passes/Partition.h"
#include "passes/Pass.h"

#include "llvm/Support/JSON.h"

#include <gtest/gtest.h>

#include <chrono>

namespace unit_partition_graph {

using namespace cleave;
using namespace cleave::passes;

namespace {

std::unique_ptr<ir::Graph> trainingGraph(const std::string &model,
                                         int64_t microbatchSize) {
  frontend::ImportOptions importOpts;
  importOpts.microbatchSize = microbatchSize;
  auto g = frontend::importOnnxFile(std::string(CLEAVE_SOURCE_DIR) + "/" +
                                        model,
                                    importOpts);
  if (!g) {
    ADD_FAILURE() << llvm::toString(g.takeError());
    return nullptr;
  }
  PipelineOptions pipe;
  pipe.context.training.optimizer = "adamw";
  if (auto e = runPipeline(**g,
                           {"remove-identity", "dce", "autodiff",
                            "split-backward", "verify-2bp", "optimizer"},
                           pipe)) {
    ADD_FAILURE() << llvm::toString(std::move(e));
    return nullptr;
  }
  return std::move(*g);
}

std::vector<std::string> layerNames(const Layering &l) {
  std::vector<std::string> names;
  for (const Layer &layer : l.layers)
    names.push_back(layer.name);
  return names;
}

TEST(Layers, ScopeOfNodeNames) {
  EXPECT_EQ(scopeOf("/blocks.3/attn/MatMul", 1), "blocks.3");
  EXPECT_EQ(scopeOf("/blocks.3/attn/MatMul", 2), "blocks.3.attn");
  EXPECT_EQ(scopeOf("/blocks.3/attn/MatMul", 5), "blocks.3.attn");
  EXPECT_EQ(scopeOf("/layers/layers.0/Gemm", 1), "layers.0"); // a container
  EXPECT_EQ(scopeOf("/Add", 1), "");
  // Through wrappers: the dynamo form of a ResNet block's path.
  EXPECT_EQ(scopeOf("/m/layer1/layer1.0/conv1/node_Conv_3", 2), "m.layer1.0");
  EXPECT_EQ(scopeOf("", 1), "");
}

TEST(Layers, GptLayersFromScopes) {
  auto g = trainingGraph("examples/gpt/gpt-tiny.onnx", 2);
  ASSERT_TRUE(g);
  auto l = groupLayers(*g, {});
  ASSERT_TRUE(bool(l)) << llvm::toString(l.takeError());
  EXPECT_EQ(layerNames(*l),
            (std::vector<std::string>{"wte", "wpe", "blocks.0", "blocks.1",
                                      "ln_f", "lm_head"}));
  EXPECT_EQ(l->depth, 1u); // blocks.0, blocks.1 repeat at depth 1
  auto deeper = groupLayers(*g, {2});
  ASSERT_TRUE(bool(deeper));
  EXPECT_EQ(deeper->layers.size(), 2u + 2 * 4 + 2); // ln_1, attn, ln_2, mlp
  EXPECT_TRUE(deeper->find("blocks.1.mlp"));
}

// Every op has a layer; backward ops share their forward op's location's
// layer; optimizer ops sit with their parameter; forward ops never read a
// later layer.
TEST(Layers, BackwardAndOptimizerOpsFollowTheirForwardOp) {
  auto g = trainingGraph("examples/gpt/gpt-tiny.onnx", 2);
  ASSERT_TRUE(g);
  auto l = groupLayers(*g, {});
  ASSERT_TRUE(bool(l));
  llvm::StringMap<unsigned> forwardLayer;
  for (const auto &op : g->ops()) {
    ASSERT_TRUE(l->layerOfOp.count(op.get())) << op->describe();
    unsigned layer = l->layerOfOp.lookup(op.get());
    if (op->phase() == ir::Phase::Fwd) {
      forwardLayer.try_emplace(op->loc(), layer);
      for (const ir::Value *v : op->operands())
        if (auto from = l->layerOf(v)) {
          EXPECT_LE(*from, layer) << op->describe();
        }
    } else if (op->phase() != ir::Phase::Opt) {
      EXPECT_EQ(layer, forwardLayer.lookup(op->loc())) << op->describe();
    } else if (op->numOperands() > 0 &&
               op->operand(0)->kind() == ir::ValueKind::Param) {
      EXPECT_EQ(layer, *l->layerOf(op->operand(0))) << op->describe();
    }
  }
  EXPECT_EQ(l->layerOfOp.lookup(g->lookup("blocks.1.mlp.c_fc.weight.next")
                                    ->definingOp()),
            *l->find("blocks.1"));
}

TEST(Layers, CutPointsWithoutNames) {
  auto g = trainingGraph("tests/models/training/mlp/model.onnx", 4);
  ASSERT_TRUE(g);
  for (const auto &op : g->ops())
    if (op->phase() != ir::Phase::Opt)
      const_cast<ir::Op *>(op.get())->setLoc("");
  auto l = groupLayers(*g, {});
  ASSERT_TRUE(bool(l));
  EXPECT_GT(l->layers.size(), 2u);
  EXPECT_EQ(l->layers[0].name, "layer.0");
  // Cut points: between consecutive layers at most one forward value
  // crosses.
  for (size_t cut = 1; cut < l->layers.size(); ++cut) {
    int crossing = 0;
    for (const auto &op : g->ops()) {
      if (op->phase() != ir::Phase::Fwd || l->layerOfOp.lookup(op.get()) >= cut)
        continue;
      for (const ir::Value *r : op->results())
        for (const ir::Use &u : r->uses())
          if (u.user->phase() == ir::Phase::Fwd &&
              l->layerOfOp.lookup(u.user) >= cut) {
            ++crossing;
            break;
          }
    }
    EXPECT_LE(crossing, 1) << "cut before layer " << cut;
  }
}

// The imbalance of a split: slowest stage time / mean stage time.
double imbalanceOf(const StageCostTable &table, llvm::ArrayRef<int> starts) {
  double slowest = 0, total = 0;
  for (size_t s = 0; s < starts.size(); ++s) {
    int end = s + 1 < starts.size() ? starts[s + 1] : table.numLayers();
    slowest = std::max(slowest, table.time(starts[s], end));
    total += table.time(starts[s], end);
  }
  return slowest / (total / double(starts.size()));
}

// The bar: a 12-layer GPT into 4 stages. The split's predicted step time
// equals the best over every set of cut points, and its imbalance is at
// most 1.10 whenever some split of these layers reaches 1.10.
TEST(Partition, TwelveLayerGptMatchesBruteForce) {
  auto g = trainingGraph("tests/models/gpt12_small.onnx", 8);
  ASSERT_TRUE(g);
  for (const char *device : {"cpu", "h200"}) {
    PartitionOptions opts;
    opts.stages = 4;
    opts.microbatches = 8;
    opts.deviceProfile = device;
    auto r = partition(*g, opts);
    ASSERT_TRUE(bool(r)) << llvm::toString(r.takeError());
    ASSERT_EQ(r->layering.layers.size(), 16u);

    auto profile = lookupDeviceProfile(device);
    auto times = predictOpTimes(*g, {}, *profile);
    ASSERT_TRUE(bool(times));
    StageCostTable table(buildLayerChain(*g, r->layering, *times),
                         {profile->linkLatency, profile->linkBandwidth});
    double bestStep = 1e300, bestImbalance = 1e300;
    int n = table.numLayers();
    for (int a = 1; a < n; ++a)
      for (int b = a + 1; b < n; ++b)
        for (int c = b + 1; c < n; ++c) {
          bestStep = std::min(bestStep,
                              predictedStepTime(table, {0, a, b, c}, 8));
          bestImbalance = std::min(bestImbalance,
                                   imbalanceOf(table, {0, a, b, c}));
        }
    EXPECT_NEAR(r->stepTime, bestStep, 1e-12 * bestStep) << device;
    std::printf("12-layer GPT, 4 stages, %s profile: step %.3f ms, "
                "imbalance %.3f (least any split reaches: %.3f)\n",
                device, r->stepTime * 1e3, r->imbalance, bestImbalance);
    if (bestImbalance <= 1.10) {
      EXPECT_LE(r->imbalance, 1.10) << device;
    }
  }
}

TEST(Partition, EveryOpOnItsLayersStageInOrder) {
  auto g = trainingGraph("tests/models/gpt12_small.onnx", 8);
  ASSERT_TRUE(g);
  PartitionOptions opts;
  opts.stages = 4;
  opts.microbatches = 8;
  auto r = partition(*g, opts);
  ASSERT_TRUE(bool(r));
  int lastForwardStage = 0;
  for (const auto &op : g->ops()) {
    ASSERT_TRUE(r->stageOfOp.count(op.get()));
    int stage = r->stageOfOp.lookup(op.get());
    EXPECT_EQ(stage, r->stageOfLayer[r->layering.layerOfOp.lookup(op.get())]);
    if (op->phase() == ir::Phase::Fwd) {
      EXPECT_GE(stage, lastForwardStage) << op->describe();
      lastForwardStage = stage;
    }
  }
  // The schedules' view: one entry per stage, in seconds.
  ASSERT_EQ(r->costs.stages.size(), 4u);
  EXPECT_EQ(r->costs.timeUnit, "s");
  for (size_t s = 0; s < 4; ++s) {
    EXPECT_EQ(r->costs.stages[s].f, r->stages[s].f);
    EXPECT_EQ(r->costs.stages[s].activationBytes,
              r->stages[s].activationBytes);
  }
  EXPECT_EQ(r->costs.stages[0].recvBytes, 0);
  EXPECT_EQ(r->costs.stages[3].sendBytes, 0);
  EXPECT_EQ(r->costs.stages[0].sendBytes, r->costs.stages[1].recvBytes);
}

TEST(Partition, PeaksStayWithinTheCap) {
  auto g = trainingGraph("tests/models/gpt12_small.onnx", 8);
  ASSERT_TRUE(g);
  PartitionOptions opts;
  opts.stages = 4;
  opts.microbatches = 8;
  auto free = partition(*g, opts);
  ASSERT_TRUE(bool(free));
  // Cap just under the uncapped split's largest peak: stage 0 (holding 4
  // microbatches) must give up layers.
  int64_t peak = 0;
  for (const StageReport &s : free->stages)
    peak = std::max(peak, s.peakBytes);
  EXPECT_EQ(peak, free->stages[0].peakBytes);
  opts.memCap = peak - 1;
  auto capped = partition(*g, opts);
  ASSERT_TRUE(bool(capped)) << llvm::toString(capped.takeError());
  for (const StageReport &s : capped->stages)
    EXPECT_LE(s.peakBytes, *opts.memCap) << "stage " << s.index;
  EXPECT_LT(capped->stages[0].lastLayer, free->stages[0].lastLayer);
  EXPECT_GE(capped->stepTime, free->stepTime);

  opts.memCap = 1 << 20;
  auto none = partition(*g, opts);
  ASSERT_FALSE(bool(none));
  std::string msg = llvm::toString(none.takeError());
  EXPECT_EQ(msg.rfind("no split of 16 layers into 4 stages fits the memory "
                      "cap of 1.00 MiB per stage; the smallest cap that fits "
                      "is ",
                      0),
            0u)
      << msg;
}

TEST(Partition, SplitAtOverridesTheSearch) {
  auto g = trainingGraph("examples/gpt/gpt-tiny.onnx", 2);
  ASSERT_TRUE(g);
  PartitionOptions opts;
  opts.microbatches = 4;
  opts.splitAt = {"blocks.1", "ln_f"};
  auto r = partition(*g, opts);
  ASSERT_TRUE(bool(r)) << llvm::toString(r.takeError());
  ASSERT_EQ(r->stages.size(), 3u);
  EXPECT_EQ(r->stages[1].firstLayer, int(*r->layering.find("blocks.1")));
  EXPECT_EQ(r->stages[2].firstLayer, int(*r->layering.find("ln_f")));
}

std::string partitionError(const ir::Graph &g, const PartitionOptions &opts) {
  auto r = partition(g, opts);
  if (r)
    return "no error";
  return llvm::toString(r.takeError());
}

TEST(Partition, ErrorsAreOneClearLine) {
  auto g = trainingGraph("examples/gpt/gpt-tiny.onnx", 2);
  ASSERT_TRUE(g);
  PartitionOptions opts;
  opts.splitAt = {"blocks.9"};
  EXPECT_EQ(partitionError(*g, opts),
            "--split-at names 'blocks.9', which is not a layer (layers: wte, "
            "wpe, blocks.0, blocks.1, ln_f, lm_head)");
  opts.splitAt = {"wte"};
  EXPECT_EQ(partitionError(*g, opts),
            "--split-at names 'wte', the first layer; name the first layer of "
            "each stage after the first");
  opts.splitAt = {"ln_f", "blocks.1"};
  EXPECT_EQ(partitionError(*g, opts),
            "--split-at: 'blocks.1' comes before or with the layer named "
            "before it; list the layers in model order");
  opts.splitAt = {"blocks.1"};
  opts.stages = 3;
  EXPECT_EQ(partitionError(*g, opts),
            "--split-at names 1 layers, which makes 2 stages, but --stages is "
            "3");
  opts.splitAt.clear();
  opts.stages = 8;
  EXPECT_EQ(partitionError(*g, opts),
            "cannot cut 6 layers into 8 stages: use at most 6 stages, or a "
            "larger --layer-depth for more layers");
  opts.stages = 2;
  opts.splitAt = {"blocks.1"};
  opts.memCap = 1000;
  EXPECT_EQ(partitionError(*g, opts).rfind("--split-at: stage 0 (wte..blocks.0) "
                                           "needs ",
                                           0),
            0u);
}

TEST(Partition, UniformModelBalancesLayerCounts) {
  auto g = trainingGraph("tests/models/gpt12_small.onnx", 8);
  ASSERT_TRUE(g);
  PartitionOptions opts;
  opts.stages = 4;
  opts.microbatches = 8;
  opts.costModel.kind = CostModelKind::Uniform;
  auto r = partition(*g, opts);
  ASSERT_TRUE(bool(r));
  EXPECT_EQ(r->costs.timeUnit, "unit");
  // 16 layers: the slowest stage cannot have fewer than 4. (Splits with
  // the same slowest stage tie; the earliest stages get the fewest layers,
  // which also needs the least memory under 1F1B.)
  int most = 0;
  for (size_t s = 0; s < 4; ++s) {
    most = std::max(most, r->stages[s].lastLayer - r->stages[s].firstLayer + 1);
    EXPECT_EQ(r->costs.stages[s].f, 1);
  }
  EXPECT_EQ(most, 4);
}

TEST(Partition, JsonReportHasTheIssuesFields) {
  auto g = trainingGraph("examples/gpt/gpt-tiny.onnx", 2);
  ASSERT_TRUE(g);
  PartitionOptions opts;
  opts.stages = 2;
  opts.microbatches = 4;
  auto r = partition(*g, opts);
  ASSERT_TRUE(bool(r));
  std::string text;
  llvm::raw_string_ostream os(text);
  writeStageReportJson(*r, os);
  auto json = llvm::json::parse(os.str());
  ASSERT_TRUE(bool(json)) << llvm::toString(json.takeError());
  const llvm::json::Object &top = *json->getAsObject();
  EXPECT_EQ(top.getString("time_unit"), llvm::StringRef("s"));
  EXPECT_TRUE(top.getNumber("imbalance"));
  const llvm::json::Array &stages = *top.getArray("stages");
  ASSERT_EQ(stages.size(), 2u);
  for (const char *field :
       {"index", "layers", "param_bytes", "activation_bytes", "peak_bytes",
        "f_time", "b_time", "w_time", "send_bytes", "recv_bytes"})
    EXPECT_TRUE(stages[0].getAsObject()->get(field)) << field;
}

} // namespace

namespace {

// A 96-layer MLP training graph: layers.k is MatMul + Relu on [8, 64].
std::unique_ptr<ir::Graph> deepMlp(int layers) {
  std::string text = "graph @deep {\n  input %h0 : f32[8,64]\n";
  for (int k = 1; k <= layers; ++k)
    text += "  param %w" + std::to_string(k) + " : f32[64,64] = splat<0.01>\n";
  for (int k = 1; k <= layers; ++k) {
    std::string scope = "/layers." + std::to_string(k - 1) + "/";
    std::string prev = std::to_string(k - 1), cur = std::to_string(k);
    text += "  %m" + cur + " = MatMul(%h" + prev + ", %w" + cur +
            ") : f32[8,64] @\"" + scope + "MatMul\"\n";
    text += "  %h" + cur + " = Relu(%m" + cur + ") : f32[8,64] @\"" + scope +
            "Relu\"\n";
  }
  text += "  %loss = ReduceSum(%h" + std::to_string(layers) +
          ") {keepdims = 0} : f32[] @\"/loss\"\n  output %loss\n}\n";
  auto g = ir::parseGraph(text, "deep");
  if (!g) {
    ADD_FAILURE() << llvm::toString(g.takeError());
    return nullptr;
  }
  PipelineOptions pipe;
  if (auto e = runPipeline(**g, {"autodiff", "split-backward", "optimizer"},
                           pipe)) {
    ADD_FAILURE() << llvm::toString(std::move(e));
    return nullptr;
  }
  return std::move(*g);
}

// The bar: a 96-layer model into 16 stages under a cap that binds, from
// the graph (layers, costs, search) in under a second; the time is printed.
TEST(Partition, NinetySixLayerGraphUnderASecond) {
  auto g = deepMlp(96);
  ASSERT_TRUE(g);
  PartitionOptions opts;
  opts.stages = 16;
  opts.microbatches = 32;
  auto free = partition(*g, opts);
  ASSERT_TRUE(bool(free)) << llvm::toString(free.takeError());
  ASSERT_EQ(free->layering.layers.size(), 96u);
  int64_t peak = 0;
  for (const StageReport &s : free->stages)
    peak = std::max(peak, s.peakBytes);
  opts.memCap = peak - 1;
  auto start = std::chrono::steady_clock::now();
  auto capped = partition(*g, opts);
  double seconds = std::chrono::duration<double>(
                       std::chrono::steady_clock::now() - start)
                       .count();
  ASSERT_TRUE(bool(capped)) << llvm::toString(capped.takeError());
  for (const StageReport &s : capped->stages)
    EXPECT_LE(s.peakBytes, *opts.memCap);
  std::printf("96-layer graph into 16 stages under a cap: %.1f ms, "
              "imbalance %.3f\n",
              seconds * 1e3, capped->imbalance);
  // The bar is for an optimized build; an unoptimized, instrumented one
  // (CI's ASan + UBSan build) runs the same search several times slower.
#if defined(NDEBUG) && !defined(__SANITIZE_ADDRESS__)
  EXPECT_LT(seconds, 1.0);
#endif
}

} // namespace

} // namespace unit_partition_graph
