// The passes (dce, remove-identity) on small .cir graphs, and the pipeline
// driver: unknown names, the verifier between passes, IR dumps.
#include "passes/Pass.h"

#include "ir/Parser.h"
#include "ir/Printer.h"
#include "ir/Verifier.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace unit_passes {

using namespace cleave;
using namespace cleave::ir;
using ::testing::HasSubstr;

namespace {

std::unique_ptr<Graph> parse(llvm::StringRef text) {
  auto g = parseGraph(text, "pass-test.cir");
  if (!g) {
    ADD_FAILURE() << llvm::toString(g.takeError());
    return nullptr;
  }
  EXPECT_FALSE(bool(verifyGraph(**g)));
  return std::move(*g);
}

// Runs `pass` and returns whether it reported a change (failing the test if
// it returned an error).
bool run(passes::PassFn pass, Graph &g) {
  auto changed = pass(g, passes::PassContext{});
  if (!changed) {
    ADD_FAILURE() << llvm::toString(changed.takeError());
    return false;
  }
  return *changed;
}

const char *kDeadCode = R"(graph @g {
  input %x : f32[4]
  input %unused : f32[4]
  param %w : f32[4] = dense<[1.0, 2.0, 3.0, 4.0]>
  param %dead_w : f32[4] = dense<[0.0, 0.0, 0.0, 0.0]>
  const %never : i64[1] = dense<[7]>
  %a = Mul(%x, %w) : f32[4]
  %dead1 = Add(%x, %dead_w) : f32[4]
  %dead2 = Relu(%dead1) : f32[4]
  %y = Relu(%a) : f32[4]
  output %y
}
)";

} // namespace

TEST(DeadCodeElimination, RemovesDeadOpsAndUnusedDeclarations) {
  auto g = parse(kDeadCode);
  ASSERT_TRUE(g);
  EXPECT_TRUE(run(passes::eliminateDeadCode, *g));
  EXPECT_FALSE(bool(verifyGraph(*g)));
  EXPECT_EQ(printGraph(*g), R"(graph @g {
  input %x : f32[4]
  input %unused : f32[4]
  param %w : f32[4] = dense<[1.0, 2.0, 3.0, 4.0]>
  %a = Mul(%x, %w) : f32[4]
  %y = Relu(%a) : f32[4]
  output %y
}
)");
  // A second run finds nothing to do.
  EXPECT_FALSE(run(passes::eliminateDeadCode, *g));
}

TEST(DeadCodeElimination, KeepsOutputsEvenWithoutUsesAndDeclaredOutputs) {
  auto g = parse(R"(graph @g {
  input %x : f32[2]
  param %w : f32[2] = dense<[1.0, 2.0]>
  %dropped, %mask = Dropout(%x) {ratio = 0.5} : f32[2], bool[2]
  output %mask
  output %w
  output %x
}
)");
  ASSERT_TRUE(g);
  EXPECT_FALSE(run(passes::eliminateDeadCode, *g));
  EXPECT_EQ(g->ops().size(), 1u);
  EXPECT_EQ(g->declared().size(), 1u);
}

TEST(RemoveIdentity, ForwardsTheOperandToUsers) {
  auto g = parse(R"(graph @g {
  input %x : f32[3]
  %i1 = Identity(%x) : f32[3]
  %i2 = Identity(%i1) : f32[3]
  %y = Add(%i2, %i1) : f32[3]
  output %y
}
)");
  ASSERT_TRUE(g);
  EXPECT_TRUE(run(passes::removeIdentities, *g));
  EXPECT_FALSE(bool(verifyGraph(*g)));
  EXPECT_EQ(printGraph(*g), R"(graph @g {
  input %x : f32[3]
  %y = Add(%x, %x) : f32[3]
  output %y
}
)");
  Value *x = g->lookup("x");
  EXPECT_EQ(x->uses().size(), 2u);
  EXPECT_FALSE(run(passes::removeIdentities, *g));
}

TEST(RemoveIdentity, KeepsAnIdentityThatProducesAGraphOutput) {
  auto g = parse(R"(graph @g {
  input %x : f32[3]
  %inner = Identity(%x) : f32[3]
  %r = Relu(%inner) : f32[3]
  %out = Identity(%r) : f32[3]
  output %out
}
)");
  ASSERT_TRUE(g);
  EXPECT_TRUE(run(passes::removeIdentities, *g));
  EXPECT_EQ(printGraph(*g), R"(graph @g {
  input %x : f32[3]
  %r = Relu(%x) : f32[3]
  %out = Identity(%r) : f32[3]
  output %out
}
)");
  EXPECT_EQ(g->outputs()[0]->name(), "out");
}

