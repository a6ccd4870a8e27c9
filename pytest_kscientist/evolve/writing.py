"""The write stage of a generation: one writer call per kept plan and one repair call per
candidate of the previous generation that failed when it ran, at once where the writer allows.

A writer that sets ``concurrent = True`` (the LLM writer) is called from one thread per plan;
any other is called in turn. The drafts are stored in plan order in the main thread, so the
population's ids and the event log do not depend on which call finished first. A writer with a
``repair(task, failed, base, plan)`` method gets the failed file with its trimmed error (issue
13: a Triton compile error's cause reached no prompt); the repaired file joins this
generation's evaluation, with the failed candidate's parents and plan.
"""

from __future__ import annotations

import inspect
import threading
from collections.abc import Callable
from typing import Any

from pytest_kscientist.evolve.population import Event, Member
from pytest_kscientist.evolve.roles import ExperimentPlan, Selection


class Stop(Exception):
    """Ends the run early, with the reason to show and the exit code to return; ``stand_in``
    says whether the offline role may replace the failing one for the generation (not for a
    provider outage, issue 13)."""

    def __init__(self, reason: str, code: int = 0, stand_in: bool = True) -> None:
        super().__init__(reason)
        self.reason = reason
        self.code = code
        self.stand_in = stand_in


Outcome = tuple[Any, "Stop | None"]


def accepts(method: Any, name: str) -> bool:
    """Whether ``method`` takes a keyword argument ``name`` (older writers take fewer)."""
    try:
        params = inspect.signature(method).parameters
    except (TypeError, ValueError):
        return False
    return name in params or any(p.kind is p.VAR_KEYWORD for p in params.values())


def run_calls(calls: list[Callable[[], Any]], store: list[Callable[[Outcome], bool]],
              parallel: bool) -> None:
    """Run each call and hand its outcome, (result, None) or (None, Stop), to its ``store`` in
    the main thread, in order: right after the call when sequential (a Ctrl-C keeps the drafts
    written so far; a ``store`` answering False ends the calls), after all calls in threads
    when ``parallel``. Ctrl-C reaches the main
    thread while it waits; the threads are daemons and end with the process."""
    def outcome(call: Callable[[], Any]) -> Outcome:
        try:
            return call(), None
        except Stop as stop:
            return None, stop

    if not parallel or len(calls) < 2:
        for call, keep in zip(calls, store, strict=True):
            if not keep(outcome(call)):
                return
        return
    results: list[Outcome] = [(None, None)] * len(calls)
    finished = threading.Semaphore(0)

    def run(k: int, call: Callable[[], Any]) -> None:
        try:
            results[k] = outcome(call)
        finally:
            finished.release()

    for k, call in enumerate(calls):
        threading.Thread(target=run, args=(k, call), daemon=True, name=f"ks-writer-{k}").start()
    for _ in calls:
        finished.acquire()
    for keep, result in zip(store, results, strict=True):
        keep(result)


