"""Starts a long training job under mpirun, kills the process of one rank
with SIGKILL once it runs, and reports how long mpirun took to end the
others and what it said.

usage: kill_rank.py CLEAVE_RUN PLAN RANKS VICTIM
"""
import os
import signal
import subprocess
import sys
import time

cleave_run, plan, ranks, victim = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4]
cmd = ["mpirun", "--allow-run-as-root", "--oversubscribe", "-np", ranks,
       cleave_run, plan, "--steps", "1000000", "--quiet", "--threads", "1"]
job = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                       text=True)


def find_rank():
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open("/proc/%s/environ" % pid, "rb") as f:
                env = f.read().split(b"\0")
            with open("/proc/%s/cmdline" % pid, "rb") as f:
                cmdline = f.read()
        except OSError:
            continue
        if (cleave_run.encode() in cmdline and
                ("OMPI_COMM_WORLD_RANK=" + victim).encode() in env):
            return int(pid)
    return None


pid = None
deadline = time.time() + 30
while pid is None and time.time() < deadline:
    time.sleep(0.5)
    pid = find_rank()
if pid is None:
    job.kill()
    sys.exit("rank %s never started" % victim)
time.sleep(1.0)  # let training run
t0 = time.time()
os.kill(pid, signal.SIGKILL)
try:
    out, err = job.communicate(timeout=60)
except subprocess.TimeoutExpired:
    job.kill()
    sys.exit("the other ranks still ran 60 s after rank %s was killed" % victim)
print("job ended %.1f s after rank %s was killed, exit status %d" %
      (time.time() - t0, victim, job.returncode))
for line in err.splitlines():
    if "exited on signal" in line:
        print(line.strip())
