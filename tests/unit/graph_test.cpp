// The Graph API (declarations, ops, use lists, renaming) and the verifier's
// checks on graphs built in C++.
#include "ir/Graph.h"
#include "ir/Verifier.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace unit_graph {

using namespace cleave::ir;
using ::testing::HasSubstr;

namespace {

TensorType f32(Shape s) { return TensorType(DType::F32, std::move(s)); }

std::shared_ptr<TensorData> zeros(Shape s) {
  TensorType t(DType::F32, s);
  return TensorData::fromDoubles(DType::F32, s,
                                 std::vector<double>(t.numElements(), 0.0));
}

// (user, operand index) pairs of a value's uses, for comparing use lists.
std::vector<std::pair<const Op *, unsigned>> usesOf(const Value *v) {
  std::vector<std::pair<const Op *, unsigned>> out;
  for (const Use &u : v->uses())
    out.push_back({u.user, u.operandIndex});
  return out;
}

using UseList = std::vector<std::pair<const Op *, unsigned>>;

std::string verifyMessage(const Graph &g) {
  return llvm::toString(verifyGraph(g));
}

// x:f32[2,3] -> Add(x, w) -> Relu -> output.
struct SmallGraph {
  Graph g;
  Value *x, *w;
  Op *add, *relu;
  SmallGraph() {
    x = g.addInput("x", f32({2, 3}));
    w = g.addParam("w", zeros({3}));
    add = g.appendOp(OpKind::Add, {x, w}, {f32({2, 3})}, {"sum"});
    relu = g.appendOp(OpKind::Relu, {add->result()}, {f32({2, 3})}, {"y"}, {},
                      "/act/Relu");
    g.addOutput(relu->result());
  }
};

} // namespace

TEST(Graph, BuildsValuesOpsAndUseLists) {
  SmallGraph s;
  EXPECT_EQ(s.g.name(), "main");
  EXPECT_EQ(s.x->kind(), ValueKind::Input);
  EXPECT_EQ(s.w->kind(), ValueKind::Param);
  EXPECT_EQ(s.w->type(), f32({3}));
  EXPECT_TRUE(s.w->isDeclared());
  EXPECT_EQ(s.add->result()->name(), "sum");
  EXPECT_EQ(s.add->result()->definingOp(), s.add);
  EXPECT_EQ(s.add->result()->kind(), ValueKind::Result);
  EXPECT_EQ(s.x->definingOp(), nullptr);
  EXPECT_EQ(usesOf(s.x), (UseList{{s.add, 0}}));
  EXPECT_EQ(usesOf(s.w), (UseList{{s.add, 1}}));
  EXPECT_EQ(usesOf(s.add->result()), (UseList{{s.relu, 0}}));
  EXPECT_FALSE(s.relu->result()->hasUses());
  EXPECT_TRUE(s.g.isOutput(s.relu->result()));
  EXPECT_EQ(s.g.lookup("y"), s.relu->result());
  EXPECT_EQ(s.g.lookup("nope"), nullptr);
  EXPECT_EQ(s.g.ops().size(), 2u);
  EXPECT_FALSE(bool(verifyGraph(s.g)));
}

TEST(Graph, SetOperandMovesTheUse) {
  SmallGraph s;
  s.add->setOperand(1, s.x);
  EXPECT_EQ(s.add->operand(1), s.x);
  EXPECT_FALSE(s.w->hasUses());
  EXPECT_EQ(usesOf(s.x), (UseList{{s.add, 0}, {s.add, 1}}));
  // Setting the same value again changes nothing.
  s.add->setOperand(1, s.x);
  EXPECT_EQ(usesOf(s.x).size(), 2u);
  EXPECT_FALSE(bool(verifyGraph(s.g)));
}

