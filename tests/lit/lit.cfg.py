# lit configuration for cleave's FileCheck tests: .cir files run through
# cleave-opt (parser, verifier, passes) and .test files run the tools on
# .onnx models. Run from the build tree (lit.site.cfg.py sets the paths):
#   python3 /usr/lib/llvm-14/build/utils/lit/lit.py -sv build/tests/lit
import os

import lit.formats

config.name = "cleave"
config.test_format = lit.formats.ShTest(execute_external=False)
config.suffixes = [".cir", ".test"]
# Inputs/ holds files the tests read, not tests.
config.excludes = ["Inputs", "lit.cfg.py", "lit.site.cfg.py.in"]

config.test_source_root = os.path.dirname(__file__)
config.test_exec_root = os.path.join(config.cleave_obj_root, "tests", "lit")

# Inputs outside tests/lit: the committed models and the bundled examples.
config.substitutions.append(("%models", os.path.join(
    config.cleave_src_root, "tests", "models")))
config.substitutions.append(("%examples", os.path.join(
    config.cleave_src_root, "examples")))
config.substitutions.append(("%python", config.python_executable))
# The folder of the built tools, for scripts that take it as an argument.
config.substitutions.append(("%toolsdir", config.cleave_tools_dir))
# The bad-input corpus (tests/bad-inputs/make_bad_inputs.py writes it) and
# the inputs that once crashed a fuzz target (tests/fuzz/regressions).
config.substitutions.append(("%bad", os.path.join(
    config.cleave_src_root, "tests", "bad-inputs")))
config.substitutions.append(("%fuzzregressions", os.path.join(
    config.cleave_src_root, "tests", "fuzz", "regressions")))

# Tool names become absolute paths, so a test never runs a stale copy from
# PATH. Whole words only (not inside paths or longer names); lit substitutes
# in order, so the longer name goes first.
tool_subs = [
    ("cleave-partition", os.path.join(config.cleave_tools_dir, "cleave-partition")),
    ("cleave-run", os.path.join(config.cleave_tools_dir, "cleave-run")),
    ("cleave-sched", os.path.join(config.cleave_tools_dir, "cleave-sched")),
    ("cleave-opt", os.path.join(config.cleave_tools_dir, "cleave-opt")),
    ("cleavec", os.path.join(config.cleave_tools_dir, "cleavec")),
    ("FileCheck", config.filecheck),
]
# `not` (inverts an exit status) and `count` (checks a line count) come with
# FileCheck in Debian's llvm-14.
for helper in ["not", "count"]:
    path = os.path.join(os.path.dirname(config.filecheck), helper)
    if os.path.exists(path):
        tool_subs.append((helper, path))
for name, path in tool_subs:
    config.substitutions.append(
        (r"(?<![\w/.-])%s(?![\w/.-])" % name.replace("-", r"\-"), path))

# Give the tools a predictable environment.
config.environment["LC_ALL"] = "C"
# The fixed `cpu` device profile, not this machine's measured one (the
# tools' default), so that predicted times and the partitions chosen by
# them are the same on every machine the suite runs on.
config.environment["CLEAVE_DEVICE_PROFILE"] = "cpu"
# The kernel-library choices travel into the tests: OpenBLAS's kernel family
# (this project's environments force Haswell, and without it the backend
# picks one from the CPU) and cleave's GEMM library (CLEAVE_GEMM), so that a
# run of the suite under CLEAVE_GEMM=openblas tests what it says.
for name in ("OPENBLAS_CORETYPE", "CLEAVE_GEMM"):
    if name in os.environ:
        config.environment[name] = os.environ[name]

# mpirun on PATH: the MPI tests (REQUIRES: mpi) run cleave-run one stage per
# process. They pass --allow-run-as-root (Open MPI refuses root otherwise)
# and --oversubscribe (more ranks than cores) themselves.
import shutil
if shutil.which("mpirun"):
    config.available_features.add("mpi")

# A visible GPU (nvidia-smi lists one): the tests of cleave-run's no-device
# error (UNSUPPORTED: cuda-device) then do not apply.
import subprocess
try:
    if subprocess.run(["nvidia-smi", "-L"], capture_output=True,
                      timeout=20).returncode == 0:
        config.available_features.add("cuda-device")
except (OSError, subprocess.TimeoutExpired):
    pass

# A Python with onnxruntime (scripts/test.sh makes one from pinned PyPI
# wheels and names it in CLEAVE_ORT_PYTHON): the tests that reload trained
# models in onnxruntime (REQUIRES: onnxruntime) run with it.
ort_python = os.environ.get("CLEAVE_ORT_PYTHON", "")
if ort_python and os.path.exists(ort_python):
    config.available_features.add("onnxruntime")
    config.substitutions.append(("%ortpython", ort_python))

# A Python with PyTorch, transformers, torchvision, onnx and onnxruntime
# (tests/models/corpus/make-venv.sh makes one; name its interpreter in
# CLEAVE_TORCH_PYTHON): the test that loads trained weights back into the
# PyTorch modules (REQUIRES: torch) runs with it.
torch_python = os.environ.get("CLEAVE_TORCH_PYTHON", "")
if torch_python and os.path.exists(torch_python):
    config.available_features.add("torch")
    config.substitutions.append(("%torchpython", torch_python))
