#!/usr/bin/env python3
"""The model-zoo sweep: does cleave train what PyTorch trains, model by model?

Run with the pinned PyTorch 2 venv (tests/models/corpus/make-venv.sh):

    HF_HUB_OFFLINE=1 nice $VENV/bin/python tests/models/sweep/zoo.py \
        [--only gpt2,resnet18] [--exporters dynamo,legacy] [--list] \
        [--work /tmp/cleave-zoo] [--tools build/tools] [--timeout 300]

Every entry of the registry (models.py: small random-init configurations of
transformers and torchvision classes, each wrapped to return its loss) is
exported the README's way (dynamo=True, optimize=False) and with the legacy
exporter, in train() with every dropout 0, into <work>/<model>-<exporter>/,
laid out as tests/models/corpus/ (model.onnx, inputs/, reference/,
reference64/, steps/). PyTorch's references are train()-mode semantics
(BatchNorm with batch statistics), float32 and float64 (the float64 copy
runs under the corpus's Float64Mode), and a 3-step SGD run of 4 microbatches
per step.

Then cleave runs through its command-line tools and six columns are
recorded per export:

  exported   torch.onnx.export succeeded
  imported   `cleavec model.onnx` exits 0 (else its first error line)
  grads      first-microbatch gradients from `cleave-opt --passes=<cleavec's
             training pipeline up to verify-2bp> --run` within 10x PyTorch
             float32's own error against float64 (tests/unit/corpus_test.cpp's
             metric)
  stages     a 2-stage plan's parameters after 3 steps are the 1-stage
             plan's, byte for byte (`cleave-run --save`)
  threads    `--threads` 1, 2 and 4 give the same bytes
  loss       the loss of the trained model (cleave-opt --run on the saved
             .onnx, first microbatch) within 1e-3 (relative) of PyTorch's
             after the same 3 steps

Results go to <work>/results.json (merged with an earlier run's, so a sweep
can be resumed or extended with --only) and <work>/results.md. Any failure
of one model is recorded as that model's reason; the sweep goes on.
"""

import argparse
import collections
import contextlib
import copy
import datetime
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import time
import traceback
import warnings

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(HERE)))
sys.path.insert(0, HERE)

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.nn as nn  # noqa: E402

import models  # noqa: E402
sys.path.insert(0, os.path.join(ROOT, "examples", "pytorch"))
from annotate_export import annotate_export  # noqa: E402
from cleave_checks import (COLUMNS, F64_LOSS_RTOL, F64_RTOL, GRAD_FACTOR, LOSS_RTOL, THREADS, Tools,  # noqa: E402
                           recheck_grads, recheck_loss, run_cleave)

STEPS = 3
MICROBATCHES = 4
LR = 0.01
MOMENTUM = 0.9


# --------------------------------------------------------------------------
# PyTorch side

class Float64Mode(torch.overrides.TorchFunctionMode):
    """Every float32 request made float64 (transformers computes RMSNorm,
    rotary embeddings and its losses in float32 whatever the model's dtype;
    tests/models/corpus/export_corpus.py's Float64Mode). float32_results
    counts float32 tensors still produced."""

    def __init__(self):
        super().__init__()
        self.float32_results = 0
        self.saved_default = None

    def __enter__(self):
        # Factory calls without a dtype (XGLM's torch.full((), finfo(dtype).min))
        # make float64 too.
        self.saved_default = torch.get_default_dtype()
        torch.set_default_dtype(torch.float64)
        return super().__enter__()

    def __exit__(self, *exc):
        torch.set_default_dtype(self.saved_default)
        return super().__exit__(*exc)

    def __torch_function__(self, func, types, args=(), kwargs=None):
        from torch.utils._pytree import tree_flatten, tree_map
        kwargs = kwargs or {}
        if func is torch.Tensor.float:
            func = torch.Tensor.double

        def fix(a):
            return torch.float64 if a is torch.float32 else a
        out = func(*tree_map(fix, args), **tree_map(fix, kwargs))
        for t in tree_flatten(out)[0]:
            if isinstance(t, torch.Tensor) and t.dtype == torch.float32:
                self.float32_results += 1
        return out


