"""Runs a saved ONNX model in onnxruntime on a folder of .npy inputs and
compares its loss (the first output) with the one cleave computed.

usage: ort_loss.py MODEL INPUTS_DIR CLEAVE_LOSS.npy NAME
Prints one line; exits 1 when the relative difference exceeds 1e-5.
"""
import os
import sys

import numpy as np
import onnxruntime as ort

model, inputs, cleave_loss, name = sys.argv[1:5]
options = ort.SessionOptions()
options.log_severity_level = 3  # errors only
session = ort.InferenceSession(model, options, providers=["CPUExecutionProvider"])
feeds = {i.name: np.load(os.path.join(inputs, i.name + ".npy"))
         for i in session.get_inputs()}
theirs = float(session.run(None, feeds)[0])
mine = float(np.load(cleave_loss))
diff = abs(theirs - mine) / max(abs(mine), 1e-12)
verdict = "ok" if diff <= 1e-5 else "MISMATCH"
print(f"{name}: onnxruntime loss {theirs:.7g} cleave {mine:.7g} "
      f"relative difference {diff:.2e} {verdict}")
sys.exit(0 if verdict == "ok" else 1)