TEST(Graph, ReplaceAllUsesWithUpdatesOperandsAndOutputs) {
  SmallGraph s;
  Value *sum = s.add->result(), *y = s.relu->result();
  Op *neg = s.g.appendOp(OpKind::Neg, {y}, {f32({2, 3})}, {"n"});
  s.g.addOutput(neg->result());
  s.g.replaceAllUsesWith(y, sum);
  EXPECT_EQ(neg->operand(0), sum);
  EXPECT_FALSE(y->hasUses());
  EXPECT_EQ(usesOf(sum), (UseList{{s.relu, 0}, {neg, 0}}));
  ASSERT_EQ(s.g.outputs().size(), 2u);
  EXPECT_EQ(s.g.outputs()[0], sum);
  EXPECT_FALSE(s.g.isOutput(y));
  EXPECT_FALSE(bool(verifyGraph(s.g)));
}

TEST(Graph, EraseOpRemovesItsUsesAndResults) {
  SmallGraph s;
  Value *sum = s.add->result();
  s.g.replaceAllUsesWith(s.relu->result(), sum);
  s.g.eraseOp(s.relu);
  EXPECT_FALSE(sum->hasUses());
  EXPECT_EQ(s.g.lookup("y"), nullptr);
  ASSERT_EQ(s.g.ops().size(), 1u);
  EXPECT_EQ(s.g.ops()[0].get(), s.add);
  EXPECT_FALSE(bool(verifyGraph(s.g)));
  // The freed name can be used again.
  EXPECT_EQ(s.g.uniqueName("y"), "y");
}

TEST(Graph, EraseDeclaredRemovesTheValue) {
  SmallGraph s;
  Value *unused = s.g.addConst("c", zeros({2}));
  ASSERT_EQ(s.g.declared().size(), 2u);
  s.g.eraseDeclared(unused);
  EXPECT_EQ(s.g.declared().size(), 1u);
  EXPECT_EQ(s.g.lookup("c"), nullptr);
}

TEST(Graph, UniqueNameAndFreshResultNames) {
  SmallGraph s;
  EXPECT_EQ(s.g.uniqueName("z"), "z");
  EXPECT_EQ(s.g.uniqueName("x"), "x.1");
  s.g.addInput("x.1", f32({1}));
  EXPECT_EQ(s.g.uniqueName("x"), "x.2");
  // A clashing result name is made unique; an empty one gets a fresh name.
  Op *a = s.g.appendOp(OpKind::Relu, {s.x}, {f32({2, 3})}, {"x"});
  EXPECT_EQ(a->result()->name(), "x.2");
  Op *b = s.g.appendOp(OpKind::Relu, {s.x}, {f32({2, 3})});
  EXPECT_FALSE(b->result()->name().empty());
  EXPECT_EQ(s.g.lookup(b->result()->name()), b->result());
  Op *c = s.g.appendOp(OpKind::Relu, {s.x}, {f32({2, 3})});
  EXPECT_NE(b->result()->name(), c->result()->name());
}

TEST(Graph, SetKindChangesDeclaredTensors) {
  SmallGraph s;
  s.g.setKind(s.w, ValueKind::Buffer);
  EXPECT_EQ(s.w->kind(), ValueKind::Buffer);
  EXPECT_EQ(valueKindName(s.w->kind()), "buffer");
}

TEST(Graph, OpAttributesFallBackToDefaults) {
  Graph g;
  Value *x = g.addInput("x", f32({4}));
  Op *leaky = g.appendOp(OpKind::LeakyRelu, {x}, {f32({4})});
  EXPECT_FALSE(leaky->hasAttr("alpha"));
  EXPECT_FLOAT_EQ(leaky->getFloat("alpha"), 0.01f);
  leaky->setAttr("alpha", 0.2f);
  EXPECT_TRUE(leaky->hasAttr("alpha"));
  EXPECT_FLOAT_EQ(leaky->getFloat("alpha"), 0.2f);
  EXPECT_EQ(leaky->name(), "LeakyRelu");
}

TEST(Graph, DescribeNamesTheOnnxNodeOrTheResult) {
  SmallGraph s;
  EXPECT_EQ(s.relu->describe(), "Relu '/act/Relu'");
  EXPECT_EQ(s.add->describe(), "Add producing %sum");
}

