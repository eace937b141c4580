#!/usr/bin/env python3
"""One training step of the corpus models (tests/models/corpus) at
benchmark size, cleave against PyTorch 2 eager (and torch.compile) in the
same run.

Run (after building), with the PyTorch 2 venv of
tests/models/corpus/make-venv.sh:
    $VENV/bin/python tests/bench/train_corpus_vs_pytorch.py [--build build]
        [--models resnet18,mobilenet_v2,...] [--threads 2] [--rounds 5]
        [--steps 10] [--compile] [--unfused] [--seq T] [--batch B]
        [--keep DIR]

Models (the corpus's classes, at the sizes the issue measured; one stage,
one microbatch, SGD lr 0.01, the same --threads for both):
  * resnet18, mobilenet_v2, efficientnet_b0: torchvision, 10 classes,
    32x32 images, batch 16 (BatchNorm with batch statistics);
  * vit: torchvision VisionTransformer, 32x32 images in 4x4 patches,
    4 layers, d 256, 4 heads, batch 16;
  * gpt2, bert, llama: transformers, 4 layers, d 256, 4 heads (llama 2 KV
    heads), vocab 1024, T 128, batch 8 (--seq, --batch change both);
  * gpt: the tests' GPT (examples/gpt/model.py), 4 layers, d 256, 4 heads,
    T 128, vocab 256, batch 8.
Each is exported with the legacy exporter in training mode (opset 17,
do_constant_folding=False; the dynamo exporter writes BatchNorm in
inference form), and cleave is given the same inputs (--data).

Timing, in rounds (--rounds), each round every framework one after the
other, never at once:
  * PyTorch eager: zero_grad, loss = module(*inputs), backward, SGD step;
    --steps timed steps per round (3 warm-up steps before the first round);
  * torch.compile (--compile): the same step with the module compiled
    (default inductor backend; its compile happens in the warm-up);
  * cleave: cleave-run PLAN --threads T --data DIR --steps 3+STEPS, the
    step lines' own ms of the steps after the first 3;
  * cleave unfused (--unfused): the same with a plan compiled with
    --fused-attention=off, the attention as exported (the scores stored).
Printed per model: the median step of each framework over all rounds, the
ratios torch/cleave (above 1.0: cleave is faster), the first losses of
both (same weights, same batch), and the training FLOPs per step (counted
by torch.utils.flop_counter) as GFLOP/s each framework achieves, against a
measured f32 GEMM of PyTorch (torch.mm, 2048^3) and of cleave's runtime
(build/tests/cleave-bench-device-profile, 1024^3) on the same threads;
"of sgemm" is cleave's GFLOP/s over the median of its sgemm measured in
each round right after cleave's steps (the machine's speed drifts by 10%
and more over a run, so a rate measured once at the start is no baseline).
"ceiling" is PyTorch's step over the time the counted FLOPs take at that
sgemm rate: the ratio cleave would reach if its step were nothing but
those products, each at the rate of a large square one, so the most that
faster kernels can give on this machine (below 1.5x, the 1.5x goal is out
of the kernels' reach there; fused causal attention, which skips the key
tiles a query cannot see, does fewer FLOPs than counted at long T).
Peak memory of a step, both sides: PyTorch's parameters plus the growth of
the resident set's high-water mark over the first two steps of a fresh
process (gradients, saved activations, temporaries; VmHWM, reset through
/proc/self/clear_refs), and cleave-run's measured peak bytes of the stage
(parameters, gradients, activations and temporaries in its frames).
"""

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
import warnings

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # see train_vs_pytorch.py

import numpy as np  # noqa: E402
import torch  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "examples", "gpt"))
sys.path.insert(0, os.path.join(ROOT, "tests", "models", "corpus"))
# The corpus's loss wrappers, so both sides train what the corpus exports.
from export_corpus import CausalLMWithLoss, MaskedLMWithLoss, WithLoss  # noqa: E402
WARMUP = 3


def images(batch):
    return {"x": torch.randn(batch, 3, 32, 32),
            "labels": torch.randint(0, 10, (batch,))}


SEQ, BATCH = 128, 8  # the token models' sequence and batch (--seq, --batch)


def tokens(batch, vocab=1024, seq=None, labels=False):
    seq = seq or SEQ
    ids = torch.randint(0, vocab, (batch, seq))
    out = {"input_ids": ids, "attention_mask": torch.ones(batch, seq, dtype=torch.int64)}
    if labels:
        pick = torch.rand(batch, seq) < 0.15
        out["labels"] = torch.where(pick, torch.randint(0, vocab, (batch, seq)),
                                    torch.full((batch, seq), -100))
    return out


