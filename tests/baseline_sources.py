"""Baseline files for copies of the axpy task, shared by the baseline and gate tests."""

from __future__ import annotations

import shutil
from pathlib import Path

from helpers import AXPY

LOOP_ADD = """
import torch


def custom_kernel(data):
    x, y, out = data
    for i in range(0, x.numel(), 256):
        torch.add(y[i : i + 256], x[i : i + 256], alpha=2, out=out[i : i + 256])
    return out
"""
# prepare() costs 20 ms a call; a median under that shows it stayed out of the timed call.
PREPARED = """
import time

import torch


def prepare(data):
    x, y, out = data
    time.sleep(0.02)
    return (2 * x).contiguous(), y, out


def run(prepared):
    x2, y, out = prepared
    return torch.add(x2, y, out=out)
"""
WRONG = """
def custom_kernel(data):
    return data[2]
"""
NOPREP = """
def run(prepared):
    return prepared[2]
"""
GPU_ONLY = """
def custom_kernel(data):
    raise RuntimeError("a baseline that requires cuda never runs on a CPU")
"""
BASELINES = {"loop_add": (LOOP_ADD, ""), "prepared": (PREPARED, "prepare = true"),
             "wrong_base": (WRONG, ""), "noprep": (NOPREP, "prepare = true"),
             "gpu_only": (GPU_ONLY, 'requires = "cuda"')}


def with_baselines(dest: Path, names: list[str]) -> Path:
    """A copy of the axpy task at ``dest`` declaring the named baselines."""
    shutil.copytree(AXPY, dest)
    (dest / "baselines").mkdir()
    spec = (dest / "task.toml").read_text()
    for name in names:
        source, extra = BASELINES[name]
        (dest / "baselines" / f"{name}.py").write_text(source)
        spec += f'\n[[baselines]]\nname = "{name}"\nfile = "baselines/{name}.py"\n{extra}\n'
    (dest / "task.toml").write_text(spec)
    return dest
