"""Writes tests/models/opset23/: small opset-23/24 decoders built with
onnx.helper around ONNX's own RotaryEmbedding and Attention ops, with
PyTorch references computed independently of ONNX (a hand-written rotary
embedding and torch.nn.functional.scaled_dot_product_attention with
enable_gqa), in float32 and float64.

Run with the corpus venv (tests/models/corpus/make-venv.sh prints it: torch
2.15, onnx 1.23.2, onnxruntime 1.32):

    $VENV/bin/python tests/models/make_attention_opset23.py

Every model has 2 decoder layers (`m.layers.0`, `m.layers.1`: RMSNorm,
q/k/v projections, RotaryEmbedding on q and k, Attention with 4 query heads
and 2 key/value heads, output projection, residual) and returns one scalar
`loss` (the mean square of the last hidden state). The three differ in the
forms of the two ops:

| folder | opset | forms |
|---|---|---|
| `rope-causal-gqa` | 23 | 4-D q/k/v (batch, heads, seq, head), `is_causal=1`, rotary with `position_ids` (an int64 initializer) and a [positions, head/2] cache |
| `float-mask-3d` | 24 | 3-D q/k/v (batch, seq, heads*head) with `q_num_heads` / `kv_num_heads`, an additive float mask input (-inf on padded keys plus a bias), explicit `scale`, partial rotary (`rotary_embedding_dim=2` of 4), 3-D rotary with `num_heads` and a [batch, seq, 1] cache |
| `bool-mask-causal` | 23 | 4-D, a boolean mask input (key padding) together with `is_causal=1`, interleaved rotary with a [batch, seq, head/2] cache |

Each folder follows tests/models/corpus/ (see its README): model.onnx,
inputs/, reference/ (float32 loss and gradients, params.txt, buffers.txt),
reference64/ (float64), steps/data and steps/hyper.txt (3 steps x 4
microbatches of 2). `bernoulli-unsupported.onnx` is one Bernoulli node,
whose function body uses an op cleave lacks. `function-ops/` applies
other ops ONNX defines by function bodies (Softplus, Mish, HardSwish,
ReduceL2, ...) to one input, with onnxruntime's outputs. The script checks each model with the ONNX checker and
that onnxruntime's loss matches the PyTorch float32 one. Two runs write
identical files.
"""
import json
import os
import shutil

import numpy as np
import onnx
import onnxruntime as ort
import torch
import torch.nn.functional as F
from onnx import TensorProto, helper, numpy_helper

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "opset23")

B, S, E = 2, 8, 16
QH, KVH, D = 4, 2, 4
LAYERS = 2
MICRO, STEPS = 4, 3
EPS = 1e-5


# --- the PyTorch reference (independent of ONNX's function bodies) --------