class WriteStage:
    """Mixed into ``loop.Evolution``: the plans of a design and the repairs due, written."""

    pop: Any
    generation: int
    _call: Callable[..., Any]
    _stage: Callable[[str, str], None]
    _remaining: Callable[[], float | None]

    def _write_stage(self, g: int, design: Event, plans: list[ExperimentPlan], done: set[int],
                     base: Member, roles: Any, brief: Any) -> Stop | None:
        """Write the plans not done yet and the repairs due; store the drafts in order; then
        raise the first stop a call ended with (a spent budget, an outage). Return the first
        failure when every call failed (no draft came back), else None."""
        selection = Selection.model_validate(design.data["selection"])
        by_id = {m.id: m for m in self.pop.members()}
        reference = by_id.get(selection.reference_id or "")
        writer = roles.writer
        extra: dict[str, Any] = ({"reference": reference.summary() if reference else None}
                                 if accepts(writer.write, "reference") else {})
        if any(p.grafts for p in plans) and accepts(writer.write, "population"):
            extra["population"] = [m.summary() for m in by_id.values()]  # the grafts' donors
        todo = [(i, plan) for i, plan in enumerate(plans) if i not in done]
        repairs = self._repairs_due(g, writer, by_id)
        calls: list[Callable[[], Any]] = [
            (lambda plan=plan: self._call("writer", writer.write, brief, base.summary(), plan,
                                          **extra))
            for _, plan in todo
        ] + [
            (lambda failed=failed, parent=parent: self._call(
                "writer", writer.repair, brief, failed.summary(), parent.summary(),
                failed.meta.plan))
            for failed, parent in repairs
        ]
        if not calls:
            return None
        self._remaining()
        if len(calls) > 1 and getattr(writer, "concurrent", False):
            self._stage("write", f"{len(calls)} writer calls at once")
        stops: list[Stop] = []
        failed: list[Stop] = []

        def keeper(save: Callable[[Any, Stop | None], None]) -> Callable[[Outcome], bool]:
            def keep(result: Outcome) -> bool:
                draft, stop = result
                if stop is not None and (stop.code == 0 or not stop.stand_in):
                    stops.append(stop)  # raised once every draft that came back is stored
                    return False
                if stop is not None:
                    failed.append(stop)
                save(draft, stop)
                return True
            return keep

        store = [keeper(lambda d, s, i=i, plan=plan: self._store_plan(
                     g, i, plan, base, design, roles, d, s)) for i, plan in todo]
        store += [keeper(lambda d, s, f=failed, p=parent: self._store_repair(
                      g, f, p, roles, d, s)) for failed, parent in repairs]
        run_calls(calls, store, parallel=bool(getattr(writer, "concurrent", False)))
        if stops:
            raise stops[0]
        if len(failed) == len(calls):
            return failed[0]
        return None

    def _repairs_due(self, g: int, writer: Any,
                     by_id: dict[str, Member]) -> list[tuple[Member, Member]]:
        """(failed, its parent) for the written candidates of generation g-1 that failed when
        they ran and have not been repaired (one repair per candidate; repairs are not
        repaired again)."""
        if not callable(getattr(writer, "repair", None)):
            return []
        handled = {e.data.get("failed") for e in self.pop.events() if e.kind == "repair_done"}
        due = []
        for m in by_id.values():
            parent = by_id.get(m.meta.parents[0]) if m.meta.parents else None
            if (m.meta.generation == g - 1 and m.meta.origin == "writer" and m.status == "failed"
                    and not m.meta.repair_of and m.meta.plan is not None
                    and m.id not in handled and parent is not None):
                due.append((m, parent))
        return due

    def _store_plan(self, g: int, i: int, plan: ExperimentPlan, base: Member, design: Event,
                    roles: Any, draft: Any, stop: Stop | None) -> None:
        design_id = design.data["design_id"]
        if stop is not None:
            self._stage("write", f"plan {i + 1} '{plan.title}' skipped: {stop.reason}")
            self.pop.log("plan_done", g, design_id=design_id, plan_index=i,
                         plan_title=plan.title, outcome="write_failed", error=stop.reason)
            return
        selection = Selection.model_validate(design.data["selection"])
        parents = [base.id] + [r for r in [selection.reference_id] if r and r != base.id]
        added = self.pop.add(
            draft.source, generation=g, origin="writer", parents=parents, selection=selection,
            plan=plan, plan_index=i, explanation=draft.explanation, roles=roles.names(),
        )
        outcome = "duplicate" if added.duplicate else "added"
        note = f"identical to {added.id}, not evaluated again" if added.duplicate else "written"
        self._stage("write", f"{added.id if not added.duplicate else '-'} '{plan.title}': {note}")
        self.pop.log(
            "plan_done", g, design_id=design_id, plan_index=i, outcome=outcome, candidate=added.id
        )

    def _store_repair(self, g: int, failed: Member, parent: Member, roles: Any, draft: Any,
                      stop: Stop | None) -> None:
        if stop is not None:
            self._stage("repair", f"{failed.id} not repaired: {stop.reason}")
            self.pop.log("repair_done", g, failed=failed.id, outcome="write_failed",
                         error=stop.reason)
            return
        added = self.pop.add(
            draft.source, generation=g, origin="writer", parents=list(failed.meta.parents),
            selection=failed.meta.selection, plan=failed.meta.plan, explanation=draft.explanation,
            roles=roles.names(), repair_of=failed.id,
        )
        note = f"identical to {added.id}, not evaluated again" if added.duplicate else "written"
        self._stage("repair", f"{added.id if not added.duplicate else '-'} repairs {failed.id} "
                              f"({parent.id}'s child): {note}")
        self.pop.log("repair_done", g, failed=failed.id,
                     outcome="duplicate" if added.duplicate else "added", candidate=added.id)
