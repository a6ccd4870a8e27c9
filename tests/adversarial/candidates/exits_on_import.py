"""Attack: exit with status 0 while being imported, before any check can run."""

import os

os._exit(0)


def custom_kernel(data):
    return data[4]
