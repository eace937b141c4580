"""Compares what `cleave-opt --passes=autodiff --run` wrote (loss.npy,
grad.<param>.npy) with a model folder's PyTorch references (the layout of
tests/models/corpus: reference/ in float32, reference64/ in float64,
reference/params.txt). Standard library only (lit's Python has no numpy).

The error of a gradient is max|g - g64| / max|g64| (the model's largest
max|g64| for a gradient that is zero in exact arithmetic); cleave's worst
must be within 10x of PyTorch float32's worst (floored at 1e-7).

    python3 check_reference.py OUT_DIR MODEL_DIR

With --expected, compares every EXPECTED_DIR/<name>.npy (onnxruntime's
outputs) with OUT_DIR/<name>.npy to 1e-6 relative to its largest finite
value (an infinite or NaN value must be matched exactly; integer and bool
outputs element for element):

    python3 check_reference.py --expected OUT_DIR EXPECTED_DIR
"""
import ast
import math
import os
import struct
import sys


def read_npy(path):
    with open(path, "rb") as f:
        data = f.read()
    if data[:6] != b"\x93NUMPY":
        sys.exit("%s: not a .npy file" % path)
    if data[6] == 1:
        length, start = struct.unpack("<H", data[8:10])[0], 10
    else:
        length, start = struct.unpack("<I", data[8:12])[0], 12
    header = ast.literal_eval(data[start:start + length].decode("latin1"))
    code = {"<f4": "f", "<f8": "d", "<i4": "i", "<i8": "q", "|i1": "b",
            "|b1": "?"}[header["descr"]]
    body = data[start + length:]
    count = len(body) // struct.calcsize(code)
    return list(struct.unpack("<%d%s" % (count, code), body))


def compare_outputs(out, expected):
    bad = 0
    for name in sorted(os.listdir(expected)):
        want = read_npy(os.path.join(expected, name))
        got = read_npy(os.path.join(out, name))
        if want and not isinstance(want[0], float):
            # integers and bools: every element exactly
            ok = got == want
            bad += not ok
            print("%s: %s" % (name[:-4], "ok" if ok else "WRONG"))
            continue
        # An infinite or NaN expected value must come out the same; the
        # finite ones within 1e-6 of the largest of them.
        finite = [abs(v) for v in want if math.isfinite(v)]
        scale = max(finite + [1e-30])
        err = max([0.0] + [
            abs(a - b) / scale if math.isfinite(b)
            else (0.0 if a == b or (math.isnan(a) and math.isnan(b))
                  else math.inf)
            for a, b in zip(got, want)])
        ok = len(got) == len(want) and err <= 1e-6
        bad += not ok
        print("%s: %s" % (name[:-4], "ok" if ok else "WRONG (%.1e)" % err))
    return 1 if bad else 0


def main():
    if sys.argv[1] == "--expected":
        return compare_outputs(sys.argv[2], sys.argv[3])
    out, model = sys.argv[1], sys.argv[2]
    loss = read_npy(os.path.join(out, "loss.npy"))[0]
    loss64 = read_npy(os.path.join(model, "reference64", "loss.npy"))[0]
    rel = abs(loss - loss64) / abs(loss64)
    if not math.isfinite(rel):
        rel = math.inf  # a NaN loss fails
    print("loss %.6f, float64 %.6f: %s" % (loss, loss64,
                                          "ok" if rel < 1e-5 else "WRONG"))
    with open(os.path.join(model, "reference", "params.txt")) as f:
        params = [line.strip() for line in f if line.strip()]
    grads = {}
    for p in params:
        name = "grad.%s.npy" % p
        grads[p] = [read_npy(os.path.join(d, name)) for d in
                    (out, os.path.join(model, "reference"),
                     os.path.join(model, "reference64"))]
    scale = max(max(abs(v) for v in g64) for _, _, g64 in grads.values())
    mine = torch = 0.0
    for p, (g, g32, g64) in grads.items():
        s = max(abs(v) for v in g64)
        s = scale if s < 1e-4 * scale else s
        # A NaN fails: max() would pass over it.
        mine = max(mine, max(abs(a - b) if math.isfinite(a - b) else math.inf
                             for a, b in zip(g, g64)) / s)
        torch = max(torch, max(abs(a - b) for a, b in zip(g32, g64)) / s)
    ok = mine <= 10 * max(torch, 1e-7)
    print("%d gradients: error against float64 %s (cleave %.1e, PyTorch "
          "float32 %.1e)" % (len(grads), "within 10x of PyTorch's" if ok
                             else "TOO LARGE", mine, torch))
    return 0 if ok and rel < 1e-5 else 1


if __name__ == "__main__":
    sys.exit(main())
