"""Attack: raise SystemExit(0) from inside the kernel, hoping the harness exits "successfully"."""

import sys


def custom_kernel(data):
    sys.exit(0)
