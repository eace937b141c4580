"""The cleave side of the model-zoo sweep: the five columns after export,
measured on one export folder through cleave's command-line tools.

Needs numpy only (onnx, where present, adds how far the trained parameters
are from PyTorch's), so that zoo.py (with PyTorch) and check_ci.py (CI,
without PyTorch) share it. A folder holds what zoo.py writes, the layout of
tests/models/corpus/*:

    model.onnx, inputs/<input>.npy, reference/grad.<init>.npy (float32),
    reference64/grad.<init>.npy (float64; in the CI copies float32, with
    PyTorch float32's error in reference64/torch_f32_error.txt instead of
    reference/), steps/data/<input>.npy (3 steps
    x 4 microbatches), steps/hyper.txt, steps/loss_after.npy (PyTorch's
    loss on inputs/ after the 3 steps), steps/params/<init>.npy
"""

import os
import re
import shutil
import subprocess
import time

import numpy as np

GRAD_FACTOR = 10.0
GRAD_FLOOR = 1e-7
LOSS_RTOL = 1e-3
# The float64 recheck (zoo.py float64_recheck): cleave's float64 gradients
# against PyTorch's float64 ones, and its loss after the 3 steps. The loss
# bound is looser: the BatchNorm networks at batch 4 amplify float64
# rounding too (ResNet-50's gradients differ by 3e-10 between any two
# float64 implementations, its 3-step loss by 5e-6), while a semantic
# difference shows far above it (a learning rate 2.2e-8 off, relative,
# moves ResNet-50's 3-step loss by 2e-3).
F64_RTOL = 1e-8
F64_LOSS_RTOL = 1e-4
# cleavec's graph pipeline (passes/Pipelines.cpp, less the bf16-only
# mixed-precision) and its training passes up to the 2BP check: the graph
# whose outputs are the loss and every grad.<param>. (`cleavec
# --dump-ir-after=bogus` lists the pipeline; keep the two the same, or the
# gradients checked are not the ones cleavec trains with.)
GRAD_PASSES = ("remove-identity,slice-packed-views,recognize-gelu,recognize-silu,"
               "stable-log-sigmoid,recognize-rms-norm,recognize-attention,pack-attention,matmul-to-gemm,"
               "batch-major-attention,"
               "dce,autodiff,split-backward,verify-2bp")
THREADS = (1, 2, 4)
COLUMNS = ("exported", "imported", "grads", "stages", "threads", "loss")


def read_hyper(folder):
    h = {}
    with open(os.path.join(folder, "steps", "hyper.txt")) as f:
        for line in f:
            k, v = line.split()
            h[k] = float(v) if "." in v or "e" in v else int(v)
    return h


class Tools:
    """cleave's tools in `folder`; every execution (cleave-run, cleave-opt
    --run) on `device` (cpu, cuda-emulated or cuda)."""

    def __init__(self, folder, timeout, device="cpu"):
        self.folder = folder
        self.timeout = timeout
        self.device = device

    def run(self, tool, args, cwd, log):
        """(exit code, first error line, stdout) of one tool call; the whole
        call and its output appended to `log`."""
        cmd = [os.path.join(self.folder, tool)] + [str(a) for a in args]
        if self.device != "cpu" and (tool == "cleave-run" or
                                     (tool == "cleave-opt" and "--run" in cmd)):
            cmd += ["--device", self.device]
        t0 = time.time()
        try:
            p = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True,
                               timeout=self.timeout, errors="replace")
            code, out, err = p.returncode, p.stdout, p.stderr
        except subprocess.TimeoutExpired as e:
            code, out = -1, (e.stdout or b"").decode(errors="replace") if isinstance(
                e.stdout, bytes) else (e.stdout or "")
            err = "timed out after %ds" % self.timeout
        with open(log, "a") as f:
            f.write("$ %s  (exit %s, %.1fs)\n%s%s\n" % (
                " ".join(cmd), code, time.time() - t0, out[-4000:], err[-4000:]))
        line = ""
        if code != 0:
            lines = [ln.strip() for ln in (err + "\n" + out).splitlines() if ln.strip()]
            errs = [ln for ln in lines if "error" in ln.lower()] or lines
            line = errs[0] if errs else "exit %s" % code
            if code < 0 and code != -1:
                line = "killed by signal %d" % -code
        return code, line[:300], out


