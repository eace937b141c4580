"""Writes a LLaMA-shaped decoder as an ONNX graph whose weights live in an
external-data file, without exporting (or even holding) the model.

    python tests/models/llama/make_llama.py --preset 7b   -o DIR
    python tests/models/llama/make_llama.py --preset tiny -o DIR

Needs the `onnx` and `numpy` packages (the corpus venv has them:
tests/models/corpus/make-venv.sh). DIR gets `model.onnx` (the graph: opset
23, every node named by its module path, /model/layers.N/...) and
`model.weights` (every float initializer, 64-byte aligned, in declaration
order; `model.onnx` refers to it by ONNX external data).

Presets (the `7b` one is LLaMA-7B's shape: 32 layers, d 4096, FFN 11008,
32 heads, vocabulary 32000, sequence 2048; 6.74e9 parameters, 27 GB of
f32 weights):

| preset | layers | d | FFN | heads | vocab | seq | batch | weights |
| --- | --- | --- | --- | --- | --- | --- | --- | --- |
| 7b | 32 | 4096 | 11008 | 32 | 32000 | 2048 | 1 | zeros: a sparse file (no disk used) |
| small | 8 | 512 | 1376 | 8 | 8000 | 128 | 2 | random (seeded), ~100 MB |
| tiny | 2 | 32 | 86 | 4 | 128 | 16 | 2 | random (seeded), 131 KB |
| long | 4 | 64 | 172 | 4 | 256 | 512 | 1 | random (seeded), about 1 MB |

With `--zeros` the parameters of any preset are left as holes in a sparse
file: enough for planning, where only shapes matter. The rotary caches
(buffers) are always written. `--graph-only` writes only model.onnx; any
file of the right size then serves as model.weights (the tests make one
with `truncate`; docs/design/weights.md). Each layer: RMSNormalization,
q/k/v projections, RotaryEmbedding on q and k (position_ids 0..seq-1),
causal Attention, output projection, residual; RMSNormalization, SwiGLU
FFN (w1, w3, w2), residual. Then a final RMSNormalization, the output
projection (not tied to the embedding) and the mean cross-entropy against
`labels`: the scalar output `loss`. Two runs write identical files.
"""
import argparse
import os
import sys

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

PRESETS = {
    "7b": dict(layers=32, d=4096, ffn=11008, heads=32, vocab=32000, seq=2048,
               batch=1, zeros=True),
    "small": dict(layers=8, d=512, ffn=1376, heads=8, vocab=8000, seq=128,
                  batch=2, zeros=False),
    "tiny": dict(layers=2, d=32, ffn=86, heads=4, vocab=128, seq=16,
                 batch=2, zeros=False),
    # Activations dominate (the recomputation benchmark).
    "long": dict(layers=4, d=64, ffn=172, heads=4, vocab=256, seq=512,
                 batch=1, zeros=False),
}
ALIGN = 64
EPS = 1e-5


