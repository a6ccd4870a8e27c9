"""The suite's pytest sessions forked by ``session_server`` start as ``python -m pytest``
would: their folder, environment, arguments, paths, exit code and output, fresh random state,
and the interpreter's exit (threads joined, ``atexit`` run); what a fork cannot give starts
for real."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import session_server
from helpers import PYTEST

PROBE = '''
import atexit, json, os, random, sys, threading, time
from pathlib import Path


def test_probe():
    here = Path(os.environ["PROBE_OUT"])
    here.write_text(json.dumps({
        "cwd": os.getcwd(), "path": sys.path[:3], "argv0": sys.argv[0],
        "env": {k: os.environ.get(k) for k in ("PROBE_SET", "PROBE_UNSET")},
        "parent": os.getppid(), "random": random.random(),
    }))
    print("to stdout")
    print("to stderr", file=sys.stderr)

    def late():
        time.sleep(0.3)
        (here.parent / "thread.txt").write_text("joined")

    threading.Thread(target=late).start()
    atexit.register(lambda: (here.parent / "atexit.txt").write_text("ran"))
    assert os.environ.get("PROBE_FAIL") != "1"
'''


@pytest.fixture
def probe(tmp_path: Path) -> Path:
    (tmp_path / "test_probe.py").write_text(PROBE)
    (tmp_path / "extra").mkdir()
    return tmp_path


def served(folder: Path, name: str, timeout: float = 120,
           **env: str) -> tuple[subprocess.CompletedProcess[str], dict]:
    environ = dict(os.environ, PROBE_OUT=str(folder / f"{name}.json"), PROBE_SET="yes", **env)
    environ.pop("PROBE_UNSET", None)
    proc = session_server.run([*PYTEST, "-q", "-s", "test_probe.py"], cwd=folder, env=environ,
                              timeout=timeout)
    out = folder / f"{name}.json"
    return proc, json.loads(out.read_text()) if out.exists() else {}


def test_a_forked_session_starts_as_the_command_would(probe: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PROBE_UNSET", "the caller's, not the session's")
    extra = str(probe / "extra")
    proc, seen = served(probe, "one", PYTHONPATH=os.pathsep.join(
        filter(None, [extra, os.environ.get("PYTHONPATH", "")])))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert seen["parent"] != os.getpid()  # forked by the server, not started here
    assert seen["cwd"] == str(probe) and seen["path"][:2] == [str(probe), extra]
    assert seen["argv0"].endswith(os.path.join("pytest", "__main__.py"))
    assert seen["env"] == {"PROBE_SET": "yes", "PROBE_UNSET": None}
    assert "to stdout" in proc.stdout and "to stderr" in proc.stderr
    assert "to stderr" not in proc.stdout and "1 passed" in proc.stdout
    assert (probe / "thread.txt").read_text() == "joined"  # joined before the exit
    assert (probe / "atexit.txt").read_text() == "ran"
    failed, again = served(probe, "two", PROBE_FAIL="1")
    assert failed.returncode == 1 and "1 failed" in failed.stdout
    assert again["random"] != seen["random"]
    usage = session_server.run([*PYTEST, "--no-such-flag"], cwd=probe, timeout=60)
    assert usage.returncode == 4 and "unrecognized arguments" in usage.stderr


def test_what_a_fork_cannot_give_starts_for_real(probe: Path) -> None:
    proc, seen = served(probe, "hashed", PYTHONHASHSEED="123")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert seen["parent"] == os.getpid()
    torch_copy = probe / "other"
    (torch_copy / "torch").mkdir(parents=True)
    assert session_server.popen([*PYTEST], None, None, probe, dict(
        os.environ, PYTHONPATH=str(torch_copy))) is None
    assert session_server.popen([sys.executable, "-c", "pass"], None, None, probe, None) is None


def test_a_session_past_its_timeout_is_killed(probe: Path) -> None:
    (probe / "test_probe.py").write_text("import time\n\ndef test_long():\n    time.sleep(60)\n")
    with pytest.raises(subprocess.TimeoutExpired):
        session_server.run([*PYTEST, "-q", "test_probe.py"], cwd=probe, timeout=3)