def make(name):
    """(module with loss, inputs)."""
    import torchvision
    import transformers
    lm = dict(vocab_size=1024, attn_implementation="sdpa")
    if name == "resnet18":
        return WithLoss(torchvision.models.resnet18(num_classes=10)), images(16)
    if name == "mobilenet_v2":
        return WithLoss(torchvision.models.mobilenet_v2(num_classes=10, dropout=0.0)), images(16)
    if name == "efficientnet_b0":
        m = torchvision.models.efficientnet_b0(num_classes=10, dropout=0.0,
                                               stochastic_depth_prob=0.0)
        return WithLoss(m), images(16)
    if name == "vit":
        m = torchvision.models.VisionTransformer(
            image_size=32, patch_size=4, num_layers=4, num_heads=4, hidden_dim=256,
            mlp_dim=1024, num_classes=10, dropout=0.0, attention_dropout=0.0)
        return WithLoss(m), images(16)
    if name == "gpt2":
        cfg = transformers.GPT2Config(n_positions=SEQ, n_embd=256, n_layer=4, n_head=4,
                                      resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, **lm)
        return CausalLMWithLoss(transformers.GPT2LMHeadModel(cfg)), tokens(BATCH)
    if name == "llama":
        cfg = transformers.LlamaConfig(hidden_size=256, intermediate_size=688,
                                       num_hidden_layers=4, num_attention_heads=4,
                                       num_key_value_heads=2, max_position_embeddings=SEQ,
                                       pad_token_id=None, **lm)
        return CausalLMWithLoss(transformers.LlamaForCausalLM(cfg)), tokens(BATCH)
    if name == "bert":
        cfg = transformers.BertConfig(hidden_size=256, num_hidden_layers=4,
                                      num_attention_heads=4, intermediate_size=1024,
                                      max_position_embeddings=SEQ, hidden_dropout_prob=0.0,
                                      attention_probs_dropout_prob=0.0, **lm)
        return MaskedLMWithLoss(transformers.BertForMaskedLM(cfg)), tokens(BATCH, labels=True)
    if name == "gpt":
        from model import GPT
        m = GPT(vocab=256, block_size=SEQ, n_layer=4, n_head=4, n_embd=256, dropout=0.0)
        return m, {"idx": torch.randint(0, 256, (BATCH, SEQ)),
                   "targets": torch.randint(0, 256, (BATCH, SEQ))}
    sys.exit(f"unknown model {name}")


def export(model, inputs, path):
    args = tuple(inputs.values())
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        state = {k: v.clone() for k, v in model.state_dict().items()}
        model.train()
        torch.onnx.export(model, args, path, dynamo=False, opset_version=17,
                          training=torch.onnx.TrainingMode.TRAINING,
                          do_constant_folding=False, input_names=list(inputs),
                          output_names=["loss"])
        model.load_state_dict(state)  # the export's forward moved BatchNorm statistics


def torch_step(model, opt, args):
    opt.zero_grad(set_to_none=True)
    loss = model(*args)
    loss.backward()
    opt.step()
    return loss


def torch_times(step, steps):
    times, loss = [], None
    for _ in range(steps):
        t0 = time.perf_counter()
        loss = step()
        times.append((time.perf_counter() - t0) * 1000)
    return times, float(loss.detach())


def run(cmd):
    out = subprocess.run(cmd, capture_output=True, text=True)
    if out.returncode != 0:
        sys.exit(f"{' '.join(cmd)} failed ({out.returncode}): {out.stderr.strip()}")
    return out.stdout


def cleave_times(tools, plan, data, threads, steps):
    out = run([os.path.join(tools, "cleave-run"), plan, f"--threads={threads}",
               f"--data={data}", f"--steps={WARMUP + steps}"])
    rows = {int(m.group(1)): (float(m.group(2)), float(m.group(3))) for m in re.finditer(
        r"^step\s+(\d+)/\d+\s+loss (\S+)\s+\d+ samples/s\s+(\S+) ms", out, re.M)}
    return [rows[k][1] for k in sorted(rows) if k > WARMUP], rows[1][0]


def proc_status_kb(field):
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    return 0


