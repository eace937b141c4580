"""Replays a pipeline schedule in PyTorch's CSV notation, independently of
cleave's simulator, and prints its makespan (one isolated step).

usage: replay_csv.py FILE.csv [--chunk-cost X]

Row r is rank r's program: actions <stage><F|I|W|B|SEND_F|RECV_F|SEND_B|RECV_B><mb>.
Every compute action takes X (default 1): F, I (input gradient) and W each
X, B (full backward) 2X, whose gradient leaves at its end. Links are free;
a SEND posts its value when the action that made it ended, a RECV waits
for it. A rank runs its row in order, one action at a time."""
import re
import sys

TOKEN = re.compile(r"^(\d+)(SEND_F|RECV_F|SEND_B|RECV_B|F|I|W|B)(\d+)$")


def main(argv):
    path = argv[1]
    cost = float(argv[argv.index("--chunk-cost") + 1]) if "--chunk-cost" in argv else 1.0
    rows = []
    with open(path) as f:
        for line in f:
            cells = [c.strip() for c in line.strip().split(",") if c.strip()]
            rows.append([TOKEN.match(c).groups() for c in cells])
    clock = [0.0] * len(rows)
    cursor = [0] * len(rows)
    made = {}     # (direction, stage, mb) -> time the value exists
    arrived = {}  # (direction, from stage, to stage, mb) -> arrival time
    progress = True
    while progress:
        progress = False
        for r, row in enumerate(rows):
            while cursor[r] < len(row):
                stage, kind, mb = row[cursor[r]]
                stage, mb = int(stage), int(mb)
                if kind in ("RECV_F", "RECV_B"):
                    peer = stage - 1 if kind == "RECV_F" else stage + 1
                    key = (kind[-1], peer, stage, mb)
                    if key not in arrived:
                        break
                    clock[r] = max(clock[r], arrived[key])
                elif kind in ("SEND_F", "SEND_B"):
                    peer = stage + 1 if kind == "SEND_F" else stage - 1
                    arrived[(kind[-1], stage, peer, mb)] = made[(kind[-1], stage, mb)]
                else:
                    took = 2 * cost if kind == "B" else cost
                    clock[r] += took
                    if kind == "F":
                        made[("F", stage, mb)] = clock[r]
                    elif kind in ("I", "B"):
                        made[("B", stage, mb)] = clock[r]
                cursor[r] += 1
                progress = True
    for r, row in enumerate(rows):
        if cursor[r] < len(row):
            sys.exit("deadlock: rank %d waits at %s" % (r, "".join(row[cursor[r]])))
    print("makespan %g" % max(clock))


if __name__ == "__main__":
    main(sys.argv)