def read_npy_dir(folder):
    return {f[:-4]: np.load(os.path.join(folder, f)) for f in os.listdir(folder)
            if f.endswith(".npy")}


def saved_params(path):
    """{initializer: array} of a model cleave-run saved (needs onnx)."""
    import onnx
    import onnx.numpy_helper
    m = onnx.load(path)
    return {i.name: onnx.numpy_helper.to_array(i) for i in m.graph.initializer}


def same_bytes(a, b):
    with open(a, "rb") as fa, open(b, "rb") as fb:
        return fa.read() == fb.read()


def grad_error(mine, ref32, ref64):
    """tests/unit/corpus_test.cpp's metric: per tensor max|g - g64| / scale,
    scale = the tensor's max|g64|, or the model's largest where the tensor's
    is under 1e-4 of it (a gradient zero in exact arithmetic); the model's
    error is the worst tensor's. Returns (cleave, PyTorch f32 or 0 without
    ref32, worst name)."""
    model_scale = max(float(np.max(np.abs(g))) if g.size else 0.0 for g in ref64.values())
    worst, e_mine, e_torch = None, 0.0, 0.0
    for name, g64 in ref64.items():
        own = float(np.max(np.abs(g64))) if g64.size else 0.0
        scale = model_scale if own < 1e-4 * model_scale else own
        scale = max(scale, 1e-30)
        e = float(np.max(np.abs(mine[name].astype(np.float64) - g64))) / scale if g64.size else 0.0
        if not np.isfinite(e):
            e = float("inf")
        if e >= e_mine:
            e_mine, worst = e, name
        if ref32 is not None:
            e_torch = max(e_torch, float(np.max(np.abs(ref32[name].astype(np.float64) - g64)))
                          / scale if g64.size else 0.0)
    return e_mine, e_torch, worst


