// What the tools share: flag parsing, list splitting, shape flags, and
// writing output files so that a failure leaves nothing behind.
#include "tools/ToolSupport.h"
#include "TestSupport.h"

#include "llvm/Support/FileSystem.h"
#include "llvm/Support/MemoryBuffer.h"
#include "llvm/Support/Path.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace unit_tool_support {

using namespace cleave;
using namespace cleave::tools;
using ::testing::HasSubstr;

namespace {

using Strings = std::vector<std::string>;

// The flags of a typical tool: -o/--output (value), --passes (value,
// repeatable), --verbose (no value).
Flags toolFlags() {
  return Flags({{"o", true, false},
                {"output", true, false},
                {"passes", true, true},
                {"input-shape", true, true},
                {"microbatch-size", true, false},
                {"verbose", false, false}});
}

// Parses `args` (without the program name); returns the error or "".
std::string parseArgs(Flags &flags, Strings args) {
  std::vector<char *> argv{const_cast<char *>("tool")};
  for (std::string &a : args)
    argv.push_back(a.data());
  return llvm::toString(flags.parse(int(argv.size()), argv.data()));
}

using testsupport::TempDir;

} // namespace

static std::string messageOf(llvm::Error e) {
  return e ? llvm::toString(std::move(e)) : "success";
}

// --- Flags ------------------------------------------------------------------

TEST(Flags, ValueFormsAndPositionals) {
  Flags f = toolFlags();
  ASSERT_EQ(parseArgs(f, {"model.onnx", "--output=a.cir", "--passes", "dce",
                          "-", "--verbose", "-o", "x"}),
            "");
  EXPECT_EQ(f.get("output"), "a.cir");
  EXPECT_EQ(f.get("passes"), "dce");
  EXPECT_EQ(f.get("o"), "x");
  EXPECT_TRUE(f.has("verbose"));
  EXPECT_FALSE(f.has("microbatch-size"));
  EXPECT_EQ(f.get("microbatch-size"), std::nullopt);
  EXPECT_EQ(f.positional(), (Strings{"model.onnx", "-"}));
}

TEST(Flags, ValueMayContainEqualsAndBeEmpty) {
  Flags f = toolFlags();
  ASSERT_EQ(parseArgs(f, {"--input-shape=x=2,3", "--output="}), "");
  EXPECT_EQ(f.get("input-shape"), "x=2,3");
  EXPECT_EQ(f.get("output"), "");
}

TEST(Flags, RepeatedFlags) {
  Flags f = toolFlags();
  ASSERT_EQ(parseArgs(f, {"--passes=dce", "--passes", "verify"}), "");
  EXPECT_EQ(f.getAll("passes"), (Strings{"dce", "verify"}));
  Flags g = toolFlags();
  EXPECT_EQ(parseArgs(g, {"-o", "a", "-o", "b"}), "flag '--o' is given twice");
  Flags h = toolFlags();
  EXPECT_EQ(parseArgs(h, {"--verbose", "--verbose"}),
            "flag '--verbose' is given twice");
}

TEST(Flags, UnknownFlag) {
  Flags f = toolFlags();
  EXPECT_EQ(parseArgs(f, {"--outptu=x"}),
            "unknown flag '--outptu=x' (see --help)");
  Flags g = toolFlags();
  EXPECT_THAT(parseArgs(g, {"-x"}), HasSubstr("unknown flag '-x'"));
}

TEST(Flags, MissingOrUnexpectedValue) {
  Flags f = toolFlags();
  EXPECT_EQ(parseArgs(f, {"in.onnx", "-o"}), "flag '-o' needs a value");
  Flags g = toolFlags();
  EXPECT_EQ(parseArgs(g, {"--verbose=yes"}), "flag '--verbose' takes no value");
}

// --- parseCount, splitList, readImportFlags ---------------------------------

TEST(ToolSupport, ParseCount) {
  auto v = parseCount("microbatch-size", "12");
  ASSERT_TRUE(bool(v));
  EXPECT_EQ(*v, 12);
  for (const char *bad : {"-1", "abc", "", "1.5", "3x"}) {
    auto e = parseCount("microbatch-size", bad);
    ASSERT_FALSE(bool(e)) << bad;
    EXPECT_EQ(llvm::toString(e.takeError()),
              std::string("--microbatch-size needs a non-negative integer, "
                          "not '") +
                  bad + "'");
  }
}

TEST(ToolSupport, SplitList) {
  EXPECT_EQ(splitList("a,b,c"), (Strings{"a", "b", "c"}));
  EXPECT_EQ(splitList("dce"), (Strings{"dce"}));
  EXPECT_EQ(splitList(""), Strings{});
  EXPECT_EQ(splitList("a,,b,"), (Strings{"a", "b"}));
  EXPECT_EQ(splitList(" a , b "), (Strings{"a", "b"}));
}

TEST(ToolSupport, SplitListDropsBlankParts) {
  // Parts that are only spaces are dropped too.
  EXPECT_EQ(splitList("a, ,b"), (Strings{"a", "b"}));
}

