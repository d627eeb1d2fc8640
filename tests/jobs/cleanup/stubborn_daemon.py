"""A process that leaves a daemon behind: double fork, setsid (a session of its own, out
of every process group of the job), SIGTERM ignored, output closed.

usage: stubborn_daemon.py PID_DIR exit|wait. Writes PID_DIR/main-PID, and the daemon
PID_DIR/daemon-PID, once the daemon runs; then the main process exits 0 (`exit`) or
sleeps until it is stopped (`wait`). The daemon gives up by itself after 300 s.
"""

import os
import signal
import sys
import time

pid_dir, mode = sys.argv[1], sys.argv[2]
ready_r, ready_w = os.pipe()
if os.fork() == 0:  # the first child: start the daemon and leave (the daemon is orphaned)
    os.close(ready_r)
    os.setsid()
    if os.fork() == 0:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        null = os.open(os.devnull, os.O_RDWR)
        for fd in (0, 1, 2):
            os.dup2(null, fd)
        open(os.path.join(pid_dir, f"daemon-{os.getpid()}"), "w").close()
        os.write(ready_w, b"x")
        os.close(ready_w)
        time.sleep(300)
    os._exit(0)
os.close(ready_w)
os.read(ready_r, 1)  # the daemon is up
os.wait()  # the first child
open(os.path.join(pid_dir, f"main-{os.getpid()}"), "w").close()
print("daemon started", flush=True)
if mode == "wait":
    time.sleep(300)
