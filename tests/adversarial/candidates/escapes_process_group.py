"""Attack: double-fork a daemon in a new session, out of the worker's process group, that would
outlive the worker (and, e.g., rewrite the results file after pytest has written it). It holds
a lock on ESCAPE_DIR/lock for as long as it lives and leaves ESCAPE_DIR/started behind."""

import fcntl
import os
import time


def _daemon():
    os.setsid()
    if os.fork():
        os._exit(0)
    folder = os.environ["ESCAPE_DIR"]
    fd = os.open(os.path.join(folder, "lock"), os.O_CREAT | os.O_RDWR)
    fcntl.flock(fd, fcntl.LOCK_EX)
    open(os.path.join(folder, "started"), "w").close()
    time.sleep(300)  # long enough to outlive the test session; never forever
    os._exit(0)


if os.fork() == 0:
    _daemon()
os.wait()
while not os.path.exists(os.path.join(os.environ["ESCAPE_DIR"], "started")):
    time.sleep(0.01)


def custom_kernel(data):
    return data[4]
