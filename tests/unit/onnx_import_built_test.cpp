// The ONNX frontend on small models built in the test with ONNX's protobuf
// classes: Reshape targets, shape folding, auto_pad, Split and Squeeze
// defaults, initializer classification, and the errors for opsets, ops,
// element types and unbound dims, each on the smallest model that shows it.
#include "frontend/OnnxImporter.h"
#include "frontend/OnnxNode.h"
#include "interp/Interpreter.h"
#include "ir/Verifier.h"
#include "runtime/Kernel.h"
#include "TestSupport.h"

#include "llvm/ADT/StringRef.h"
#include "llvm/Support/FileSystem.h"
#include "llvm/Support/Path.h"
#include "llvm/Support/raw_ostream.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>

// The onnx targets' interface definitions do not reach this binary (the
// frontend links onnx privately), so the one that selects the generated
// header is set here.
#ifndef ONNX_ML
#define ONNX_ML 1
#endif
#include <onnx/onnx_pb.h>

namespace unit_onnx_import_built {

using namespace cleave;
using namespace cleave::ir;
using ::testing::HasSubstr;
using ::testing::Not;

namespace {

using testsupport::TempDir;

frontend::ImportOptions microbatch4() {
  frontend::ImportOptions o;
  o.microbatchSize = 4;
  return o;
}

// The message of an import that must fail ("" if it succeeded).
std::string importError(const std::string &path,
                        const frontend::ImportOptions &opts) {
  auto g = frontend::importOnnxFile(path, opts);
  if (g)
    return "";
  return llvm::toString(g.takeError());
}

// Builds a small single-graph ONNX model. Dims given as names are symbolic.
class ModelBuilder {
public:
  explicit ModelBuilder(int64_t opset = 17) {
    model_.set_ir_version(8);
    model_.set_producer_name("cleave-unit-tests");
    auto *imp = model_.add_opset_import();
    imp->set_domain("");
    imp->set_version(opset);
    graph().set_name("built");
  }
  onnx::GraphProto &graph() { return *model_.mutable_graph(); }
  onnx::ModelProto &model() { return model_; }

  void input(const std::string &name, int elemType,
             const std::vector<std::string> &dims) {
    auto *tt = graph().add_input();
    tt->set_name(name);
    auto *t = tt->mutable_type()->mutable_tensor_type();
    t->set_elem_type(elemType);
    auto *shape = t->mutable_shape();
    for (const std::string &d : dims) {
      int64_t v;
      if (llvm::StringRef(d).getAsInteger(10, v))
        shape->add_dim()->set_dim_param(d);
      else
        shape->add_dim()->set_dim_value(v);
    }
  }
  // The checker wants a shape on outputs; unknown dims of the right rank
  // leave the sizes to shape inference.
  void output(const std::string &name, int elemType, int rank) {
    auto *o = graph().add_output();
    o->set_name(name);
    auto *t = o->mutable_type()->mutable_tensor_type();
    t->set_elem_type(elemType);
    auto *shape = t->mutable_shape();
    for (int i = 0; i < rank; ++i)
      shape->add_dim();
  }
  void initInts(const std::string &name, std::vector<int64_t> dims,
                std::vector<int64_t> values) {
    auto *t = graph().add_initializer();
    t->set_name(name);
    t->set_data_type(onnx::TensorProto::INT64);
    for (int64_t d : dims)
      t->add_dims(d);
    for (int64_t v : values)
      t->add_int64_data(v);
  }
  void initFloats(const std::string &name, std::vector<int64_t> dims,
                  std::vector<float> values) {
    auto *t = graph().add_initializer();
    t->set_name(name);
    t->set_data_type(onnx::TensorProto::FLOAT);
    for (int64_t d : dims)
      t->add_dims(d);
    for (float v : values)
      t->add_float_data(v);
  }
  onnx::NodeProto &node(const std::string &op,
                        const std::vector<std::string> &inputs,
                        const std::vector<std::string> &outputs,
                        const std::string &name = "") {
    auto *n = graph().add_node();
    n->set_op_type(op);
    n->set_name(name.empty() ? "/" + op : name);
    for (const std::string &i : inputs)
      n->add_input(i);
    for (const std::string &o : outputs)
      n->add_output(o);
    return *n;
  }
  static void attr(onnx::NodeProto &n, const std::string &name, int64_t v) {
    auto *a = n.add_attribute();
    a->set_name(name);
    a->set_type(onnx::AttributeProto::INT);
    a->set_i(v);
  }
  static void attr(onnx::NodeProto &n, const std::string &name,
                   std::vector<int64_t> v) {
    auto *a = n.add_attribute();
    a->set_name(name);
    a->set_type(onnx::AttributeProto::INTS);
    for (int64_t x : v)
      a->add_ints(x);
  }
  static void attr(onnx::NodeProto &n, const std::string &name,
                   const std::string &v) {
    auto *a = n.add_attribute();
    a->set_name(name);
    a->set_type(onnx::AttributeProto::STRING);
    a->set_s(v);
  }

