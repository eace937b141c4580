#!/usr/bin/env python3
"""Runs seeded hostile inputs of the families of docs/reliability.md's
"Trust" section through the tools.

  untrusted_sweep.py CLEAVEC CLEAVE_OPT CLEAVE_RUN MODEL.onnx [--count N]
                     [--seed S] [--jobs J] [--timeout SECONDS] [--keep DIR]

The first three are the tools' paths; MODEL.onnx is a small training model (tests/models/training/mlp/model.onnx). Each case is drawn
from one family, in turn:

  path     a .cir whose file<...> or onnx<...> tensor names a hostile path
           (absolute, climbing out with .., a symlink out, a folder, a
           device, a FIFO, empty, very long, a NUL escape); it must be
           refused unless the name lies inside the .cir's folder
  json     a cost profile nesting [ and { 1 to 200,000 levels deep
  hex      hex<"..."> of a random digit count for an i8 tensor
  npz      a .npz whose member's zip headers claim a random size
  expand   cleave-opt --run on an Expand to a random huge shape
  csv      a schedule CSV against random --stages / --microbatches
  sched    cleave-sched on a random schedule, stage count (up to 5,000),
           chunks and microbatch count (up to 2^21): it runs, or is
           refused, inside the time limit
  worder   a generated schedule's CSV with one stage's W (or B) actions
           reordered: refused unless the order is still by microbatch
  ckpt     a checkpoint with one byte flipped (or cut short) resumed:
           refused, since every byte is covered by a checksum

Each runs under a 4 GB address-space limit and --timeout, and must exit 0,
or exit 1 or 2 with exactly one line on stderr, `TOOL: error: ...`; a
path that should have been refused and ran is a failure too. A signal, a
time-out (a hang) or any other output fails, kept under --keep. Prints the
tallies per family; exits 1 if any case failed.
"""
import argparse
import concurrent.futures
import os
import random
import shutil
import struct
import subprocess
import sys
import tempfile
import zlib

FAMILIES = ["path", "json", "hex", "npz", "expand", "csv", "sched", "worder",
            "ckpt"]
SCHED_MAX_MICROBATCHES = [1 << 21]  # --sched-max-microbatches
SCHEDULES = ["gpipe", "1f1b", "gpipe-2bp", "1f1b-2bp", "zb-h1", "zb-h2",
             "interleaved-1f1b", "looped-bfs", "zb-v", "v-half", "v-min",
             "dualpipe-v", "auto"]
LIMIT_KB = 4000000


def write(path, data):
    with open(path, "wb" if isinstance(data, bytes) else "w") as f:
        f.write(data)


def npz_claiming(path, rng):
    """A .npz with one deflated member x.npy whose headers claim a size."""
    payload = bytes(rng.getrandbits(8) for _ in range(rng.choice([0, 10, 5000])))
    c = zlib.compressobj(rng.choice([0, 6]), zlib.DEFLATED, -15)
    data = c.compress(payload) + c.flush()
    claimed = rng.choice([0, 1, len(payload), 1 << 20, 1 << 31, (1 << 32) - 1,
                          1 << 32, 1 << 40, (1 << 64) - 1])
    name = b"x.npy"
    zip64 = struct.pack("<HHQQ", 1, 16, claimed, len(data))
    crc = zlib.crc32(payload)
    local = struct.pack("<IHHHHHIIIHH", 0x04034B50, 45, 0, 8, 0, 0, crc,
                        0xFFFFFFFF, 0xFFFFFFFF, len(name), len(zip64))
    local += name + zip64
    central = struct.pack("<IHHHHHHIIIHHHHHII", 0x02014B50, 45, 45, 0, 8, 0,
                          0, crc, 0xFFFFFFFF, 0xFFFFFFFF, len(name),
                          len(zip64), 0, 0, 0, 0, 0) + name + zip64
    end = struct.pack("<IHHHHIIH", 0x06054B50, 0, 0, 1, 1, len(central),
                      len(local) + len(data), 0)
    write(path, local + data + central + end)


