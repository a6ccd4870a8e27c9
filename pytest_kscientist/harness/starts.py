"""Workers started and loaded in the background before the first item needs them
(``start_workers``), so their starts, imports and builds overlap each other and the items that
time nothing, and none overlaps a timed call.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from pytest_kscientist.errors import CandidateFailure
from pytest_kscientist.harness.items import ROUND_ROLES, CandidateItem, CaseItem
from pytest_kscientist.harness.spawn import WorkerDied

if TYPE_CHECKING:
    from pytest_kscientist.harness.collect import CandidateNode


def start_workers(items: list[Any], jobs: int) -> int:
    """Begin starting and loading, ``jobs`` at a time in the background, the workers of every
    candidate (and baseline) that has an item to run; returns how many were begun.

    A worker's start (torch's import) and load (the candidate's import: a ``load_inline``
    build, a Triton compile at import) then overlap with the others' on the machine's cores and
    with the items that time nothing (task validation, checks): an item waits for its own
    candidate's start, and the first benchmark item for every start
    (``KsSession.wait_for_starts``), so no build runs beside a timed call. A load that fails is
    the candidate's failure, shown whole by its first item.
    """
    nodes: list[CandidateNode] = []
    partners: list[Any] = []
    for item in items:
        if not isinstance(item, CandidateItem):
            continue
        node = item.candidate
        if node in nodes or node.skip_reason or node.worker is not None:
            continue
        if node.load_failure is not None:
            continue
        nodes.append(node)
        if isinstance(item, CaseItem) and item.kind == "bench" and node.role == "candidate":
            partners += [p for p in node.ks.partners_for(node.task) if p not in partners]
    if len(nodes) + len(partners) < 2 or jobs < 2:
        return 0  # nothing to overlap: the first item starts its worker as before
    for node in nodes:  # made here, not by two threads at once
        node.ks.evaluator(node.task)
        _ = node.ks.spares
    gate = threading.BoundedSemaphore(jobs)
    pending = nodes[0].ks.starting
    for node in nodes:
        node.starting = Starting(node.start_early, gate, pending)
    for partner in partners:
        Starting(partner.start_early, gate, pending)
    # --ks-bench-workers N (auto on a GPU when kernels are compared): the twins that take a
    # kernel's other rounds start now too, beside the rest, not when a round first needs one
    # (on an H200 two copies of a kernel and the reference took 68 s a session with 4 twins
    # started in the rounds, against 32 s with one worker a kernel).
    twins = 0
    for owner in [*(n for n in nodes if n.role in ROUND_ROLES), *partners]:
        for turn in range(1, owner.turns.count):
            Starting(functools.partial(owner.turns.start_ahead, turn, owner._start_twin), gate,
                     pending)
            twins += 1
    nodes[0].ks.warm_ups += _warm_ups(items, nodes, partners)
    return len(nodes) + len(partners) + twins


def _warm_ups(items: list[Any], nodes: list[CandidateNode], partners: list[Any]
              ) -> list[WarmUp]:
    """The workers begun here whose first call would be a timed round's, each with the case
    of its first benchmark: every twin, and the own worker of a kernel with no item but its
    benchmarks (the reference, a baseline, a candidate under ``-k bench``). A worker that
    ran checks (every check item comes before the first benchmark) has made its first call."""
    first: dict[str, Any] = {}  # task name -> the case of its first benchmark item
    untimed: set[int] = set()  # ids of the nodes with an item other than a benchmark
    for item in items:
        if not isinstance(item, CandidateItem):
            continue
        if isinstance(item, CaseItem) and item.kind == "bench":
            first.setdefault(item.candidate.task.name, item.case)
        else:
            untimed.add(id(item.candidate))
    warm: list[WarmUp] = []
    ks = nodes[0].ks
    for owner in [*nodes, *partners]:
        case = first.get(owner.task.name)
        if case is None:
            continue
        evaluator = ks.evaluator(owner.task)
        first_turn = 1 if id(owner) in untimed else 0  # its own worker ran checks
        warm += [WarmUp(owner, turn, evaluator, case)
                 for turn in range(first_turn, owner.turns.count)]
    return warm


class WarmUp:
    """The first call of round ``turn``'s worker of ``owner`` (a candidate node or a
    baseline's Partner), made untimed before the rounds (``KsSession._begin_warm_ups``), in
    the worker its start left (none: its round starts one and says why that fails). A hang
    there goes into its ``Turns.hung``: the verdict of that turn's round, which does not
    start another worker to wait out ``--ks-timeout`` again."""

    def __init__(self, owner: Any, turn: int, evaluator: Any, case: Any) -> None:
        self.owner, self.turn, self.evaluator, self.case = owner, turn, evaluator, case

    def run(self) -> None:
        turns = self.owner.turns
        worker = turns.twin(self.turn) if self.turn else self.owner.worker
        if worker is None or not worker.alive() or not self.owner.timeable():
            return  # none, or not to be timed (a failed check closed it, or may yet)
        try:
            self.evaluator.untimed_call(worker, self.case)
        except WorkerDied as exc:
            if exc.hung:
                turns.hung[self.turn] = WorkerDied(
                    f"first call, made before the rounds: {exc.reason}", exc.detail, hung=True)
        except CandidateFailure:
            pass  # the round's own calls meet it again and report it there


class Starting(threading.Thread):
    """A worker's start in the background (``start_workers``), or its first call (``WarmUp``),
    one of ``gate``'s at a time, listed in ``pending`` (its session's ``KsSession.starting``,
    ``warming``) until waited for.

    A daemon: an interrupted session does not wait for a build to end (the worker it was
    starting dies with this process, through its lifeline)."""

    def __init__(self, job: Callable[[], None], gate: threading.BoundedSemaphore,
                 pending: list[Any], name: str = "ks-start") -> None:
        super().__init__(name=name, daemon=True)
        self.job, self.gate = job, gate
        self.error: BaseException | None = None
        # Set when the job has ended. Waited on instead of join(): a join interrupted by a
        # signal (pytest-timeout's alarm, Ctrl-C) marks the thread ended while it still runs
        # (CPython's bpo-45274), and a later join returned at once, beside the running start.
        self.done = threading.Event()
        pending.append(self)
        self.start()

    def run(self) -> None:
        try:
            with self.gate:
                try:
                    self.job()
                except BaseException as exc:  # noqa: BLE001 - raised again where waited for
                    self.error = exc
        finally:
            self.done.set()

    def wait(self) -> None:
        self.done.wait()
        error, self.error = self.error, None
        if error is not None:
            raise error


