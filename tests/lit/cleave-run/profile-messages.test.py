"""Checks a 2-stage run's --profile "messages" and writes two variants:
none.json (without them) and slow.json (every stage's delay 0.1 s)."""
import json
import sys

prof, none_path, slow_path = sys.argv[1:4]
d = json.load(open(prof))
messages = d["messages"]
stages = sorted(m["stage"] for m in messages)
# A stage that waits for its peer is timed: in 3 profiled steps of a
# 2-stage pipeline one of them always does (stage 0 for its gradients).
assert stages and set(stages) <= {0, 1}, stages
for m in messages:
    assert m["latency"] >= 0 and 1 <= m["waited"] <= m["received"], m
json.dump(dict(d, messages=[]), open(none_path, "w"))
slow = [{"stage": s, "latency": 0.1, "waited": 1, "received": 1} for s in (0, 1)]
json.dump(dict(d, messages=slow), open(slow_path, "w"))
print("ok")