def make_case(family, rng, tools, model, plan, work, checkpoint):
    """The command of one case, and whether it must be refused (None:
    either running or a one-line refusal is right)."""
    cleavec, opt, run = tools
    sched = os.path.join(os.path.dirname(cleavec), "cleave-sched")
    if family == "sched":
        stages = rng.choice([1, 2, 3, 4, 8, 64, 4096, 5000])
        mbs = min(rng.choice([1, 2, 7, 64, 1000, 1 << 16, 1 << 20, 1 << 21]),
                  SCHED_MAX_MICROBATCHES[0])
        cmd = [sched, "--schedule", rng.choice(SCHEDULES), "--stages",
               str(stages), "--microbatches", str(mbs)]
        if rng.random() < 0.3:
            cmd += ["--chunks", str(rng.choice([1, 2, 3, 8]))]
        return cmd, None
    if family == "worder":
        name = rng.choice(["1f1b-2bp", "zb-h1", "zb-h2"])
        p, m = rng.choice([2, 3, 4]), rng.choice([2, 4, 6])
        csv = os.path.join(work, "s.csv")
        subprocess.run([sched, "--schedule", name, "--stages", str(p),
                        "--microbatches", str(m), "--emit=schedule-csv",
                        "-o", csv], check=True, stdout=subprocess.DEVNULL)
        rows = open(csv).read().split("\n")
        r = rng.randrange(p)
        cells = rows[r].split(",")
        kind = rng.choice(["W", "I"])
        picked = [i for i, c in enumerate(cells) if c[len(str(r))] == kind]
        i, j = sorted(rng.sample(picked, 2))
        cells[i], cells[j] = cells[j], cells[i]
        rows[r] = ",".join(cells)
        write(csv, "\n".join(rows))
        return [sched, "--schedule", "csv:" + csv], True
    if family == "ckpt":
        data = bytearray(open(checkpoint, "rb").read())
        if rng.random() < 0.2:
            data = data[:rng.randrange(len(data))]
        else:
            data[rng.randrange(len(data))] ^= 1 << rng.randrange(8)
        os.makedirs(os.path.join(work, "ck"))
        write(os.path.join(work, "ck", "checkpoint.bin"), bytes(data))
        return [run, plan, "--steps", "3", "--threads", "1", "--resume",
                os.path.join(work, "ck")], True
    if family == "path":
        inside = os.path.join(work, "cir")
        os.makedirs(os.path.join(inside, "sub"))
        secret = os.path.join(work, "secret.bin")
        write(secret, bytes(32))
        write(os.path.join(inside, "sub", "w.bin"), bytes(32))
        os.symlink(secret, os.path.join(inside, "link.bin"))
        os.mkfifo(os.path.join(inside, "fifo"))
        choices = [("sub/w.bin", False), ("./sub/../sub/w.bin", False),
                   (secret, True), ("../secret.bin", True),
                   ("sub/../../secret.bin", True), ("link.bin", True),
                   ("/etc/passwd", True), ("/dev/zero", True), ("fifo", True),
                   ("sub", True), ("", True), ("x" * 5000, True),
                   ("sub/w.bin\\00/../../secret.bin", True),
                   ("/" + "../" * 50 + "etc/passwd", True)]
        name, refuse = rng.choice(choices)
        kind = rng.choice(["file", "onnx"])
        ref = (f'file<"{name}", 0, 32>' if kind == "file"
               else f'onnx<"{name}", "x">')
        refuse = refuse or kind == "onnx"  # w.bin is no ONNX model
        write(os.path.join(inside, "g.cir"),
              f"graph @g {{ const %x : f32[8] = {ref} output %x }}\n")
        os.makedirs(os.path.join(work, "in"))
        return [opt, os.path.join(inside, "g.cir"), "--run", "--inputs",
                os.path.join(work, "in"), "--outputs",
                os.path.join(work, "out")], refuse
    if family == "json":
        depth = rng.choice([1, 10, 64, 65, 1000, 50000, 200000])
        opens = "".join(rng.choice("[{") for _ in range(depth))
        text = "".join(o if o == "[" else '{"a":' for o in opens)
        text += "".join("]" if o == "[" else "}" for o in reversed(opens))
        write(os.path.join(work, "p.json"), text)
        return [cleavec, model, "--stages", "2", "--microbatches", "2",
                "--cost-model", "profile:" + os.path.join(work, "p.json"),
                "-o", os.path.join(work, "p.cplan")], depth > 1
    if family == "hex":
        n = rng.randrange(0, 9)
        digits = "".join(rng.choice("0123456789abcdefXg") for _ in range(n))
        write(os.path.join(work, "h.cir"),
              f'graph @g {{ const %x : i8[2] = hex<"{digits}"> output %x }}\n')
        ok = len(digits) == 4 and all(c in "0123456789abcdef" for c in digits)
        return [opt, os.path.join(work, "h.cir")], not ok
    if family == "npz":
        npz_claiming(os.path.join(work, "d.npz"), rng)
        return [run, plan, "--steps", "1", "--threads", "1", "--data",
                os.path.join(work, "d.npz")], True
    if family == "expand":
        lead = rng.choice([2 ** 20, 2 ** 28, 2 ** 31, 2 ** 40, 2 ** 50])
        write(os.path.join(work, "e.cir"),
              "graph @g { const %x : f32[1,4,8] = splat<1.0> "
              f"%y = Expand(%x) {{shape = [{lead}, 4, 8]}} : "
              f"f32[{lead},4,8] output %y }}\n")
        os.makedirs(os.path.join(work, "in"))
        return [opt, os.path.join(work, "e.cir"), "--run", "--inputs",
                os.path.join(work, "in"), "--outputs",
                os.path.join(work, "out")], lead * 128 > LIMIT_KB * 1024
    # csv: a 2-rank, 4-microbatch schedule against random flags
    rows = ["0F0,0F1,0F2,0F3,0B0,0B1,0B2,0B3",
            "1F0,1B0,1F1,1B1,1F2,1B2,1F3,1B3"]
    write(os.path.join(work, "s.csv"), "\n".join(rows) + "\n")
    cmd = [cleavec, model, "--schedule", "csv:" + os.path.join(work, "s.csv"),
           "-o", os.path.join(work, "c.cplan")]
    stages, mbs = rng.choice([None, 1, 2, 3]), rng.choice([None, 2, 4, 8])
    if stages:
        cmd += ["--stages", str(stages)]
    if mbs:
        cmd += ["--microbatches", str(mbs)]
    return cmd, (stages not in (None, 2)) or (mbs not in (None, 4))


