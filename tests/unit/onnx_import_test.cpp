// The ONNX frontend on the committed models (tests/models, the bundled GPT):
// which ops come out, how initializers are classified, shape binding, and the
// one-line errors for files that are not usable models.
#include "frontend/OnnxImporter.h"
#include "ir/Printer.h"
#include "ir/Verifier.h"
#include "TestSupport.h"

#include "llvm/ADT/StringRef.h"
#include "llvm/Support/FileSystem.h"
#include "llvm/Support/MemoryBuffer.h"
#include "llvm/Support/Path.h"
#include "llvm/Support/raw_ostream.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <map>
#include <set>

namespace unit_onnx_import {

using namespace cleave;
using namespace cleave::ir;
using ::testing::HasSubstr;
using ::testing::Not;

namespace {

std::string sourcePath(const std::string &rel) {
  return std::string(CLEAVE_SOURCE_DIR) + "/" + rel;
}

frontend::ImportOptions microbatch4() {
  frontend::ImportOptions o;
  o.microbatchSize = 4;
  return o;
}

std::unique_ptr<Graph>
importOrDie(const std::string &rel,
            const frontend::ImportOptions &opts = microbatch4()) {
  auto g = frontend::importOnnxFile(sourcePath(rel), opts);
  if (!g) {
    ADD_FAILURE() << rel << ": " << llvm::toString(g.takeError());
    return nullptr;
  }
  return std::move(*g);
}

// The message of an import that must fail ("" if it succeeded).
std::string importError(const std::string &path,
                        const frontend::ImportOptions &opts = microbatch4()) {
  auto g = frontend::importOnnxFile(path, opts);
  if (g)
    return "";
  return llvm::toString(g.takeError());
}

std::set<std::string> opNames(const Graph &g) {
  std::set<std::string> out;
  for (const auto &op : g.ops())
    out.insert(std::string(op->name()));
  return out;
}

std::map<ValueKind, int> kindCounts(const Graph &g) {
  std::map<ValueKind, int> out;
  for (const Value *v : g.declared())
    ++out[v->kind()];
  return out;
}

// Checks the invariants every imported graph has: it verifies and every
// value has a fully static, non-negative shape.
void expectWellFormed(const Graph &g) {
  EXPECT_FALSE(bool(verifyGraph(g))) << llvm::toString(verifyGraph(g));
  auto staticShape = [](const Value *v) {
    for (int64_t d : v->type().shape)
      EXPECT_GE(d, 0) << v->name();
  };
  for (const Value *v : g.inputs())
    staticShape(v);
  for (const Value *v : g.declared())
    staticShape(v);
  for (const auto &op : g.ops())
    for (const Value *r : op->results())
      staticShape(r);
}

using testsupport::TempDir;

std::string readFile(const std::string &path) {
  auto buf = llvm::MemoryBuffer::getFile(path, /*IsText=*/false,
                                         /*RequiresNullTerminator=*/false);
  EXPECT_TRUE(bool(buf)) << path;
  return buf ? (*buf)->getBuffer().str() : "";
}

void writeFile(const std::string &path, llvm::StringRef bytes) {
  std::error_code ec;
  llvm::raw_fd_ostream os(path, ec);
  ASSERT_FALSE(ec) << path << ": " << ec.message();
  os << bytes;
}

// Copies the external-data GPT into `dir`, with every external data location
// ("model.onnx.data") replaced by `location`. The replacement has the same
// length, so the protobuf stays valid without re-encoding it.
void writeExtModelWithLocation(const std::string &folder,
                               llvm::StringRef location) {
  const std::string original = "model.onnx.data";
  ASSERT_EQ(location.size(), original.size());
  std::string model =
      readFile(sourcePath("tests/models/gpt_tiny_ext/model.onnx"));
  size_t replaced = 0;
  for (size_t at = model.find(original); at != std::string::npos;
       at = model.find(original, at + 1), ++replaced)
    model.replace(at, original.size(), location.str());
  ASSERT_GT(replaced, 0u);
  writeFile(folder + "/model.onnx", model);
}

} // namespace

// --- the committed models ---------------------------------------------------

TEST(OnnxImport, Mlp) {
  auto g = importOrDie("tests/models/mlp.onnx");
  ASSERT_TRUE(g);
  expectWellFormed(*g);
  std::set<std::string> ops = opNames(*g);
  for (const char *op : {"Gemm", "Relu", "Tanh", "Sigmoid", "Erf", "Div", "Mul",
                         "Add", "SoftmaxCrossEntropyLoss"})
    EXPECT_TRUE(ops.count(op)) << op;
  EXPECT_EQ(kindCounts(*g)[ValueKind::Param], 10);
  EXPECT_EQ(kindCounts(*g)[ValueKind::Buffer], 0);
  ASSERT_EQ(g->inputs().size(), 2u);
  EXPECT_EQ(g->lookup("x")->type().str(), "f32[4,16]");
  EXPECT_EQ(g->lookup("labels")->type().str(), "i64[4]");
  ASSERT_EQ(g->outputs().size(), 1u);
  EXPECT_EQ(g->outputs()[0]->name(), "loss");
  EXPECT_EQ(g->outputs()[0]->type().str(), "f32[]");
  Value *w = g->lookup("mlp.net.0.weight");
  ASSERT_TRUE(w);
  EXPECT_EQ(w->kind(), ValueKind::Param);
  EXPECT_EQ(w->type().str(), "f32[32,16]");
  // Ops remember the ONNX node they came from.
  for (const auto &op : g->ops())
    EXPECT_FALSE(op->loc().empty()) << op->describe();
}

TEST(OnnxImport, MlpInferenceNeedsNoBinding) {
  auto g = importOrDie("tests/models/mlp_infer.onnx", {});
  ASSERT_TRUE(g);
  expectWellFormed(*g);
  EXPECT_EQ(g->lookup("x")->type().str(), "f32[4,16]");
  ASSERT_EQ(g->outputs().size(), 1u);
  EXPECT_EQ(g->outputs()[0]->type().str(), "f32[4,10]");
  EXPECT_FALSE(opNames(*g).count("SoftmaxCrossEntropyLoss"));
}

TEST(OnnxImport, CnnRunningStatisticsAreBuffers) {
  auto g = importOrDie("tests/models/cnn.onnx");
  ASSERT_TRUE(g);
  expectWellFormed(*g);
  std::set<std::string> ops = opNames(*g);
  for (const char *op : {"Conv", "BatchNormalization", "Relu", "MaxPool",
                         "AveragePool", "GlobalAveragePool", "Flatten",
                         "Dropout", "Gemm", "Add", "SoftmaxCrossEntropyLoss"})
    EXPECT_TRUE(ops.count(op)) << op;
  for (const char *bn : {"stem.1", "block.bn1", "block.bn2"}) {
    for (const char *stat : {".running_mean", ".running_var"}) {
      Value *v = g->lookup(std::string(bn) + stat);
      ASSERT_TRUE(v) << bn << stat;
      EXPECT_EQ(v->kind(), ValueKind::Buffer) << v->name();
    }
    for (const char *trained : {".weight", ".bias"}) {
      Value *v = g->lookup(std::string(bn) + trained);
      ASSERT_TRUE(v) << bn << trained;
      EXPECT_EQ(v->kind(), ValueKind::Param) << v->name();
    }
  }
  for (const char *w : {"stem.0.weight", "stem.0.bias", "block.conv1.weight",
                        "conv.weight", "fc.weight", "fc.bias"}) {
    ASSERT_TRUE(g->lookup(w)) << w;
    EXPECT_EQ(g->lookup(w)->kind(), ValueKind::Param) << w;
  }
  EXPECT_EQ(kindCounts(*g)[ValueKind::Buffer], 6);
  // BatchNormalization in training mode has its three results.
  for (const auto &op : g->ops())
    if (op->kind() == OpKind::BatchNormalization) {
      EXPECT_EQ(op->numResults(), 3u) << op->describe();
      EXPECT_EQ(op->getInt("training_mode"), 1) << op->describe();
    }
}

TEST(OnnxImport, ElementwiseShapeArithmeticIsFolded) {
  auto g = importOrDie("tests/models/elementwise.onnx", {});
  ASSERT_TRUE(g);
  expectWellFormed(*g);
  std::set<std::string> ops = opNames(*g);
  for (const char *op :
       {"Pow", "Sqrt", "Clip", "Where", "Cast", "Expand", "Gather", "Split",
        "Slice", "Transpose", "LogSoftmax", "ReduceMean"})
    EXPECT_TRUE(ops.count(op)) << op;
  std::map<std::string, std::string> outs;
  for (const Value *v : g->outputs())
    outs[v->name()] = v->type().str();
  EXPECT_EQ(outs["probs"], "f32[2,12]");
  EXPECT_EQ(outs["y"], "f32[2,2,4]");
}

// The causal mask feeds only a comparison, so it is state, not a weight;
// Reshape targets arrive as attributes with every -1 and 0 resolved.
static void expectGptStructure(const Graph &g, int layers) {
  expectWellFormed(g);
  for (int i = 0; i < layers; ++i) {
    Value *mask = g.lookup("blocks." + std::to_string(i) + ".attn.mask");
    ASSERT_TRUE(mask) << i;
    EXPECT_EQ(mask->kind(), ValueKind::Buffer);
  }
  EXPECT_EQ(g.lookup("wte.weight")->kind(), ValueKind::Param);
  EXPECT_EQ(g.lookup("lm_head.weight")->kind(), ValueKind::Param);
  EXPECT_EQ(kindCounts(g)[ValueKind::Buffer], layers);
  int reshapes = 0;
  for (const auto &op : g.ops()) {
    if (op->kind() != OpKind::Reshape)
      continue;
    ++reshapes;
    ASSERT_TRUE(op->hasAttr("shape")) << op->describe();
    for (int64_t d : op->getInts("shape"))
      EXPECT_GT(d, 0) << op->describe();
  }
  EXPECT_GT(reshapes, 0);
  std::set<std::string> ops = opNames(g);
  for (const char *op : {"MatMul", "Softmax", "Where", "Gather", "Split",
                         "SoftmaxCrossEntropyLoss"})
    EXPECT_TRUE(ops.count(op)) << op;
}

TEST(OnnxImport, GptTinyExample) {
  auto g = importOrDie("examples/gpt/gpt-tiny.onnx");
  ASSERT_TRUE(g);
  expectGptStructure(*g, 2);
  EXPECT_EQ(g->lookup("idx")->type().str(), "i64[4,32]");
  EXPECT_TRUE(opNames(*g).count("LayerNormalization"));
  EXPECT_EQ(kindCounts(*g)[ValueKind::Param], 30);
}

TEST(OnnxImport, GptOpset13FoldsItsShapeArithmetic) {
  auto g = importOrDie("tests/models/gpt_opset13.onnx");
  ASSERT_TRUE(g);
  expectGptStructure(*g, 1);
  EXPECT_EQ(g->lookup("targets")->type().str(), "i64[4,16]");
  // LayerNorm arrives decomposed at opset 13.
  std::set<std::string> ops = opNames(*g);
  EXPECT_FALSE(ops.count("LayerNormalization"));
  EXPECT_TRUE(ops.count("ReduceMean"));
}

TEST(OnnxImport, ExternalDataParamsRememberTheirFile) {
  auto g = importOrDie("tests/models/gpt_tiny_ext/model.onnx");
  ASSERT_TRUE(g);
  expectGptStructure(*g, 1);
  int fromFile = 0;
  for (const Value *v : g->declared()) {
    if (v->kind() == ValueKind::Const)
      continue;
    const DataOrigin &o = v->data()->origin();
    EXPECT_EQ(o.kind, DataOrigin::Kind::RawFile) << v->name();
    EXPECT_TRUE(llvm::StringRef(o.path).endswith("model.onnx.data")) << o.path;
    EXPECT_EQ(o.length, v->type().byteSize()) << v->name();
    // Still in the file: read when something needs the values.
    EXPECT_FALSE(v->data()->isLoaded()) << v->name();
    EXPECT_FALSE(bool(v->data()->load())) << v->name();
    ++fromFile;
  }
  EXPECT_EQ(fromFile, 19);
  // Big tensors print as file<> references.
  EXPECT_THAT(printGraph(*g),
              HasSubstr("param %wte.weight : f32[256,32] = file<\""));
  // Same architecture as the inline-data model: same declared types.
  auto inlineModel = importOrDie("tests/models/gpt_opset13.onnx");
  ASSERT_TRUE(inlineModel);
  for (const Value *v : inlineModel->declared()) {
    if (v->kind() == ValueKind::Const)
      continue;
    const Value *ext = g->lookup(v->name());
    ASSERT_TRUE(ext) << v->name();
    EXPECT_EQ(ext->type(), v->type()) << v->name();
    EXPECT_EQ(ext->kind(), v->kind()) << v->name();
  }
}

TEST(OnnxImport, ImportIsDeterministic) {
  auto a = importOrDie("tests/models/cnn.onnx");
  auto b = importOrDie("tests/models/cnn.onnx");
  ASSERT_TRUE(a && b);
  EXPECT_EQ(printGraph(*a), printGraph(*b));
}

TEST(OnnxImport, SupportedOpsListsFoldOnlyOpsSeparately) {
  std::vector<std::string> foldedOnly;
  std::vector<std::string> ops = frontend::supportedOnnxOps(&foldedOnly);
  EXPECT_TRUE(std::is_sorted(ops.begin(), ops.end()));
  EXPECT_THAT(ops, ::testing::Contains("Gemm"));
  EXPECT_THAT(ops, ::testing::Contains("Shape"));
  EXPECT_THAT(foldedOnly, ::testing::Contains("Shape"));
  EXPECT_THAT(foldedOnly, Not(::testing::Contains("Gemm")));
  std::vector<std::string> expanded;
  ops = frontend::supportedOnnxOps(nullptr, &expanded);
  EXPECT_THAT(expanded, ::testing::Contains("Attention"));
  EXPECT_THAT(expanded, ::testing::Contains("RotaryEmbedding"));
  EXPECT_THAT(ops, ::testing::Contains("RotaryEmbedding"));
  EXPECT_THAT(expanded, Not(::testing::Contains("MatMul")));
  std::vector<std::string> unrolled;
  ops = frontend::supportedOnnxOps(nullptr, nullptr, &unrolled);
  EXPECT_TRUE(std::is_sorted(ops.begin(), ops.end()));
  EXPECT_THAT(ops, ::testing::Contains("Loop"));
  EXPECT_THAT(ops, ::testing::Contains("If"));
  EXPECT_EQ(unrolled, (std::vector<std::string>{"If", "Loop"}));
}

// --- binding input shapes ---------------------------------------------------

TEST(OnnxImport, InputShapesBindSymbolicDims) {
  frontend::ImportOptions opts;
  opts.inputShapes["x"] = {8, 16};
  opts.inputShapes["labels"] = {8};
  auto g = importOrDie("tests/models/mlp.onnx", opts);
  ASSERT_TRUE(g);
  expectWellFormed(*g);
  EXPECT_EQ(g->lookup("x")->type().str(), "f32[8,16]");
  EXPECT_EQ(g->lookup("labels")->type().str(), "i64[8]");
}

TEST(OnnxImport, InputShapeErrors) {
  std::string mlp = sourcePath("tests/models/mlp.onnx");
  frontend::ImportOptions wrongRank;
  wrongRank.inputShapes["x"] = {8};
  wrongRank.microbatchSize = 8;
  EXPECT_THAT(importError(mlp, wrongRank),
              HasSubstr("gives 1 dims for 'x', which has rank 2"));

  frontend::ImportOptions notAnInput;
  notAnInput.inputShapes["y"] = {8, 16};
  notAnInput.microbatchSize = 8;
  EXPECT_THAT(importError(mlp, notAnInput),
              HasSubstr("names 'y', which is not an input of the model"));

  frontend::ImportOptions fixedDim;
  fixedDim.inputShapes["x"] = {4, 17};
  EXPECT_THAT(importError(sourcePath("tests/models/mlp_infer.onnx"), fixedDim),
              HasSubstr("gives 17 for axis 1 of 'x', which the model fixes "
                        "at 16"));
}

TEST(OnnxImport, UnboundSymbolicDimNamesInputAndAxis) {
  std::string msg = importError(sourcePath("tests/models/mlp.onnx"), {});
  EXPECT_THAT(msg, HasSubstr("input 'x' has a symbolic dimension 'batch' at "
                             "axis 0"));
  EXPECT_THAT(msg, HasSubstr("--microbatch-size"));
  // Binding only one input leaves the other unbound.
  frontend::ImportOptions onlyX;
  onlyX.inputShapes["x"] = {8, 16};
  EXPECT_THAT(importError(sourcePath("tests/models/mlp.onnx"), onlyX),
              HasSubstr("input 'labels' has a symbolic dimension 'batch' at "
                        "axis 0"));
}

// --- files that are not usable models ---------------------------------------

// Every such failure is one line that names the file.
static void expectOneLineNaming(const std::string &msg,
                                const std::string &path) {
  EXPECT_FALSE(msg.empty()) << "import of " << path << " succeeded";
  EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;
  EXPECT_THAT(msg, HasSubstr(path));
}

TEST(OnnxImportErrors, MissingFile) {
  TempDir dir;
  std::string path = dir.file("absent.onnx");
  std::string msg = importError(path);
  expectOneLineNaming(msg, path);
  EXPECT_THAT(msg, HasSubstr("cannot open"));
}

TEST(OnnxImportErrors, EmptyFile) {
  TempDir dir;
  std::string path = dir.file("empty.onnx");
  writeFile(path, "");
  std::string msg = importError(path);
  expectOneLineNaming(msg, path);
  EXPECT_THAT(msg, HasSubstr("is empty"));
}

TEST(OnnxImportErrors, TruncatedFile) {
  TempDir dir;
  std::string path = dir.file("mlp.onnx");
  std::string bytes = readFile(sourcePath("tests/models/mlp.onnx"));
  ASSERT_GT(bytes.size(), 1000u);
  writeFile(path, llvm::StringRef(bytes).take_front(bytes.size() / 2));
  std::string msg = importError(path);
  expectOneLineNaming(msg, path);
  EXPECT_THAT(msg, HasSubstr("not a valid ONNX model"));
}

TEST(OnnxImportErrors, TextFile) {
  TempDir dir;
  std::string path = dir.file("notes.onnx");
  writeFile(path, "this is not a model\nbut some notes\n");
  std::string msg = importError(path);
  expectOneLineNaming(msg, path);
  EXPECT_THAT(msg, HasSubstr("not"));
}

TEST(OnnxImportErrors, Directory) {
  TempDir dir;
  std::string msg = importError(std::string(dir.path));
  expectOneLineNaming(msg, std::string(dir.path));
  EXPECT_THAT(msg, HasSubstr("is a directory"));
}

// --- external data confinement ----------------------------------------------

TEST(OnnxImportErrors, ExternalDataOutsideTheModelFolder) {
  // <tmp>/model/model.onnx refers to "../model.o.data", which exists.
  TempDir dir;
  std::string modelDir = dir.file("model");
  ASSERT_FALSE(llvm::sys::fs::create_directory(modelDir));
  writeFile(dir.file("model.o.data"),
            readFile(sourcePath("tests/models/gpt_tiny_ext/model.onnx.data")));
  writeExtModelWithLocation(modelDir, "../model.o.data");
  std::string msg = importError(modelDir + "/model.onnx");
  EXPECT_THAT(msg, HasSubstr("external data location '../model.o.data' "
                             "points outside the model's folder"));
  EXPECT_EQ(msg.find('\n'), std::string::npos);
}

TEST(OnnxImportErrors, ExternalDataAtAnAbsolutePath) {
  TempDir dir;
  writeExtModelWithLocation(std::string(dir.path), "/model.onnx.dat");
  std::string msg = importError(dir.file("model.onnx"));
  EXPECT_THAT(msg, HasSubstr("'/model.onnx.dat' must be a relative path "
                             "inside the model's folder"));
}

TEST(OnnxImportErrors, ExternalDataThroughASymlinkOutside) {
  TempDir outside, dir;
  std::string data =
      readFile(sourcePath("tests/models/gpt_tiny_ext/model.onnx.data"));
  writeFile(outside.file("real.data"), data);
  writeExtModelWithLocation(std::string(dir.path), "model.onnx.data");
  ASSERT_FALSE(llvm::sys::fs::create_link(outside.file("real.data"),
                                          dir.file("model.onnx.data")));
  EXPECT_THAT(importError(dir.file("model.onnx")),
              HasSubstr("points outside the model's folder"));
}

TEST(OnnxImportErrors, ExternalDataMissingOrShort) {
  TempDir dir;
  writeExtModelWithLocation(std::string(dir.path), "model.onnx.data");
  EXPECT_THAT(importError(dir.file("model.onnx")),
              HasSubstr("external data file 'model.onnx.data' not found"));
  std::string data =
      readFile(sourcePath("tests/models/gpt_tiny_ext/model.onnx.data"));
  writeFile(dir.file("model.onnx.data"),
            llvm::StringRef(data).take_front(data.size() / 2));
  EXPECT_THAT(importError(dir.file("model.onnx")), HasSubstr("is too short"));
  // With the whole file in place, the copy imports.
  writeFile(dir.file("model.onnx.data"), data);
  EXPECT_EQ(importError(dir.file("model.onnx")), "");
}

} // namespace unit_onnx_import
