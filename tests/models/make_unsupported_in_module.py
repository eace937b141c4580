"""Writes tests/models/unsupported_in_module.onnx: one RandomUniformLike
(an op cleave lacks) named `n1` inside module m.blocks.0.drop_path, as a
dynamo export records it; for tests/lit/cleavec/unsupported-in-module.test.
Run from the project root with the corpus venv (onnx 1.23)."""
import onnx
from onnx import helper, TensorProto
x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])
y = helper.make_tensor_value_info("loss", TensorProto.FLOAT, [])
r = helper.make_node("RandomUniformLike", ["x"], ["r"], name="n1")
r.metadata_props.add(key="pkg.torch.onnx.name_scopes",
                     value="['', 'm', 'm.blocks.0', 'm.blocks.0.drop_path', 'bernoulli']")
a = helper.make_node("Mul", ["x", "r"], ["xr"], name="node_Mul_1")
l = helper.make_node("ReduceMean", ["xr"], ["loss"], name="node_ReduceMean_2", keepdims=0)
g = helper.make_graph([r, a, l], "drop_path", [x], [y])
m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 20)], ir_version=10)
onnx.checker.check_model(m)
onnx.save(m, "tests/models/unsupported_in_module.onnx")