def precision(dtype):
    return Float64Mode() if dtype == torch.float64 else contextlib.nullcontext()


def cast_inputs(inputs, dtype):
    return [t.to(dtype) if t.is_floating_point() else t for t in inputs]


def autograd(model, inputs, dtype):
    """(loss, {param name: grad or None}, float32 results left under f64)."""
    m = copy.deepcopy(model).to(dtype)
    m.train()
    m.zero_grad()
    with precision(dtype) as mode:
        loss = m(*cast_inputs(inputs.values(), dtype))
        loss.backward()
    grads = collections.OrderedDict(
        (n, None if p.grad is None else p.grad.detach().clone())
        for n, p in m.named_parameters())
    return float(loss.detach()), grads, (mode.float32_results if mode is not None else 0)


def rows(t, s, mb, batch):
    k = s * MICROBATCHES + mb
    return t[k * batch:(k + 1) * batch]


def multi_step(model, data, inputs, batch, dtype=torch.float32, lr=LR, momentum=MOMENTUM):
    """SGD(LR, MOMENTUM): each step zero_grad, (loss(mb)/M).backward() for
    M microbatches, step. Returns (params, step losses, loss of the trained
    model on `inputs`)."""
    m = copy.deepcopy(model).to(dtype)
    m.train()
    opt = torch.optim.SGD(m.parameters(), lr=lr, momentum=momentum)
    losses = []
    for s in range(STEPS):
        opt.zero_grad()
        total = 0.0
        for mb in range(MICROBATCHES):
            args = cast_inputs([rows(t, s, mb, batch) for t in data.values()], dtype)
            with precision(dtype):
                loss = m(*args)
                (loss / MICROBATCHES).backward()
            total += float(loss.detach())
        losses.append(total / MICROBATCHES)
        opt.step()
    with torch.no_grad(), precision(dtype):
        after = float(m(*cast_inputs(inputs.values(), dtype)))
    params = collections.OrderedDict((n, p.detach().clone()) for n, p in m.named_parameters())
    return params, losses, after


def export(exporter, wrapped, inputs, path):
    import onnx
    args = tuple(inputs.values())
    names = list(inputs.keys())
    model = copy.deepcopy(wrapped)
    model.train()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if exporter == "dynamo":
            torch.onnx.export(model, args, path, dynamo=True, optimize=False,
                              input_names=names, output_names=["loss"], verbose=False)
        else:
            torch.onnx.export(model, args, path, dynamo=False, opset_version=17,
                              training=torch.onnx.TrainingMode.TRAINING,
                              do_constant_folding=False, input_names=names,
                              output_names=["loss"])
    # The README's step after the export: what the exporters leave out
    # (requires_grad=False, padding_idx) recorded in the file
    # (examples/pytorch/annotate_export.py).
    annotate_export(model, path)
    return onnx.load(path, load_external_data=False)


def map_params(wrapped, graph):
    """{initializer name: parameter name} for the parameters the graph holds:
    by any of a parameter's names (a tied weight has several), else by an
    equal value."""
    import onnx.numpy_helper
    aliases = collections.OrderedDict()
    for n, p in wrapped.named_parameters(remove_duplicate=False):
        aliases.setdefault(id(p), []).append(n)
    first = {id(p): n for n, p in wrapped.named_parameters()}
    by_name = {a: first[k] for k, names in aliases.items() for a in names}
    out = collections.OrderedDict()
    for init in graph.initializer:
        if init.name in by_name:
            out[init.name] = by_name[init.name]
    unmatched = [(n, p) for n, p in wrapped.named_parameters() if n not in out.values()]
    for init in graph.initializer:
        if init.name in out or init.data_type != 1 or not unmatched:
            continue
        dims = tuple(init.dims)
        cands = [(n, p) for n, p in unmatched if tuple(p.shape) == dims]
        if not cands:
            continue
        a = onnx.numpy_helper.to_array(init)
        hits = [n for n, p in cands if np.array_equal(a, p.detach().numpy())]
        if len(hits) == 1:
            out[init.name] = hits[0]
    return out


