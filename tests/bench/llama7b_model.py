"""The LLaMA-7B-shaped graph the planning benchmarks use, set up in a
scratch folder: the committed tests/models/llama/7b/model.onnx beside a
sparse weight file of the right size (no disk used; cleavec only plans).

    with llama7b_model() as model:
        subprocess.run([cleavec, model, ...])
"""
import contextlib
import os
import shutil
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
WEIGHT_BYTES = 26954711040


@contextlib.contextmanager
def llama7b_model():
    tmp = tempfile.mkdtemp(prefix="llama7b-")
    try:
        model = os.path.join(tmp, "model.onnx")
        shutil.copy(os.path.join(ROOT, "tests/models/llama/7b/model.onnx"),
                    model)
        with open(os.path.join(tmp, "model.weights"), "wb") as f:
            f.truncate(WEIGHT_BYTES)
        yield model
    finally:
        shutil.rmtree(tmp)
