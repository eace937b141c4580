"""Writes tests/models/gemm_gelu.onnx: a two-layer MLP whose hidden layer
is Gemm (with a bias) then Gelu(approximate="tanh"), as the pair a GPU runs
as one cuBLASLt call (Backend::fusesGemmGelu), and a mean-square loss; for
tests/lit/cleave-run/gemm-gelu.test. Run from the project root with the
corpus venv (onnx 1.23)."""
import numpy as np
import onnx
from onnx import helper, numpy_helper, TensorProto

rng = np.random.default_rng(7)
def weight(name, *shape):
    return numpy_helper.from_array(
        (rng.standard_normal(shape) * 0.5).astype(np.float32), name)

x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 8])
loss = helper.make_tensor_value_info("loss", TensorProto.FLOAT, [])
inits = [weight("w1", 8, 16), weight("b1", 16), weight("w2", 16, 4),
         weight("b2", 4)]
nodes = [
    helper.make_node("Gemm", ["x", "w1", "b1"], ["h"], name="fc1"),
    helper.make_node("Gelu", ["h"], ["a"], name="act", approximate="tanh"),
    helper.make_node("Gemm", ["a", "w2", "b2"], ["y"], name="fc2"),
    helper.make_node("Mul", ["y", "y"], ["y2"], name="square"),
    helper.make_node("ReduceMean", ["y2"], ["loss"], name="mean", keepdims=0),
]
g = helper.make_graph(nodes, "gemm_gelu", [x], [loss], inits)
m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 20)],
                      ir_version=10)
onnx.checker.check_model(m)
onnx.save(m, "tests/models/gemm_gelu.onnx")
