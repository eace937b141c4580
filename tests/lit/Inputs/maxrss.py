"""Runs a command and checks its peak resident memory.

    python maxrss.py LIMIT_MIB COMMAND ARGS...

The command's stdout and stderr pass through; then one line
`peak resident memory: N MiB (limit LIMIT_MIB MiB)` goes to stdout. The exit
status is the command's, or 1 when it stayed within its own but exceeded the
limit (so a test can bound what a tool holds, e.g. a 7B model's compile)."""
import resource
import subprocess
import sys

limit = int(sys.argv[1])
status = subprocess.call(sys.argv[2:])
peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss // 1024  # KiB on Linux
print("peak resident memory: %d MiB (limit %d MiB)" % (peak, limit), flush=True)
if status == 0 and peak > limit:
    print("maxrss.py: %s used %d MiB, above the limit of %d MiB"
          % (sys.argv[2], peak, limit), file=sys.stderr)
    status = 1
sys.exit(status)