def run_case(args, index, base):
    rng = random.Random(f"{args.seed}:{index}")
    family = FAMILIES[index % len(FAMILIES)]
    work = tempfile.mkdtemp(dir=base)
    cmd, refuse = make_case(family, rng, args.tools, args.model, args.plan,
                            work, args.checkpoint)
    try:
        p = subprocess.run(
            ["sh", "-c", f"ulimit -v {LIMIT_KB}; exec \"$@\"", "sh"] + cmd,
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
            timeout=args.timeout, cwd=work)
        rc, err = p.returncode, p.stderr.decode("utf-8", "replace")
    except subprocess.TimeoutExpired:
        rc, err = None, ""
    tool = os.path.basename(cmd[0])
    if rc == 0:
        verdict = "unclear" if refuse is True else "ran"
    elif rc in (1, 2):
        lines = err.splitlines()
        ok = len(lines) == 1 and lines[0].startswith(tool + ": error: ")
        verdict = "refused" if ok else "bad-error"
    elif rc is None:
        verdict = "hang"
    else:
        verdict = "crash"
    failed = verdict not in ("ran", "refused")
    if failed and args.keep:
        shutil.copytree(work, os.path.join(args.keep, f"{verdict}-{index}"),
                        symlinks=True, ignore=lambda d, n: [
                            f for f in n if f == "fifo"])
    shutil.rmtree(work, ignore_errors=True)
    return index, family, verdict, rc, " ".join(cmd[1:])[:200], err.strip()


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("cleavec")
    ap.add_argument("cleave_opt")
    ap.add_argument("cleave_run")
    ap.add_argument("model")
    ap.add_argument("--count", type=int, default=600)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--timeout", type=float, default=60)
    ap.add_argument("--keep", default="")
    ap.add_argument("--sched-max-microbatches", type=int, default=1 << 21,
                    help="the sched family's largest microbatch count "
                         "(CI's sample keeps it small)")
    args = ap.parse_args()
    SCHED_MAX_MICROBATCHES[0] = args.sched_max_microbatches
    args.tools = [os.path.abspath(t) for t in
                  (args.cleavec, args.cleave_opt, args.cleave_run)]
    args.model = os.path.abspath(args.model)
    tally = {f: {} for f in FAMILIES}
    failures = []
    with tempfile.TemporaryDirectory() as base:
        args.plan = os.path.join(base, "p.cplan")
        subprocess.run([args.tools[0], args.model,
                        "--stages", "2", "--microbatches", "2", "-o",
                        args.plan], check=True, stdout=subprocess.DEVNULL)
        # A checkpoint after 2 steps, for the ckpt family to damage.
        subprocess.run([args.tools[2], args.plan, "--steps", "2",
                        "--threads", "1", "--quiet", "--checkpoint-dir",
                        os.path.join(base, "ck")], check=True,
                       stdout=subprocess.DEVNULL)
        args.checkpoint = os.path.join(base, "ck", "checkpoint.bin")
        with concurrent.futures.ThreadPoolExecutor(args.jobs) as pool:
            futures = [pool.submit(run_case, args, i, base)
                       for i in range(args.count)]
            for f in concurrent.futures.as_completed(futures):
                index, family, verdict, rc, cmd, err = f.result()
                t = tally[family]
                t[verdict] = t.get(verdict, 0) + 1
                if verdict not in ("ran", "refused"):
                    failures.append((index, family, verdict, rc, cmd, err))
    print(f"{args.count} hostile cases (seed {args.seed}):")
    for family in FAMILIES:
        print(f"  {family}: " + ", ".join(
            f"{k} {v}" for k, v in sorted(tally[family].items())))
    for index, family, verdict, rc, cmd, err in sorted(failures)[:20]:
        print(f"  case {index} ({family}): {verdict} (exit {rc}) {cmd!r} "
              f"{err[:300]!r}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
