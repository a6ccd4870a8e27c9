"""Probe of the harness (not an attack): always wrong, and logs which worker process served each
call (a token drawn at import) to the file named by WORKER_LOG, so a test can tell whether the
harness kept its worker after a wrong result."""

import os
import uuid

TOKEN = uuid.uuid4().hex


def custom_kernel(data):
    with open(os.environ["WORKER_LOG"], "a") as log:
        log.write(TOKEN + "\n")
    x, y, out = data
    out.copy_(x + y)
    return out
