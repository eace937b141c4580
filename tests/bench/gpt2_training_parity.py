#!/usr/bin/env python3
"""cleave against PyTorch training a Hugging Face GPT-2 the way the README's
walkthrough does: examples/pytorch/export_gpt2.py's model (its own labels=
loss) from the same initial weights, the same token-file windows in order,
AdamW with weight-decay groups (no decay on 1-D parameters), linear warm-up
+ cosine decay to a floor (HF's get_cosine_with_min_lr_schedule_with_warmup),
clip_grad_norm_ at 1.0, 4 microbatches per step, a validation loss every 50
steps; cleave on 2 stages (ZB-H1). Prints the largest per-step relative
differences of the training loss, the gradient norm, the lr and the
validation losses, and of the validation accuracies (next-token
predictions against the argmax of torch's logits); exits 1 above the
float32-noise bar.

  python3 tests/bench/gpt2_training_parity.py [--build build] [--steps 200]

Needs torch, transformers, onnxscript (the PyTorch venv of
docs/design/pytorch2.md). The token stream is synthetic (a seeded Markov
chain over 256 ids, so there is something to learn); no download.
"""
import argparse
import json
import os
import random
import struct
import subprocess
import sys
import tempfile

import torch
import transformers

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "examples", "pytorch"))
import export_gpt2  # noqa: E402

VOCAB, T, B, M = 256, 32, 4, 4
LAYERS, HEADS, EMBD = 2, 4, 64
LR, WARMUP, MIN_LR, CLIP, WD = 3e-3, 20, 3e-4, 1.0, 0.01
EVAL_EVERY, EVAL_BATCHES = 50, 2


def token_stream(n, seed):
    """One Markov chain (each id has 4 likely successors), sampled with
    `seed`: the training and validation texts differ, their language not."""
    chain = random.Random(1)
    succ = [[chain.randrange(VOCAB) for _ in range(4)] for _ in range(VOCAB)]
    r = random.Random(seed)
    ids, cur = [], 0
    for _ in range(n):
        cur = r.choice(succ[cur]) if r.random() < 0.9 else r.randrange(VOCAB)
        ids.append(cur)
    return ids


def windows(ids):
    w = (len(ids) - 1) // T
    return torch.tensor(ids[:w * T], dtype=torch.int64).view(w, T)


def torch_run(state, train_ids, val_ids, steps):
    model = export_gpt2.build(VOCAB, T, LAYERS, HEADS, EMBD, 0)
    model.load_state_dict(state)
    params = list(model.parameters())  # the tied embedding once
    opt = torch.optim.AdamW(
        [{"params": [p for p in params if p.dim() >= 2], "weight_decay": WD},
         {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}],
        lr=LR, betas=(0.9, 0.999), eps=1e-8)
    sched = transformers.get_cosine_with_min_lr_schedule_with_warmup(
        opt, num_warmup_steps=WARMUP, num_training_steps=steps, min_lr=MIN_LR)
    train, val = windows(train_ids), windows(val_ids)

    def rows(data, first):
        idx = [(first + r) % data.shape[0] for r in range(B)]
        return data[idx]

    out, evals = [], {}
    for s in range(steps):
        opt.zero_grad()
        losses = []
        for m in range(M):
            x = rows(train, (s * M + m) * B)
            loss = model(x, x.clone())
            (loss / M).backward()
            losses.append(float(loss.detach()))
        lr = opt.param_groups[0]["lr"]
        norm = float(torch.nn.utils.clip_grad_norm_(params, CLIP))
        opt.step()
        sched.step()
        out.append((sum(losses) / M, norm, lr))
        if (s + 1) % EVAL_EVERY == 0 or s + 1 == steps:
            v, hits, count = [], 0, 0
            with torch.no_grad():
                for k in range(EVAL_BATCHES * M):
                    x = rows(val, k * B)
                    v.append(float(model(x, x.clone())))
                    pred = model.m(input_ids=x).logits[:, :-1].argmax(-1)
                    hits += int((pred == x[:, 1:]).sum())
                    count += pred.numel()
            evals[s + 1] = (sum(v) / len(v), hits / count)
    return out, evals


