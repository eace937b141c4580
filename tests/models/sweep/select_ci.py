#!/usr/bin/env python3
"""Choose the sweep's CI subset and copy it into tests/models/sweep/ci/.

    python3 tests/models/sweep/select_ci.py [--work /tmp/cleave-zoo] [--dry-run]
        [--budget 1500000] [--always a-dynamo,b-legacy]
    python3 tests/models/sweep/select_ci.py --work DIR --add a-dynamo,b-legacy

A greedy set cover over the ONNX op types of every export the sweep made
(info.json op_histogram): at each turn the export that adds the most op
types not yet covered per byte it costs (model.onnx plus the files CI
reads), until every op type is covered or the budget is spent. Exports
that import come first (their ops are the ones cleave's checks reach);
exports that do not are taken after, so each op cleave refuses today is
held by one small export whose expected columns are "no" until it is
supported. ci/expected.json records the sweep's columns for each chosen
export, ci/ops.json which export covers which op.

Copied per export: model.onnx (weights inlined, node metadata but
pkg.torch.onnx.name_scopes and the FX node text cleave reads left out), inputs/, reference64/grad.* (as
float32: the rounding, 6e-8, is under the check's 1e-6 floor) with PyTorch
float32's error in reference64/torch_f32_error.txt (not its gradients),
steps/data/, steps/hyper.txt, steps/loss_after.npy, steps/losses.npy and
info.json (not the trained parameters: the check compares bits between
cleave runs and the loss against PyTorch's, which needs no onnx).
"""

import argparse
import collections
import json
import os
import shutil

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
CI = os.path.join(HERE, "ci")
COLUMNS = ("imported", "grads", "stages", "threads", "loss")


def ci_files(folder):
    out = ["model.onnx", "info.json", "steps/hyper.txt", "steps/loss_after.npy",
           "steps/loss_after64.npy",
           "steps/losses.npy"]
    for sub, prefix in (("inputs", ""), ("reference64", "grad."), ("steps/data", "")):
        d = os.path.join(folder, sub)
        for f in sorted(os.listdir(d)):
            if f.endswith(".npy") and f.startswith(prefix):
                out.append(os.path.join(sub, f))
    for sub in ("reference", "reference64"):
        out.append(os.path.join(sub, "loss.npy"))
    return [f for f in out if os.path.exists(os.path.join(folder, f))]


# The node metadata cleave reads (frontend/): module paths everywhere, and
# the FX node text where it tells cleave something (an embedding's
# padding_idx, a BatchNorm computed without running statistics, what the
# exporter's cross-entropy, scatter_reduce and avg_pool drop). The
# dynamo exporter's others (stack traces with machine-specific paths, the
# rest of the FX node text, class hierarchy, namespace) are two thirds of a
# small export's bytes and are left out of the committed copies.
KEPT_METADATA = ("pkg.torch.onnx.name_scopes",)
FX_NODE = "pkg.torch.onnx.fx_node"
FX_READ = ("aten.embedding.default", "_native_batch_norm_legit.no_stats",
           "aten.cross_entropy_loss.default", "aten.scatter_reduce.two",
           "aten.avg_pool1d.default", "aten.avg_pool2d.default", "aten.avg_pool3d.default")


def ci_model(src):
    """model.onnx as committed: weights inside (the dynamo exporter writes
    model.onnx.data beside it) and node metadata KEPT_METADATA only."""
    import onnx
    m = onnx.load(src)
    for n in m.graph.node:
        keep = [kv for kv in n.metadata_props if kv.key in KEPT_METADATA or
                (kv.key == FX_NODE and any(s in kv.value for s in FX_READ))]
        del n.metadata_props[:]
        n.metadata_props.extend(keep)
    return m.SerializeToString()


def inline(src, dst):
    with open(dst, "wb") as f:
        f.write(ci_model(src))


