// The .cir text format: printing is canonical (print -> parse -> print gives
// the same bytes), every kind of name, attribute and tensor literal survives
// the trip, and parse errors point at `buffer:line:col:` with a message that
// says what is wrong.
#include "frontend/OnnxImporter.h"
#include "ir/Parser.h"
#include "ir/Printer.h"
#include "ir/Verifier.h"
#include "TestSupport.h"

#include "llvm/ADT/StringExtras.h"
#include "llvm/Support/FileSystem.h"
#include "llvm/Support/Path.h"
#include "llvm/Support/raw_ostream.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <limits>

namespace unit_text_format {

using namespace cleave;
using namespace cleave::ir;
using ::testing::HasSubstr;
using ::testing::StartsWith;

namespace {

using Ints = std::vector<int64_t>;
const float kInf = std::numeric_limits<float>::infinity();

TensorType ty(DType d, Shape s) { return TensorType(d, std::move(s)); }

std::shared_ptr<TensorData> floats(DType d, Shape s, std::vector<double> v) {
  return TensorData::fromDoubles(d, std::move(s), v);
}

std::unique_ptr<Graph> parseOrDie(llvm::StringRef text) {
  auto g = parseGraph(text, "test.cir");
  if (!g) {
    ADD_FAILURE() << llvm::toString(g.takeError()) << "\nin:\n" << text.str();
    return nullptr;
  }
  return std::move(*g);
}

// Parses `text` and returns the error message ("" if it parsed).
std::string parseError(llvm::StringRef text) {
  auto g = parseGraph(text, "bad.cir");
  if (g)
    return "";
  return llvm::toString(g.takeError());
}

std::string sourcePath(const std::string &rel) {
  return std::string(CLEAVE_SOURCE_DIR) + "/" + rel;
}

using testsupport::TempDir;

void writeFile(const std::string &path, const void *data, size_t size) {
  std::error_code ec;
  llvm::raw_fd_ostream os(path, ec);
  ASSERT_FALSE(ec) << path << ": " << ec.message();
  os.write(static_cast<const char *>(data), size);
}

// A graph using every name style, literal kind and attribute kind the ops
// declare, multi-result ops and locations.
std::unique_ptr<Graph> buildEverythingGraph(const std::string &rawFile) {
  auto g = std::make_unique<Graph>();
  g->setName("hand built");
  Value *mulIn = g->addInput("onnx::Mul_3", ty(DType::F32, {2, 4}));
  Value *spaced = g->addInput("a b", ty(DType::F32, {4}));
  Value *quoted = g->addInput("q\"uote\\", ty(DType::I64, {3}));
  Value *flag = g->addInput("flag", ty(DType::Bool, {2, 4}));

  Value *specials = g->addParam(
      "specials", floats(DType::F32, {8},
                         {kInf, -kInf, std::nan(""), -0.0, 0.1, 1e-45,
                          3.4028234663852886e38, -1.17549435e-38}));
  std::vector<double> ramp(32);
  for (size_t i = 0; i < ramp.size(); ++i)
    ramp[i] = 0.25 * double(i) - 3;
  Value *big = g->addParam("big", floats(DType::F32, {4, 8}, ramp)); // hex<>
  // 0.1 and 1/3 are not exact in f16 / bf16: what prints must parse back
  // to the same bits.
  g->addConst("halfs",
              floats(DType::F16, {5},
                     {1.0, 65504.0, 5.9604644775390625e-08, 0.1, 1.0 / 3}));
  g->addConst("bfs", floats(DType::BF16, {3}, {-3.0, 1.0e38, 0.1}));
  g->addConst("f64s", floats(DType::F64, {3}, {0.1, 1e300, -2.5}));
  g->addConst("i32s", TensorData::fromInts(DType::I32, {2}, {-7, 2147483647}));
  g->addConst("i8s", TensorData::fromInts(DType::I8, {3}, {-128, 0, 127}));
  g->addConst("i64s",
              TensorData::fromInts(DType::I64, {2},
                                   {std::numeric_limits<int64_t>::min(),
                                    std::numeric_limits<int64_t>::max()}));
  g->addConst("bools", TensorData::fromInts(DType::Bool, {3}, {1, 0, 1}));
  g->addConst("scalar", floats(DType::F32, {}, {3.0}));
  g->addConst("empty", floats(DType::F32, {0, 3}, {}));
  g->addBuffer("halves",
               floats(DType::F32, {20}, std::vector<double>(20, 0.5)));
  DataOrigin origin{DataOrigin::Kind::RawFile, rawFile, "", 64, 128};
  g->addBuffer("from file",
               std::make_shared<TensorData>(ty(DType::F32, {32}), origin));

  auto f32 = [](Shape s) { return ty(DType::F32, std::move(s)); };
  Op *mul = g->appendOp(OpKind::Mul, {mulIn, spaced}, {f32({2, 4})},
                        {"mul out"}, {}, "/Mul \"x\"\n\t");
  Op *leaky = g->appendOp(OpKind::LeakyRelu, {mul->result()}, {f32({2, 4})},
                          {"leaky"}, {{"alpha", 0.2f}},
                          "/r\xc3\xa9sum\xc3\xa9/LeakyRelu"); // UTF-8
  Op *clip = g->appendOp(OpKind::Clip, {leaky->result()}, {f32({2, 4})},
                         {"clip"}, {{"max", kInf}, {"min", -0.0f}});
  Op *where = g->appendOp(OpKind::Where, {flag, clip->result(), mulIn},
                          {f32({2, 4})}, {"where"});
  Op *cast = g->appendOp(OpKind::Cast, {where->result()},
                         {ty(DType::F16, {2, 4})}, {"cast"}, {{"to", "f16"}});
  Op *tr = g->appendOp(OpKind::Transpose, {where->result()}, {f32({4, 2})},
                       {"tr"}, {{"perm", Ints{1, 0}}});
  Op *split =
      g->appendOp(OpKind::Split, {where->result()}, {f32({1, 4}), f32({1, 4})},
                  {"top", "bottom"},
                  {{"axis", int64_t(0)}, {"split", Ints{1, 1}}}, "/Split");
  Op *concat = g->appendOp(OpKind::Concat, {split->result(1), split->result(0)},
                           {f32({2, 4})}, {"concat"}, {{"axis", int64_t(-2)}});
  Op *norm = g->appendOp(OpKind::LayerNormalization, {concat->result(), spaced},
                         {f32({2, 4}), f32({2, 1}), f32({2, 1})},
                         {"norm", "mean", "inv std"}, {{"epsilon", 1e-05f}});
  Op *drop = g->appendOp(OpKind::Dropout, {norm->result()},
                         {f32({2, 4}), ty(DType::Bool, {2, 4})},
                         {"dropped", "mask"}, {{"ratio", 0.25f}});
  Op *gather = g->appendOp(OpKind::Gather, {big, quoted}, {f32({3, 8})},
                           {"rows"}, {{"axis", int64_t(0)}});
  g->addOutput(drop->result(0));
  g->addOutput(drop->result(1));
  g->addOutput(norm->result(2));
  g->addOutput(cast->result());
  g->addOutput(tr->result());
  g->addOutput(gather->result());
  g->addOutput(specials);
  return g;
}

} // namespace

TEST(TextFormat, PrintsASmallGraphExactly) {
  Graph g;
  Value *x = g.addInput("x", ty(DType::F32, {2}));
  Value *w = g.addParam("w", floats(DType::F32, {2}, {1.5, -0.0}));
  Op *add =
      g.appendOp(OpKind::Add, {x, w}, {ty(DType::F32, {2})}, {"y"}, {}, "/add");
  Op *t = g.appendOp(OpKind::Transpose, {add->result()}, {ty(DType::F32, {2})},
                     {"t"}, {{"perm", Ints{0}}});
  g.addOutput(t->result());
  EXPECT_EQ(printGraph(g), "graph @main {\n"
                           "  input %x : f32[2]\n"
                           "  param %w : f32[2] = dense<[1.5, -0.0]>\n"
                           "  %y = Add(%x, %w) : f32[2] @\"/add\"\n"
                           "  %t = Transpose(%y) {perm = [0]} : f32[2]\n"
                           "  output %t\n"
                           "}\n");
}

TEST(TextFormat, QuotesNamesThatAreNotPlainIdentifiers) {
  EXPECT_EQ(valueRef("x.1/y-z_2"), "%x.1/y-z_2");
  EXPECT_EQ(valueRef("onnx::Mul_3"), "%\"onnx::Mul_3\"");
  EXPECT_EQ(valueRef("a b"), "%\"a b\"");
  EXPECT_EQ(valueRef("say \"hi\""), "%\"say \\\"hi\\\"\"");
  EXPECT_EQ(quoteString("tab\there\n\\"), "\"tab\\09here\\0a\\\\\"");
}

TEST(TextFormat, FloatsPrintShortestAndReadBack) {
  EXPECT_EQ(formatFloat(1.0f), "1.0");
  EXPECT_EQ(formatFloat(0.1f), "0.1");
  EXPECT_EQ(formatFloat(-0.0f), "-0.0");
  EXPECT_EQ(formatFloat(1e-05f), "1e-05");
  EXPECT_EQ(formatFloat(kInf), "inf");
  EXPECT_EQ(formatFloat(-kInf), "-inf");
  EXPECT_EQ(formatFloat(std::nanf("")), "nan");
  EXPECT_EQ(formatFloat(16777216.0f), "16777216.0");
  EXPECT_EQ(formatDouble(0.1), "0.1");
  EXPECT_EQ(formatDouble(1.0 / 3), "0.3333333333333333");
  for (float v : {1.0f / 3, 3.4028235e38f, 1.17549435e-38f, 1e-45f, 123456.79f})
    EXPECT_EQ(std::strtof(formatFloat(v).c_str(), nullptr), v) << v;
}

TEST(TextFormat, EverythingRoundTrips) {
  TempDir dir;
  std::vector<float> raw(48, 2.0f);
  writeFile(dir.file("raw.bin"), raw.data(), raw.size() * 4);
  auto g = buildEverythingGraph(dir.file("raw.bin"));
  ASSERT_FALSE(bool(verifyGraph(*g))) << llvm::toString(verifyGraph(*g));
  std::string first = printGraph(*g);

  // Spot checks of the canonical spelling.
  EXPECT_THAT(first, StartsWith("graph @\"hand built\" {\n"));
  EXPECT_THAT(first, HasSubstr("input %\"onnx::Mul_3\" : f32[2,4]\n"));
  EXPECT_THAT(first, HasSubstr("input %\"q\\\"uote\\\\\" : i64[3]\n"));
  EXPECT_THAT(first, HasSubstr("= dense<[inf, -inf, nan, -0.0, 0.1, 1e-45, "
                               "3.4028235e+38, -1.1754944e-38]>"));
  EXPECT_THAT(first, HasSubstr("param %big : f32[4,8] = hex<\""));
  EXPECT_THAT(first, HasSubstr("const %halfs : f16[5] = dense<[1.0, 65504.0, "
                               "5.9604645e-08, 0.099975586, 0.33325195]>"));
  EXPECT_THAT(first, HasSubstr("const %bools : bool[3] = dense<[true, false, "
                               "true]>"));
  EXPECT_THAT(first, HasSubstr("const %scalar : f32[] = dense<3.0>"));
  EXPECT_THAT(first, HasSubstr("const %empty : f32[0,3] = dense<[]>"));
  EXPECT_THAT(first, HasSubstr("buffer %halves : f32[20] = splat<0.5>"));
  EXPECT_THAT(first, HasSubstr("buffer %\"from file\" : f32[32] = file<\"" +
                               dir.file("raw.bin") + "\", 64, 128>"));
  EXPECT_THAT(first, HasSubstr("{max = inf, min = -0.0}"));
  EXPECT_THAT(first, HasSubstr("%top, %bottom = Split(%where) {axis = 0, "
                               "split = [1, 1]} : f32[1,4], f32[1,4] "
                               "@\"/Split\""));
  EXPECT_THAT(first, HasSubstr("%norm, %mean, %\"inv std\" = "
                               "LayerNormalization(%concat, %\"a b\") "
                               "{epsilon = 1e-05} : f32[2,4], f32[2,1], "
                               "f32[2,1]\n"));
  EXPECT_THAT(first, HasSubstr("{to = \"f16\"}"));
  EXPECT_THAT(first, HasSubstr("@\"/Mul \\\"x\\\"\\0a\\09\"\n"));

  auto parsed = parseOrDie(first);
  ASSERT_TRUE(parsed);
  EXPECT_FALSE(bool(verifyGraph(*parsed)));
  EXPECT_EQ(printGraph(*parsed), first);

  // Values come back bit for bit, not just as equal text.
  const Value *specials = parsed->lookup("specials");
  ASSERT_TRUE(specials && specials->data());
  const float *p = specials->data()->as<float>();
  EXPECT_TRUE(std::signbit(p[3]) && p[3] == 0.0f);
  EXPECT_TRUE(std::isnan(p[2]));
  EXPECT_EQ(p[5], 1e-45f);
  const Value *big = parsed->lookup("big");
  ASSERT_TRUE(big);
  EXPECT_EQ(big->data()->bytes(), g->lookup("big")->data()->bytes());
  EXPECT_EQ(parsed->lookup("i64s")->data()->getInt(0),
            std::numeric_limits<int64_t>::min());
  EXPECT_EQ(parsed->ops()[0]->loc(), "/Mul \"x\"\n\t");
  EXPECT_EQ(parsed->ops()[1]->loc(), "/r\xc3\xa9sum\xc3\xa9/LeakyRelu");
  EXPECT_EQ(parsed->lookup("halfs")->data()->bytes(),
            g->lookup("halfs")->data()->bytes());
  EXPECT_EQ(parsed->lookup("bfs")->data()->bytes(),
            g->lookup("bfs")->data()->bytes());
  EXPECT_EQ(parsed->name(), "hand built");
}

TEST(TextFormat, FileReferencesLoadTheirBytes) {
  TempDir dir;
  std::vector<float> values(36);
  for (size_t i = 0; i < values.size(); ++i)
    values[i] = float(i) * 1.5f;
  writeFile(dir.file("w.bin"), values.data(), values.size() * 4);
  std::string text = "graph @g {\n  param %w : f32[32] = file<\"" +
                     dir.file("w.bin") + "\", 16, 128>\n  output %w\n}\n";
  auto g = parseOrDie(text);
  ASSERT_TRUE(g);
  const auto &data = g->lookup("w")->data();
  EXPECT_FALSE(data->isLoaded());
  EXPECT_EQ(printGraph(*g), text); // printing does not need the bytes
  ASSERT_FALSE(bool(data->load()));
  EXPECT_EQ(data->as<float>()[0], 6.0f); // element 4 of the file
  EXPECT_EQ(data->as<float>()[31], 52.5f);

  // A range that does not hold the type is a parse error.
  EXPECT_THAT(parseError("graph @g {\n  param %w : f32[32] = file<\"w.bin\", "
                         "0, 100>\n  output %w\n}\n"),
              HasSubstr("file<> range of 100 bytes at offset 0 does not hold "
                        "f32[32] (128 bytes)"));
  // So is a missing file, or one too short for the range.
  EXPECT_THAT(parseError("graph @g {\n  param %w : f32[32] = file<\"" +
                         dir.file("nope.bin") +
                         "\", 0, 128>\n"
                         "  output %w\n}\n"),
              HasSubstr("nope.bin"));
  EXPECT_THAT(parseError("graph @g {\n  param %w : f32[32] = file<\"" +
                         dir.file("w.bin") +
                         "\", 32, 128>\n"
                         "  output %w\n}\n"),
              HasSubstr("w.bin"));
}

TEST(TextFormat, SmallTensorsKnownByReferenceStayReferences) {
  // Printing never loads data: a small tensor that was parsed from a
  // reference prints as that reference, not inline.
  TempDir dir;
  float four[4] = {1, 2, 3, 4};
  writeFile(dir.file("w.bin"), four, sizeof four);
  std::string text = "graph @g {\n  param %w : f32[4] = file<\"" +
                     dir.file("w.bin") + "\", 0, 16>\n  output %w\n}\n";
  auto g = parseOrDie(text);
  ASSERT_TRUE(g);
  EXPECT_EQ(printGraph(*g), text);
  EXPECT_FALSE(g->lookup("w")->data()->isLoaded());
  PrintOptions everythingInline;
  everythingInline.inlineLimit = 1 << 20;
  EXPECT_EQ(printGraph(*g, everythingInline), text);
}

// --- parse errors -----------------------------------------------------------

TEST(TextFormatErrors, UnknownOp) {
  EXPECT_EQ(parseError("graph @g {\n"
                       "  input %x : f32[2]\n"
                       "  %y = Frobnicate(%x) : f32[2]\n"
                       "  output %y\n}\n"),
            "bad.cir:3:8: unknown op 'Frobnicate'");
}

TEST(TextFormatErrors, UndefinedValue) {
  EXPECT_EQ(parseError("graph @g {\n"
                       "  input %x : f32[2]\n"
                       "  %y = Relu(%z) : f32[2]\n"
                       "  output %y\n}\n"),
            "bad.cir:3:13: use of undefined value %z");
  EXPECT_THAT(
      parseError("graph @g {\n  input %x : f32[2]\n  output %nope\n}\n"),
      HasSubstr("bad.cir:3:"));
}

TEST(TextFormatErrors, DuplicateDefinition) {
  EXPECT_EQ(parseError("graph @g {\n"
                       "  input %x : f32[2]\n"
                       "  %x = Relu(%x) : f32[2]\n"
                       "  output %x\n}\n"),
            "bad.cir:3:3: value %x is defined twice");
  EXPECT_THAT(parseError("graph @g {\n  input %x : f32[2]\n"
                         "  param %x : f32[1] = dense<[1.0]>\n}\n"),
              HasSubstr("bad.cir:3:"));
  EXPECT_THAT(parseError("graph @g {\n  input %x : f32[2]\n"
                         "  %a, %a = Split(%x) {split = [1, 1]} : f32[1], "
                         "f32[1]\n}\n"),
              HasSubstr("value %a is defined twice"));
}

TEST(TextFormatErrors, BadType) {
  EXPECT_EQ(parseError("graph @g {\n  input %x : f33[2]\n}\n"),
            "bad.cir:2:14: expected an element type (f32, f16, bf16, f64, "
            "i64, i32, i8, bool), found 'f33'");
  EXPECT_THAT(parseError("graph @g {\n  input %x : f32[2,-1]\n}\n"),
              HasSubstr("bad shape: dimension 1 is negative (-1)"));
  EXPECT_THAT(parseError("graph @g {\n  input %x : f32[2,x]\n}\n"),
              HasSubstr("expected an integer, found 'x'"));
  EXPECT_THAT(parseError("graph @g {\n  input %x : f32[2\n}\n"),
              HasSubstr("expected ','"));
}

TEST(TextFormatErrors, DenseCountMismatch) {
  std::string msg = parseError("graph @g {\n"
                               "  const %c : f32[3] = dense<[1.0, 2.0]>\n}\n");
  EXPECT_THAT(msg, StartsWith("bad.cir:2:"));
  EXPECT_THAT(msg, HasSubstr("dense<> has 2 values but f32[3] has 3"));
  EXPECT_THAT(
      parseError("graph @g {\n  const %c : bool[1] = dense<[yes]>\n}\n"),
      HasSubstr("expected true or false, found 'yes'"));
  EXPECT_THAT(parseError("graph @g {\n  const %c : i64[1] = dense<[1.5]>\n}\n"),
              HasSubstr("expected an integer"));
  EXPECT_THAT(parseError("graph @g {\n  const %c : f32[1] = dense<[one]>\n}\n"),
              HasSubstr("expected a number, found 'one'"));
  EXPECT_THAT(
      parseError("graph @g {\n  const %c : f32[2] = hex<\"0000\">\n}\n"),
      HasSubstr("hex<> data has 2 bytes, f32[2] needs 8"));
  EXPECT_THAT(parseError("graph @g {\n  const %c : f32[1] = blob<1>\n}\n"),
              HasSubstr("expected tensor data"));
}

TEST(TextFormatErrors, UnknownAttribute) {
  EXPECT_EQ(parseError("graph @g {\n"
                       "  input %x : f32[2]\n"
                       "  %y = Relu(%x) {alpha = 0.5} : f32[2]\n}\n"),
            "bad.cir:3:18: op Relu has no attribute 'alpha'");
  EXPECT_THAT(
      parseError("graph @g {\n  input %x : f32[2]\n"
                 "  %y = Concat(%x) {axis = 0, axis = 0} : f32[2]\n}\n"),
      HasSubstr("attribute 'axis' is given twice"));
  EXPECT_THAT(parseError("graph @g {\n  input %x : f32[2]\n"
                         "  %y = Concat(%x) {axis = 0.5} : f32[2]\n}\n"),
              HasSubstr("expected an integer, found '0.5'"));
}

TEST(TextFormatErrors, UnterminatedString) {
  EXPECT_EQ(parseError("graph @g {\n  input %\"x : f32[2]\n}\n"),
            "bad.cir:2:10: newline inside a string");
  EXPECT_EQ(parseError("graph @g {\n  input %\"x"), "bad.cir:2:10: "
                                                    "unterminated string");
  EXPECT_THAT(parseError("graph @g {\n  input %\"x\\q\" : f32[2]\n}\n"),
              HasSubstr("bad escape in string"));
}

TEST(TextFormatErrors, TrailingGarbageAndMissingBrace) {
  EXPECT_EQ(parseError("graph @g {\n  input %x : f32[2]\n  output %x\n}\n"
                       "junk\n"),
            "bad.cir:5:1: unexpected text after the graph");
  EXPECT_THAT(parseError("graph @g {\n  input %x : f32[2]\n"),
              HasSubstr("expected '}' to close the graph"));
  EXPECT_THAT(parseError("graph @g {\n  inptu %x : f32[2]\n}\n"),
              HasSubstr("found 'inptu'"));
  EXPECT_THAT(parseError(""), HasSubstr("bad.cir:1:1: expected 'graph'"));
}

TEST(TextFormatErrors, LiteralsOutOfRangeAndEmptyNames) {
  EXPECT_THAT(
      parseError("graph @g {\n  const %c : f32[1] = dense<[1e39]>\n}\n"),
      HasSubstr("'1e39' is out of range for f32"));
  EXPECT_THAT(parseError("graph @g {\n  const %c : f16[1] = dense<[1e5]>\n}\n"),
              HasSubstr("out of range for f16"));
  EXPECT_THAT(parseError("graph @g {\n  const %c : i8[1] = dense<[200]>\n}\n"),
              HasSubstr("200 does not fit in i8"));
  EXPECT_THAT(parseError("graph @g {\n  input %\"\" : f32[1]\n}\n"),
              HasSubstr("value names must not be empty"));
  EXPECT_THAT(parseError("graph @g {\n  input %x : f32[1]\n  output %x\n"
                         "  output %x\n}\n"),
              HasSubstr("bad.cir:4:10: value %x is listed as an output twice"));
  // Infinity is fine when written as such.
  auto g = parseOrDie("graph @g {\n  const %c : f16[2] = dense<[inf, -inf]>\n"
                      "  output %c\n}\n");
  ASSERT_TRUE(g);
  EXPECT_TRUE(std::isinf(g->lookup("c")->data()->getDouble(0)));
}

TEST(TextFormatErrors, FiniteLiteralsNeverBecomeInfinity) {
  // A literal above the type's rounding midpoint to infinity is rejected
  // as out of range rather than read as inf (f32 3.4028237e38, bf16 3.4e38).
  std::vector<std::string> becameInf;
  for (const char *lit :
       {"f32[1] = dense<[3.4028237e38]>", "bf16[1] = dense<[3.4e38]>"}) {
    auto g = parseGraph(std::string("graph @g {\n  const %c : ") + lit +
                            "\n  output %c\n}\n",
                        "lit.cir");
    if (!g) {
      EXPECT_THAT(llvm::toString(g.takeError()), HasSubstr("out of range"));
      continue;
    }
    if (std::isinf((*g)->lookup("c")->data()->getDouble(0)))
      becameInf.push_back(lit);
  }
  EXPECT_TRUE(becameInf.empty())
      << "finite literals parsed as inf: " << llvm::join(becameInf, "; ");
}

TEST(TextFormat, CommentsAndWhitespaceAreIgnored) {
  auto g = parseOrDie("// leading comment\ngraph @g {  // the graph\n"
                      "\tinput %x : f32[ 2 , 3 ]\n"
                      "  %y = Relu( %x ) : f32[2,3]   // trailing\n"
                      "  output %y\n}\n");
  ASSERT_TRUE(g);
  EXPECT_EQ(printGraph(*g), "graph @g {\n  input %x : f32[2,3]\n"
                            "  %y = Relu(%x) : f32[2,3]\n  output %y\n}\n");
}

// --- committed models -------------------------------------------------------

TEST(TextFormat, CommittedModelsRoundTripAndReloadTheirData) {
  frontend::installOnnxDataResolver();
  frontend::ImportOptions opts;
  opts.microbatchSize = 4;
  for (const char *rel :
       {"tests/models/mlp.onnx", "tests/models/mlp_infer.onnx",
        "tests/models/cnn.onnx", "tests/models/elementwise.onnx",
        "tests/models/gpt_opset13.onnx", "tests/models/gpt_tiny_ext/model.onnx",
        "examples/gpt/gpt-tiny.onnx"}) {
    SCOPED_TRACE(rel);
    auto imported = frontend::importOnnxFile(sourcePath(rel), opts);
    ASSERT_TRUE(bool(imported)) << llvm::toString(imported.takeError());
    std::string first = printGraph(**imported);
    auto parsed = parseOrDie(first);
    ASSERT_TRUE(parsed);
    EXPECT_FALSE(bool(verifyGraph(*parsed)));
    EXPECT_EQ(printGraph(*parsed), first);
    // Large tensors were printed by reference; they load back to the same
    // bytes.
    for (const Value *v : parsed->declared()) {
      const Value *orig = (*imported)->lookup(v->name());
      ASSERT_TRUE(orig) << v->name();
      ASSERT_FALSE(bool(v->data()->load())) << v->name();
      ASSERT_FALSE(bool(orig->data()->load())) << v->name();
      EXPECT_EQ(v->data()->bytes(), orig->data()->bytes()) << v->name();
    }
  }
}

} // namespace unit_text_format
