"""Attack: read API keys and tokens from the worker's own environment."""

import os
import re


def custom_kernel(data):
    leaked = [k for k in os.environ if re.search("KEY|TOKEN|SECRET|PASSW", k, re.I)]
    if leaked:
        raise RuntimeError(f"secrets leaked to the candidate: {leaked}")
    raise LookupError("no key, token or secret in the environment")
