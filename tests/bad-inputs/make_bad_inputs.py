#!/usr/bin/python3
"""Writes the bad-input corpus (tests/bad-inputs/): malformed ONNX models
and .npy data sets that cleave must reject with one clear error line, a
non-zero exit and no output file. tests/lit/bad-inputs/*.test run them.

Deterministic: rerunning it rewrites the same bytes. Needs Debian's
python3-onnx and python3-numpy:
    /usr/bin/python3 tests/bad-inputs/make_bad_inputs.py
Bad plans are made from a fresh cleavec output inside the lit tests, so that
they follow the current format.
"""
import os

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

HERE = os.path.dirname(os.path.abspath(__file__))
ONNX_DIR = os.path.join(HERE, "onnx")
DATA_DIR = os.path.join(HERE, "data")


def tiny_model(opset=13, init=None, nodes=None, inputs=None, outputs=None,
               out_shape=(2, 3)):
    """y = Relu(x @ W), x f32[2,4], W f32[4,3], unless parts are replaced."""
    if init is None:
        init = [numpy_helper.from_array(
            np.arange(12, dtype=np.float32).reshape(4, 3) / 10, "W")]
    if nodes is None:
        nodes = [helper.make_node("MatMul", ["x", "W"], ["h"], name="mm"),
                 helper.make_node("Relu", ["h"], ["y"], name="relu")]
    if inputs is None:
        inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 4])]
    if outputs is None:
        outputs = [helper.make_tensor_value_info("y", TensorProto.FLOAT,
                                                 list(out_shape))]
    graph = helper.make_graph(nodes, "bad", inputs, outputs, init)
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", opset)],
        producer_name="make_bad_inputs")
    model.ir_version = 8
    return model


def save(name, model_or_bytes):
    path = os.path.join(ONNX_DIR, name)
    data = model_or_bytes if isinstance(model_or_bytes, bytes) else \
        model_or_bytes.SerializeToString()
    with open(path, "wb") as f:
        f.write(data)


def external(name, dims, location, length=None):
    t = TensorProto()
    t.name = name
    t.data_type = TensorProto.FLOAT
    t.dims.extend(dims)
    t.data_location = TensorProto.EXTERNAL
    e = t.external_data.add()
    e.key, e.value = "location", location
    if length is not None:
        e = t.external_data.add()
        e.key, e.value = "length", str(length)
    return t