def save(path, array):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    np.save(path, array, allow_pickle=False)


def histogram(graph):
    h = collections.Counter(n.op_type for n in graph.node)
    return collections.OrderedDict(sorted(h.items()))


# --------------------------------------------------------------------------

def build_references(entry, index):
    """(wrapped module, inputs, data, batch, refs) for one registry entry;
    refs holds the float32/float64 gradients and the 3-step run."""
    torch.manual_seed(1000 + index)
    gen = torch.Generator().manual_seed(1000 + index)
    module, sample, wrapper, batch = entry.build()
    perturbed = models.perturb_constant_params(module, gen)
    wrapped = wrapper(module)
    models.warm_up_batchnorm(wrapped, sample, batch, gen)
    models.no_dropout(wrapped)
    wrapped.train()
    inputs = sample(torch.Generator().manual_seed(2000 + index), batch)
    data = sample(torch.Generator().manual_seed(3000 + index), STEPS * MICROBATCHES * batch)
    loss32, g32, _ = autograd(wrapped, inputs, torch.float32)
    loss64, g64, f32_left = autograd(wrapped, inputs, torch.float64)
    p32, losses, after = multi_step(wrapped, data, inputs, batch)
    # The float64 run says how far float32 rounding alone moves the 3 steps
    # (BatchNorm networks at batch 4 are chaotic: 1e-1 apart at times).
    _, losses64, after64 = multi_step(wrapped, data, inputs, batch, torch.float64)
    refs = dict(sample=sample, index=index, losses64=losses64, after64=after64, loss32=loss32, loss64=loss64, g32=g32, g64=g64, f32_left=f32_left,
                params=p32, losses=losses, after=after, perturbed=len(perturbed),
                n_params=sum(p.numel() for p in wrapped.parameters()))
    return wrapped, inputs, data, batch, refs


def build_export(entry, exporter, wrapped, inputs, data, batch, refs, folder):
    shutil.rmtree(folder, ignore_errors=True)
    os.makedirs(folder)
    path = os.path.join(folder, "model.onnx")
    mo = export(exporter, wrapped, inputs, path)
    graph = mo.graph
    mapping = map_params(wrapped, graph)
    for k, t in inputs.items():
        save(os.path.join(folder, "inputs", k + ".npy"), t.numpy())
    save(os.path.join(folder, "reference", "loss.npy"), np.float32(refs["loss32"]))
    save(os.path.join(folder, "reference64", "loss.npy"), np.float64(refs["loss64"]))
    for init, pname in mapping.items():
        if refs["g32"][pname] is None:
            continue   # not on the loss's path
        save(os.path.join(folder, "reference", "grad.%s.npy" % init),
             refs["g32"][pname].numpy())
        save(os.path.join(folder, "reference64", "grad.%s.npy" % init),
             refs["g64"][pname].numpy())
        save(os.path.join(folder, "steps", "params", init + ".npy"),
             refs["params"][pname].numpy())
    with open(os.path.join(folder, "reference", "params.txt"), "w") as f:
        f.write("".join(i + "\n" for i in mapping))
    for k, t in data.items():
        save(os.path.join(folder, "steps", "data", k + ".npy"), t.numpy())
    save(os.path.join(folder, "steps", "losses.npy"), np.asarray(refs["losses"], np.float32))
    save(os.path.join(folder, "steps", "loss_after.npy"), np.float32(refs["after"]))
    save(os.path.join(folder, "steps", "loss_after64.npy"), np.float64(refs["after64"]))
    with open(os.path.join(folder, "steps", "hyper.txt"), "w") as f:
        f.write("lr %g\nmomentum %g\nmicrobatches %d\nsteps %d\nbatch %d\n" % (
            LR, MOMENTUM, MICROBATCHES, STEPS, batch))
    unmapped = [n for n, g in refs["g32"].items()
                if g is not None and n not in mapping.values()]
    opset = {(o.domain or "ai.onnx"): o.version for o in mo.opset_import}.get("ai.onnx")
    info = collections.OrderedDict([
        ("model", entry.name), ("exporter", exporter), ("class", entry.cls),
        ("opset", opset), ("nodes", len(graph.node)),
        ("op_histogram", histogram(graph)),
        ("functions", len(mo.functions)),
        ("model_bytes", sum(os.path.getsize(os.path.join(folder, f))
                            for f in os.listdir(folder) if f.startswith("model.onnx"))),
        ("parameters", refs["n_params"]), ("parameter_tensors", len(mapping)),
        ("unmapped_parameters", unmapped),
        ("inputs", [[k, list(t.shape), str(t.dtype)] for k, t in inputs.items()]),
        ("loss", refs["loss32"]), ("loss64", refs["loss64"]),
        ("steps_losses", refs["losses"]), ("loss_after", refs["after"]),
        ("steps_losses64", refs["losses64"]), ("loss_after64", refs["after64"]),
        ("float32_results_under_float64", refs["f32_left"]),
    ])
    with open(os.path.join(folder, "info.json"), "w") as f:
        json.dump(info, f, indent=1)
    return info