def copy_export(work, k, files, rec):
    """Copies export `k` of `work` into ci/; returns its expected.json entry."""
    for x in files:
        dst = os.path.join(CI, k, x)
        os.makedirs(os.path.dirname(dst), exist_ok=True)
        if x == "model.onnx":
            inline(os.path.join(work, k, x), dst)
        elif x.startswith("reference64/grad."):
            np.save(dst, np.load(os.path.join(work, k, x)).astype(np.float32))
        else:
            shutil.copyfile(os.path.join(work, k, x), dst)
    if "grad_err_torch" in rec:
        with open(os.path.join(CI, k, "reference64", "torch_f32_error.txt"), "w") as f:
            f.write("%.6e\n" % rec["grad_err_torch"])
    entry = collections.OrderedDict((c, bool(rec.get(c))) for c in COLUMNS)
    reason = next((rec[r] for r in ("reason", "grads_reason", "train_reason",
                                    "stages_reason", "threads_reason", "loss_reason")
                   if rec.get(r)), None)
    if reason:
        entry["reason"] = reason
    return entry


def add_exports(work, keys, results, cands):
    """--add: the named exports join the committed subset as they are (the
    greedy choice is not rerun; the exports there stay): copied, with their
    expected.json and ops.json entries and a row of the README's table."""
    def load(name):
        with open(os.path.join(CI, name)) as f:
            return json.load(f, object_pairs_hook=collections.OrderedDict)
    expected, ops_by = load("expected.json"), load("ops.json")
    with open(os.path.join(CI, "README.md")) as f:
        lines = f.read().split("\n")
    last_row = max(i for i, l in enumerate(lines) if l.startswith("| "))
    rows = []
    for k in keys:
        ops, size, files, rec = cands[k]
        seen = set().union(*(set(v) for v in ops_by.values()))
        expected[k] = copy_export(work, k, files, rec)
        ops_by[k] = sorted(ops)
        rows.append("| %s | %d | %s | %s |" % (
            k, size, " | ".join("yes" if rec.get(c) else "no" for c in COLUMNS),
            ", ".join(sorted(ops - seen)) or "(none new: added for what it trains)"))
        print("added %s (%d B)" % (k, size))
    lines[last_row + 1:last_row + 1] = rows
    table = [l for l in lines if l.startswith("| ") and not l.startswith("| export")]
    total = sum(int(l.split("|")[2]) for l in table)
    covered = set().union(*(set(v) for v in ops_by.values()))
    for i, l in enumerate(lines):
        if l.split(" ")[1:2] == ["exports,"]:
            rest = l.split(" op types", 1)[1]
            marker = "; not covered (over the byte budget): "
            if rest.startswith(marker):
                left = [o for o in rest[len(marker):].rstrip(".").split(", ")
                        if o not in covered]
                rest = marker + ", ".join(left) + "." if left else "."
            lines[i] = "%d exports, %d bytes, %d op types%s" % (
                len(table), total, len(covered), rest)
    for name, data in (("expected.json", expected), ("ops.json", ops_by)):
        with open(os.path.join(CI, name), "w") as f:
            json.dump(data, f, indent=1)
            f.write("\n")
    with open(os.path.join(CI, "README.md"), "w") as f:
        f.write("\n".join(lines))


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--work", default="/tmp/cleave-zoo")
    ap.add_argument("--budget", type=int, default=1500000, help="bytes in all")
    ap.add_argument("--always", default="", help="exports to take first")
    ap.add_argument("--dry-run", action="store_true")
    ap.add_argument("--add", default="",
                    help="add these exports of --work to the committed subset")
    args = ap.parse_args()
    with open(os.path.join(args.work, "results.json")) as f:
        results = json.load(f)["results"]
    cands = {}
    for key, rec in results.items():
        folder = os.path.join(args.work, key)
        if not rec.get("exported") or not os.path.exists(os.path.join(folder, "info.json")):
            continue
        with open(os.path.join(folder, "info.json")) as f:
            info = json.load(f)
        files = ci_files(folder)
        size = sum(os.path.getsize(os.path.join(folder, x)) // (
            2 if x.startswith("reference64/grad.") else 1) for x in files
            if x != "model.onnx") + len(ci_model(os.path.join(folder, "model.onnx")))
        cands[key] = (set(info["op_histogram"]), size, files, rec)
    if args.add:
        add_exports(args.work, [k for k in args.add.split(",") if k], results, cands)
        return
    chosen, covered, total = [], set(), 0
    for key in [k for k in args.always.split(",") if k]:
        ops, size, _, _ = cands[key]
        chosen.append(key)
        covered |= ops
        total += size
    for imported in (True, False):
        pool = {k: v for k, v in cands.items() if bool(v[3].get("imported")) == imported}
        while True:
            best, score = None, 0.0
            for k, (ops, size, _, _) in pool.items():
                if k in chosen or total + size > args.budget:
                    continue
                gain = len(ops - covered)
                if gain and gain / size > score:
                    best, score = k, gain / size
            if best is None:
                break
            chosen.append(best)
            covered |= pool[best][0]
            total += pool[best][1]
    everything = set().union(*(v[0] for v in cands.values())) if cands else set()
    missing = sorted(everything - covered)
    for k in chosen:
        ops, size, _, rec = cands[k]
        print("%-34s %8d B  %s" % (k, size, " ".join(
            "%s=%s" % (c, "yes" if rec.get(c) else "no") for c in COLUMNS)))
    print("%d exports, %d bytes; %d of %d op types covered%s" % (
        len(chosen), total, len(covered), len(everything),
        "; not covered (budget): " + ", ".join(missing) if missing else ""))
    if args.dry_run:
        return
    for d in os.listdir(CI) if os.path.isdir(CI) else []:
        if os.path.isdir(os.path.join(CI, d)):
            shutil.rmtree(os.path.join(CI, d))
    expected, ops_by = collections.OrderedDict(), collections.OrderedDict()
    for k in chosen:
        ops, _, files, rec = cands[k]
        expected[k] = copy_export(args.work, k, files, rec)
        ops_by[k] = sorted(ops)
    with open(os.path.join(CI, "expected.json"), "w") as f:
        json.dump(expected, f, indent=1)
        f.write("\n")
    with open(os.path.join(CI, "ops.json"), "w") as f:
        json.dump(ops_by, f, indent=1)
        f.write("\n")
    write_readme(chosen, cands, total, covered, missing)


