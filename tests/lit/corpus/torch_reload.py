"""Loads models cleave trained back into the corpus's PyTorch modules with
examples/pytorch/load_trained.py and checks them.

usage: torch_reload.py CORPUS EXAMPLES OUT NAME...
For each NAME (an export folder such as gpt2-dynamo), OUT/NAME.onnx is what
`cleave-run --save` wrote after the corpus's 3 SGD steps (steps/hyper.txt).
The model inside the export's wrapper (names without its "m.") gets the
trained tensors; then
  * each of its parameters equals its initializer in NAME.onnx, bit for bit;
  * they match PyTorch's own 3 steps (steps/params) as closely as float32
    allows (10x the export's float32-vs-float64 error after 3 steps, at
    least 1e-4 of each tensor's largest value);
  * the module, wrapped again, computes onnxruntime's loss of NAME.onnx on
    the corpus inputs (relative 1e-5).
Prints one line per export; exits 1 on the first failure.
"""
import json
import os
import sys

import numpy as np
import onnx
import onnx.numpy_helper
import onnxruntime as ort
import torch

corpus, examples, out = sys.argv[1:4]
sys.path.insert(0, corpus)
sys.path.insert(0, os.path.join(examples, "pytorch"))
import export_corpus  # noqa: E402
from load_trained import load_trained  # noqa: E402


def rel(a, b):
    return float(np.max(np.abs(a - b)) / max(float(np.max(np.abs(b))), 1e-12))


for name in sys.argv[4:]:
    folder = os.path.join(corpus, name)
    trained = os.path.join(out, name + ".onnx")
    info = json.load(open(os.path.join(folder, "info.json")))
    make = export_corpus.MODELS[name.rsplit("-", 1)[0]][0]
    torch.manual_seed(0)
    model, _, wrapper = make()
    report = load_trained(model, trained)
    assert report.prefix == "m.", report.prefix
    inits = {t.name: onnx.numpy_helper.to_array(t)
             for t in onnx.load(trained).graph.initializer}
    params = dict(model.named_parameters())
    steps_err, tol = 0.0, max(1e-4, 10 * info["steps_f32_vs_f64_max_param_rel_err"])
    for pname, init in report.parameters.items():
        mine = params[pname].detach().numpy()
        if not np.array_equal(mine, inits[init]):
            sys.exit("%s: %s differs from initializer %s" % (name, pname, init))
        theirs = np.load(os.path.join(folder, "steps", "params", init + ".npy"))
        steps_err = max(steps_err, rel(mine, theirs))
    if len(report.parameters) != info["parameter_tensors"]:
        sys.exit("%s: %d parameters loaded, the export has %d" %
                 (name, len(report.parameters), info["parameter_tensors"]))
    if steps_err > tol:
        sys.exit("%s: parameters %.2e from PyTorch's 3 steps (tolerance %.1e)"
                 % (name, steps_err, tol))
    wrapped = wrapper(model)
    export_corpus.set_mode(wrapped, info["references_batchnorm"] == "eval")
    order = [i["name"] for i in info["inputs"]]
    feeds = {i: np.load(os.path.join(folder, "inputs", i + ".npy")) for i in order}
    with torch.no_grad():
        loss = float(wrapped(*[torch.from_numpy(feeds[i]) for i in order]))
    options = ort.SessionOptions()
    options.log_severity_level = 3
    session = ort.InferenceSession(trained, options,
                                   providers=["CPUExecutionProvider"])
    theirs = float(session.run(None, {i.name: feeds[i.name]
                                      for i in session.get_inputs()})[0])
    loss_err = abs(loss - theirs) / max(abs(theirs), 1e-12)
    if loss_err > 1e-5:
        sys.exit("%s: PyTorch loss %.7g, onnxruntime %.7g" % (name, loss, theirs))
    print("%s: %d parameters, %d buffers loaded (%d kept); PyTorch's 3 steps "
          "%.1e away; loss %.6g, onnxruntime's %.1e away ok" %
          (name, len(report.parameters), len(report.buffers),
           len(report.buffers_kept), steps_err, loss, loss_err))
