"""Writes lr_table.txt: learning rates of each step from PyTorch's and HF
transformers' schedulers, the reference for tests/unit/lr_schedule_test.cpp
(runtime/LrSchedule.h states the formula cleave uses).

Each line: DECAY PEAK WARMUP MIN-LR DECAY-STEPS STEP LR, LR being what the
optimizer's param group holds while step STEP (from 0) updates, as a
training loop that calls scheduler.step() after optimizer.step() sees it.

Run with a Python that has torch and transformers:
  python tests/models/lr_schedule/make_table.py > tests/models/lr_schedule/lr_table.txt
"""
import math
import torch
import transformers

def lrs(make, peak, steps):
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=peak)
    sched = make(opt)
    out = []
    for _ in range(steps):
        out.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    return out

cases = []
# HF: warm-up from 0, then cosine to a floor (up to DECAY-STEPS: past it
# HF's cosine climbs again, cleave stays at the floor), linear to 0,
# constant.
for peak, warm, floor, total in [(1e-3, 10, 1e-5, 50), (0.1, 4, 0.0, 20),
                                 (3e-4, 0, 3e-5, 30)]:
    cases.append(("cosine", peak, warm, floor, total, lrs(
        lambda o: transformers.get_cosine_with_min_lr_schedule_with_warmup(
            o, num_warmup_steps=warm, num_training_steps=total,
            min_lr=floor), peak, total + 1)))
for peak, warm, total in [(1e-3, 10, 50), (0.05, 3, 12)]:
    cases.append(("linear", peak, warm, 0.0, total, lrs(
        lambda o: transformers.get_linear_schedule_with_warmup(
            o, num_warmup_steps=warm, num_training_steps=total),
        peak, total + 5)))
    cases.append(("none", peak, warm, 0.0, total, lrs(
        lambda o: transformers.get_constant_schedule_with_warmup(
            o, num_warmup_steps=warm), peak, total + 5)))
# torch.optim.lr_scheduler without a warm-up: CosineAnnealingLR and LinearLR
# down to a floor over DECAY-STEPS (the table stops there: past T_max
# CosineAnnealingLR climbs again, cleave stays at the floor).
for peak, floor, total in [(0.01, 1e-4, 40), (2e-3, 5e-4, 16)]:
    cases.append(("cosine", peak, 0, floor, total, lrs(
        lambda o: torch.optim.lr_scheduler.CosineAnnealingLR(
            o, T_max=total, eta_min=floor), peak, total + 1)))
    cases.append(("linear", peak, 0, floor, total, lrs(
        lambda o: torch.optim.lr_scheduler.LinearLR(
            o, start_factor=1.0, end_factor=floor / peak, total_iters=total),
        peak, total + 5)))

print("# torch %s, transformers %s: DECAY PEAK WARMUP MIN-LR DECAY-STEPS STEP LR"
      % (torch.__version__, transformers.__version__))
for decay, peak, warm, floor, total, values in cases:
    for step, lr in enumerate(values):
        print("%s %.17g %d %.17g %d %d %.17g" % (decay, peak, warm, floor,
                                                  total, step, lr))