TEST(ToolSupport, ReadImportFlags) {
  Flags f = toolFlags();
  ASSERT_EQ(parseArgs(f, {"--input-shape", "x=2,3", "--input-shape=labels=2",
                          "--microbatch-size", "4"}),
            "");
  frontend::ImportOptions opts;
  ASSERT_FALSE(bool(readImportFlags(f, opts)));
  EXPECT_EQ(opts.inputShapes["x"], (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(opts.inputShapes["labels"], (std::vector<int64_t>{2}));
  EXPECT_EQ(opts.microbatchSize, 4);
}

TEST(ToolSupport, ReadImportFlagsErrors) {
  auto errorFor = [](Strings args) {
    Flags f = toolFlags();
    std::string parsed = parseArgs(f, args);
    if (!parsed.empty())
      return "parse: " + parsed;
    frontend::ImportOptions opts;
    return llvm::toString(readImportFlags(f, opts));
  };
  EXPECT_EQ(errorFor({"--input-shape", "x"}),
            "--input-shape needs NAME=d0,d1,..., not 'x'");
  EXPECT_EQ(errorFor({"--input-shape", "=2,3"}),
            "--input-shape needs NAME=d0,d1,..., not '=2,3'");
  EXPECT_EQ(errorFor({"--input-shape", "x=2,-3"}),
            "--input-shape needs a non-negative integer, not '-3'");
  EXPECT_EQ(errorFor({"--input-shape", "x=2", "--input-shape", "x=3"}),
            "--input-shape gives 'x' twice");
  EXPECT_EQ(errorFor({"--microbatch-size", "0"}),
            "--microbatch-size must be at least 1");
}

// A graph whose inputs have these shapes (a fixed batch or none).
static std::unique_ptr<ir::Graph> graphWithInputs(
    const std::vector<ir::Shape> &shapes) {
  auto g = std::make_unique<ir::Graph>();
  int k = 0;
  for (const ir::Shape &s : shapes)
    g->addInput("x" + std::to_string(k++),
                ir::TensorType(ir::DType::F32, s));
  return g;
}

TEST(ToolSupport, MicrobatchSizeOnAFixedBatchIsRefused) {
  frontend::ImportOptions opts;
  auto fixed = graphWithInputs({{4, 16}, {}});
  EXPECT_EQ(messageOf(checkMicrobatchSizeUsed(*fixed, opts)), "success");
  opts.microbatchSize = 8;
  EXPECT_EQ(messageOf(checkMicrobatchSizeUsed(*fixed, opts)),
            "--microbatch-size=8 would do nothing: the model fixes the "
            "leading (batch) dimension of its inputs ('x0' is " +
                fixed->inputs()[0]->type().str() +
                "); re-export the model with a dynamic batch dimension "
                "(torch.onnx.export's dynamic_shapes or dynamic_axes) to "
                "choose the batch here, or leave the flag out");
  // An input the flag bound (or that already had that batch) uses it.
  auto bound = graphWithInputs({{3}, {8, 16}});
  EXPECT_EQ(messageOf(checkMicrobatchSizeUsed(*bound, opts)), "success");
  auto scalars = graphWithInputs({{}});
  EXPECT_THAT(messageOf(checkMicrobatchSizeUsed(*scalars, opts)),
              HasSubstr("the model has no input with a leading dimension"));
}

// --- --help against the parser ---------------------------------------------

TEST(Flags, DocumentedFlagsAreTheEntries) {
  const char help[] = R"(usage: tool [options]

Prose that names --not-an-entry is not an entry.
  --emit=summary|ir-like  prints; --mentioned-here does not count
  -o FILE                write it
  -h, --help             show this help
  --stages=P, --schedule=NAME,
  --split-at=LAYER,..., --layer-depth=N
                         --continuation-lines do not count
   --three-spaces         neither does a deeper indent
)";
  EXPECT_EQ(documentedFlags(help),
            (Strings{"--emit", "-o", "-h", "--help", "--stages", "--schedule",
                     "--split-at", "--layer-depth"}));
}

TEST(Flags, HelpMustDocumentExactlyTheParsersFlags) {
  Flags f({{"o", true, false}, {"help", false, false}, {"stages", true, false}});
  auto check = [&](const char *help) { return messageOf(f.checkHelp(help)); };
  EXPECT_EQ(check("  -o FILE  out\n  --help  this\n  --stages=P  stages\n"),
            "success");
  EXPECT_EQ(check("  -o FILE  out\n  --help  this\n"),
            "the flag parser takes --stages, which --help does not document");
  EXPECT_EQ(check("  -o FILE  out\n  --help  this\n  --stages=P  a\n"
                  "  --chunks=V  b\n"),
            "--help documents --chunks, which the flag parser does not take");
  EXPECT_EQ(check("  -o FILE  out\n  --help  this\n  --stages=P  a\n"
                  "  --stages=P  again\n"),
            "--help documents --stages twice");
}

TEST(Flags, AllowLargeHelpNamesOnlyTheBoundsGiven) {
  std::string h =
      allowLargeHelp({LargeBound::Stages, LargeBound::Microbatches});
  EXPECT_EQ(documentedFlags(h), (Strings{"--allow-large"}));
  EXPECT_THAT(h, HasSubstr("microbatches from 2^20 to 2^24"));
  EXPECT_THAT(h, ::testing::Not(HasSubstr("threads")));
  EXPECT_THAT(h, ::testing::Not(HasSubstr("steps")));
  EXPECT_THAT(h, ::testing::Not(HasSubstr("replicas")));
  for (llvm::StringRef line : llvm::split(llvm::StringRef(h).rtrim(), '\n'))
    EXPECT_LE(line.size(), 77u) << line.str();
}

// --- fail -------------------------------------------------------------------

TEST(ToolSupport, FailPrintsOneLine) {
  ::testing::internal::CaptureStderr();
  int code = fail("cleavec", "bad input\nsecond line", kBadInput);
  std::string err = ::testing::internal::GetCapturedStderr();
  EXPECT_EQ(code, 1);
  EXPECT_EQ(err, "cleavec: error: bad input\\nsecond line\n");
}

TEST(ToolSupport, FailEscapesEveryControlCharacter) {
  ::testing::internal::CaptureStderr();
  fail("cleavec",
       std::string("a\rb\tc\x1b[31md\x7f") + '\x01' + "e" + '\0' + "f",
       kBadInput);
  std::string err = ::testing::internal::GetCapturedStderr();
  EXPECT_EQ(err, "cleavec: error: a\\x0db\\x09c\\x1b[31md\\x7f\\x01e\\x00f\n");
  EXPECT_EQ(escapeControls("caf\xc3\xa9 ok"), "caf\xc3\xa9 ok"); // UTF-8 stays
}

// --- limits -------------------------------------------------------------------


TEST(ToolSupport, CountsBeyondTheLimitsNameTheFlagAndTheNumber) {
  auto check = [](std::vector<std::string> args, const std::string &flag,
                  int64_t value) {
    std::vector<char *> argv{const_cast<char *>("tool")};
    for (std::string &a : args)
      argv.push_back(a.data());
    Flags flags({{"microbatches", true, false}, allowLargeFlagSpec()});
    EXPECT_FALSE(bool(flags.parse(int(argv.size()), argv.data())));
    return messageOf(checkLimit(flags, flag, value,
                                &support::SizeLimits::microbatches,
                                "microbatches"));
  };
  EXPECT_EQ(check({}, "microbatches", 1 << 20), "success");
  EXPECT_EQ(check({}, "microbatches", (1 << 20) + 1),
            "--microbatches=1048577 is more than 1048576 microbatches, the "
            "most cleave runs without --allow-large (which allows up to "
            "16777216)");
  EXPECT_EQ(check({"--allow-large"}, "microbatches", (1 << 20) + 1), "success");
  EXPECT_EQ(check({"--allow-large"}, "microbatches", int64_t(1) << 40),
            "--microbatches=1099511627776 is more than 16777216 microbatches, "
            "the most cleave runs even with --allow-large");
  auto big = parseCount("steps", "1000000000000");
  ASSERT_TRUE(bool(big));
  EXPECT_EQ(*big, 1000000000000);
  EXPECT_EQ(messageOf(parseCount("steps", "99999999999999999999").takeError()),
            "--steps=99999999999999999999 is too large");
}

// --- writeOutput ------------------------------------------------------------

TEST(WriteOutput, WritesTheFileAndNothingElse) {
  TempDir dir;
  ASSERT_FALSE(bool(writeOutput(dir.file("out.cir"), "graph text\n")));
  auto buf = llvm::MemoryBuffer::getFile(dir.file("out.cir"));
  ASSERT_TRUE(bool(buf));
  EXPECT_EQ((*buf)->getBuffer(), "graph text\n");
  EXPECT_EQ(dir.entries(), Strings{"out.cir"});
  // Overwrites an existing file.
  ASSERT_FALSE(bool(writeOutput(dir.file("out.cir"), "v2")));
  EXPECT_EQ((*llvm::MemoryBuffer::getFile(dir.file("out.cir")))->getBuffer(),
            "v2");
}

TEST(WriteOutput, MissingFolderLeavesNoFileBehind) {
  TempDir dir;
  std::string target = dir.file("no/such/dir/out.cir");
  std::string msg = llvm::toString(writeOutput(target, "text"));
  EXPECT_THAT(msg, HasSubstr("cannot write '" + target + "'"));
  EXPECT_FALSE(llvm::sys::fs::exists(target));
  EXPECT_EQ(dir.entries(), Strings{});
}

TEST(WriteOutput, TargetThatIsAFolderLeavesNoTemporaryBehind) {
  TempDir dir;
  ASSERT_FALSE(llvm::sys::fs::create_directory(dir.file("taken")));
  std::string msg = llvm::toString(writeOutput(dir.file("taken"), "text"));
  EXPECT_THAT(msg, HasSubstr("cannot write"));
  EXPECT_EQ(dir.entries(), Strings{"taken"});
  EXPECT_TRUE(llvm::sys::fs::is_directory(dir.file("taken")));
}

} // namespace unit_tool_support
