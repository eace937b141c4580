#!/usr/bin/env python3
"""How planning scales with what an input can ask for: a long chain of
unnamed ops (no module paths, so the partitioner's layers come from cut
points) and a schedule of 2^20 microbatches. Prints wall seconds and peak
resident memory per run, measured here (no bar: this machine is shared).

  python3 tests/bench/planning_scale.py [--build build] [--ops 10000]
                                        [--microbatches 1048576]

Needs `onnx` (the PyTorch venv of docs/design/pytorch2.md) for the chain.
"""
import argparse
import os
import resource
import subprocess
import sys
import tempfile
import time

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def chain(n, path):
    """n unnamed ops: a MatMul every fourth, Tanh between; a mean as loss."""
    rng = np.random.default_rng(0)
    nodes, inits, x = [], [], "x"
    for i in range(n):
        if i % 4 == 0:
            w = "w%d" % i
            inits.append(numpy_helper.from_array(
                (rng.random((16, 16)) * 0.1).astype(np.float32), w))
            nodes.append(helper.make_node("MatMul", [x, w], ["t%d" % i]))
        else:
            nodes.append(helper.make_node("Tanh", [x], ["t%d" % i]))
        x = "t%d" % i
    nodes.append(helper.make_node("ReduceMean", [x], ["loss"], keepdims=0))
    g = helper.make_graph(
        nodes, "chain", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 16])],
        [helper.make_tensor_value_info("loss", TensorProto.FLOAT, [])], inits)
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), path)


def timed(cmd):
    before = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    t = time.perf_counter()
    r = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                       text=True)
    seconds = time.perf_counter() - t
    peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    if r.returncode:
        sys.exit("failed: %s\n%s" % (" ".join(cmd), r.stderr))
    # ru_maxrss of the children is the largest so far: runs go smallest first.
    return seconds, max(peak, before) / 1024


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--build", default=os.path.join(ROOT, "build"))
    p.add_argument("--ops", type=int, default=10000)
    p.add_argument("--microbatches", type=int, default=1 << 20)
    a = p.parse_args()
    tools = os.path.join(a.build, "tools")
    with tempfile.TemporaryDirectory() as tmp:
        model = os.path.join(tmp, "chain.onnx")
        chain(a.ops, model)
        for stages in (2, 4):
            s, mb = timed([os.path.join(tools, "cleavec"), model, "--stages",
                           str(stages), "--microbatches", "4", "-o",
                           os.path.join(tmp, "p.cplan")])
            print("cleavec, %d unnamed ops, %d stages: %.2f s, peak %.0f MiB"
                  % (a.ops, stages, s, mb))
    for sched in ("1f1b", "zb-h1"):
        s, mb = timed([os.path.join(tools, "cleave-sched"), "--stages", "4",
                       "--microbatches", str(a.microbatches), "--schedule", sched])
        print("cleave-sched, 4 stages, %d microbatches, %s (build, validate, "
              "simulate): %.2f s, peak %.0f MiB" % (a.microbatches, sched, s, mb))


if __name__ == "__main__":
    main()