// --- the pipeline -----------------------------------------------------------

TEST(Pipeline, RegistryKnowsEveryPass) {
  for (const char *name : {"dce", "remove-identity", "verify"}) {
    const passes::PassInfo *p = passes::lookupPass(name);
    ASSERT_TRUE(p) << name;
    EXPECT_EQ(p->name, name);
    EXPECT_FALSE(p->summary.empty()) << name;
  }
  EXPECT_EQ(passes::lookupPass("nope"), nullptr);
  EXPECT_GE(passes::allPasses().size(), 3u);
}

TEST(Pipeline, RejectsUnknownPassNamesBeforeRunningAnything) {
  auto g = parse(kDeadCode);
  ASSERT_TRUE(g);
  std::string before = printGraph(*g);
  passes::PipelineOptions opts;
  llvm::Error e = passes::runPipeline(*g, {"dce", "constant-fold"}, opts);
  std::string msg = llvm::toString(std::move(e));
  EXPECT_THAT(msg, HasSubstr("unknown pass 'constant-fold'"));
  EXPECT_THAT(msg, HasSubstr("dce")); // lists the known ones
  EXPECT_EQ(printGraph(*g), before);  // dce did not run
  EXPECT_FALSE(bool(passes::checkPassNames({"dce", "remove-identity"})));
}

TEST(Pipeline, RunsPassesInOrder) {
  auto g = parse(R"(graph @g {
  input %x : f32[3]
  %i = Identity(%x) : f32[3]
  %dead = Neg(%i) : f32[3]
  %y = Relu(%i) : f32[3]
  output %y
}
)");
  ASSERT_TRUE(g);
  passes::PipelineOptions opts;
  ASSERT_FALSE(bool(passes::runPipeline(*g, {"remove-identity", "dce"}, opts)));
  ASSERT_EQ(g->ops().size(), 1u);
  EXPECT_EQ(g->ops()[0]->kind(), OpKind::Relu);
  EXPECT_EQ(g->ops()[0]->operand(0)->name(), "x");
}

TEST(Pipeline, VerifiesBetweenPasses) {
  // Well-formed text, but the Relu's declared result type is wrong; the
  // parser leaves type checking to the verifier.
  auto parsed = parseGraph(R"(graph @g {
  input %x : f32[3]
  %y = Relu(%x) : f32[4]
  output %y
}
)",
                           "bad-type.cir");
  ASSERT_TRUE(bool(parsed)) << llvm::toString(parsed.takeError());
  Graph &g = **parsed;
  passes::PipelineOptions opts;
  std::string msg = llvm::toString(passes::runPipeline(g, {"dce"}, opts));
  EXPECT_THAT(msg, HasSubstr("IR is invalid after pass dce"));
  EXPECT_THAT(msg, HasSubstr("result %y has type f32[4] but the op gives "
                             "f32[3]"));
  opts.verifyEach = false;
  EXPECT_FALSE(bool(passes::runPipeline(g, {"dce"}, opts)));
  // The verify pass checks even when verifyEach is off.
  EXPECT_THAT(llvm::toString(passes::runPipeline(g, {"verify"}, opts)),
              HasSubstr("IR is invalid after pass verify"));
}

TEST(Pipeline, DumpsIrAfterTheRequestedPasses) {
  auto g = parse(kDeadCode);
  ASSERT_TRUE(g);
  std::string dump;
  llvm::raw_string_ostream os(dump);
  passes::PipelineOptions opts;
  opts.dumpAfter = {"dce"};
  opts.dumpStream = &os;
  ASSERT_FALSE(bool(passes::runPipeline(*g, {"remove-identity", "dce"}, opts)));
  os.flush();
  EXPECT_EQ(dump, "// -----// IR after dce //----- //\n" + printGraph(*g));
  EXPECT_TRUE(passes::wantsDump({{"all"}, true, nullptr}, "anything"));
  EXPECT_FALSE(passes::wantsDump({{"dce"}, true, nullptr}, "verify"));
}

} // namespace unit_passes
