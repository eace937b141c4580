#!/usr/bin/env python3
"""One ONNX Runtime training step, timed; a helper of train_vs_pytorch.py.

Runs under an interpreter that has the `onnxruntime-training` wheel (it
needs no PyTorch here):
    python3 tests/bench/ort_train_step.py MODEL.onnx DATA_DIR --params a,b,...
        [--iters 30] [--threads 2] [--lr 0.01] [--spin]

MODEL.onnx returns the scalar loss itself (PyTorch export in training mode),
DATA_DIR holds <input name>.npy for every graph input. The script builds
ORT's training artifacts (training, eval and SGD optimizer graphs, loss
taken as the model's own output), then times train_step + optimizer step +
lazy_reset_grad per step and prints `median_ms`, `first_loss`, `step8_loss` (the loss of
step 8, before its update), `last_loss`
as "key value" lines, or `unavailable REASON` and exit status 3.
"""

import argparse
import importlib
import os
import statistics
import sys
import tempfile
import time
import types


def import_ort_training():
    # onnxruntime/training/__init__.py imports its PyTorch-only parts
    # (optim, amp) unconditionally; the on-device training API and the
    # artifact generator need only onnx and onnxruntime, so load those two
    # without running the package's __init__.
    import onnxruntime as ort
    ort.set_default_logger_severity(3)  # no warnings on stderr
    pkg = types.ModuleType("onnxruntime.training")
    pkg.__path__ = [os.path.join(ort.__path__[0], "training")]
    sys.modules["onnxruntime.training"] = pkg
    artifacts = importlib.import_module("onnxruntime.training.artifacts")
    api = importlib.import_module("onnxruntime.training.api")
    return ort, artifacts, api


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("data")
    ap.add_argument("--params", required=True, help="comma-separated trainable initializers")
    ap.add_argument("--iters", type=int, default=30)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--lr", type=float, default=0.01)
    ap.add_argument("--spin", action="store_true",
                    help="keep ORT's default spinning of idle intra-op threads")
    args = ap.parse_args()
    try:
        import numpy as np
        import onnx
        ort, artifacts, api = import_ort_training()
    except Exception as e:  # noqa: BLE001 - any import failure means "not here"
        print(f"unavailable {type(e).__name__}: {e}")
        sys.exit(3)

    model = onnx.load(args.model)
    # ORT's gradient builders read optional outputs that PyTorch's export
    # leaves off (Dropout's mask, SoftmaxCrossEntropyLoss's log_prob,
    # LayerNormalization's mean and inverse std); name them, which changes
    # nothing else in the graph.
    wanted = {"Dropout": 2, "SoftmaxCrossEntropyLoss": 2, "LayerNormalization": 3}
    for k, node in enumerate(model.graph.node):
        while len(node.output) < wanted.get(node.op_type, 0):
            node.output.append(f"ort_bench_{k}_{len(node.output)}")
    params = args.params.split(",")
    inputs = [i.name for i in model.graph.input]
    feeds = [np.load(os.path.join(args.data, n + ".npy")) for n in inputs]
    with tempfile.TemporaryDirectory() as tmp:
        artifacts.generate_artifacts(model, requires_grad=params, frozen_params=[
            i.name for i in model.graph.initializer if i.name not in params],
            loss=None, optimizer=artifacts.OptimType.SGD, artifact_directory=tmp)
        # The onnx package next to ORT 1.19 may be newer than ORT: it stamps
        # the optimizer graph with an IR version and default-domain opset
        # that ORT 1.19 refuses (IR 10, opset 21 at most); its ops are all
        # com.microsoft ones, so stamping the versions ORT reads is enough.
        for name in ("training_model.onnx", "eval_model.onnx", "optimizer_model.onnx"):
            path = os.path.join(tmp, name)
            m = onnx.load(path)
            if m.ir_version > 10:
                m.ir_version = 10
                for op in m.opset_import:
                    if op.domain in ("", "ai.onnx"):
                        op.version = min(op.version, 21)
                onnx.save(m, path)
        so = ort.SessionOptions()
        so.intra_op_num_threads = args.threads
        so.inter_op_num_threads = 1
        if not args.spin:
            so.add_session_config_entry("session.intra_op.allow_spinning", "0")
        state = api.CheckpointState.load_checkpoint(os.path.join(tmp, "checkpoint"))
        # no eval graph: only training steps run (and ORT 1.19 refuses the
        # eval graph of a BatchNorm model exported in training mode)
        module = api.Module(os.path.join(tmp, "training_model.onnx"), state,
                            None, device="cpu", session_options=so)
        opt = api.Optimizer(os.path.join(tmp, "optimizer_model.onnx"), module)
        opt.set_learning_rate(args.lr)
        module.train()

        def step():
            loss = module(*feeds)
            opt.step()
            module.lazy_reset_grad()
            return float(np.asarray(loss))

        losses, times = [], []
        for i in range(args.warmup + args.iters):
            t0 = time.perf_counter()
            losses.append(step())
            if i >= args.warmup:
                times.append((time.perf_counter() - t0) * 1000)
    print(f"version {ort.__version__}")
    print(f"median_ms {statistics.median(times):.4f}")
    print(f"min_ms {min(times):.4f}")
    print(f"first_loss {losses[0]:.6f}")
    print(f"step8_loss {losses[7]:.6f}")
    print(f"last_loss {losses[-1]:.6f}")
    print(f"steps {args.warmup + args.iters}")


if __name__ == "__main__":
    main()