def run_cleave(folder, tools, rec):
    """The five cleave columns of one export folder into rec."""
    log = os.path.join(folder, "cleave.log")
    if os.path.exists(log):
        os.remove(log)
    model = "model.onnx"
    h = read_hyper(folder)
    steps = h["steps"]
    hyper = ["--microbatches", h["microbatches"], "--optimizer", "sgd", "--lr", h["lr"],
             "--momentum", h["momentum"]]
    code, line, _ = tools.run("cleavec", [model] + hyper + ["--stages", 1, "-o", "p1.cplan"],
                              folder, log)
    rec["imported"] = code == 0
    if code != 0:
        rec["reason"] = line
        return

    # Gradients of the first microbatch.
    gdir = os.path.join(folder, "cleave-grads")
    shutil.rmtree(gdir, ignore_errors=True)
    code, line, _ = tools.run("cleave-opt", [model, "--passes=" + GRAD_PASSES, "--run",
                                             "--inputs", "inputs", "--outputs", "cleave-grads"],
                              folder, log)
    if code != 0:
        rec["grads"] = False
        rec["grads_reason"] = line
    else:
        got = read_npy_dir(gdir)
        ref32 = {k[5:]: v for k, v in read_npy_dir(os.path.join(folder, "reference")).items()
                 if k.startswith("grad.")}
        ref64 = {k[5:]: v for k, v in read_npy_dir(os.path.join(folder, "reference64")).items()
                 if k.startswith("grad.")}
        mine = {k[5:]: v for k, v in got.items() if k.startswith("grad.")}
        # The CI copies (select_ci.py) hold PyTorch float32's error as a
        # number instead of its gradients.
        torch_err_file = os.path.join(folder, "reference64", "torch_f32_error.txt")
        if not ref32 and os.path.exists(torch_err_file):
            with open(torch_err_file) as f:
                torch_err = float(f.read().split()[0])
            ref32 = None
        extra = sorted(set(mine) - set(ref64))
        missing = sorted(set(ref64) - set(mine))
        if extra or missing:
            rec["grads"] = False
            rec["grads_reason"] = "trained tensors differ from PyTorch's: %s%s" % (
                ("cleave trains %d PyTorch does not (%s) " % (len(extra), ", ".join(extra[:3])))
                if extra else "",
                ("cleave lacks %d (%s)" % (len(missing), ", ".join(missing[:3])))
                if missing else "")
        else:
            e_mine, e_torch, worst = grad_error(mine, ref32, ref64)
            if ref32 is None:
                e_torch = torch_err
            rec["grad_err_cleave"] = e_mine
            rec["grad_err_torch"] = e_torch
            rec["grad_worst"] = worst
            rec["grads"] = bool(e_mine <= GRAD_FACTOR * max(e_torch, GRAD_FLOOR))
            if not rec["grads"]:
                rec["grads_reason"] = "gradient error %.1e > 10 x PyTorch f32's %.1e (%s)" % (
                    e_mine, e_torch, worst)
        if "loss" in got:
            rec["cleave_loss"] = float(got["loss"])

    # Training: 1 stage on 1, 2, 4 threads; 2 stages on 1.
    runs = {}
    for t in THREADS:
        out = "s1-t%d.onnx" % t
        code, line, stdout = tools.run("cleave-run", ["p1.cplan", "--data", "steps/data",
                                                      "--steps", steps, "--save", out,
                                                      "--threads", t], folder, log)
        runs[(1, t)] = (code, line, out, stdout)
        if code != 0:
            break
    # The same plan and thread count again: bits must not depend on the
    # threads' timing either (a race or a reduction ordered by arrival).
    if runs.get((1, THREADS[-1]), (1,))[0] == 0:
        out = "s1-t%d-again.onnx" % THREADS[-1]
        code, line, stdout = tools.run("cleave-run", ["p1.cplan", "--data", "steps/data",
                                                      "--steps", steps, "--save", out,
                                                      "--threads", THREADS[-1]], folder, log)
        runs["again"] = (code, line, out, stdout)
    code, line, _ = tools.run("cleavec", [model] + hyper + ["--stages", 2, "-o", "p2.cplan"],
                              folder, log)
    if code != 0:
        runs[(2, 1)] = (code, "2-stage cleavec: " + line, None, "")
    else:
        code, line, stdout = tools.run("cleave-run", ["p2.cplan", "--data", "steps/data",
                                                      "--steps", steps, "--save", "s2-t1.onnx",
                                                      "--threads", 1], folder, log)
        runs[(2, 1)] = (code, line, "s2-t1.onnx", stdout)

    base = runs[(1, 1)]
    if base[0] != 0:
        rec["train_reason"] = base[1]
        rec["stages"] = rec["threads"] = rec["loss"] = False
        return
    p = lambda out: os.path.join(folder, out)  # noqa: E731
    s2 = runs[(2, 1)]
    if s2[0] != 0:
        rec["stages"] = False
        rec["stages_reason"] = s2[1]
    else:
        rec["stages"] = same_bytes(p(base[2]), p(s2[2]))
        if not rec["stages"]:
            rec["stages_reason"] = "2-stage parameters differ: max rel %.1e" % param_diff(
                p(base[2]), p(s2[2]))
    bad = []
    for t in THREADS[1:]:
        r = runs.get((1, t))
        if r is None or r[0] != 0:
            bad.append("--threads %d: %s" % (t, r[1] if r else "not run"))
        elif not same_bytes(p(base[2]), p(r[2])):
            bad.append("--threads %d differs from 1 (max rel %.1e)" % (
                t, param_diff(p(base[2]), p(r[2]))))
    again = runs.get("again")
    if again is not None:
        if again[0] != 0:
            bad.append("--threads %d again: %s" % (THREADS[-1], again[1]))
        elif not same_bytes(p(runs[(1, THREADS[-1])][2]), p(again[2])):
            bad.append("--threads %d run twice differs (max rel %.1e)" % (
                THREADS[-1], param_diff(p(runs[(1, THREADS[-1])][2]), p(again[2]))))
    rec["threads"] = not bad
    if bad:
        rec["threads_reason"] = "; ".join(bad)
    rec["cleave_step_losses"] = [float(x) for x in re.findall(r"loss (\S+)", base[3])
                                 if re.match(r"^[-+0-9.eEnaifNAIF]+$", x)][:steps]

    # Loss after 3 steps: the saved model's forward on the first microbatch.
    fdir = os.path.join(folder, "cleave-after")
    shutil.rmtree(fdir, ignore_errors=True)
    code, line, _ = tools.run("cleave-opt", [base[2], "--run", "--inputs", "inputs",
                                             "--outputs", "cleave-after"], folder, log)
    if code != 0:
        rec["loss"] = False
        rec["loss_reason"] = "forward of the trained model: " + line
        return
    after = float(np.load(os.path.join(fdir, "loss.npy")))
    ref = float(np.load(os.path.join(folder, "steps", "loss_after.npy")))
    rel = abs(after - ref) / max(abs(ref), 1e-6)
    rec["cleave_loss_after"] = after
    rec["loss_after_rel"] = rel if np.isfinite(rel) else float("inf")
    rec["loss"] = bool(rel <= LOSS_RTOL)
    # Where float32 rounding alone moves PyTorch's 3 steps by more than the
    # tolerance (chaotic training), cleave passes within 10x PyTorch
    # float32's own distance to float64, as the gradients do.
    f64 = os.path.join(folder, "steps", "loss_after64.npy")
    if not rec["loss"] and os.path.exists(f64):
        ref64 = float(np.load(f64))
        torch_dist = abs(ref - ref64)
        rec["loss_after_torch_f32_vs_f64"] = torch_dist / max(abs(ref64), 1e-6)
        if abs(after - ref64) <= GRAD_FACTOR * torch_dist:
            rec["loss"] = True
            rec["loss_note"] = ("PyTorch float32 itself is %.1e (rel) from float64 after "
                                "%d steps; cleave %.1e" % (rec["loss_after_torch_f32_vs_f64"],
                                                            steps, abs(after - ref64) /
                                                            max(abs(ref64), 1e-6)))
    if not rec["loss"]:
        rec["loss_reason"] = "loss after %d steps %.6g vs PyTorch %.6g (rel %.1e)" % (
            steps, after, ref, rel)
    # How far the trained parameters are from PyTorch's (information only).
    try:
        mine = saved_params(p(base[2]))
        worst = 0.0
        for k, v in mine.items():
            f = os.path.join(folder, "steps", "params", k + ".npy")
            if os.path.exists(f):
                ref = np.load(f)
                worst = max(worst, float(np.max(np.abs(v - ref))) / max(
                    float(np.max(np.abs(ref))), 1e-12))
        rec["steps_param_rel"] = worst
    except Exception as e:  # noqa: BLE001
        rec["steps_param_rel_error"] = str(e)[:200]