def torch_peak_child(name, args):
    """In a fresh process (--peak-of): the model's parameters plus the growth
    of the resident set's high-water mark over its first two SGD steps (the
    gradients, the activations autograd keeps, the temporaries), in bytes."""
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    model, inputs = make(name)
    model.train()
    argv = tuple(inputs.values())
    opt = torch.optim.SGD(model.parameters(), lr=args.lr)
    params = sum(p.numel() * p.element_size() for p in model.parameters())
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # resets VmHWM to the current resident set
    base = proc_status_kb("VmRSS")
    for _ in range(2):
        torch_step(model, opt, argv)
    print(params + (proc_status_kb("VmHWM") - base) * 1024)


def torch_peak(name, args):
    out = run([sys.executable, os.path.abspath(__file__), "--peak-of", name,
               f"--threads={args.threads}", f"--seq={args.seq}", f"--batch={args.batch}"])
    return int(out.strip().splitlines()[-1])


def cleave_peak_bytes(tools, plan, data, threads):
    """The stage's measured peak bytes from cleave-run's summary (one step)."""
    out = run([os.path.join(tools, "cleave-run"), plan, f"--threads={threads}",
               f"--data={data}", "--steps=1"])
    m = re.search(r"^0\s+\S+\s+\S+\s+(\d+) / \d+", out, re.M)
    return int(m.group(1)) if m else 0


def training_flops(model, inputs):
    from torch.utils.flop_counter import FlopCounterMode
    counter = FlopCounterMode(display=False)
    with counter:
        model(*inputs.values()).backward()
    model.zero_grad(set_to_none=True)
    return counter.get_total_flops()


def gemm_peak(threads):
    a, b = torch.randn(2048, 2048), torch.randn(2048, 2048)
    torch.mm(a, b)
    best = min(timed(lambda: torch.mm(a, b)) for _ in range(5))
    return 2 * 2048 ** 3 / best / 1e9


def cleave_sgemm(args):
    """The runtime's own f32 GEMM on 1024^3 in FLOP/s
    (cleave-bench-device-profile), or None."""
    tool = os.path.join(args.build, "tests", "cleave-bench-device-profile")
    if not os.path.exists(tool):
        return None
    out = run([tool, str(args.threads)])
    m = re.search(r"^sgemm \S+\s+(\S+) FLOP/s", out, re.M)
    return float(m.group(1)) if m else None


def cleave_peak(args):
    rate = cleave_sgemm(args)
    return f"{rate / 1e9:.0f} GFLOP/s" if rate else "n/a"


def timed(f):
    t0 = time.perf_counter()
    f()
    return time.perf_counter() - t0