def float64_recheck(exporter, wrapped, inputs, data, batch, refs, folder, tools, rec):
    """Where float32 misses the grads or loss bound, tell rounding from a
    wrong graph: export the float64 module and check that cleave computes
    PyTorch's float64 gradients and 3-step loss to F64_RTOL (a wrong op or
    semantics is off by far more), and that float32 gradients pass on a
    second input sample (rounding that decides a kink, such as a ReLU input
    within float32 error of 0, is particular to one sample)."""
    grads_failed = rec.get("grads") is False and "grad_err_cleave" in rec
    loss_failed = rec.get("loss") is False and "cleave_loss_after" in rec
    if not (grads_failed or loss_failed):
        return
    f64 = os.path.join(folder, "f64")
    shutil.rmtree(f64, ignore_errors=True)
    os.makedirs(f64)
    try:
        export(exporter, copy.deepcopy(wrapped).double(),
               collections.OrderedDict(zip(inputs, cast_inputs(inputs.values(), torch.float64))),
               os.path.join(f64, "model.onnx"))
    except Exception as e:  # noqa: BLE001
        rec["f64_reason"] = "float64 export: " + first_line(e)
        return
    mapping = map_params(wrapped, export_graph(os.path.join(f64, "model.onnx")))
    for k, t in zip(inputs, cast_inputs(inputs.values(), torch.float64)):
        save(os.path.join(f64, "inputs", k + ".npy"), t.numpy())
    for k, t in zip(data, cast_inputs(data.values(), torch.float64)):
        save(os.path.join(f64, "steps", "data", k + ".npy"), t.numpy())
    shutil.copy(os.path.join(folder, "steps", "hyper.txt"), os.path.join(f64, "steps"))
    for init, pname in mapping.items():
        if refs["g64"][pname] is not None:
            save(os.path.join(f64, "reference64", "grad.%s.npy" % init), refs["g64"][pname].numpy())
    if grads_failed:
        # The second sample's float32 and float64 references.
        gen = torch.Generator().manual_seed(2500 + refs["index"])
        inputs2 = refs["sample"](gen, batch)
        _, g32, _ = autograd(wrapped, inputs2, torch.float32)
        _, g64, _ = autograd(wrapped, inputs2, torch.float64)
        s2 = os.path.join(folder, "sample2")
        shutil.rmtree(s2, ignore_errors=True)
        for k, t in inputs2.items():
            save(os.path.join(s2, "inputs", k + ".npy"), t.numpy())
        for init, pname in map_params(wrapped, export_graph(os.path.join(folder, "model.onnx"))).items():
            if g32[pname] is not None:
                save(os.path.join(s2, "reference", "grad.%s.npy" % init), g32[pname].numpy())
                save(os.path.join(s2, "reference64", "grad.%s.npy" % init), g64[pname].numpy())
        recheck_grads(folder, tools, rec)
    if loss_failed:
        # The same hyperparameters as the float32 steps: cleave holds them
        # in float32 and applies the decimal they were written as to float64
        # parameters (ir::decimalWidened), as PyTorch float64 does.
        save(os.path.join(f64, "steps", "loss_after64.npy"), np.float64(refs["after64"]))
        recheck_loss(folder, tools, rec)