def rotary(x, cos, sin, rot_dim, interleaved):
    """x: (B, H, S, D); cos, sin: (B, S, rot_dim/2). ONNX RotaryEmbedding's
    formula written out: pairs (i, i + rot/2), or (2i, 2i+1) interleaved."""
    cos = cos.unsqueeze(1)
    sin = sin.unsqueeze(1)
    rot, rest = x[..., :rot_dim], x[..., rot_dim:]
    if interleaved:
        x1, x2 = rot[..., 0::2], rot[..., 1::2]
    else:
        x1, x2 = rot[..., : rot_dim // 2], rot[..., rot_dim // 2:]
    real = cos * x1 - sin * x2
    imag = sin * x1 + cos * x2
    if interleaved:
        rot = torch.stack([real, imag], dim=-1).reshape(rot.shape)
    else:
        rot = torch.cat([real, imag], dim=-1)
    return torch.cat([rot, rest], dim=-1)


def reference_loss(cfg, params, x, mask):
    """The loss of the decoder in `cfg` as PyTorch computes it."""
    h = x
    for layer in range(LAYERS):
        p = lambda n: params["m.layers.%d.%s" % (layer, n)]
        a = F.rms_norm(h, (E,), p("norm.weight"), eps=EPS)
        q = (a @ p("attn.q_proj.weight")).reshape(B, S, QH, D).transpose(1, 2)
        k = (a @ p("attn.k_proj.weight")).reshape(B, S, KVH, D).transpose(1, 2)
        v = (a @ p("attn.v_proj.weight")).reshape(B, S, KVH, D).transpose(1, 2)
        cos, sin = cfg["cos_sin"](x.dtype)
        q = rotary(q, cos, sin, cfg["rot_dim"], cfg["interleaved"])
        k = rotary(k, cos, sin, cfg["rot_dim"], cfg["interleaved"])
        attn_mask = None
        causal = cfg["causal"]
        if mask is not None:
            attn_mask = mask.to(x.dtype) if mask.dtype != torch.bool else mask
            if causal:  # sdpa takes one or the other: combine them
                attn_mask = attn_mask & torch.ones(S, S, dtype=torch.bool).tril()
                causal = False
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask,
                                           is_causal=causal,
                                           scale=cfg.get("scale"),
                                           enable_gqa=True)
        y = y.transpose(1, 2).reshape(B, S, QH * D)
        h = h + y @ p("attn.o_proj.weight")
    return (h * h).mean()


# --- the ONNX graph -------------------------------------------------------

def build_model(cfg, params, buffers):
    nodes, inits = [], []
    for name, value in list(params.items()) + list(buffers.items()):
        inits.append(numpy_helper.from_array(value, name))
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, [B, S, E])]
    mask_name = ""
    if cfg["mask"] == "float":
        mask_name = "attn_bias"
        inputs.append(helper.make_tensor_value_info(
            mask_name, TensorProto.FLOAT, [B, 1, S, S]))
    elif cfg["mask"] == "bool":
        mask_name = "key_mask"
        inputs.append(helper.make_tensor_value_info(
            mask_name, TensorProto.BOOL, [B, 1, S, S]))
    three_d = cfg["three_d"]
    shapes = {}

    def node(op, ins, outs, path, **attrs):
        nodes.append(helper.make_node(op, ins, outs, name=path + "/" + op
                                      + "_" + str(len(nodes)), **attrs))

    def const(name, values):
        inits.append(numpy_helper.from_array(np.array(values, np.int64), name))
        return name

    if not three_d:
        const("heads_q", [0, 0, QH, D])
        const("heads_kv", [0, 0, KVH, D])
        const("merged", [0, 0, QH * D])
    h = "x"
    for layer in range(LAYERS):
        pre = "m.layers.%d." % layer
        path = "/m/layers.%d/attn" % layer
        t = lambda n: "l%d_%s" % (layer, n)
        node("RMSNormalization", [h, pre + "norm.weight"], [t("a")],
             "/m/layers.%d/norm" % layer, axis=-1, epsilon=EPS)
        for n in "qkv":
            node("MatMul", [t("a"), pre + "attn.%s_proj.weight" % n],
                 [t(n + "p")], path)
        rope = dict(interleaved=int(cfg["interleaved"]))
        if cfg["rot_dim"] != D:
            rope["rotary_embedding_dim"] = cfg["rot_dim"]
        rope_inputs = ["m.rotary.cos_cache", "m.rotary.sin_cache"]
        if cfg["position_ids"]:
            rope_inputs.append("m.rotary.position_ids")
        if three_d:
            q, k, v = t("qp"), t("kp"), t("vp")
            node("RotaryEmbedding", [q] + rope_inputs, [t("qr")], path,
                 num_heads=QH, **rope)
            node("RotaryEmbedding", [k] + rope_inputs, [t("kr")], path,
                 num_heads=KVH, **rope)
            attn = dict(q_num_heads=QH, kv_num_heads=KVH)
        else:
            for n, shape in (("q", "heads_q"), ("k", "heads_kv"),
                             ("v", "heads_kv")):
                node("Reshape", [t(n + "p"), shape], [t(n + "s")], path)
                node("Transpose", [t(n + "s")], [t(n + "h")], path,
                     perm=[0, 2, 1, 3])
            node("RotaryEmbedding", [t("qh")] + rope_inputs, [t("qr")], path,
                 **rope)
            node("RotaryEmbedding", [t("kh")] + rope_inputs, [t("kr")], path,
                 **rope)
            v = t("vh")
            attn = {}
        if cfg["causal"]:
            attn["is_causal"] = 1
        if "scale" in cfg:
            attn["scale"] = cfg["scale"]
        node("Attention", [t("qr"), t("kr"), v] + ([mask_name] if mask_name
                                                   else []),
             [t("y")], path, **attn)
        if three_d:
            y = t("y")
        else:
            node("Transpose", [t("y")], [t("yt")], path, perm=[0, 2, 1, 3])
            node("Reshape", [t("yt"), "merged"], [t("ym")], path)
            y = t("ym")
        node("MatMul", [y, pre + "attn.o_proj.weight"], [t("o")], path)
        node("Add", [h, t("o")], [t("h")], "/m/layers.%d" % layer)
        h = t("h")
    node("Mul", [h, h], ["sq"], "/m/loss")
    node("ReduceMean", ["sq"], ["loss"], "/m/loss", keepdims=0)
    graph = helper.make_graph(
        nodes, "decoder", inputs,
        [helper.make_tensor_value_info("loss", TensorProto.FLOAT, [])],
        inits)
    model = helper.make_model(graph, opset_imports=[
        helper.make_opsetid("", cfg["opset"])], producer_name=
        "cleave tests/models/make_attention_opset23.py")
    model.ir_version = {23: 11, 24: 12}[cfg["opset"]]  # the first to allow it
    onnx.checker.check_model(model, full_check=True)
    return model


