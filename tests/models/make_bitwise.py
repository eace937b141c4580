"""Writes tests/models/bitwise/: one opset-18 graph of ONNX's bitwise and
logical ops (BitwiseAnd, BitwiseOr, BitwiseXor, BitwiseNot on int32, int64
and int8, with broadcasting; Xor, And, Or, Not on bool; BitwiseOr of two
constants, which cleavec folds), the masks an integer attention mask makes
(CpmAnt's BitwiseOr / BitwiseAnd of int32 masks), OneHot of indices
computed at run time (the legacy export of a mixture-of-experts router;
negative and out-of-range indices, three axes, values given as an input),
and onnxruntime's outputs in expected/. nonzero.onnx is one NonZero node,
which cleave refuses (a result shaped by the data), onehot-depth.onnx a
OneHot of depth 2^40 (refused: no output could hold it). Run with the corpus venv (tests/models/corpus/make-venv.sh):
    $VENV/bin/python tests/models/make_bitwise.py
Two runs write identical files.
"""
import os
import shutil

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "bitwise")

TYPES = {np.float32: TensorProto.FLOAT, np.int32: TensorProto.INT32, np.int64: TensorProto.INT64,
         np.int8: TensorProto.INT8, np.bool_: TensorProto.BOOL}


def main():
    rng = np.random.default_rng(3)
    lo32, hi32 = np.iinfo(np.int32).min, np.iinfo(np.int32).max
    feeds = {
        # the extremes and -1 (every bit) beside random values
        "a32": np.array([[lo32, hi32, -1, 0, 5, -6],
                         [7, -8, 1 << 30, 12345, -99999, 3]], np.int32),
        "b32": rng.integers(lo32, hi32, 6, dtype=np.int64).astype(np.int32),
        "a64": np.array([np.iinfo(np.int64).min, -1, 1 << 40, 77], np.int64),
        "b64": np.array([-1, 1 << 40 | 3, 5, np.iinfo(np.int64).max],
                        np.int64),
        "a8": np.array([-128, 127, -1, 0, 85], np.int8),
        "b8": np.array([1, -86, 15, -1, 60], np.int8),
        "p": rng.integers(0, 2, (2, 6)).astype(np.bool_),
        "q": rng.integers(0, 2, (6,)).astype(np.bool_),
        "mask": np.array([[1, 1, 1, 0, 0, 0], [1, 1, 1, 1, 1, 0]], np.int32),
        "hot": np.array([[0, 2, -1], [5, -4, 1]], np.int64),
        "onoff": np.array([0.5, 2.0], np.float32),
    }
    nodes, outputs = [], []

    def node(op, ins, out, dtype):
        nodes.append(helper.make_node(op, ins, [out], name="/m/" + out))
        outputs.append(helper.make_tensor_value_info(out, TYPES[dtype], None))

    for suffix, dtype in (("32", np.int32), ("64", np.int64), ("8", np.int8)):
        a, b = "a" + suffix, "b" + suffix
        node("BitwiseAnd", [a, b], "and" + suffix, dtype)
        node("BitwiseOr", [a, b], "or" + suffix, dtype)
        node("BitwiseXor", [a, b], "xor" + suffix, dtype)
        node("BitwiseNot", [a], "not" + suffix, dtype)
    for op in ("Xor", "And", "Or"):
        node(op, ["p", "q"], op.lower() + "_bool", np.bool_)
    node("Not", ["p"], "not_bool", np.bool_)
    # A constant operand pair cleavec folds at import.
    c1 = numpy_helper.from_array(np.array([12, -16, 0, 1], np.int64), "c1")
    c2 = numpy_helper.from_array(np.array([3, 5, -1, 1], np.int64), "c2")
    nodes.append(helper.make_node("BitwiseOr", ["c1", "c2"], ["c12"],
                                  name="/m/c12"))
    node("Add", ["c12", "a64"], "folded64", np.int64)
    # CpmAnt's masks: key padding OR'ed with a direction flag, AND'ed
    # with a causal lower triangle, all int32.
    tril = numpy_helper.from_array(
        np.tril(np.ones((6, 6), np.int32)).reshape(1, 6, 6), "tril")
    flag = numpy_helper.from_array(np.array([[[0]], [[1]]], np.int32), "flag")
    nodes.append(helper.make_node("Unsqueeze", ["mask", "one"], ["mask3"],
                                  name="/m/mask3"))
    nodes.append(helper.make_node("BitwiseOr", ["mask3", "flag"], ["keys"],
                                  name="/m/keys"))
    node("BitwiseAnd", ["keys", "tril"], "mask_and", np.int32)
    one = numpy_helper.from_array(np.array([1], np.int64), "one")
    # OneHot of runtime indices: depth 4 (a constant), values constant or
    # an input.
    depth = numpy_helper.from_array(np.array(4, np.int64), "depth")
    offon = numpy_helper.from_array(np.array([0.0, 1.0], np.float32), "offon")
    for axis, out, values in ((-1, "onehot_last", "offon"),
                              (1, "onehot_mid", "onoff"),
                              (0, "onehot_first", "offon")):
        nodes.append(helper.make_node("OneHot", ["hot", "depth", values], [out],
                                      name="/m/" + out, axis=axis))
        outputs.append(helper.make_tensor_value_info(out, TensorProto.FLOAT, None))

    graph = helper.make_graph(
        nodes, "bitwise",
        [helper.make_tensor_value_info(n, TYPES[v.dtype.type], list(v.shape))
         for n, v in feeds.items()],
        outputs, initializer=[c1, c2, tril, flag, one, depth, offon])
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 18)],
        producer_name="cleave tests/models/make_bitwise.py")
    model.ir_version = 8
    model = onnx.shape_inference.infer_shapes(model, strict_mode=True)
    del model.graph.value_info[:]
    onnx.checker.check_model(model, full_check=True)
    shutil.rmtree(OUT, ignore_errors=True)
    os.makedirs(os.path.join(OUT, "inputs"))
    os.makedirs(os.path.join(OUT, "expected"))
    onnx.save(model, os.path.join(OUT, "model.onnx"))
    for n, v in feeds.items():
        np.save(os.path.join(OUT, "inputs", n + ".npy"), v)
    sess = ort.InferenceSession(model.SerializeToString(),
                                providers=["CPUExecutionProvider"])
    values = sess.run(None, feeds)
    for out, value in zip([o.name for o in model.graph.output], values):
        np.save(os.path.join(OUT, "expected", out + ".npy"), value)
    print("bitwise  %d outputs, from onnxruntime" % len(values))
    nz = helper.make_graph(
        [helper.make_node("NonZero", ["x"], ["y"], name="/m/experts/NonZero")],
        "nonzero", [helper.make_tensor_value_info("x", TensorProto.INT64, [4])],
        [helper.make_tensor_value_info("y", TensorProto.INT64, [1, None])])
    nzm = helper.make_model(nz, opset_imports=[helper.make_opsetid("", 18)],
                            producer_name="cleave tests/models/make_bitwise.py")
    nzm.ir_version = 8
    onnx.checker.check_model(nzm, full_check=True)
    onnx.save(nzm, os.path.join(OUT, "nonzero.onnx"))
    # A OneHot whose depth (2^40) no output could hold: refused at import.
    big = numpy_helper.from_array(np.array(1 << 40, np.int64), "depth")
    oh = helper.make_graph(
        [helper.make_node("OneHot", ["i", "depth", "offon"], ["y"], name="/m/OneHot")],
        "onehot_depth", [helper.make_tensor_value_info("i", TensorProto.INT64, [3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [3, 1 << 40])],
        initializer=[big, numpy_helper.from_array(np.array([0.0, 1.0], np.float32),
                                                  "offon")])
    ohm = helper.make_model(oh, opset_imports=[helper.make_opsetid("", 18)],
                            producer_name="cleave tests/models/make_bitwise.py")
    ohm.ir_version = 8
    onnx.checker.check_model(ohm)
    onnx.save(ohm, os.path.join(OUT, "onehot-depth.onnx"))


if __name__ == "__main__":
    main()