def export_graph(path):
    import onnx
    return onnx.load(path, load_external_data=False).graph


def first_line(e):
    return reason_line("%s: %s" % (type(e).__name__, str(e).strip()))


def reason_line(text):
    """The line of an exception's text that names the cause: torch.onnx
    wraps the exporter's own error (a line `<class 'ValueError'>: ...`)
    in a page of advice."""
    text = re.sub(r"\x1b\[[0-9;]*m", "", text)
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    for ln in lines:
        if ln.startswith("<class '"):
            return ln[:300]
    for ln in lines:
        if any(k in ln for k in ("Unsupported", "unsupported", "not supported",
                                  "Could not", "could not")):
            return ln[:300]
    return lines[0][:300] if lines else "?"


def sweep_model(entry, index, exporters, work, tools, results, save_results):
    t0 = time.time()
    try:
        wrapped, inputs, data, batch, refs = build_references(entry, index)
    except Exception as e:  # noqa: BLE001
        for exp in exporters:
            results["%s-%s" % (entry.name, exp)] = collections.OrderedDict([
                ("model", entry.name), ("class", entry.cls), ("family", entry.family),
                ("exporter", exp), ("exported", False),
                ("reason", "model/reference: " + first_line(e)),
                ("trace", traceback.format_exc()[-2000:])])
        save_results()
        print("%-28s MODEL FAILED %s" % (entry.name, first_line(e)), flush=True)
        return
    for exp in exporters:
        key = "%s-%s" % (entry.name, exp)
        rec = collections.OrderedDict([("model", entry.name), ("class", entry.cls),
                                       ("family", entry.family), ("exporter", exp)])
        folder = os.path.join(work, key)
        t1 = time.time()
        try:
            info = build_export(entry, exp, wrapped, inputs, data, batch, refs, folder)
            rec["exported"] = True
            rec["nodes"] = info["nodes"]
            rec["parameters"] = info["parameters"]
            rec["ops"] = sorted(info["op_histogram"])
            rec["loss_torch"] = refs["loss32"]
            if info["unmapped_parameters"]:
                rec["note"] = "parameters not found among initializers: %s" % ", ".join(
                    info["unmapped_parameters"][:4])
        except Exception as e:  # noqa: BLE001
            rec["exported"] = False
            rec["reason"] = "export: " + first_line(e)
            rec["trace"] = traceback.format_exc()[-2000:]
        if rec["exported"]:
            try:
                run_cleave(folder, tools, rec)
                float64_recheck(exp, wrapped, inputs, data, batch, refs, folder, tools, rec)
            except Exception as e:  # noqa: BLE001
                rec["reason"] = "sweep: " + first_line(e)
                rec["trace"] = traceback.format_exc()[-2000:]
        rec["seconds"] = round(time.time() - t1, 1)
        results[key] = rec
        save_results()
        print("%-28s %s %s" % (key, " ".join(
            "%s=%s" % (c, mark(rec.get(c))) for c in COLUMNS), short_reason(rec)), flush=True)
    del wrapped
    print("%-28s (%.0fs)" % (entry.name, time.time() - t0), flush=True)


def mark(v):
    return {True: "yes", False: "NO", None: "-"}[v]


def short_reason(rec):
    for k in ("reason", "grads_reason", "train_reason", "stages_reason", "threads_reason",
              "loss_reason"):
        if rec.get(k):
            return "[%s] %s" % (k, rec[k])
    return ""


def machine():
    cpu = ""
    flags = ""
    try:
        with open("/proc/cpuinfo") as f:
            text = f.read()
        cpu = re.search(r"model name\s*:\s*(.*)", text).group(1)
        flags = "avx512f" if " avx512f" in text else "no avx512f"
    except Exception:  # noqa: BLE001
        pass
    return "%s, %d cores, %s, %s" % (cpu, os.cpu_count() or 0, flags, platform.platform())