README_HEAD = """# The sweep's CI subset

Exports chosen from a model-zoo sweep run (`../zoo.py`) by `../select_ci.py`:
a greedy set cover of the ONNX op types over every export the sweep made,
cheapest per new op type first, exports that cleave imports first, then one
small export per op cleave refuses today. CI checks them with cleave's
tools only (no PyTorch):

    python3 tests/models/sweep/check_ci.py --tools build/tools

(python3 with numpy: the onnxruntime venv of `scripts/common.sh`,
`cleave_ensure_ort_python`). Each folder has the sweep's layout (`../README.md`):
`model.onnx` (weights inside; of the dynamo exporter's node metadata only
what cleave reads is kept: `pkg.torch.onnx.name_scopes`, and the FX node
text of embeddings, statistics-free BatchNorms, cross-entropy losses,
`scatter_reduce` and average pooling), `inputs/`,
`reference64/` (PyTorch's float64 gradients, stored as float32, and
`torch_f32_error.txt`, PyTorch float32's own error against them),
`steps/` (3 steps x 4 microbatches of data, `hyper.txt`, PyTorch's step
losses and its loss on `inputs/` after the steps), `info.json`.
`expected.json` holds the sweep's five cleave columns for each export when
it was chosen (and the first failure's reason); `check_ci.py` fails on a
column that held then and fails now, and names the ones that now hold and
did not (update `expected.json` then). `ops.json` lists each export's op types.

Regenerate (after a sweep run into /tmp/cleave-zoo):

    $VENV/bin/python tests/models/sweep/select_ci.py --work /tmp/cleave-zoo --budget %(budget)d

"""


def write_readme(chosen, cands, total, covered, missing):
    lines = [README_HEAD % {"budget": max(total, 1)}]
    lines.append("| export | bytes | imported | grads | stages | threads | loss | op types it adds |")
    lines.append("|---|---|---|---|---|---|---|---|")
    seen = set()
    for k in chosen:
        ops, size, _, rec = cands[k]
        new = sorted(ops - seen)
        seen |= ops
        lines.append("| %s | %d | %s | %s |" % (
            k, size, " | ".join("yes" if rec.get(c) else "no" for c in COLUMNS),
            ", ".join(new)))
    lines.append("")
    lines.append("%d exports, %d bytes, %d op types%s." % (
        len(chosen), total, len(covered),
        "; not covered (over the byte budget): " + ", ".join(missing) if missing else
        ": every op type the sweep's exports hold"))
    with open(os.path.join(CI, "README.md"), "w") as f:
        f.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
