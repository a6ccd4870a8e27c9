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
    text = bt.table([failed, hung], tmp_path / "seed.py", [], [])
    assert "| (a) | " in text and " | - | 3 | half |" in text
    assert " | - | 124 | " in text
    assert "ninja" not in text and "generations" not in text  # neither was measured


def test_the_build_split_and_the_generations_are_read_back(tmp_path) -> None:
    """ninja's log of the build (start and end in ms, each target) and the evolve loop's
    "evaluate | done in N s" lines become the table's last two lines."""
    bt = _module()
    log = tmp_path / "ks_seed" / ".ninja_log"
    log.parent.mkdir()
    log.write_text("# ninja log v5\n0\t4600\t0\tcuda.cuda.o\t1\n2\t402\t0\tmain.o\t2\n"
                   "4600\t4700\t0\tks_seed.so\t3\n")
    split = bt.ninja_split(tmp_path)
    assert split == [("cuda.cuda.o", 4.6), ("main.o", 0.4), ("ks_seed.so", 0.1)]
    gens = bt.generations("kscientist evolve fp8_gemm | gen 0/1 | evaluate | done in 68.8 s: "
                          "c0001 passed\nkscientist evolve fp8_gemm | gen 1/1 | evaluate | done "
                          "in 59.0 s: c0006 passed\n")
    assert gens == [68.8, 59.0]
    text = bt.table([], tmp_path / "seed.py", split, gens)
    assert "cuda.cuda.o 4.6 s, main.o 0.4 s, ks_seed.so 0.1 s" in text
    assert "gen 0 68.8 s, gen 1 59.0 s" in text