def cpu_model():
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return "?"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--models", default="resnet18,mobilenet_v2,efficientnet_b0,vit,gpt2,bert,llama,gpt")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--steps", type=int, default=10, help="timed steps per round")
    ap.add_argument("--lr", type=float, default=0.01)
    ap.add_argument("--compile", action="store_true", help="time torch.compile too")
    ap.add_argument("--unfused", action="store_true",
                    help="time cleave with --fused-attention=off too")
    ap.add_argument("--seq", type=int, default=128, help="the token models' T")
    ap.add_argument("--batch", type=int, default=8, help="the token models' batch")
    ap.add_argument("--keep", metavar="DIR",
                    help="write the exports, plans and data under DIR (for cleave-run --profile)")
    ap.add_argument("--peak-of", metavar="MODEL", help=argparse.SUPPRESS)
    args = ap.parse_args()
    global SEQ, BATCH
    SEQ, BATCH = args.seq, args.batch
    if args.peak_of:
        return torch_peak_child(args.peak_of, args)
    tools = os.path.join(args.build, "tools")
    for t in ("cleavec", "cleave-run"):
        if not os.path.exists(os.path.join(tools, t)):
            sys.exit(f"missing {tools}/{t}: build first (ninja -C build)")
    torch.set_num_threads(args.threads)
    peak = gemm_peak(args.threads)
    print(f"CPU: {cpu_model()}; {args.threads} threads; torch {torch.__version__}; "
          f"OPENBLAS_CORETYPE={os.environ.get('OPENBLAS_CORETYPE', 'unset')}; "
          f"torch.mm f32 2048^3: {peak:.0f} GFLOP/s; cleave's sgemm: {cleave_peak(args):s}")
    print(f"medians over {args.rounds} interleaved rounds x {args.steps} steps "
          f"(after {WARMUP} warm-up steps); ratio = torch ms / cleave ms")
    head = f"{'model':16} {'torch ms':>9} {'cleave ms':>10} {'torch/cl':>8}"
    if args.compile:
        head += f" {'compile ms':>10} {'comp/cl':>7}"
    if args.unfused:
        head += f" {'unfused ms':>10} {'unf/cl':>6}"
    print(head + f" {'GFLOP':>6} {'cl GFLOP/s':>10} {'of sgemm':>8} {'ceiling':>7} {'torch GF/s':>10} {'peak MB torch/cl':>16}"
          "   first loss torch / cleave")
    with tempfile.TemporaryDirectory() as scratch:
        tmp = args.keep or scratch
        os.makedirs(tmp, exist_ok=True)
        for name in args.models.split(","):
            torch.manual_seed(0)
            model, inputs = make(name)
            path = os.path.join(tmp, name + ".onnx")
            export(model, inputs, path)
            data = os.path.join(tmp, name)
            os.makedirs(data, exist_ok=True)
            for k, v in inputs.items():
                np.save(os.path.join(data, k + ".npy"), v.numpy())
            plan = os.path.join(tmp, name + ".cplan")
            run([os.path.join(tools, "cleavec"), path, "--microbatches=1",
                 "--optimizer=sgd", f"--lr={args.lr}", "-o", plan])
            unfused = os.path.join(tmp, name + "-unfused.cplan")
            if args.unfused:
                run([os.path.join(tools, "cleavec"), path, "--microbatches=1",
                     "--optimizer=sgd", f"--lr={args.lr}", "--fused-attention=off",
                     "-o", unfused])
            flops = training_flops(model, inputs)
            model.train()
            argv = tuple(inputs.values())
            first_torch = float(model(*argv).detach())
            opt = torch.optim.SGD(model.parameters(), lr=args.lr)
            eager = lambda: torch_step(model, opt, argv)  # noqa: E731
            torch_times(eager, WARMUP)
            frameworks = {"torch": eager}
            if args.compile:
                compiled = torch.compile(model)
                copt = torch.optim.SGD(compiled.parameters(), lr=args.lr)
                frameworks["compile"] = lambda: torch_step(compiled, copt, argv)  # noqa: E731
                torch_times(frameworks["compile"], WARMUP)
            times = {k: [] for k in list(frameworks) + ["cleave", "unfused"]}
            first_cleave = None
            sgemm = []  # cleave's sgemm in each round, beside its steps
            for _ in range(args.rounds):
                for k, f in frameworks.items():
                    times[k] += torch_times(f, args.steps)[0]
                ms, loss = cleave_times(tools, plan, data, args.threads, args.steps)
                times["cleave"] += ms
                if (rate := cleave_sgemm(args)):
                    sgemm.append(rate)
                first_cleave = loss
                if args.unfused:
                    times["unfused"] += cleave_times(tools, unfused, data, args.threads,
                                                     args.steps)[0]
            med = {k: statistics.median(v) for k, v in times.items() if v}
            line = f"{name:16} {med['torch']:9.2f} {med['cleave']:10.2f} {med['torch'] / med['cleave']:8.2f}"
            if args.compile:
                line += f" {med['compile']:10.2f} {med['compile'] / med['cleave']:7.2f}"
            if args.unfused:
                line += f" {med['unfused']:10.2f} {med['unfused'] / med['cleave']:6.2f}"
            gf = flops / 1e9
            peaks = (f"{torch_peak(name, args) / 1e6:.0f} / "
                     f"{cleave_peak_bytes(tools, plan, data, args.threads) / 1e6:.0f}")
            share = (f"{gf / med['cleave'] * 1e12 / statistics.median(sgemm) * 100:7.0f}%"
                     if sgemm else "     n/a")
            # The ratio a step of only the counted FLOPs at the sgemm's rate
            # would reach: the most faster kernels can give on this machine.
            ceiling = (f"{med['torch'] / (flops / statistics.median(sgemm) * 1e3):6.2f}x"
                       if sgemm else "    n/a")
            line += (f" {gf:6.2f} {gf / med['cleave'] * 1e3:10.1f} {share} {ceiling}"
                     f" {gf / med['torch'] * 1e3:10.1f}"
                     f" {peaks:>16}   {first_torch:.4f} / {first_cleave:.4f}")
            print(line, flush=True)


if __name__ == "__main__":
    main()