# --- data -----------------------------------------------------------------

def make_case(name, cfg, seed):
    rng = np.random.default_rng(seed)
    params = {}
    for layer in range(LAYERS):
        pre = "m.layers.%d." % layer
        params[pre + "norm.weight"] = (1 + 0.1 * rng.standard_normal(E)).astype(np.float32)
        for n, cols in (("q", QH * D), ("k", KVH * D), ("v", KVH * D)):
            params[pre + "attn.%s_proj.weight" % n] = (
                rng.standard_normal((E, cols)) / np.sqrt(E)).astype(np.float32)
        params[pre + "attn.o_proj.weight"] = (
            rng.standard_normal((QH * D, E)) / np.sqrt(QH * D)).astype(np.float32)
    half = cfg["rot_dim"] // 2
    inv_freq = 1.0 / (10000 ** (np.arange(half) * 2.0 / cfg["rot_dim"]))
    buffers = {}
    if cfg["position_ids"]:
        positions = np.arange(2 * S)[:, None] * inv_freq[None, :]
        pos_ids = np.stack([np.arange(S), np.arange(S) + 3]).astype(np.int64)
        buffers["m.rotary.cos_cache"] = np.cos(positions).astype(np.float32)
        buffers["m.rotary.sin_cache"] = np.sin(positions).astype(np.float32)
        buffers["m.rotary.position_ids"] = pos_ids

        def cos_sin(dtype):
            c = torch.tensor(buffers["m.rotary.cos_cache"], dtype=dtype)
            s_ = torch.tensor(buffers["m.rotary.sin_cache"], dtype=dtype)
            ids = torch.tensor(pos_ids)
            return c[ids], s_[ids]
    else:
        positions = (np.arange(S)[None, :, None] + np.array([0, 5])[:, None, None]
                     ) * inv_freq[None, None, :]
        buffers["m.rotary.cos_cache"] = np.cos(positions).astype(np.float32)
        buffers["m.rotary.sin_cache"] = np.sin(positions).astype(np.float32)

        def cos_sin(dtype):
            return (torch.tensor(buffers["m.rotary.cos_cache"], dtype=dtype),
                    torch.tensor(buffers["m.rotary.sin_cache"], dtype=dtype))
    cfg = dict(cfg, cos_sin=cos_sin)

    rows = MICRO * STEPS * B
    xs = rng.standard_normal((rows, S, E)).astype(np.float32)
    masks = None
    if cfg["mask"] == "float":
        masks = (0.5 * rng.standard_normal((rows, 1, S, S))).astype(np.float32)
        # Odd samples pad their last 2 keys.
        masks[1::2, :, :, S - 2:] = -np.inf
    elif cfg["mask"] == "bool":
        masks = np.ones((rows, 1, S, S), dtype=bool)
        masks[1::2, :, :, S - 3:] = False  # keys never masked for row 0

    model = build_model(cfg, params, buffers)
    folder = os.path.join(OUT, name)
    shutil.rmtree(folder, ignore_errors=True)
    for sub in ("inputs", "reference", "reference64", "steps/data"):
        os.makedirs(os.path.join(folder, sub))
    onnx.save(model, os.path.join(folder, "model.onnx"))
    mask_name = {"float": "attn_bias", "bool": "key_mask"}.get(cfg["mask"])
    np.save(os.path.join(folder, "inputs/x.npy"), xs[:B])
    np.save(os.path.join(folder, "steps/data/x.npy"), xs)
    if masks is not None:
        np.save(os.path.join(folder, "inputs/%s.npy" % mask_name), masks[:B])
        np.save(os.path.join(folder, "steps/data/%s.npy" % mask_name), masks)
    with open(os.path.join(folder, "steps/hyper.txt"), "w") as f:
        f.write("lr 0.1\nmomentum 0.9\nmicrobatches %d\nsteps %d\nbatch %d\n"
                % (MICRO, STEPS, B))
    with open(os.path.join(folder, "reference/params.txt"), "w") as f:
        f.write("".join(n + "\n" for n in params))
    with open(os.path.join(folder, "reference/buffers.txt"), "w") as f:
        f.write("".join(n + "\n" for n in buffers))

    grads = {}
    for dtype, sub in ((torch.float32, "reference"), (torch.float64, "reference64")):
        tp = {n: torch.tensor(v, dtype=dtype, requires_grad=True)
              for n, v in params.items()}
        x = torch.tensor(xs[:B], dtype=dtype)
        m = None if masks is None else torch.tensor(masks[:B])
        if m is not None and m.dtype != torch.bool:
            m = m.to(dtype)
        loss = reference_loss(cfg, tp, x, m)
        loss.backward()
        np.save(os.path.join(folder, sub, "loss.npy"), loss.detach().numpy())
        for n, v in tp.items():
            np.save(os.path.join(folder, sub, "grad.%s.npy" % n), v.grad.numpy())
        grads[sub] = ({n: v.grad.numpy() for n, v in tp.items()}, loss.item())

    feeds = {"x": xs[:B]}
    if masks is not None:
        feeds[mask_name] = masks[:B]
    sess = ort.InferenceSession(model.SerializeToString(),
                                providers=["CPUExecutionProvider"])
    ort_loss = float(sess.run(None, feeds)[0])
    g32, loss32 = grads["reference"]
    g64, loss64 = grads["reference64"]
    scale = max(np.abs(g).max() for g in g64.values())
    f32_err = max(np.abs(g32[n] - g64[n]).max() /
                  max(np.abs(g64[n]).max(), 1e-4 * scale) for n in g64)
    assert abs(ort_loss - loss64) < 1e-5 * abs(loss64), (name, ort_loss, loss64)
    info = {"opset": cfg["opset"], "loss64": loss64, "loss32": loss32,
            "onnxruntime_loss": ort_loss, "torch_f32_grad_error": f32_err,
            "model_bytes": os.path.getsize(os.path.join(folder, "model.onnx"))}
    with open(os.path.join(folder, "info.json"), "w") as f:
        json.dump(info, f, indent=1, sort_keys=True)
        f.write("\n")
    print("%-18s opset %d loss64 %.9f onnxruntime %.9f torch f32 grad error %.2e"
          % (name, cfg["opset"], loss64, ort_loss, f32_err))