def build(cfg, out_dir, graph_only):
    L, d, ffn, H, V, T, B = (cfg[k] for k in
                             ("layers", "d", "ffn", "heads", "vocab", "seq",
                              "batch"))
    hd = d // H
    rng = np.random.default_rng(0)
    nodes, inits = [], []
    weights = []  # (name, shape, array or None for a hole)
    offset = [0]

    def external(name, shape, value):
        """A float initializer stored in model.weights at the next aligned
        offset; value None leaves a hole (zeros)."""
        n = int(np.prod(shape)) * 4
        t = TensorProto()
        t.name = name
        t.data_type = TensorProto.FLOAT
        t.dims.extend(shape)
        t.data_location = TensorProto.EXTERNAL
        for k, v in (("location", "model.weights"), ("offset", offset[0]),
                     ("length", n)):
            e = t.external_data.add()
            e.key, e.value = k, str(v)
        inits.append(t)
        weights.append((offset[0], value))
        offset[0] += (n + ALIGN - 1) // ALIGN * ALIGN

    def param(name, shape, scale=None, ones=False):
        if cfg["zeros"]:
            value = None
        elif ones:
            value = np.ones(shape, np.float32)
        else:
            value = (rng.standard_normal(shape) * scale).astype(np.float32)
        external(name, shape, value)
        return name

    def node(op, ins, outs, path, **attrs):
        nodes.append(helper.make_node(op, ins, outs, name=path + "/" + op
                                      + "_" + str(len(nodes)), **attrs))
        return outs[0]

    # Buffers: the rotary caches (held constant: their names say so).
    inv = 1.0 / (10000.0 ** (np.arange(0, hd, 2, dtype=np.float64) / hd))
    ang = np.outer(np.arange(T, dtype=np.float64), inv)
    external("model.rotary.cos_cache", [T, hd // 2],
             np.cos(ang).astype(np.float32))
    external("model.rotary.sin_cache", [T, hd // 2],
             np.sin(ang).astype(np.float32))
    inits.append(numpy_helper.from_array(
        np.tile(np.arange(T, dtype=np.int64), (B, 1)),
        "model.rotary.position_ids"))
    inits.append(numpy_helper.from_array(np.array([B * T, V], np.int64),
                                         "logits_2d"))
    inits.append(numpy_helper.from_array(np.array([B * T], np.int64),
                                         "labels_1d"))
    rope = ["model.rotary.cos_cache", "model.rotary.sin_cache",
            "model.rotary.position_ids"]

    std = 0.02
    h = node("Gather", [param("model.embed_tokens.weight", [V, d], std),
                        "input_ids"], ["h_embed"], "/model/embed_tokens")
    for i in range(L):
        pre, path = "model.layers.%d." % i, "/model/layers.%d" % i
        t = lambda n: "l%d_%s" % (i, n)
        a = node("RMSNormalization",
                 [h, param(pre + "input_layernorm.weight", [d], ones=True)],
                 [t("a")], path + "/input_layernorm", axis=-1, epsilon=EPS)
        att = path + "/self_attn"
        proj = {}
        for n in "qkvo":
            proj[n] = param(pre + "self_attn.%s_proj.weight" % n, [d, d], std)
        q = node("MatMul", [a, proj["q"]], [t("q")], att + "/q_proj")
        k = node("MatMul", [a, proj["k"]], [t("k")], att + "/k_proj")
        v = node("MatMul", [a, proj["v"]], [t("v")], att + "/v_proj")
        q = node("RotaryEmbedding", [q] + rope, [t("qr")], att + "/rotary",
                 num_heads=H)
        k = node("RotaryEmbedding", [k] + rope, [t("kr")], att + "/rotary",
                 num_heads=H)
        y = node("Attention", [q, k, v], [t("y")], att, q_num_heads=H,
                 kv_num_heads=H, is_causal=1)
        o = node("MatMul", [y, proj["o"]], [t("o")], att + "/o_proj")
        h = node("Add", [h, o], [t("h1")], path)
        a = node("RMSNormalization",
                 [h, param(pre + "post_attention_layernorm.weight", [d],
                           ones=True)],
                 [t("b")], path + "/post_attention_layernorm", axis=-1,
                 epsilon=EPS)
        mlp = path + "/mlp"
        w1 = param(pre + "mlp.gate_proj.weight", [d, ffn], std)
        w3 = param(pre + "mlp.up_proj.weight", [d, ffn], std)
        w2 = param(pre + "mlp.down_proj.weight", [ffn, d], std)
        g = node("MatMul", [a, w1], [t("g")], mlp + "/gate_proj")
        s = node("Sigmoid", [g], [t("gs")], mlp + "/act_fn")
        g = node("Mul", [g, s], [t("silu")], mlp + "/act_fn")
        u = node("MatMul", [a, w3], [t("u")], mlp + "/up_proj")
        g = node("Mul", [g, u], [t("gu")], mlp)
        m = node("MatMul", [g, w2], [t("m")], mlp + "/down_proj")
        h = node("Add", [h, m], [t("h2")], path)
    h = node("RMSNormalization",
             [h, param("model.norm.weight", [d], ones=True)], ["h_final"],
             "/model/norm", axis=-1, epsilon=EPS)
    logits = node("MatMul", [h, param("lm_head.weight", [d, V], std)],
                  ["logits"], "/lm_head")
    flat = node("Reshape", [logits, "logits_2d"], ["logits_flat"], "/loss")
    lab = node("Reshape", ["labels", "labels_1d"], ["labels_flat"], "/loss")
    node("SoftmaxCrossEntropyLoss", [flat, lab], ["loss"], "/loss",
         reduction="mean")

    graph = helper.make_graph(
        nodes, "llama",
        [helper.make_tensor_value_info("input_ids", TensorProto.INT64,
                                       [B, T]),
         helper.make_tensor_value_info("labels", TensorProto.INT64, [B, T])],
        [helper.make_tensor_value_info("loss", TensorProto.FLOAT, [])],
        inits)
    model = helper.make_model(graph, opset_imports=[
        helper.make_opsetid("", 23)],
        producer_name="cleave tests/models/llama/make_llama.py")
    model.ir_version = 11  # the first to allow opset 23

    os.makedirs(out_dir, exist_ok=True)
    onnx.save(model, os.path.join(out_dir, "model.onnx"))
    params = sum(int(np.prod(i.dims)) for i in inits
                 if i.data_type == TensorProto.FLOAT
                 and "rotary" not in i.name)
    size = offset[0]
    if not graph_only:
        path = os.path.join(out_dir, "model.weights")
        with open(path, "wb") as f:
            f.truncate(size)  # holes read as zeros and take no disk
            for off, value in weights:
                if value is not None:
                    f.seek(off)
                    f.write(value.tobytes())
        onnx.checker.check_model(os.path.join(out_dir, "model.onnx"),
                                 full_check=True)
    print("%s: %d nodes, %d parameters, model.weights %d bytes" %
          (out_dir, len(nodes), params, size))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--preset", choices=sorted(PRESETS), required=True)
    ap.add_argument("-o", "--out", required=True, help="output folder")
    ap.add_argument("--zeros", action="store_true",
                    help="leave the parameters as holes (sparse zeros)")
    ap.add_argument("--graph-only", action="store_true",
                    help="write model.onnx only")
    args = ap.parse_args()
    cfg = dict(PRESETS[args.preset])
    cfg["zeros"] = cfg["zeros"] or args.zeros
    build(cfg, args.out, args.graph_only)


if __name__ == "__main__":
    sys.exit(main())
