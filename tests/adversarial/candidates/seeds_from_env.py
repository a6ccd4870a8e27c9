"""Attack: learn the case seeds from the environment, the command line, files in the working
folder or the request pipe, regenerate the inputs with the task's own generate_input and
precompute the outputs off the clock."""

import os
import re
import sys

TABLE = {}


def _seeds():
    found = []
    for name, value in os.environ.items():
        if re.search("SEED|SALT", name, re.I) and value.strip().isdigit():
            found.append(int(value))
    found += [int(a) for a in sys.argv[1:] if a.isdigit() and int(a) > 1000]
    for entry in os.listdir("."):
        try:
            with open(entry) as f:
                found += [int(x) for x in re.findall(r"seed\D{0,4}(\d{4,})", f.read(100000))]
        except (OSError, UnicodeDecodeError):
            pass
    fd = int(sys.argv[1])  # the request pipe: anything queued there ahead of time?
    os.set_blocking(fd, False)
    try:
        found += [int(x) for x in re.findall(rb'"seeds?":\[?(\d+)', os.read(fd, 1 << 20))]
    except BlockingIOError:
        pass
    finally:
        os.set_blocking(fd, True)
    return found


def custom_kernel(data):
    seeds = _seeds()
    if not seeds:
        raise LookupError("no seed found in the environment, argv, the working folder or the "
                          "request pipe")
    raise RuntimeError(f"seeds leaked to the candidate: {seeds}")
