"""Writes an ONNX model whose graph calls model-local function E40 of
domain 'custom', where E_k calls E_(k-1) twice and E0 is a Relu: 2^40 calls
if ONNX shape inference expanded them. Protobuf written by hand (field
numbers from onnx.proto), so no onnx package is needed.
    function_fanout.py OUT.onnx [LEVELS]"""
import sys


def varint(n):
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        out.append(b | (0x80 if n else 0))
        if not n:
            return bytes(out)


def field(num, payload):
    """A length-delimited field."""
    if isinstance(payload, str):
        payload = payload.encode()
    return varint(num << 3 | 2) + varint(len(payload)) + payload


def int_field(num, value):
    return varint(num << 3) + varint(value)


def node(op, inputs, outputs, name, domain=""):
    b = b"".join(field(1, i) for i in inputs)
    b += b"".join(field(2, o) for o in outputs)
    b += field(3, name) + field(4, op)
    return b + (field(7, domain) if domain else b"")


def opset(domain, version):
    return field(1, domain) + int_field(2, version)


def value_info(name, dims):
    shape = b"".join(field(1, int_field(1, d)) for d in dims)
    tensor = int_field(1, 1) + field(2, shape)  # FLOAT
    return field(1, name) + field(2, field(1, tensor))


levels = int(sys.argv[2]) if len(sys.argv) > 2 else 40
model = int_field(1, 8)  # ir_version
model += field(8, opset("", 17)) + field(8, opset("custom", 1))
graph = field(1, node("E%d" % levels, ["x"], ["y"], "call", "custom"))
graph += field(2, "fanout")
graph += field(11, value_info("x", [2, 3])) + field(12, value_info("y", [2, 3]))
model += field(7, graph)
for k in range(levels + 1):
    if k == 0:
        body = field(7, node("Relu", ["a"], ["b"], "relu"))
    else:
        body = field(7, node("E%d" % (k - 1), ["a"], ["t"], "first", "custom"))
        body += field(7, node("E%d" % (k - 1), ["t"], ["b"], "second", "custom"))
    fn = field(1, "E%d" % k) + field(4, "a") + field(5, "b") + body
    fn += field(9, opset("", 17)) + field(9, opset("custom", 1))
    fn += field(10, "custom")
    model += field(25, fn)
open(sys.argv[1], "wb").write(model)