def make_onnx():
    os.makedirs(ONNX_DIR, exist_ok=True)
    good = tiny_model().SerializeToString()
    # The good model itself: the tests check it compiles, so that each bad
    # one fails for its own reason.
    save("good.onnx", good)
    # Truncated: the first half, and the last byte missing.
    save("truncated-half.onnx", good[: len(good) // 2])
    save("truncated-1.onnx", good[:-1])
    # Bit flips: deterministic single-bit and byte flips across the file.
    b = bytearray(good)
    for i in range(3, len(b), 17):
        b[i] ^= 0x40
    save("bitflip-many.onnx", bytes(b))
    b = bytearray(good)
    b[len(b) // 3] ^= 0xFF
    save("bitflip-one.onnx", bytes(b))
    # Not protobuf at all / empty.
    save("garbage.onnx", bytes(range(256)) * 4)
    save("empty.onnx", b"")
    # Unsupported opsets: too new and too old.
    save("opset-99.onnx", tiny_model(opset=99))
    save("opset-5.onnx", tiny_model(opset=5))
    # A cycle: h = Relu(y), y = Relu(h).
    save("cycle.onnx", tiny_model(
        init=[], inputs=[helper.make_tensor_value_info(
            "x", TensorProto.FLOAT, [2, 3])],
        nodes=[helper.make_node("Add", ["x", "y"], ["h"], name="a"),
               helper.make_node("Relu", ["h"], ["y"], name="b")]))
    # A node input naming nothing.
    save("dangling-input.onnx", tiny_model(
        nodes=[helper.make_node("MatMul", ["x", "nothing"], ["h"], name="mm"),
               helper.make_node("Relu", ["h"], ["y"], name="relu")]))
    # A graph output no node produces.
    save("dangling-output.onnx", tiny_model(
        outputs=[helper.make_tensor_value_info("z", TensorProto.FLOAT, [2, 3])]))
    # Initializer shape does not fit its use: W is [5,3] for x [2,4].
    save("init-shape-mismatch.onnx", tiny_model(init=[numpy_helper.from_array(
        np.zeros((5, 3), dtype=np.float32), "W")]))
    # Absurd dims: an input of 2^62 x 2^62 (the element count overflows
    # int64), an initializer claiming 2^62 x 2^62 with no data, and a
    # merely huge input (2^40 x 2^20 floats).
    save("huge-input.onnx", tiny_model(
        init=[], nodes=[helper.make_node("Relu", ["x"], ["y"], name="relu")],
        inputs=[helper.make_tensor_value_info(
            "x", TensorProto.FLOAT, [2 ** 62, 2 ** 62])],
        out_shape=(2 ** 62, 2 ** 62)))
    t = TensorProto()
    t.name, t.data_type = "W", TensorProto.FLOAT
    t.dims.extend([2 ** 62, 2 ** 62])
    save("huge-initializer.onnx", tiny_model(init=[t]))
    save("large-input.onnx", tiny_model(
        init=[], nodes=[helper.make_node("Relu", ["x"], ["y"], name="relu")],
        inputs=[helper.make_tensor_value_info(
            "x", TensorProto.FLOAT, [2 ** 40, 2 ** 20])],
        out_shape=(2 ** 40, 2 ** 20)))
    # A negative dimension on an initializer.
    t = TensorProto()
    t.name, t.data_type = "W", TensorProto.FLOAT
    t.dims.extend([4, -3])
    t.raw_data = b"\0" * 48
    save("negative-dim.onnx", tiny_model(init=[t]))
    # Declared size larger than the data: raw_data of 8 bytes for f32[4,3].
    t = TensorProto()
    t.name, t.data_type = "W", TensorProto.FLOAT
    t.dims.extend([4, 3])
    t.raw_data = b"\0" * 8
    save("short-raw-data.onnx", tiny_model(init=[t]))
    # A large declared shape (2^16 x 2^16 floats, 16 GiB) over 8 bytes of
    # raw_data, and over no data at all.
    t = TensorProto()
    t.name, t.data_type = "W", TensorProto.FLOAT
    t.dims.extend([2 ** 16, 2 ** 16])
    t.raw_data = b"\0" * 8
    save("large-initializer-short-data.onnx", tiny_model(init=[t]))
    t = TensorProto()
    t.name, t.data_type = "W", TensorProto.FLOAT
    t.dims.extend([2 ** 16, 2 ** 16])
    save("large-initializer-no-data.onnx", tiny_model(init=[t]))
    # float_data with too few values.
    t = TensorProto()
    t.name, t.data_type = "W", TensorProto.FLOAT
    t.dims.extend([4, 3])
    t.float_data.extend([1.0, 2.0])
    save("short-float-data.onnx", tiny_model(init=[t]))
    # External data: missing file; outside the folder (relative and
    # absolute); an existing file too short for the tensor.
    save("external-missing.onnx", tiny_model(
        init=[external("W", [4, 3], "no-such-weights.bin")]))
    save("external-outside.onnx", tiny_model(
        init=[external("W", [4, 3], "../make_bad_inputs.py")]))
    save("external-absolute.onnx", tiny_model(
        init=[external("W", [4, 3], "/etc/passwd")]))
    save("external-short.onnx", tiny_model(
        init=[external("W", [4, 3], "external-short.bin")]))
    with open(os.path.join(ONNX_DIR, "external-short.bin"), "wb") as f:
        f.write(b"\0" * 20)
    save("external-length.onnx", tiny_model(
        init=[external("W", [4, 3], "external-short.bin", length=2 ** 62)]))
    # External data and raw_data both: which bytes were meant is unknown.
    both = external("W", [4, 3], "external-raw.bin")
    both.raw_data = np.ones(12, np.float32).tobytes()
    save("external-and-raw.onnx", tiny_model(init=[both]))
    with open(os.path.join(ONNX_DIR, "external-raw.bin"), "wb") as f:
        f.write(b"\0" * 48)
    # Shape arithmetic that folds to a huge constant: ConstantOfShape of
    # [2^31, 2^31] and Range(0, 2^40, 1), both feeding the output.
    shp = numpy_helper.from_array(np.array([2 ** 31, 2 ** 31], np.int64), "s")
    save("fold-huge-constant.onnx", tiny_model(
        init=[shp], inputs=[],
        nodes=[helper.make_node("ConstantOfShape", ["s"], ["y"], name="cos")],
        out_shape=(2 ** 31, 2 ** 31)))
    lims = [numpy_helper.from_array(np.array(v, np.int64), n)
            for n, v in (("start", 0), ("limit", 2 ** 40), ("delta", 1))]
    save("fold-huge-range.onnx", tiny_model(
        init=lims, inputs=[],
        nodes=[helper.make_node("Range", ["start", "limit", "delta"], ["r"],
                                name="range"),
               helper.make_node("Cast", ["r"], ["y"], to=TensorProto.FLOAT,
                                name="cast")],
        out_shape=(2 ** 40,)))
    # An experimental ONNX op (the checker only warns about those).
    save("experimental-op.onnx", tiny_model(
        init=[], nodes=[helper.make_node("Scale", ["x"], ["y"], name="s")],
        out_shape=(2, 4)))
    # An element type cleave does not support (string).
    t = helper.make_tensor("W", TensorProto.STRING, [1], [b"a"])
    save("string-initializer.onnx", tiny_model(
        init=[t], nodes=[helper.make_node("Identity", ["W"], ["y"])],
        outputs=[helper.make_tensor_value_info("y", TensorProto.STRING, [1])]))


def save_npy(case, name, array):
    d = os.path.join(DATA_DIR, case)
    os.makedirs(d, exist_ok=True)
    np.save(os.path.join(d, name + ".npy"), array)


def make_data():
    # For tests/models/training/mlp: x f32[N,16], labels i64[N] in 0..9.
    rng = np.random.default_rng(7)
    x = rng.standard_normal((8, 16)).astype(np.float32)
    labels = (np.arange(8) % 10).astype(np.int64)
    save_npy("wrong-dtype", "x", x.astype(np.float64))
    save_npy("wrong-dtype", "labels", labels)
    save_npy("wrong-shape", "x", x[:, :15].copy())
    save_npy("wrong-shape", "labels", labels)
    save_npy("row-mismatch", "x", x)
    save_npy("row-mismatch", "labels", labels[:5].copy())
    nan = x.copy()
    nan[3, 5] = np.nan
    save_npy("nan", "x", nan)
    save_npy("nan", "labels", labels)
    save_npy("truncated-npy", "labels", labels)
    save_npy("truncated-npy", "x", x)
    p = os.path.join(DATA_DIR, "truncated-npy", "x.npy")
    with open(p, "rb") as f:
        b = f.read()
    with open(p, "wb") as f:
        f.write(b[:-100])
    save_npy("bad-label", "x", x)
    bad = labels.copy()
    bad[2] = 99
    save_npy("bad-label", "labels", bad)


if __name__ == "__main__":
    make_onnx()
    make_data()
