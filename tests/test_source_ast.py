"""source_ast: the pytest process's parses never run two at a time (CPython 3.11's AST
conversion keeps its recursion depth in interpreter-wide state)."""

from __future__ import annotations

import ast
import threading

from pytest_kscientist.formats import source_ast


def test_parses_from_several_threads_never_overlap(monkeypatch) -> None:
    meet = threading.Barrier(2, timeout=0.2)  # passes only if two parses are inside at once
    overlapped = []
    real_parse = ast.parse

    def parse_waiting_for_another(source, *args, **kwargs):
        try:
            meet.wait()
            overlapped.append(True)
        except threading.BrokenBarrierError:
            meet.reset()
        return real_parse(source, *args, **kwargs)

    monkeypatch.setattr(ast, "parse", parse_waiting_for_another)
    trees = []
    threads = [threading.Thread(target=lambda: trees.append(source_ast.parse("x = 1")))
               for _ in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(trees) == 3 and not overlapped


def test_compile_module_gives_the_code_of_the_tree() -> None:
    namespace: dict = {}
    exec(source_ast.compile_module(source_ast.parse("y = 2 * 3"), "<t>"), namespace)  # noqa: S102
    assert namespace["y"] == 6
