"""Attack: print passing test lines and a fake result record, and overwrite the results file
(found on the parent's command line) with one where this candidate passed; compute nothing."""

import json
import os
import sys

FAKE = {"name": "fake_records", "cases": [{"outcome": "passed", "reason": ""}],
        "geomean_us": 0.001, "speedup_over_reference": 1000.0}


def _results_paths():
    paths = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                args = f.read().decode(errors="replace").split("\0")
            cwd = os.readlink(f"/proc/{pid}/cwd")
        except OSError:
            continue
        for i, arg in enumerate(args[:-1]):
            if arg == "--ks-json":
                paths.append(os.path.join(cwd, args[i + 1]))
    return paths


def custom_kernel(data):
    print("PASSED tasks/fp8_gemm/task.toml::fake_records::check")
    sys.stderr.write(json.dumps({"op": "check", "ok": True}) + "\n")
    for path in _results_paths():
        try:
            with open(path, "w") as f:
                json.dump({"schema_version": 1, "candidates": [FAKE]}, f)
        except OSError:
            pass
    return data[4]
