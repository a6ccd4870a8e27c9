"""bench/build_times.py without a GPU: each step runs in a fresh process with the extension
cache it was given, reports the import's own time, and the table says what was measured."""

from __future__ import annotations

import sys

from helpers import REPO, load_file


def _module():
    return load_file(REPO / "bench" / "build_times.py", "build_times")


def test_an_import_step_runs_the_seed_with_its_own_extension_cache(tmp_path) -> None:
    bt = _module()
    seed = tmp_path / "seed.py"
    seed.write_text("import os, pathlib\n"
                    "pathlib.Path(os.environ['TORCH_EXTENSIONS_DIR']).mkdir(parents=True)\n"
                    "pathlib.Path(os.environ['TORCH_EXTENSIONS_DIR'], 'built').touch()\n")
    cache = tmp_path / "cache"
    step = bt.timed("(a)", [sys.executable, "-c", bt.IMPORT, str(seed)], cache, 60)
    assert step.returncode == 0, step.tail
    assert (cache / "built").exists()
    assert step.import_s is not None and 0 <= step.import_s <= step.wall_s


def test_a_failing_or_hung_step_is_a_row_with_its_exit_code(tmp_path) -> None:
    bt = _module()
    failed = bt.timed("(a)", [sys.executable, "-c", "print('half'); raise SystemExit(3)"],
                      tmp_path / "c1", 60)
    assert (failed.returncode, failed.import_s, failed.last_line) == (3, None, "half")
    hung = bt.timed("(b)", [sys.executable, "-c", "import time; time.sleep(30)"],
                    tmp_path / "c2", 0.5)
    assert hung.returncode == 124 and "timed out" in hung.tail
    text = bt.table([failed, hung], pch_before=False, seed=tmp_path / "seed.py")
    assert "torch's PCH before (a): absent" in text
    assert "| (a) | " in text and " | - | 3 | half |" in text
    assert " | - | 124 | " in text