def make_unsupported_body():
    """bernoulli-unsupported.onnx: Bernoulli, whose function body draws with
    RandomUniformLike, an op cleave lacks (the error names both)."""
    node = helper.make_node("Bernoulli", ["p"], ["y"],
                            name="/m/dropout_mask/Bernoulli")
    graph = helper.make_graph(
        [node], "bernoulli",
        [helper.make_tensor_value_info("p", TensorProto.FLOAT, [2, 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 23)],
                              producer_name=
                              "cleave tests/models/make_attention_opset23.py")
    model.ir_version = 11
    onnx.checker.check_model(model, full_check=True)
    onnx.save(model, os.path.join(OUT, "bernoulli-unsupported.onnx"))


# Ops without an IR op of their own that the importer expands through their
# ONNX function bodies (beside RotaryEmbedding and Attention), with the
# attributes to give (none: the function's defaults).
FUNCTION_OPS = [
    ("Celu", {}), ("Elu", {"alpha": 0.5}), ("HardSigmoid", {}),
    ("HardSwish", {}), ("Mish", {}), ("PRelu", {}),
    ("ReduceL1", {"keepdims": 0}), ("ReduceL2", {}),
    ("ReduceLogSumExp", {}), ("ReduceSumSquare", {"keepdims": 0}),
    ("Selu", {}), ("Shrink", {"lambd": 0.3, "bias": 0.1}),
    ("Softplus", {}), ("Softsign", {}), ("Swish", {"alpha": 1.5}),
    ("ThresholdedRelu", {}),
]


def make_function_ops():
    """function-ops/: one opset-24 graph applying each of FUNCTION_OPS to
    `x` (PRelu with `slope`), and onnxruntime's outputs in expected/."""
    rng = np.random.default_rng(7)
    feeds = {"x": (2 * rng.standard_normal((2, 3, 4))).astype(np.float32),
             "slope": rng.standard_normal(4).astype(np.float32)}
    nodes, outputs = [], []
    for op, attrs in FUNCTION_OPS:
        ins = ["x", "slope"] if op == "PRelu" else ["x"]
        nodes.append(helper.make_node(op, ins, ["y_" + op], name="/m/" + op,
                                      **attrs))
        outputs.append(helper.make_tensor_value_info("y_" + op,
                                                     TensorProto.FLOAT, None))
    graph = helper.make_graph(
        nodes, "function_ops",
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, list(v.shape))
         for n, v in feeds.items()], outputs)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 24)],
                              producer_name=
                              "cleave tests/models/make_attention_opset23.py")
    model.ir_version = 12
    model = onnx.shape_inference.infer_shapes(model, strict_mode=True)
    del model.graph.value_info[:]
    onnx.checker.check_model(model, full_check=True)
    folder = os.path.join(OUT, "function-ops")
    shutil.rmtree(folder, ignore_errors=True)
    os.makedirs(os.path.join(folder, "inputs"))
    os.makedirs(os.path.join(folder, "expected"))
    onnx.save(model, os.path.join(folder, "model.onnx"))
    for n, v in feeds.items():
        np.save(os.path.join(folder, "inputs", n + ".npy"), v)
    sess = ort.InferenceSession(model.SerializeToString(),
                                providers=["CPUExecutionProvider"])
    for out, value in zip([o.name for o in model.graph.output],
                          sess.run(None, feeds)):
        np.save(os.path.join(folder, "expected", out + ".npy"), value)
    print("function-ops       %d ops, outputs from onnxruntime" %
          len(FUNCTION_OPS))


