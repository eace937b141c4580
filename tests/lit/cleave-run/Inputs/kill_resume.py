"""Kills a training run with SIGKILL at random points, resumes it from its
last checkpoint each time, and finishes it; the caller compares the saved
model with an uninterrupted run's.

usage: kill_resume.py CLEAVE_RUN PLAN STEPS KILLS WORKDIR OUT.onnx [ARGS...]

A kill "lands" when the process was still running when SIGKILL reached it;
the script goes on until KILLS kills have landed (at most 10 x KILLS tries;
a run that finishes before its kill starts the training again from the
beginning) and prints how many landed and at which completed step each
resume began.
"""
import os
import random
import signal
import subprocess
import sys
import time

cleave_run, plan, steps, kills, work, out = sys.argv[1:7]
extra = sys.argv[7:]
steps, kills = int(steps), int(kills)
ckpt = os.path.join(work, "ckpt")
os.makedirs(work, exist_ok=True)
rng = random.Random(20261129)


def command(save=None):
    cmd = [cleave_run, plan, "--steps", str(steps), "--quiet",
           "--checkpoint-dir", ckpt, "--checkpoint-every", "1"] + extra
    if os.path.exists(os.path.join(ckpt, "checkpoint.bin")):
        cmd += ["--resume", ckpt]
    if save:
        cmd += ["--save", save]
    return cmd


# How long an uninterrupted run takes, to spread the kills over it.
t0 = time.time()
subprocess.run(command(), check=True, stdout=subprocess.DEVNULL,
               cwd=work)
full = time.time() - t0
for name in os.listdir(ckpt):
    os.remove(os.path.join(ckpt, name))

landed, tries, resumed_at = 0, 0, []
while landed < kills and tries < 10 * kills:
    tries += 1
    path = os.path.join(ckpt, "checkpoint.bin")
    if os.path.exists(path):
        # "CLEAVECKPT3\n", u64 header length, u32 version, u64 plan
        # identity, u32 stages, u64 entries, then u64 steps done
        # (runtime/Checkpoint.h).
        with open(path, "rb") as f:
            resumed_at.append(int.from_bytes(f.read(52)[44:52], "little"))
    p = subprocess.Popen(command(), stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True, cwd=work)
    time.sleep(rng.uniform(0.05, 1.0) * full / kills * 2)
    p.send_signal(signal.SIGKILL)
    stdout, stderr = p.communicate()
    if p.returncode == -signal.SIGKILL:
        landed += 1
    elif p.returncode != 0:
        sys.exit("run failed (exit %d): %s" % (p.returncode, stderr.strip()))
    else:
        # Finished before the kill (the machine ran faster than when `full`
        # was measured): train again from the start, so the remaining kills
        # still land somewhere in a run.
        for name in os.listdir(ckpt):
            os.remove(os.path.join(ckpt, name))
done = subprocess.run(command(save=out), capture_output=True, text=True,
                      cwd=work)
if done.returncode != 0:
    sys.exit("final run failed: " + done.stderr.strip())
print("kills landed: %d of %d tries; resumed after steps: %s" %
      (landed, tries, " ".join(map(str, resumed_at))))
if landed < kills:
    sys.exit("only %d kills landed" % landed)