def markdown(results, meta):
    from report import table
    return table(results, meta)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", default="", help="comma-separated registry names")
    ap.add_argument("--family", default="",
                    help="one family of --list (transformers, torchvision, timm, torch.nn, "
                         "'torch.nn losses', 'torch.nn layers', ...)")
    ap.add_argument("--exporters", default="dynamo,legacy")
    ap.add_argument("--work", default="/tmp/cleave-zoo")
    ap.add_argument("--tools", default=os.path.join(ROOT, "build", "tools"))
    ap.add_argument("--timeout", type=int, default=300, help="seconds per cleave command")
    ap.add_argument("--jobs", type=int, default=1, help="models at a time (only 1)")
    ap.add_argument("--list", action="store_true", help="print the registry and exit")
    ap.add_argument("--skip-done", action="store_true",
                    help="leave out exports already in results.json")
    args = ap.parse_args()
    if args.jobs != 1:
        ap.error("--jobs: the sweep runs one model at a time")
    reg = models.registry()
    if args.list:
        for e in reg:
            print("%-28s %-12s %s" % (e.name, e.family, e.cls))
        count = collections.Counter(e.family for e in reg)
        print("%d entries: %s" % (len(reg), ", ".join(
            "%d %s" % (n, fam) for fam, n in count.most_common())))
        return
    names = [n for n in args.only.split(",") if n]
    by_name = {e.name: e for e in reg}
    for n in names:
        if n not in by_name:
            ap.error("unknown model %r (see --list)" % n)
    todo = [by_name[n] for n in names] if names else [
        e for e in reg if not args.family or e.family == args.family]
    exporters = [x for x in args.exporters.split(",") if x]
    for x in exporters:
        if x not in ("dynamo", "legacy"):
            ap.error("--exporters: dynamo and/or legacy")
    os.makedirs(args.work, exist_ok=True)
    tools = Tools(os.path.abspath(args.tools), args.timeout)
    res_path = os.path.join(args.work, "results.json")
    results = collections.OrderedDict()
    meta = {}
    if os.path.exists(res_path):
        with open(res_path) as f:
            old = json.load(f)
        results.update(old.get("results", {}))
        meta = old.get("meta", {})
    meta.update({
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "machine": machine(), "torch": torch.__version__,
        "command": " ".join(["zoo.py"] + sys.argv[1:]),
        "lr": LR, "momentum": MOMENTUM, "steps": STEPS, "microbatches": MICROBATCHES,
        "loss_rtol": LOSS_RTOL, "grad_factor": GRAD_FACTOR, "f64_rtol": F64_RTOL, "f64_loss_rtol": F64_LOSS_RTOL, "threads": list(THREADS),
    })
    try:
        import transformers
        import torchvision
        meta["transformers"] = transformers.__version__
        meta["torchvision"] = torchvision.__version__
        import timm
        meta["timm"] = timm.__version__
    except Exception:  # noqa: BLE001
        pass

    def save_results():
        tmp = res_path + ".tmp"
        with open(tmp, "w") as f:
            json.dump({"meta": meta, "results": results}, f, indent=1)
        os.replace(tmp, res_path)
        with open(os.path.join(args.work, "results.md"), "w") as f:
            f.write(markdown(results, meta))

    torch.set_num_threads(1)
    # Seeds by registry index; a variant (models.variant) takes its base
    # entry's, so that both start from the same weights and samples.
    position = {e.name: i for i, e in enumerate(reg)}
    index = {e.name: position[getattr(e.build, "seed_of", e.name)] for e in reg}
    for e in todo:
        if args.skip_done and all("%s-%s" % (e.name, x) in results for x in exporters):
            continue
        sweep_model(e, index[e.name], exporters, args.work, tools, results, save_results)
    save_results()
    print(markdown(results, meta))


if __name__ == "__main__":
    main()