def make_overflow_ops():
    """overflow-ops-17/ and overflow-ops-24/: ReduceLogSumExp (over the last
    axis, the middle one kept, all of them) and Softplus of values up to
    about 1500, where exp overflows float32 and float64 (ONNX's
    ReduceLogSumExp body exponentiates in float64), and a row of -inf; at
    opset 17 (no function bodies, axes an attribute) and 24 (bodies, axes
    an input).
    Expected: PyTorch's formulas in float64 (logsumexp: the maximum, 0 where
    it is infinite, plus log sum exp of the rest; softplus: x past 20),
    rounded to float32."""
    rng = np.random.default_rng(11)
    x = (1000 * rng.standard_normal((3, 4, 5))).astype(np.float32)
    x[2, 1, :] = -np.inf
    with torch.no_grad():
        t = torch.from_numpy(x.astype(np.float64))
        expected = {
            "y_lse_last": torch.logsumexp(t, -1),
            "y_lse_mid": torch.logsumexp(t, 1, keepdim=True),
            "y_lse_all": torch.logsumexp(t.flatten(), 0),
            "y_softplus": F.softplus(t),
        }
    for opset in (17, 24):
        def reduce(out, axes, keepdims):
            if axes is None:
                return [helper.make_node("ReduceLogSumExp", ["x"], [out],
                                         name="/m/" + out, keepdims=keepdims)]
            if opset < 18:
                return [helper.make_node("ReduceLogSumExp", ["x"], [out],
                                         name="/m/" + out, axes=axes,
                                         keepdims=keepdims)]
            return [helper.make_node("Constant", [], [out + "_axes"],
                                     value=helper.make_tensor(
                                         out + "_axes", TensorProto.INT64,
                                         [len(axes)], axes)),
                    helper.make_node("ReduceLogSumExp", ["x", out + "_axes"],
                                     [out], name="/m/" + out,
                                     keepdims=keepdims)]
        nodes = (reduce("y_lse_last", [-1], 0) + reduce("y_lse_mid", [1], 1) +
                 reduce("y_lse_all", None, 0) +
                 [helper.make_node("Softplus", ["x"], ["y_softplus"],
                                   name="/m/y_softplus")])
        graph = helper.make_graph(
            nodes, "overflow_ops",
            [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(x.shape))],
            [helper.make_tensor_value_info(n, TensorProto.FLOAT, None)
             for n in expected])
        model = helper.make_model(
            graph, opset_imports=[helper.make_opsetid("", opset)],
            producer_name="cleave tests/models/make_attention_opset23.py")
        model.ir_version = 8 if opset < 18 else 12
        model = onnx.shape_inference.infer_shapes(model, strict_mode=True)
        onnx.checker.check_model(model, full_check=True)
        folder = os.path.join(OUT, "overflow-ops-%d" % opset)
        shutil.rmtree(folder, ignore_errors=True)
        os.makedirs(os.path.join(folder, "inputs"))
        os.makedirs(os.path.join(folder, "expected"))
        onnx.save(model, os.path.join(folder, "model.onnx"))
        np.save(os.path.join(folder, "inputs", "x.npy"), x)
        for n, v in expected.items():
            np.save(os.path.join(folder, "expected", n + ".npy"),
                    v.numpy().astype(np.float32))
    print("overflow-ops       opsets 17 and 24, outputs from PyTorch's formulas")


CASES = [
    ("rope-causal-gqa", dict(opset=23, three_d=False, causal=True, mask=None,
                             rot_dim=D, interleaved=False, position_ids=True)),
    ("float-mask-3d", dict(opset=24, three_d=True, causal=False, mask="float",
                           rot_dim=2, interleaved=False, position_ids=False,
                           scale=0.4)),
    ("bool-mask-causal", dict(opset=23, three_d=False, causal=True, mask="bool",
                              rot_dim=D, interleaved=True, position_ids=False)),
]

if __name__ == "__main__":
    torch.manual_seed(0)
    for i, (name, cfg) in enumerate(CASES):
        make_case(name, cfg, 1000 + i)
    make_unsupported_body()
    make_function_ops()
    make_overflow_ops()