// --- verifier ---------------------------------------------------------------

TEST(Verifier, CatchesAWrongResultType) {
  Graph g;
  Value *x = g.addInput("x", f32({2, 3}));
  Op *t = g.appendOp(OpKind::Transpose, {x}, {f32({2, 3})}, {"t"},
                     {{"perm", std::vector<int64_t>{1, 0}}}, "/T");
  g.addOutput(t->result());
  EXPECT_EQ(verifyMessage(g), "Transpose '/T': result %t has type f32[2,3] "
                              "but the op gives f32[3,2]");
}

TEST(Verifier, CatchesAMissingRequiredAttribute) {
  Graph g;
  Value *x = g.addInput("x", f32({2}));
  Op *c = g.appendOp(OpKind::Concat, {x, x}, {f32({4})}, {"c"});
  g.addOutput(c->result());
  EXPECT_EQ(verifyMessage(g),
            "Concat producing %c: missing required attribute 'axis'");
}

TEST(Verifier, CatchesAShapeErrorFromTheTypeRule) {
  Graph g;
  Value *a = g.addInput("a", f32({2, 3}));
  Value *b = g.addInput("b", f32({4, 5}));
  Op *m = g.appendOp(OpKind::MatMul, {a, b}, {f32({2, 5})}, {"m"}, {}, "/mm");
  g.addOutput(m->result());
  EXPECT_THAT(verifyMessage(g), HasSubstr("MatMul '/mm': inner dimensions"));
}

TEST(Verifier, CatchesUseBeforeDefinition) {
  Graph g;
  Value *x = g.addInput("x", f32({2}));
  Op *first = g.appendOp(OpKind::Relu, {x}, {f32({2})}, {"a"});
  Op *second = g.appendOp(OpKind::Neg, {x}, {f32({2})}, {"b"});
  first->setOperand(0, second->result());
  g.addOutput(first->result());
  EXPECT_EQ(verifyMessage(g), "Relu producing %a: operand 0 %b is used before "
                              "it is defined");
}

TEST(Verifier, CatchesAnOutputThatIsNotDefined) {
  Graph other;
  Value *stranger = other.addInput("elsewhere", f32({2}));
  Graph g;
  Value *x = g.addInput("x", f32({2}));
  g.addOutput(x);
  g.addOutput(stranger);
  EXPECT_EQ(verifyMessage(g), "output %elsewhere is not defined");
}

TEST(Verifier, CatchesAnOutputListedTwice) {
  Graph g;
  Value *x = g.addInput("x", f32({2}));
  g.addOutput(x);
  g.addOutput(x);
  EXPECT_EQ(verifyMessage(g), "output %x is listed twice");
}

TEST(Verifier, CatchesAGraphWithoutOutputs) {
  Graph g;
  g.setName("empty");
  g.addInput("x", f32({2}));
  EXPECT_EQ(verifyMessage(g), "graph @empty has no outputs");
}

TEST(Verifier, CatchesDeclaredDataOfTheWrongType) {
  SmallGraph s;
  s.w->setData(zeros({4}));
  EXPECT_EQ(verifyMessage(s.g),
            "param %w is declared f32[3] but its data is f32[4]");
  s.w->setData(nullptr);
  EXPECT_EQ(verifyMessage(s.g), "param %w has no data");
}

TEST(Verifier, CatchesNegativeDimensionsAndNamesTheValue) {
  Graph g;
  Value *x = g.addInput("onnx::x", f32({2, -1}));
  g.addOutput(x);
  EXPECT_EQ(verifyMessage(g),
            "value %\"onnx::x\": dimension 1 is negative (-1)");
}

TEST(Verifier, CatchesAWrongOperandCount) {
  Graph g;
  Value *x = g.addInput("x", f32({2}));
  Op *add = g.appendOp(OpKind::Add, {x}, {f32({2})}, {"s"});
  g.addOutput(add->result());
  EXPECT_EQ(verifyMessage(g), "Add producing %s: has 1 operands, expected 2");
}

} // namespace unit_graph