def cleave_run(build, onnx_path, tmp, steps):
    tools = os.path.join(build, "tools")
    plan = os.path.join(tmp, "p.cplan")
    subprocess.run([os.path.join(tools, "cleavec"), onnx_path, "--stages",
                    "2", "--microbatches", str(M), "--schedule", "zb-h1",
                    "--optimizer", "adamw", "--weight-decay", str(WD), "-o",
                    plan], check=True, stdout=subprocess.DEVNULL)
    log = os.path.join(tmp, "run.jsonl")
    subprocess.run([os.path.join(tools, "cleave-run"), plan, "--steps",
                    str(steps), "--data", "tokens:" + os.path.join(tmp, "train.bin"),
                    "--eval-data", "tokens:" + os.path.join(tmp, "val.bin"),
                    "--eval-every", str(EVAL_EVERY), "--eval-batches",
                    str(EVAL_BATCHES), "--lr", str(LR), "--warmup-steps",
                    str(WARMUP), "--lr-decay", "cosine", "--min-lr",
                    str(MIN_LR), "--clip-grad-norm", str(CLIP), "--log", log,
                    "--quiet"], check=True, stdout=subprocess.DEVNULL)
    with open(log) as f:
        rows = [json.loads(line) for line in f]
    return ([(r["loss"], r["grad_norm"], r["lr"]) for r in rows],
            {r["step"]: (r["eval_loss"], r["eval_accuracy"]) for r in rows
             if "eval_loss" in r})


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--build", default=os.path.join(ROOT, "build"))
    p.add_argument("--steps", type=int, default=200)
    args = p.parse_args()
    torch.manual_seed(0)
    train_ids, val_ids = token_stream(40000, 10), token_stream(4000, 20)
    with tempfile.TemporaryDirectory() as tmp:
        for name, ids in (("train", train_ids), ("val", val_ids)):
            with open(os.path.join(tmp, name + ".bin"), "wb") as f:
                f.write(struct.pack("<%dH" % len(ids), *ids))
        model = export_gpt2.build(VOCAB, T, LAYERS, HEADS, EMBD, 0)
        state = {k: v.clone() for k, v in model.state_dict().items()}
        ids = torch.randint(0, VOCAB, (B, T))
        onnx_path = os.path.join(tmp, "gpt2.onnx")
        torch.onnx.export(model, (ids, ids.clone()), onnx_path, dynamo=True,
                          optimize=False, input_names=["input_ids", "labels"],
                          output_names=["loss"])
        ref, ref_eval = torch_run(state, train_ids, val_ids, args.steps)
        got, got_eval = cleave_run(args.build, onnx_path, tmp, args.steps)
    rel = lambda a, b: abs(a - b) / max(abs(b), 1e-12)
    worst = [max(rel(g[k], r[k]) for g, r in zip(got, ref)) for k in range(3)]
    first100 = max(rel(g[0], r[0]) for g, r in list(zip(got, ref))[:100])
    ev = max(rel(got_eval[s][0], ref_eval[s][0]) for s in ref_eval)
    acc = max(abs(got_eval[s][1] - ref_eval[s][1]) for s in ref_eval)
    clipped = sum(1 for r in ref if r[1] > CLIP)
    print("GPT-2 (%d layers, width %d, %d ids, %dx%d tokens x %d microbatches), "
          "%d steps (%d clipped by torch): largest relative difference of the "
          "loss %.2e (first 100 steps %.2e), the grad norm %.2e, the lr %.2e; "
          "validation losses at steps %s: %.2e, their accuracies %.2e "
          "(absolute); losses %.4f -> %.4f (torch %.4f -> %.4f), validation "
          "%.4f -> %.4f (torch %.4f -> %.4f), accuracy %.2f%% -> %.2f%% "
          "(torch %.2f%% -> %.2f%%)"
          % (LAYERS, EMBD, VOCAB, B, T, M, len(got), clipped, worst[0],
             first100, worst[1], worst[2], sorted(ref_eval), ev, acc,
             got[0][0], got[-1][0], ref[0][0], ref[-1][0],
             got_eval[min(got_eval)][0], got_eval[max(got_eval)][0],
             ref_eval[min(ref_eval)][0], ref_eval[max(ref_eval)][0],
             100 * got_eval[min(got_eval)][1], 100 * got_eval[max(got_eval)][1],
             100 * ref_eval[min(ref_eval)][1], 100 * ref_eval[max(ref_eval)][1]))
    ok = (len(got) == args.steps and sorted(got_eval) == sorted(ref_eval)
          and max(worst[0], worst[2], ev) < 1e-3 and acc < 1e-3)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