def param_diff(a, b):
    """The largest relative difference of two saved models' parameters
    (nan without onnx)."""
    try:
        pa, pb = saved_params(a), saved_params(b)
    except ImportError:
        return float("nan")
    worst = 0.0
    for k in pa:
        if k in pb and pa[k].shape == pb[k].shape and pa[k].dtype.kind == "f":
            d = float(np.max(np.abs(pa[k].astype(np.float64) - pb[k]))) if pa[k].size else 0.0
            worst = max(worst, d / max(float(np.max(np.abs(pb[k]))), 1e-12))
    return worst




def recheck_grads(folder, tools, rec):
    """Where float32 gradients miss the bound: the float64 export's
    gradients against PyTorch float64 (to F64_RTOL), and float32 on a second
    input sample (zoo.py float64_recheck wrote f64/ and sample2/). Both
    holding, the grads column holds, with the figures in grads_note."""
    log = os.path.join(folder, "cleave.log")
    f64 = os.path.join(folder, "f64")
    shutil.rmtree(os.path.join(f64, "cleave-grads"), ignore_errors=True)
    code, line, _ = tools.run("cleave-opt", ["model.onnx", "--passes=" + GRAD_PASSES, "--run",
                                             "--inputs", "inputs", "--outputs", "cleave-grads"],
                              f64, log)
    if code != 0:
        rec["f64_reason"] = "float64 gradients: " + line
        return
    e64, _, worst64 = grad_error(grads_in(os.path.join(f64, "cleave-grads")), None,
                                 grads_in(os.path.join(f64, "reference64")))
    rec["grad_err_f64"] = e64
    s2 = os.path.join(folder, "sample2")
    shutil.rmtree(os.path.join(s2, "cleave-grads"), ignore_errors=True)
    code, line, _ = tools.run("cleave-opt", ["model.onnx", "--passes=" + GRAD_PASSES, "--run",
                                             "--inputs", "sample2/inputs", "--outputs",
                                             "sample2/cleave-grads"], folder, log)
    if code != 0:
        rec["f64_reason"] = "second sample: " + line
        return
    e2, t2, _ = grad_error(grads_in(os.path.join(s2, "cleave-grads")),
                           grads_in(os.path.join(s2, "reference")),
                           grads_in(os.path.join(s2, "reference64")))
    rec["grad_err_sample2"] = [e2, t2]
    if e64 <= F64_RTOL and e2 <= GRAD_FACTOR * max(t2, GRAD_FLOOR):
        rec["grads"] = True
        rec["grads_note"] = (
            "float32 %.1e vs PyTorch's %.1e on the first sample; float64 export %.1e from "
            "PyTorch float64; second sample %.1e vs %.1e" % (
                rec["grad_err_cleave"], rec["grad_err_torch"], e64, e2, t2))
        rec.pop("grads_reason", None)
    else:
        rec["grads_reason"] += "; float64 export %.1e (%s), second sample %.1e vs %.1e" % (
            e64, worst64, e2, t2)