  std::string save(const TempDir &dir, const std::string &file = "m.onnx") {
    std::string bytes;
    EXPECT_TRUE(model_.SerializeToString(&bytes));
    std::error_code ec;
    llvm::raw_fd_ostream os(dir.file(file), ec);
    EXPECT_FALSE(ec) << ec.message();
    os << bytes;
    return dir.file(file);
  }

private:
  onnx::ModelProto model_;
};

constexpr int kFloat = onnx::TensorProto::FLOAT;
constexpr int kInt64 = onnx::TensorProto::INT64;

const Op *onlyOp(const Graph &g, OpKind kind) {
  const Op *found = nullptr;
  for (const auto &op : g.ops())
    if (op->kind() == kind) {
      EXPECT_EQ(found, nullptr) << "more than one " << op->name();
      found = op.get();
    }
  EXPECT_NE(found, nullptr);
  return found;
}

std::unique_ptr<Graph> importBuilt(const std::string &path,
                                   const frontend::ImportOptions &opts = {}) {
  auto g = frontend::importOnnxFile(path, opts);
  if (!g) {
    ADD_FAILURE() << llvm::toString(g.takeError());
    return nullptr;
  }
  EXPECT_FALSE(bool(verifyGraph(**g))) << llvm::toString(verifyGraph(**g));
  return std::move(*g);
}

} // namespace

TEST(OnnxImportBuilt, ReshapeResolvesZeroAndMinusOne) {
  TempDir dir;
  ModelBuilder m;
  m.input("x", kFloat, {"2", "3", "4"});
  m.initInts("target", {3}, {0, -1, 2}); // copy dim 0, infer the middle
  m.node("Reshape", {"x", "target"}, {"y"});
  m.output("y", kFloat, 3);
  auto g = importBuilt(m.save(dir));
  ASSERT_TRUE(g);
  const Op *r = onlyOp(*g, OpKind::Reshape);
  ASSERT_TRUE(r);
  EXPECT_EQ(r->getInts("shape"), (std::vector<int64_t>{2, 6, 2}));
  EXPECT_EQ(g->outputs()[0]->type().str(), "f32[2,6,2]");
  // The target shape was consumed as an attribute, not kept as a tensor.
  EXPECT_EQ(g->lookup("target"), nullptr);
}

TEST(OnnxImportBuilt, ShapeArithmeticFoldsIntoAttributes) {
  // y = Reshape(x, Concat(Gather(Shape(x), 0), [-1])): flatten all but dim 0.
  TempDir dir;
  ModelBuilder m;
  m.input("x", kFloat, {"batch", "3", "4"});
  m.initInts("zero", {}, {0});
  m.initInts("axes0", {1}, {0});
  m.initInts("minus1", {1}, {-1});
  m.node("Shape", {"x"}, {"s"});
  m.node("Gather", {"s", "zero"}, {"b"});
  m.node("Unsqueeze", {"b", "axes0"}, {"b1"});
  ModelBuilder::attr(m.node("Concat", {"b1", "minus1"}, {"target"}), "axis",
                     int64_t(0));
  m.node("Reshape", {"x", "target"}, {"y"});
  m.output("y", kFloat, 2);
  frontend::ImportOptions opts;
  opts.microbatchSize = 5;
  auto g = importBuilt(m.save(dir), opts);
  ASSERT_TRUE(g);
  EXPECT_EQ(g->ops().size(), 1u); // only the Reshape is left
  EXPECT_EQ(g->outputs()[0]->type().str(), "f32[5,12]");
}

TEST(OnnxImportBuilt, FloorCeilSignAndTransposeOfConstantsFold) {
  // The pads of HF's causal-LM loss through the legacy exporter are a
  // Transpose of reshaped shape arithmetic cast to int64; adaptive pooling
  // in VGG computes its windows with Floor, Ceil and Sign.
  TempDir dir;
  ModelBuilder m;
  m.input("x", kFloat, {"2", "3"});
  // Float shape arithmetic starts from integers (float initializers are
  // parameters): p = [7, 12, 2, 29] / 10.
  m.initInts("p10", {4}, {7, 12, 2, 29});
  m.initInts("ten", {1}, {10});
  ModelBuilder::attr(m.node("Cast", {"p10"}, {"pn"}), "to",
                     int64_t(onnx::TensorProto::FLOAT));
  ModelBuilder::attr(m.node("Cast", {"ten"}, {"tenf"}), "to",
                     int64_t(onnx::TensorProto::FLOAT));
  m.node("Div", {"pn", "tenf"}, {"p"});
  m.initInts("shape22", {2}, {2, 2});
  m.initInts("flat", {1}, {-1});
  m.node("Floor", {"p"}, {"pf"});                 // 0 1 0 2
  m.node("Reshape", {"pf", "shape22"}, {"p22"});   // [[0,1],[0,2]]
  m.node("Transpose", {"p22"}, {"pt"});            // [[0,0],[1,2]]
  m.node("Reshape", {"pt", "flat"}, {"pflat"});
  ModelBuilder::attr(m.node("Cast", {"pflat"}, {"pads"}), "to",
                     int64_t(onnx::TensorProto::INT64));
  m.node("Pad", {"x", "pads"}, {"padded"});        // [2,3] -> [3,5]
  m.initInts("s", {2}, {-4, 3});
  m.initInts("c10", {2}, {5, 142});
  m.node("Sign", {"s"}, {"sgi"});                  // -1 1
  ModelBuilder::attr(m.node("Cast", {"sgi"}, {"sg"}), "to",
                     int64_t(onnx::TensorProto::FLOAT));
  ModelBuilder::attr(m.node("Cast", {"c10"}, {"c10f"}), "to",
                     int64_t(onnx::TensorProto::FLOAT));
  m.node("Div", {"c10f", "tenf"}, {"c"});          // 0.5 14.2
  m.node("Ceil", {"c"}, {"cl"});                   // 1 15
  m.node("Mul", {"sg", "cl"}, {"t"});              // -1 15
  ModelBuilder::attr(m.node("Cast", {"t"}, {"target"}), "to",
                     int64_t(onnx::TensorProto::INT64));
  m.node("Reshape", {"padded", "target"}, {"y"});  // [1,15]
  m.output("y", kFloat, 2);
  auto g = importBuilt(m.save(dir), {});
  ASSERT_TRUE(g);
  const Op *pad = onlyOp(*g, OpKind::Pad);
  ASSERT_TRUE(pad);
  EXPECT_EQ(pad->getInts("pads"), (std::vector<int64_t>{0, 0, 1, 2}));
  EXPECT_EQ(g->outputs()[0]->type().str(), "f32[1,15]");
}

TEST(OnnxImportBuilt, PowOfConstantsFolds) {
  // DINOv2's legacy export sizes its position grid with Pow: 2.0^3 = 8.
  TempDir dir;
  ModelBuilder m;
  m.input("x", kFloat, {"2", "4"});
  m.initInts("two_i", {1}, {2});
  m.initInts("three", {1}, {3});
  ModelBuilder::attr(m.node("Cast", {"two_i"}, {"two"}), "to",
                     int64_t(onnx::TensorProto::FLOAT));
  m.node("Pow", {"two", "three"}, {"p"});
  ModelBuilder::attr(m.node("Cast", {"p"}, {"shape"}), "to",
                     int64_t(onnx::TensorProto::INT64));
  m.node("Reshape", {"x", "shape"}, {"y"});
  m.output("y", kFloat, 1);
  auto g = importBuilt(m.save(dir), {});
  ASSERT_TRUE(g);
  EXPECT_EQ(g->outputs()[0]->type().str(), "f32[8]");
}

TEST(OnnxImportBuilt, ResizeToItsOwnSizeIsIdentity) {
  // DINOv2's legacy export: a bicubic Resize of the position table to the
  // size it has. Another size is a cubic Resize (exclude_outside, which
  // PyTorch never writes, refused).
  for (int64_t out : {4, 8}) {
    TempDir dir;
    ModelBuilder m;
    m.input("x", kFloat, {"1", "2", "4", "4"});
    m.initInts("sizes", {4}, {1, 2, out, out});
    onnx::NodeProto &r = m.node("Resize", {"x", "", "", "sizes"}, {"y"});
    ModelBuilder::attr(r, "mode", std::string("cubic"));
    ModelBuilder::attr(r, "exclude_outside", int64_t(1));
    m.output("y", kFloat, 4);
    if (out == 4) {
      auto g = importBuilt(m.save(dir), {});
      ASSERT_TRUE(g);
      for (const auto &op : g->ops())
        EXPECT_NE(op->kind(), OpKind::Resize);
      EXPECT_EQ(g->outputs()[0]->type().str(), "f32[1,2,4,4]");
    } else {
      EXPECT_THAT(importError(m.save(dir), {}),
                  HasSubstr("cubic with exclude_outside is not supported"));
    }
  }
}

TEST(OnnxImportBuilt, ClipOfConstantsFolds) {
  // timm's "same" padding through the legacy exporter: max(pad, 0) as a
  // Clip with only its min, then the pads; and both bounds clamp: the
  // amounts [-2, 1, 3, 7] clipped to [0, 2] are [0, 1, 2, 2], [2, 3]
  // padded to [4, 6].
  TempDir dir;
  ModelBuilder m;
  m.input("x", kFloat, {"2", "3"});
  m.initInts("raw", {4}, {-2, 1, 3, 7});
  m.initInts("zero", {}, {0});
  m.initInts("two", {}, {2});
  m.node("Clip", {"raw", "zero"}, {"low"});        // 0 1 3 7
  m.node("Clip", {"low", "", "two"}, {"pads"});   // 0 1 2 2
  m.node("Pad", {"x", "pads"}, {"y"});             // [2,3] -> [4,6]
  m.output("y", kFloat, 2);
  auto g = importBuilt(m.save(dir), {});
  ASSERT_TRUE(g);
  const Op *pad = onlyOp(*g, OpKind::Pad);
  ASSERT_TRUE(pad);
  EXPECT_EQ(pad->getInts("pads"), (std::vector<int64_t>{0, 1, 2, 2}));
  EXPECT_EQ(g->outputs()[0]->type().str(), "f32[4,6]");
}

TEST(OnnxImportBuilt, TileOfConstantsFolds) {
  // Whisper's position ids: a constant row tiled per sequence, then used
  // as a gather's indices; [2, 3] tiled twice gives the shape [2, 3, 2, 3].
  TempDir dir;
  ModelBuilder m;
  m.input("x", kFloat, {"36"});
  m.initInts("row", {2}, {2, 3});
  m.initInts("reps", {1}, {2});
  m.node("Tile", {"row", "reps"}, {"shape"});
  m.node("Reshape", {"x", "shape"}, {"y"});
  m.output("y", kFloat, 4);
  auto g = importBuilt(m.save(dir), {});
  ASSERT_TRUE(g);
  EXPECT_EQ(g->outputs()[0]->type().str(), "f32[2,3,2,3]");
}

TEST(OnnxImportBuilt, Uint8FoldsButIsRefusedAtRunTime) {
  // XLNet builds masks from arange(dtype=uint8): constants that fold (a
  // Cast to uint8 wraps at 256). A uint8 value the graph would compute on
  // at run time is one error line.
  for (bool runtime : {false, true}) {
    TempDir dir;
    ModelBuilder m;
    m.input("x", kFloat, {"2", "2"});
    m.initInts("v", {2}, {258, 1});
    ModelBuilder::attr(m.node("Cast", {"v"}, {"u"}), "to",
                       int64_t(onnx::TensorProto::UINT8));   // [2, 1]
    m.initInts("two", {1}, {2});
    ModelBuilder::attr(m.node("Cast", {"two"}, {"two_u"}), "to",
                       int64_t(onnx::TensorProto::UINT8));
    m.node("Equal", {"u", "two_u"}, {"eq"});                 // [true, false]
    if (runtime) {
      ModelBuilder::attr(m.node("Cast", {"x"}, {"xu"}), "to",
                         int64_t(onnx::TensorProto::UINT8));
      ModelBuilder::attr(m.node("Cast", {"xu"}, {"y"}), "to",
                         int64_t(onnx::TensorProto::FLOAT));
    } else {
      m.node("Where", {"eq", "x", "x"}, {"w"});
      m.node("Identity", {"w"}, {"y"});
    }
    m.output("y", kFloat, 2);
    if (runtime) {
      EXPECT_THAT(importError(m.save(dir), {}),
                  HasSubstr("computes on uint8 data (u8[2,2]) at run time"));
    } else {
      auto g = importBuilt(m.save(dir), {});
      ASSERT_TRUE(g);
      EXPECT_EQ(g->outputs()[0]->type().str(), "f32[2,2]");
    }
  }
}

TEST(OnnxImportBuilt, OneHotOfConstantsFolds) {
  // Mamba2's legacy export builds a shape with OneHot: index 1 of depth 3
  // with values [1, 4] is [1, 4, 1]; a negative index counts from the end.
  TempDir dir;
  ModelBuilder m;
  m.input("x", kFloat, {"4"});
  m.initInts("idx", {1}, {-2});
  m.initInts("depth", {1}, {3});
  m.initInts("values", {2}, {1, 4});
  m.initInts("zero", {1}, {0});
  m.node("OneHot", {"idx", "depth", "values"}, {"oh"});  // [[1, 4, 1]]
  m.node("Squeeze", {"oh", "zero"}, {"shape"});          // [1, 4, 1]
  m.node("Reshape", {"x", "shape"}, {"y"});
  m.output("y", kFloat, 3);
  auto g = importBuilt(m.save(dir), {});
  ASSERT_TRUE(g);
  EXPECT_EQ(g->outputs()[0]->type().str(), "f32[1,4,1]");
}

TEST(OnnxImportBuilt, EmbeddingPaddingIdxFromDynamoMetadata) {
  // aten.embedding(weight, ids, 0): the Gather carries padding_idx 0 for
  // its gradient; a Gather without the metadata has none.
  TempDir dir;
  ModelBuilder m;
  m.input("ids", onnx::TensorProto::INT64, {"2"});
  m.initFloats("table", {3, 2}, {1, 2, 3, 4, 5, 6});
  onnx::NodeProto &emb = m.node("Gather", {"table", "ids"}, {"e"});
  auto *meta = emb.add_metadata_props();
  meta->set_key("pkg.torch.onnx.fx_node");
  meta->set_value("%embedding : [num_users=1] = call_function[target=torch."
                  "ops.aten.embedding.default](args = (%p_table, %ids, 0), "
                  "kwargs = {})");
  m.node("Gather", {"table", "ids"}, {"f"});
  m.node("Add", {"e", "f"}, {"y"});
  m.output("y", kFloat, 2);
  auto g = importBuilt(m.save(dir), {});
  ASSERT_TRUE(g);
  std::vector<const Op *> gathers;
  for (const auto &op : g->ops())
    if (op->kind() == OpKind::Gather)
      gathers.push_back(op.get());
  ASSERT_EQ(gathers.size(), 2u);
  EXPECT_EQ(gathers[0]->getInt("padding_idx"), 0);
  EXPECT_FALSE(gathers[1]->hasAttr("padding_idx"));
}

TEST(OnnxImportBuilt, AZeroBiasOfAnotherShapeIsNoBias) {
  // PyTorch's exporter writes a Conv3d without bias as zeros of [M, 2].
  TempDir dir;
  ModelBuilder m;
  m.input("x", kFloat, {"1", "2", "3", "3", "3"});
  m.initFloats("w", {4, 2, 1, 1, 1}, std::vector<float>(8, 0.5f));
  m.initInts("zshape", {2}, {4, 2});
  m.node("ConstantOfShape", {"zshape"}, {"zeros"});
  m.node("Conv", {"x", "w", "zeros"}, {"y"});
  m.output("y", kFloat, 5);
  auto g = importBuilt(m.save(dir), {});
  ASSERT_TRUE(g);
  const Op *conv = onlyOp(*g, OpKind::Conv);
  ASSERT_TRUE(conv);
  EXPECT_EQ(conv->numOperands(), 2u);
  EXPECT_EQ(g->outputs()[0]->type().str(), "f32[1,4,3,3,3]");
}

TEST(OnnxImportBuilt, NoStatsBatchNormTrainsOnTheBatch) {
  // batch_norm(x, None, None, training=True) from the dynamo exporter: the
  // graph computes the statistics and feeds an inference-form op; the
  // node's fx_node metadata names aten._native_batch_norm_legit.no_stats.
  TempDir dir;
  ModelBuilder m;
  m.input("x", kFloat, {"4", "3", "2", "2"});
  m.input("mean", kFloat, {"3"});
  m.input("var", kFloat, {"3"});
  m.initFloats("scale", {3}, {1, 1, 1});
  m.initFloats("bias", {3}, {0, 0, 0});
  onnx::NodeProto &bn = m.node("BatchNormalization",
                               {"x", "scale", "bias", "mean", "var"}, {"y"});
  auto *meta = bn.add_metadata_props();
  meta->set_key("pkg.torch.onnx.fx_node");
  meta->set_value("%bn = call_function[target=torch.ops.aten._native_batch_"
                  "norm_legit.no_stats](args = (%x, None, None, True, 0.0, "
                  "1e-05), kwargs = {})");
  m.output("y", kFloat, 4);
  auto g = importBuilt(m.save(dir), {});
  ASSERT_TRUE(g);
  const Op *op = onlyOp(*g, OpKind::BatchNormalization);
  ASSERT_TRUE(op);
  EXPECT_EQ(op->getInt("training_mode"), 1);
}

TEST(OnnxImportBuilt, EinsumIsAMatMulBetweenTransposes) {
  // XLNet's form: "ibnd,jbnd->bnij" contracts d, batches b and n.
  TempDir dir;
  ModelBuilder m;
  m.input("q", kFloat, {"5", "2", "3", "4"});
  m.input("k", kFloat, {"6", "2", "3", "4"});
  ModelBuilder::attr(m.node("Einsum", {"q", "k"}, {"y"}), "equation",
                     std::string("ibnd,jbnd->bnij"));
  m.output("y", kFloat, 4);
  auto g = importBuilt(m.save(dir), {});
  ASSERT_TRUE(g);
  ASSERT_TRUE(onlyOp(*g, OpKind::MatMul));
  EXPECT_EQ(g->outputs()[0]->type().str(), "f32[2,3,5,6]");
}

TEST(OnnxImportBuilt, EinsumWithEllipsisIsOneLine) {
  TempDir dir;
  ModelBuilder m;
  m.input("a", kFloat, {"2", "3", "4"});
  m.input("b", kFloat, {"2", "4", "5"});
  ModelBuilder::attr(m.node("Einsum", {"a", "b"}, {"y"}), "equation",
                     std::string("...ij,...jk->...ik"));
  m.output("y", kFloat, 3);
  std::string msg = importError(m.save(dir), {});
  EXPECT_THAT(msg, HasSubstr("Einsum '...ij,...jk->...ik': \"...\" "
                             "(broadcast dims) is not supported"));
  EXPECT_EQ(msg.find('\n'), std::string::npos);
}

TEST(OnnxImportBuilt, OpsetOutsideTheSupportedRange) {
  TempDir dir;
  ModelBuilder m(6);
  m.input("x", kFloat, {"2"});
  m.node("Relu", {"x"}, {"y"});
  m.output("y", kFloat, 1);
  std::string path = m.save(dir);
  EXPECT_THAT(importError(path, {}),
              HasSubstr("uses opset 6 of the default ONNX domain; cleave "
                        "supports opsets 7 to 28"));
}

TEST(OnnxImportBuilt, OldSoftmaxFlattensAtItsAxis) {
  // Before opset 13, Softmax normalizes over all dims from `axis` on
  // (default 1): imported as reshape, softmax over the last dim, reshape.
  TempDir dir;
  ModelBuilder m(12);
  m.input("x", kFloat, {"2", "3", "4"});
  m.node("Softmax", {"x"}, {"y"});
  m.output("y", kFloat, 3);
  auto g = importBuilt(m.save(dir), {});
  ASSERT_TRUE(g);
  ASSERT_EQ(g->ops().size(), 3u);
  EXPECT_EQ(g->ops()[0]->kind(), OpKind::Reshape);
  EXPECT_EQ(g->ops()[0]->result()->type().str(), "f32[2,12]");
  EXPECT_EQ(g->ops()[1]->kind(), OpKind::Softmax);
  EXPECT_EQ(g->ops()[2]->result()->type().str(), "f32[2,3,4]");
}

TEST(OnnxImportBuilt, UnsupportedOpNamesTheNode) {
  TempDir dir;
  ModelBuilder m;
  m.input("x", kFloat, {"2"});
  m.node("Det", {"x"}, {"y"}, "/act/Det");
  m.output("y", kFloat, 1);
  std::string msg = importError(m.save(dir), {});
  EXPECT_THAT(msg, HasSubstr("unsupported op 'Det'"));
  EXPECT_THAT(msg, HasSubstr("at node '/act/Det'"));
  EXPECT_EQ(msg.find('\n'), std::string::npos);
}

TEST(OnnxImportBuilt, SymbolicDimPastAxisZero) {
  TempDir dir;
  ModelBuilder m;
  m.input("tokens", kInt64, {"batch", "seq"});
  m.node("Identity", {"tokens"}, {"y"});
  m.output("y", kInt64, 2);
  std::string path = m.save(dir);
  std::string msg = importError(path, {});
  EXPECT_THAT(msg, HasSubstr("input 'tokens' has a symbolic dimension 'batch' "
                             "at axis 0"));
  msg = importError(path, microbatch4());
  EXPECT_THAT(msg, HasSubstr("input 'tokens' has a symbolic dimension 'seq' at "
                             "axis 1; bind it with --input-shape "
                             "tokens=d0,d1,..."));
  EXPECT_THAT(msg, Not(HasSubstr("--microbatch-size")));
  frontend::ImportOptions both = microbatch4();
  both.inputShapes["tokens"] = {4, 7};
  auto g = importBuilt(path, both);
  ASSERT_TRUE(g);
  EXPECT_EQ(g->lookup("tokens")->type().str(), "i64[4,7]");
}

TEST(OnnxImportBuilt, UnsupportedElementTypeNamesTheInput) {
  TempDir dir;
  ModelBuilder m;
  m.input("pixels", onnx::TensorProto::UINT8, {"2"});
  m.node("Identity", {"pixels"}, {"y"});
  m.output("y", onnx::TensorProto::UINT8, 1);
  EXPECT_THAT(importError(m.save(dir), {}),
              HasSubstr("graph input 'pixels': element type uint8 is not "
                        "supported"));
}

TEST(OnnxImportBuilt, ConvAutoPadSameUpper) {
  // 6 wide, kernel 3, stride 2: 3 outputs need 1 pad, at the end for
  // SAME_UPPER and at the start for SAME_LOWER.
  for (const char *mode : {"SAME_UPPER", "SAME_LOWER"}) {
    SCOPED_TRACE(mode);
    TempDir dir;
    ModelBuilder m;
    m.input("x", kFloat, {"1", "1", "6", "6"});
    m.initFloats("w", {1, 1, 3, 3}, std::vector<float>(9, 1.0f));
    auto &conv = m.node("Conv", {"x", "w"}, {"y"});
    ModelBuilder::attr(conv, "auto_pad", std::string(mode));
    ModelBuilder::attr(conv, "strides", std::vector<int64_t>{2, 2});
    m.output("y", kFloat, 4);
    auto g = importBuilt(m.save(dir));
    ASSERT_TRUE(g);
    const Op *c = onlyOp(*g, OpKind::Conv);
    ASSERT_TRUE(c);
    std::vector<int64_t> want = std::string(mode) == "SAME_UPPER"
                                    ? std::vector<int64_t>{0, 0, 1, 1}
                                    : std::vector<int64_t>{1, 1, 0, 0};
    EXPECT_EQ(c->getInts("pads"), want);
    EXPECT_EQ(c->getInts("dilations"), (std::vector<int64_t>{1, 1}));
    EXPECT_EQ(g->outputs()[0]->type().str(), "f32[1,1,3,3]");
  }
}

TEST(OnnxImportBuilt, SplitWithoutSizesDividesEvenly) {
  TempDir dir;
  ModelBuilder m;
  m.input("x", kFloat, {"2", "6"});
  auto &split = m.node("Split", {"x"}, {"a", "b", "c"});
  ModelBuilder::attr(split, "axis", int64_t(1));
  for (const char *o : {"a", "b", "c"})
    m.output(o, kFloat, 2);
  auto g = importBuilt(m.save(dir));
  ASSERT_TRUE(g);
  const Op *s = onlyOp(*g, OpKind::Split);
  ASSERT_TRUE(s);
  EXPECT_EQ(s->getInts("split"), (std::vector<int64_t>{2, 2, 2}));
}

TEST(OnnxImportBuilt, SqueezeWithoutAxesDropsEveryUnitDim) {
  TempDir dir;
  ModelBuilder m;
  m.input("x", kFloat, {"1", "3", "1", "2"});
  m.node("Squeeze", {"x"}, {"y"});
  m.output("y", kFloat, 2);
  auto g = importBuilt(m.save(dir));
  ASSERT_TRUE(g);
  EXPECT_EQ(g->outputs()[0]->type().str(), "f32[3,2]");
  EXPECT_EQ(onlyOp(*g, OpKind::Squeeze)->getInts("axes"),
            (std::vector<int64_t>{0, 2}));
}

TEST(OnnxImportBuilt, InitializersAreClassifiedByUse) {
  // w is trained (reaches the float output through Mul); threshold only
  // feeds a comparison (buffer); ids is an integer tensor (const).
  TempDir dir;
  ModelBuilder m;
  m.input("x", kFloat, {"3"});
  m.initFloats("w", {3}, {1, 2, 3});
  m.initFloats("threshold", {3}, {0, 0, 0});
  m.initFloats("table", {4, 3}, std::vector<float>(12, 0.5f));
  m.initInts("ids", {2}, {0, 3});
  m.node("Mul", {"x", "w"}, {"xw"});
  m.node("Greater", {"xw", "threshold"}, {"pos"});
  m.node("Where", {"pos", "xw", "x"}, {"y"});
  m.node("Gather", {"table", "ids"}, {"rows"});
  m.output("y", kFloat, 1);
  m.output("rows", kFloat, 2);
  auto g = importBuilt(m.save(dir));
  ASSERT_TRUE(g);
  EXPECT_EQ(g->lookup("w")->kind(), ValueKind::Param);
  EXPECT_EQ(g->lookup("threshold")->kind(), ValueKind::Buffer);
  EXPECT_EQ(g->lookup("table")->kind(), ValueKind::Param);
  EXPECT_EQ(g->lookup("ids")->kind(), ValueKind::Const);
}

TEST(OnnxImportBuilt, FrozenMetadataKeepsParametersFixed) {
  // cleave.frozen (examples/pytorch/annotate_export.py) lists the module's
  // requires_grad=False parameters; a name the graph lacks is ignored.
  TempDir dir;
  ModelBuilder m;
  m.input("x", kFloat, {"3"});
  m.initFloats("w", {3}, {1, 2, 3});
  m.initFloats("pos", {3}, {0.5f, 0.25f, 0.125f});
  m.node("Mul", {"x", "w"}, {"xw"});
  m.node("Add", {"xw", "pos"}, {"y"});
  m.output("y", kFloat, 1);
  auto *meta = m.model().add_metadata_props();
  meta->set_key("cleave.frozen");
  meta->set_value("pos\nm.gone.weight\n");
  auto g = importBuilt(m.save(dir));
  ASSERT_TRUE(g);
  EXPECT_EQ(g->lookup("w")->kind(), ValueKind::Param);
  EXPECT_EQ(g->lookup("pos")->kind(), ValueKind::Buffer);
}

TEST(OnnxImportBuilt, ParameterListMetadataSaysWhatALegacyExportTrains) {
  // No signature (a legacy export): without cleave.parameters a
  // one-element initializer is held (a scale, by the name-and-size guess);
  // with the list annotate_export.py writes, exactly the listed ones train:
  // a Conv1d(3, 1)'s one-element bias does, an unlisted vector does not,
  // a listed but frozen one does not.
  for (bool listed : {false, true}) {
    TempDir dir;
    ModelBuilder m;
    m.input("x", kFloat, {"3"});
    m.initFloats("m.agg.weight", {3}, {1, 2, 3});
    m.initFloats("m.agg.bias", {1}, {0.5f});
    m.initFloats("m.table", {3}, {0.5f, 0.25f, 0.125f});
    m.initFloats("m.frozen", {3}, {1, 1, 1});
    m.node("Mul", {"x", "m.agg.weight"}, {"a"});
    m.node("Add", {"a", "m.agg.bias"}, {"b"});
    m.node("Mul", {"b", "m.table"}, {"c"});
    m.node("Add", {"c", "m.frozen"}, {"y"});
    m.output("y", kFloat, 1);
    if (listed) {
      auto *meta = m.model().add_metadata_props();
      meta->set_key("cleave.parameters");
      meta->set_value("m.agg.weight\nm.agg.bias\nm.frozen\nm.other.weight");
      meta = m.model().add_metadata_props();
      meta->set_key("cleave.frozen");
      meta->set_value("m.frozen");
    }
    auto g = importBuilt(m.save(dir));
    ASSERT_TRUE(g);
    EXPECT_EQ(g->lookup("m.agg.weight")->kind(), ValueKind::Param);
    EXPECT_EQ(g->lookup("m.agg.bias")->kind(),
              listed ? ValueKind::Param : ValueKind::Buffer);
    EXPECT_EQ(g->lookup("m.table")->kind(),
              listed ? ValueKind::Buffer : ValueKind::Param);
    EXPECT_EQ(g->lookup("m.frozen")->kind(),
              listed ? ValueKind::Buffer : ValueKind::Param);
  }
}

TEST(OnnxImportBuilt, PaddingIdxMetadataMarksTheEmbeddingGather) {
  // cleave.padding_idx (annotate_export.py) for a legacy export, which has
  // no node metadata; a malformed line is one error naming the key.
  for (std::string value : {"table 2", "table two"}) {
    TempDir dir;
    ModelBuilder m;
    m.input("ids", onnx::TensorProto::INT64, {"2"});
    m.initFloats("table", {3, 2}, {1, 2, 3, 4, 5, 6});
    m.node("Gather", {"table", "ids"}, {"y"});
    m.output("y", kFloat, 2);
    auto *meta = m.model().add_metadata_props();
    meta->set_key("cleave.padding_idx");
    meta->set_value(value);
    if (value == "table 2") {
      auto g = importBuilt(m.save(dir), {});
      ASSERT_TRUE(g);
      const Op *op = onlyOp(*g, OpKind::Gather);
      ASSERT_TRUE(op);
      EXPECT_EQ(op->getInt("padding_idx"), 2);
    } else {
      EXPECT_THAT(importError(m.save(dir), {}),
                  HasSubstr("metadata cleave.padding_idx line 'table two'"));
    }
  }
}

TEST(OnnxImportBuilt, ClipBoundsFromFloatInitializers) {
  // Clip min/max (and Dropout ratio, Pad constant_value) may be float
  // scalar initializers, as exporters with constant folding write them.
  TempDir dir;
  ModelBuilder m;
  m.input("x", kFloat, {"4"});
  m.initFloats("lo", {}, {0.0f});
  m.initFloats("hi", {}, {6.0f});
  m.node("Clip", {"x", "lo", "hi"}, {"y"}, "/relu6");
  m.output("y", kFloat, 1);
  auto g = frontend::importOnnxFile(m.save(dir));
  ASSERT_TRUE(bool(g)) << llvm::toString(g.takeError());
  const Op *clip = onlyOp(**g, OpKind::Clip);
  ASSERT_TRUE(clip);
  EXPECT_EQ(clip->getFloat("min"), 0.0f);
  EXPECT_EQ(clip->getFloat("max"), 6.0f);
}

TEST(OnnxImportBuilt, ClipBoundsFromConstantNodes) {
  TempDir dir;
  ModelBuilder m;
  m.input("x", kFloat, {"4"});
  auto &lo = m.node("Constant", {}, {"lo"});
  auto *a = lo.add_attribute();
  a->set_name("value_float");
  a->set_type(onnx::AttributeProto::FLOAT);
  a->set_f(-1.5f);
  m.node("Clip", {"x", "lo"}, {"y"});
  m.output("y", kFloat, 1);
  auto g = importBuilt(m.save(dir));
  ASSERT_TRUE(g);
  const Op *clip = onlyOp(*g, OpKind::Clip);
  ASSERT_TRUE(clip);
  EXPECT_EQ(clip->getFloat("min"), -1.5f);
  EXPECT_FALSE(clip->hasAttr("max"));
}

// ConvTranspose: the IR's ConvTranspose of the shape ONNX gives (pads,
// output_padding, strides, group; or output_shape with auto_pad's split of
// the padding), the bias added per channel; bad attributes in one line.
TEST(OnnxImportBuilt, ConvTransposeShapesAndErrors) {
  struct Case {
    std::vector<int64_t> strides, pads, outPad, outShape;
    int64_t group;
    std::string autoPad, want, error;
  };
  const Case cases[] = {
      {{2, 2}, {1, 1, 1, 1}, {1, 1}, {}, 2, "", "f32[1,6,8,10]", ""},
      {{2, 2}, {}, {}, {}, 1, "", "f32[1,6,9,11]", ""},
      {{2, 2}, {}, {}, {8, 10}, 1, "SAME_UPPER", "f32[1,6,8,10]", ""},
      {{2, 2}, {}, {2, 0}, {}, 1, "", "",
       "output_padding below the stride or the dilation"},
      {{1, 1}, {}, {}, {}, 3, "", "", "does not fit X"},
      {{2, 2}, {}, {}, {20, 10}, 1, "", "", "larger than the transposed"},
  };
  for (const Case &c : cases) {
    SCOPED_TRACE(c.want + c.error);
    TempDir dir;
    ModelBuilder m(17);
    m.input("x", kFloat, {"1", "4", "4", "5"});
    m.initFloats("w", {4, 6 / c.group, 3, 3},
                 std::vector<float>(size_t(4 * (6 / c.group) * 9), 0.5f));
    m.initFloats("b", {6}, std::vector<float>(6, 0.25f));
    auto &n = m.node("ConvTranspose", {"x", "w", "b"}, {"y"});
    ModelBuilder::attr(n, "strides", c.strides);
    ModelBuilder::attr(n, "group", c.group);
    if (!c.pads.empty())
      ModelBuilder::attr(n, "pads", c.pads);
    if (!c.outPad.empty())
      ModelBuilder::attr(n, "output_padding", c.outPad);
    if (!c.outShape.empty())
      ModelBuilder::attr(n, "output_shape", c.outShape);
    if (!c.autoPad.empty())
      ModelBuilder::attr(n, "auto_pad", c.autoPad);
    m.output("y", kFloat, 4);
    if (!c.error.empty()) {
      auto g = frontend::importOnnxFile(m.save(dir), {});
      ASSERT_FALSE(bool(g));
      std::string msg = llvm::toString(g.takeError());
      EXPECT_NE(msg.find(c.error), std::string::npos) << msg;
      EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;
      continue;
    }
    auto g = importBuilt(m.save(dir));
    ASSERT_TRUE(g);
    const Op *t = onlyOp(*g, OpKind::ConvTranspose);
    ASSERT_TRUE(t);
    EXPECT_EQ(t->result()->type().str(), c.want);
    EXPECT_EQ(g->outputs()[0]->type().str(), c.want); // after the bias
  }
}

// GRU and RNN are unrolled (frontend/Decompose.h); what they do not run is
// refused in one line naming it: sequence_lens, another activation, more
// activations than directions, clip.
TEST(OnnxImportBuilt, RecurrentRefusalsNameWhatIsNotSupported) {
  struct Case {
    std::string op;
    bool seqLens;
    std::vector<std::string> activations;
    bool clip;
    std::string error;
  };
  const Case cases[] = {
      {"GRU", false, {}, false, ""},
      {"GRU", false, {"Sigmoid", "Tanh"}, false, ""},
      {"GRU", true, {}, false, "sequence_lens is not supported"},
      {"GRU", false, {"Sigmoid", "Relu"}, false, "only the default activations"},
      {"GRU", false, {}, true, "clip are not supported"},
      {"RNN", false, {"Relu"}, false, ""},
      {"RNN", false, {"Sigmoid"}, false, ""},
      {"RNN", false, {"Elu"}, false, "RNN activation 'Elu' is not supported"},
      {"RNN", false, {"Relu", "Tanh", "Relu"}, false,
       "an RNN takes one activation a direction, not 3"},
  };
  for (const Case &c : cases) {
    SCOPED_TRACE(c.op + ": " + c.error);
    TempDir dir;
    ModelBuilder m(17);
    int gates = c.op == "GRU" ? 3 : 1;
    m.input("x", kFloat, {"5", "2", "3"});
    m.initFloats("w", {1, 4 * gates, 3}, std::vector<float>(12 * gates, 0.1f));
    m.initFloats("r", {1, 4 * gates, 4}, std::vector<float>(16 * gates, 0.1f));
    m.initFloats("b", {1, 8 * gates}, std::vector<float>(8 * gates, 0.1f));
    std::vector<std::string> ins{"x", "w", "r", "b"};
    if (c.seqLens) {
      m.initInts("lens", {2}, {5, 5});
      ins.push_back("lens");
    }
    auto &n = m.node(c.op, ins, {"y", "yh"});
    ModelBuilder::attr(n, "hidden_size", int64_t(4));
    if (!c.activations.empty()) {
      auto *a = n.add_attribute();
      a->set_name("activations");
      a->set_type(onnx::AttributeProto::STRINGS);
      for (const std::string &s : c.activations)
        a->add_strings(s);
    }
    if (c.clip) {
      auto *a = n.add_attribute();
      a->set_name("clip");
      a->set_type(onnx::AttributeProto::FLOAT);
      a->set_f(1.0f);
    }
    m.output("y", kFloat, 4);
    m.output("yh", kFloat, 3);
    if (c.error.empty()) {
      auto g = importBuilt(m.save(dir));
      ASSERT_TRUE(g);
      EXPECT_EQ(g->outputs()[0]->type().str(), "f32[5,1,2,4]");
      EXPECT_EQ(g->outputs()[1]->type().str(), "f32[1,2,4]");
      continue;
    }
    auto g = frontend::importOnnxFile(m.save(dir), {});
    ASSERT_FALSE(bool(g));
    std::string msg = llvm::toString(g.takeError());
    EXPECT_NE(msg.find(c.error), std::string::npos) << msg;
    EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;
  }
}

namespace {

// A body input or output of a tensor type (rank given, sizes unknown).
void bodyValue(google::protobuf::RepeatedPtrField<onnx::ValueInfoProto> *list,
               const std::string &name, int elemType, int rank) {
  auto *v = list->Add();
  v->set_name(name);
  auto *t = v->mutable_type()->mutable_tensor_type();
  t->set_elem_type(elemType);
  auto *shape = t->mutable_shape();
  for (int i = 0; i < rank; ++i)
    shape->add_dim();
}

void bodySequence(google::protobuf::RepeatedPtrField<onnx::ValueInfoProto> *list,
                  const std::string &name, int elemType) {
  auto *v = list->Add();
  v->set_name(name);
  v->mutable_type()
      ->mutable_sequence_type()
      ->mutable_elem_type()
      ->mutable_tensor_type()
      ->set_elem_type(elemType);
}

onnx::NodeProto *bodyNode(onnx::GraphProto &g, const std::string &op,
                          const std::vector<std::string> &in,
                          const std::vector<std::string> &out) {
  auto *n = g.add_node();
  n->set_op_type(op);
  n->set_name("/body/" + op + std::to_string(g.node_size()));
  for (const auto &i : in)
    n->add_input(i);
  for (const auto &o : out)
    n->add_output(o);
  return n;
}

// torch.tensor_split(x, 2, dim=1) as the legacy exporter writes it: a Loop
// of a constant trip count whose body slices x at i * 3 and inserts the
// slice into a sequence (also scanned out), then SequenceAt picks the
// parts; and an If on a condition that folds.
void buildSplitLoop(ModelBuilder &m, bool runtimeTrips) {
  m.input("x", kFloat, {"4", "6"});
  if (runtimeTrips)
    m.input("trips", kInt64, {});
  else
    m.initInts("trips", {}, {2});
  m.initInts("one", {}, {1});
  m.initInts("three", {}, {3});
  m.initInts("zero1", {1}, {0});
  m.initInts("axis1", {1}, {1});
  ModelBuilder::attr(m.node("Cast", {"one"}, {"true"}), "to",
                     int64_t(onnx::TensorProto::BOOL));
  onnx::NodeProto &empty = m.node("SequenceEmpty", {}, {"seq0"});
  ModelBuilder::attr(empty, "dtype", int64_t(onnx::TensorProto::FLOAT));
  onnx::NodeProto &loop =
      m.node("Loop", {"trips", "true", "seq0"}, {"parts", "stacked"}, "/split");
  auto *a = loop.add_attribute();
  a->set_name("body");
  a->set_type(onnx::AttributeProto::GRAPH);
  onnx::GraphProto &body = *a->mutable_g();
  body.set_name("split_body");
  bodyValue(body.mutable_input(), "i", kInt64, 0);
  bodyValue(body.mutable_input(), "c", onnx::TensorProto::BOOL, 0);
  bodySequence(body.mutable_input(), "s", kFloat);
  bodyNode(body, "Mul", {"i", "three"}, {"start"});
  bodyNode(body, "Add", {"start", "three"}, {"end"});
  bodyNode(body, "Unsqueeze", {"start", "zero1"}, {"starts"});
  bodyNode(body, "Unsqueeze", {"end", "zero1"}, {"ends"});
  bodyNode(body, "Slice", {"x", "starts", "ends", "axis1"}, {"part"});
  bodyNode(body, "SequenceInsert", {"s", "part"}, {"s2"});
  bodyNode(body, "Identity", {"c"}, {"c2"});
  bodyValue(body.mutable_output(), "c2", onnx::TensorProto::BOOL, 0);
  bodySequence(body.mutable_output(), "s2", kFloat);
  bodyValue(body.mutable_output(), "part", kFloat, 2);
  m.initInts("first", {}, {0});
  m.initInts("second", {}, {-1});
  m.node("SequenceAt", {"parts", "first"}, {"a"});
  m.node("SequenceAt", {"parts", "second"}, {"b"});
  m.node("Sub", {"b", "a"}, {"d"});
  // If (a folded shape test): the then branch negates.
  m.node("Shape", {"d"}, {"dshape"});
  m.node("Gather", {"dshape", "one"}, {"cols"});
  m.node("Equal", {"cols", "three"}, {"isThree"});
  onnx::NodeProto &iff = m.node("If", {"isThree"}, {"y"}, "/pick");
  for (const char *branch : {"then_branch", "else_branch"}) {
    auto *ba = iff.add_attribute();
    ba->set_name(branch);
    ba->set_type(onnx::AttributeProto::GRAPH);
    onnx::GraphProto &g = *ba->mutable_g();
    g.set_name(branch);
    bool then = std::string(branch) == "then_branch";
    bodyNode(g, then ? "Neg" : "Identity", {"d"}, {then ? "neg" : "same"});
    bodyValue(g.mutable_output(), then ? "neg" : "same", kFloat, 2);
  }
  m.output("y", kFloat, 2);
  m.output("stacked", kFloat, 3);
}

} // namespace

TEST(OnnxImportBuilt, LoopOfConstantTripsUnrollsIfOfFoldedConditionInlines) {
  TempDir dir;
  ModelBuilder m;
  buildSplitLoop(m, false);
  auto g = importBuilt(m.save(dir), {});
  ASSERT_TRUE(g);
  int slices = 0, negs = 0, concats = 0;
  for (const auto &op : g->ops()) {
    slices += op->kind() == OpKind::Slice;
    negs += op->kind() == OpKind::Neg;
    concats += op->kind() == OpKind::Concat;
  }
  EXPECT_EQ(slices, 2); // one per iteration
  EXPECT_EQ(negs, 1);   // the then branch: d has 3 columns
  EXPECT_EQ(concats, 1); // the scan output stacks the two slices
  EXPECT_EQ(g->outputs()[0]->type().str(), "f32[4,3]");
  EXPECT_EQ(g->outputs()[1]->type().str(), "f32[2,4,3]");
}

TEST(OnnxImportBuilt, LoopOfRuntimeTripsIsRefused) {
  TempDir dir;
  ModelBuilder m;
  buildSplitLoop(m, true);
  std::string err = importError(m.save(dir), {});
  EXPECT_NE(err.find("the trip count"), std::string::npos) << err;
  EXPECT_NE(err.find("/split"), std::string::npos) << err;
}

TEST(OnnxImportBuilt, GridSampleBicubicIsRefusedInOneLine) {
  // F.grid_sample(mode="bicubic") through the legacy exporter (opset 16
  // spelling): cleave computes linear and nearest only.
  TempDir dir;
  ModelBuilder m(17);
  m.input("x", kFloat, {"1", "2", "4", "5"});
  m.input("grid", kFloat, {"1", "3", "3", "2"});
  onnx::NodeProto &n = m.node("GridSample", {"x", "grid"}, {"y"}, "/warp");
  ModelBuilder::attr(n, "mode", std::string("bicubic"));
  m.output("y", kFloat, 4);
  std::string err = importError(m.save(dir), {});
  EXPECT_NE(err.find("mode 'cubic' is not supported"), std::string::npos)
      << err;
  EXPECT_NE(err.find("/warp"), std::string::npos) << err;
  EXPECT_EQ(err.find('\n'), std::string::npos) << err;
}

TEST(OnnxImportBuilt, TorchCallArgsReadsTheDynamoMetadata) {
  onnx::NodeProto n;
  auto *meta = n.add_metadata_props();
  meta->set_key("pkg.torch.onnx.fx_node");
  meta->set_value("%l : [num_users=1] = call_function[target=torch.ops.aten."
                  "cross_entropy_loss.default](args = (%x, %t, None, 1, "
                  "[2, 3], (4, 5)), kwargs = {label_smoothing: 0.1})");
  auto args = frontend::torchCallArgs(n, "aten.cross_entropy_loss.default");
  ASSERT_TRUE(args.has_value());
  EXPECT_THAT(*args, ::testing::ElementsAre("%x", "%t", "None", "1", "[2, 3]",
                                            "(4, 5)", "label_smoothing=0.1"));
  EXPECT_FALSE(frontend::torchCallArgs(n, "aten.cross_entropy_loss"));
  EXPECT_FALSE(frontend::torchCallArgs(onnx::NodeProto(), "aten.embedding.default"));
}

namespace {

// The imported graph's first output, run on the CPU backend.
double runFirstOutput(const Graph &g) {
  static auto backend = runtime::createCpuBackend(1);
  auto in = interp::Interpreter::create(g, *backend);
  if (!in) {
    ADD_FAILURE() << llvm::toString(in.takeError());
    return NAN;
  }
  auto out = (*in)->run({});
  if (!out) {
    ADD_FAILURE() << llvm::toString(out.takeError());
    return NAN;
  }
  return (*out)[0]->getDouble(0);
}

// F.cross_entropy(scores, target, weight, ignore_index=..., label_smoothing=
// e) as the dynamo exporter writes it: SoftmaxCrossEntropyLoss with the
// call in the node's metadata (the op itself has no smoothing).
std::unique_ptr<Graph> importCrossEntropy(const TempDir &dir, bool probabilities,
                                          const std::string &call) {
  ModelBuilder m;
  m.initFloats("scores", {4, 3},
               {0.3f, -1.2f, 2.0f, 0.5f, 0.1f, -0.4f, 1.5f, 1.0f, -2.0f, -0.7f, 0.2f, 0.9f});
  if (probabilities)
    m.initFloats("target", {4, 3},
                 {0.2f, 0.3f, 0.5f, 1.0f, 0.0f, 0.0f, 0.6f, 0.2f, 0.2f, 0.1f, 0.1f, 0.8f});
  else
    m.initInts("target", {4}, {0, 1, 2, 1});
  m.initFloats("weight", {3}, {0.5f, 1.0f, 2.0f});
  onnx::NodeProto &n =
      m.node("SoftmaxCrossEntropyLoss", {"scores", "target", "weight"}, {"loss"});
  if (!probabilities)
    ModelBuilder::attr(n, "ignore_index", int64_t(1));
  ModelBuilder::attr(n, "reduction", std::string("mean"));
  if (!call.empty()) {
    auto *meta = n.add_metadata_props();
    meta->set_key("pkg.torch.onnx.fx_node");
    meta->set_value("%l = call_function[target=torch.ops.aten.cross_entropy_"
                    "loss.default](args = (%scores, %target, %weight, 1, " +
                    call + "), kwargs = {})");
  }
  m.output("loss", kFloat, 0);
  return importBuilt(m.save(dir), {});
}

} // namespace

TEST(OnnxImportBuilt, CrossEntropyLabelSmoothingFromDynamoMetadata) {
  // PyTorch's formula in double: (1 - e) * NLL + e / C * the mean of
  // -sum_c w_c log p_c, both over the weights of the labels not ignored.
  const double s[4][3] = {{0.3, -1.2, 2.0}, {0.5, 0.1, -0.4}, {1.5, 1.0, -2.0},
                          {-0.7, 0.2, 0.9}};
  const int y[4] = {0, 1, 2, 1};
  const double w[3] = {0.5, 1.0, 2.0}, e = 0.2;
  double nll = 0, smooth = 0, den = 0;
  for (int i = 0; i < 4; ++i) {
    double lse = std::log(std::exp(s[i][0]) + std::exp(s[i][1]) + std::exp(s[i][2]));
    if (y[i] == 1) // ignore_index
      continue;
    nll -= w[y[i]] * (s[i][y[i]] - lse);
    for (int c = 0; c < 3; ++c)
      smooth -= w[c] * (s[i][c] - lse);
    den += w[y[i]];
  }
  double expect = (1 - e) * nll / den + e / 3 * smooth / den;
  TempDir dir;
  auto g = importCrossEntropy(dir, false, "1, 0.2");
  ASSERT_TRUE(g);
  EXPECT_NEAR(runFirstOutput(*g), expect, 1e-5);
  // Without the metadata the op is ONNX's: no smoothing.
  TempDir dir2;
  auto plain = importCrossEntropy(dir2, false, "");
  ASSERT_TRUE(plain);
  EXPECT_NEAR(runFirstOutput(*plain), nll / den, 1e-5);
  EXPECT_GT(std::abs(expect - nll / den), 1e-2); // the test can tell them apart
}

TEST(OnnxImportBuilt, CrossEntropyProbabilityTargetsFromDynamoMetadata) {
  // -sum_c w_c t'_c log p_c per row, t' = t (1 - e) + e / C, the mean over
  // the rows (not over the weights).
  const double s[4][3] = {{0.3, -1.2, 2.0}, {0.5, 0.1, -0.4}, {1.5, 1.0, -2.0},
                          {-0.7, 0.2, 0.9}};
  const double t[4][3] = {{0.2, 0.3, 0.5}, {1.0, 0.0, 0.0}, {0.6, 0.2, 0.2},
                          {0.1, 0.1, 0.8}};
  const double w[3] = {0.5, 1.0, 2.0}, e = 0.1;
  double sum = 0;
  for (int i = 0; i < 4; ++i) {
    double lse = std::log(std::exp(s[i][0]) + std::exp(s[i][1]) + std::exp(s[i][2]));
    for (int c = 0; c < 3; ++c)
      sum -= w[c] * (t[i][c] * (1 - e) + e / 3) * (s[i][c] - lse);
  }
  TempDir dir;
  auto g = importCrossEntropy(dir, true, "-100, 0.1");
  ASSERT_TRUE(g);
  EXPECT_NEAR(runFirstOutput(*g), sum / 4, 1e-5);
  // Float labels without PyTorch's call are not ONNX's op: refused.
  TempDir dir2;
  ModelBuilder m;
  m.initFloats("scores", {1, 2}, {0.f, 1.f});
  m.initFloats("target", {1, 2}, {0.5f, 0.5f});
  m.node("SoftmaxCrossEntropyLoss", {"scores", "target"}, {"loss"});
  m.output("loss", kFloat, 0);
  EXPECT_THAT(importError(m.save(dir2), {}), HasSubstr("labels must be an integer tensor"));
}

TEST(OnnxImportBuilt, AttentionDropoutOfAPyTorchExportTrains) {
  // F.scaled_dot_product_attention(..., dropout_p=0.2), either exporter:
  // a Dropout with a ratio and no training_mode (ONNX's inference
  // default), which PyTorch applies whenever the call asks for it; so it
  // trains, unless --module-mode=eval. Another producer's keeps ONNX's
  // meaning.
  auto build = [](const TempDir &dir, float p, const char *producer) {
    ModelBuilder m;
    m.model().set_producer_name(producer);
    m.input("x", kFloat, {"2", "4"});
    m.initFloats("ratio", {}, {p});
    m.node("Dropout", {"x", "ratio"}, {"y"}, "/m/Dropout");
    m.output("y", kFloat, 2);
    return m.save(dir);
  };
  auto trainingMode = [](const std::unique_ptr<Graph> &g) {
    const Op *drop = g ? onlyOp(*g, OpKind::Dropout) : nullptr;
    return drop ? drop->getInt("training_mode") : -1;
  };
  TempDir dir;
  auto g = importBuilt(build(dir, 0.2f, "pytorch"));
  EXPECT_EQ(trainingMode(g), 1);
  ASSERT_TRUE(g);
  EXPECT_FLOAT_EQ(onlyOp(*g, OpKind::Dropout)->getFloat("ratio"), 0.2f);
  frontend::ImportOptions eval;
  eval.moduleMode = frontend::ImportOptions::ModuleMode::Eval;
  EXPECT_EQ(trainingMode(importBuilt(build(dir, 0.2f, "pytorch"), eval)), 0);
  EXPECT_EQ(trainingMode(importBuilt(build(dir, 0.0f, "pytorch"))), 0);
  EXPECT_EQ(trainingMode(importBuilt(build(dir, 0.2f, "other"))), 0);
}

} // namespace unit_onnx_import_built
