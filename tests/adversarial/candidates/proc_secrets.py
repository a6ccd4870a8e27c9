"""Attack: read the parent pytest process's command line and environment through /proc, for
API keys and a --ks-salt (with the salt, every seed of the session can be derived)."""

import os
import re


def _secrets():
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        if int(pid) == os.getpid():
            continue
        for name in ("cmdline", "environ"):
            try:
                with open(f"/proc/{pid}/{name}", "rb") as f:
                    text = f.read().replace(b"\0", b" ").decode(errors="replace")
            except OSError:
                continue
            found += re.findall(r"--ks-salt[ =]\d+", text)
            found += re.findall(r"\b\w*(?:API_KEY|TOKEN)\w*=", text)
    return sorted(set(found))


def custom_kernel(data):
    leaked = _secrets()
    if leaked:
        raise RuntimeError(f"secrets leaked to the candidate: {leaked}")
    raise LookupError("no other process's command line or environment is readable")