def recheck_loss(folder, tools, rec):
    """Where the float32 loss after the steps misses the bound: the same
    steps on the float64 export, against PyTorch float64's loss (F64_RTOL)."""
    log = os.path.join(folder, "cleave.log")
    f64 = os.path.join(folder, "f64")
    h = read_hyper(f64)
    hyper = ["--microbatches", h["microbatches"], "--optimizer", "sgd", "--lr", h["lr"],
             "--momentum", h["momentum"]]
    code, line, _ = tools.run("cleavec", ["model.onnx"] + hyper + ["--stages", 1, "-o",
                                                                    "p1.cplan"], f64, log)
    if code == 0:
        code, line, _ = tools.run("cleave-run", ["p1.cplan", "--data", "steps/data", "--steps",
                                                 h["steps"], "--save", "s1.onnx", "--threads", 1],
                                  f64, log)
    if code == 0:
        shutil.rmtree(os.path.join(f64, "cleave-after"), ignore_errors=True)
        code, line, _ = tools.run("cleave-opt", ["s1.onnx", "--run", "--inputs", "inputs",
                                                 "--outputs", "cleave-after"], f64, log)
    if code != 0:
        rec["f64_reason"] = "float64 steps: " + line
        return
    after = float(np.load(os.path.join(f64, "cleave-after", "loss.npy")))
    ref = float(np.load(os.path.join(f64, "steps", "loss_after64.npy")))
    rel = abs(after - ref) / max(abs(ref), 1e-6)
    rec["loss_after_rel_f64"] = rel
    if rel <= F64_LOSS_RTOL:
        rec["loss"] = True
        rec["loss_note"] = ("float32 %.1e from PyTorch float32 after the steps; the float64 "
                            "export's %.1e from PyTorch float64's (lr %g, momentum %g)" % (
                                rec["loss_after_rel"], rel, h["lr"], h["momentum"]))
        rec.pop("loss_reason", None)
    else:
        rec["loss_reason"] += "; float64 export %.1e from PyTorch float64" % rel


def grads_in(folder):
    return {k[5:]: v for k, v in read_npy_dir(folder).items() if k.startswith("grad.")}
