"""Starts a long training job under mpirun, kills the process of one rank
with SIGKILL (or stops it with SIGSTOP) once it runs, and reports how long
the job took to end and what it said.

usage: kill_rank.py CLEAVE_RUN PLAN RANKS VICTIM [KILL|STOP [ARGS...]]
ARGS go to cleave-run (say --comm-timeout 3: a stopped rank never exits, so
only the others' time-outs end the job).
"""
import os
import signal
import subprocess
import sys
import time

cleave_run, plan, ranks, victim = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4]
how = sys.argv[5] if len(sys.argv) > 5 else "KILL"
sig, verb = {"KILL": (signal.SIGKILL, "killed"),
             "STOP": (signal.SIGSTOP, "stopped")}[how]
cmd = ["mpirun", "--allow-run-as-root", "--oversubscribe", "-np", ranks,
       cleave_run, plan, "--steps", "1000000", "--quiet", "--threads", "1"]
cmd += sys.argv[6:]
job = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                       text=True)


def parent(pid):
    try:
        with open("/proc/%d/stat" % pid) as f:
            return int(f.read().rsplit(")", 1)[1].split()[1])
    except (OSError, ValueError, IndexError):
        return 0


def ours(pid):
    """Whether `pid` descends from our mpirun (lit runs other MPI tests at
    the same time, whose ranks look the same)."""
    while pid > 1:
        pid = parent(pid)
        if pid == job.pid:
            return True
    return False


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
                ("OMPI_COMM_WORLD_RANK=" + victim).encode() in env and
                ours(int(pid))):
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
os.kill(pid, sig)
try:
    out, err = job.communicate(timeout=60)
except subprocess.TimeoutExpired:
    job.kill()
    if how == "STOP":
        os.kill(pid, signal.SIGKILL)
    sys.exit("the other ranks still ran 60 s after rank %s was %s" %
             (victim, verb))
print("job ended %.1f s after rank %s was %s, exit status %d" %
      (time.time() - t0, victim, verb, job.returncode))
for line in err.splitlines():
    if "exited on signal" in line or "error:" in line:
        print(line.strip())
