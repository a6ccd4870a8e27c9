"""Every candidate of a session timed in the same rounds per case (issue 31).

Timed one after another, two copies of one kernel read 0.85x-1.25x of each other on a 2-core
CPU and one shape 19.17 vs 17.50 us on the H200: the machine drifts between their turns. So the
bench items of one case run back to back (``order_items``), and the first of them times every
candidate of the case (and the reference) in rounds beside the task's baselines (the partners
of ``baselines.py``); the others take their result from that measurement. The order changes
from round to round (``round_order``: A B C, then C B A, then B C A, A C B, ...) so that every
member takes every place and follows every other member alike: in mirrored rounds alone (A B
C, C B A) the middle member never moves, and on the H200 the middle one of two copies of a
kernel (beside the reference) read 0.92-0.95x the other's speed over four shapes (three split
over K), in each of three runs. Every candidate keeps its own budget and its full verification
sample, so the cost is the same as timing them in turn; the baselines are timed once per case
for all of them.

Each result carries ``fellows``: the speedup over every other member, from the rounds both
were timed in, with its interval; ``score`` pools them into pairwise geomeans.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from pytest_kscientist.errors import CandidateFailure, ReferenceFailed
from pytest_kscientist.formats.task import GPU_ROUNDS, BenchSpec, Case
from pytest_kscientist.harness.baselines import Partner, paired, pool, yardstick_only
from pytest_kscientist.harness.evaluate import PRECISE_AFTER, Evaluator
from pytest_kscientist.harness.results import BaselineTiming, CaseResult
from pytest_kscientist.harness.spawn import Worker


@dataclass
class Member:
    """One candidate (or the reference) timed in the rounds: its name and its live worker for
    a round (``--ks-bench-workers``: the rounds go to its workers in turn)."""

    name: str
    live: Callable[[int], Worker]
    tolerate: bool = False
    # The task's own code (the reference): who it is, for evaluator.bench's floor message.
    trusted: str = ""
    # Called when the member fails in the rounds (its worker may hold a sticky error).
    on_failure: Callable[[CandidateFailure], None] = lambda exc: None


@dataclass
class Outcome:
    """What the rounds gave one member: a result, or the failure that is its verdict."""

    result: CaseResult | None = None
    failure: CandidateFailure | None = None
    # The task's reference raised while the rounds verified an output: nobody was judged.
    reference: ReferenceFailed | None = None


@dataclass
class Lineup:
    """The bench items of a session, by case, and what their shared rounds gave.

    ``planned``: (task spec, case id) -> the nodes (collect.CandidateNode) whose bench item on
    that case is selected, in item order; ``done``: the same key -> name -> Outcome, filled by
    the first item.
    """

    planned: dict[tuple[str, str], list[Any]] = field(default_factory=dict)
    done: dict[tuple[str, str], dict[str, Outcome]] = field(default_factory=dict)

    def plan(self, key: tuple[str, str], node: Any) -> None:
        nodes = self.planned.setdefault(key, [])
        if node not in nodes:
            nodes.append(node)

    def take(self, key: tuple[str, str], name: str) -> Outcome | None:
        """The member's outcome from rounds already timed, handed out once."""
        return self.done.get(key, {}).pop(name, None)


def bench_together(evaluator: Evaluator, members: list[Member], partners: list[Partner],
                   case: Case, device_name: str, budget_s: float,
                   same: Mapping[str, str] | None = None,
                   fewer_workers: Callable[[str], bool] | None = None) -> dict[str, Outcome]:
    """Time every member and partner in rounds (``round_order``); each member's pooled result, its
    speedups over the partners (``baselines``) and over the other members (``fellows``).

    A member's failure is its own verdict and ends its part in the rounds; a partner's costs
    only the speedups over it, with the reason kept. ``same``: member -> the member or kernel
    timed beside (a partner of the candidates' kind) whose code it runs on this case
    (``--ks-same-as``): it is not timed, its rounds are that one's (``timed_as``), and its
    speedup over any kernel running that code is exactly 1; where that one failed in the rounds
    it takes its own rounds after them. ``fewer_workers(case id)``: called when a turn ran out
    of device memory; True when it retired workers of the rounds (--ks-bench-workers), so the
    turn is taken again once, in the kernel's own worker.
    """
    same = _usable(same or {}, members, partners)
    spec = evaluator.task.spec.bench
    rounds = spec.rounds_on(evaluator.device)
    share = budget_s / rounds
    quota = round_quota(spec, rounds)
    case_id = evaluator.task.case_id(case)
    mine: dict[str, list[CaseResult]] = {m.name: [] for m in members}
    theirs: dict[str, list[CaseResult]] = {p.name: [] for p in partners}
    out: dict[str, Outcome] = {}
    failed: dict[str, str] = {}
    order: list[Member | Partner] = [*(m for m in members if m.name not in same), *partners]

    def turn(bench: Callable[[], CaseResult]) -> CaseResult:
        try:
            return bench()
        except (CandidateFailure, ReferenceFailed) as exc:
            # Its device may have been filled by the rounds' own workers (a worker a round,
            # each holding its inputs, outputs and allocator cache): with them gone, again.
            # (ReferenceFailed: the reference judging an output here ran out.)
            if not (exc.out_of_memory and fewer_workers is not None
                    and fewer_workers(case_id)):
                raise
        return bench()

    def time_member(who: Member, r: int) -> None:
        try:
            mine[who.name].append(turn(lambda: evaluator.bench(
                who.live(r), case, device_name, share, tolerate=who.tolerate,
                trusted=who.trusted, **quota)))
        except CandidateFailure as exc:
            who.on_failure(exc)
            out[who.name] = Outcome(failure=exc)

    def time_partner(who: Partner, r: int) -> None:
        try:
            # A baseline is trusted code: one verified output per round is enough to report
            # its precision (each verified output of a large shape costs a transfer and a
            # judge); candidates keep the task's full sample.
            theirs[who.name].append(turn(lambda: evaluator.bench(
                who.live(r), case, device_name, share, tolerate=who.tolerate,
                trusted=f"baseline '{who.name}'",
                **(quota if who.full_sample else {**quota, "samples": 1}))))
        except CandidateFailure as exc:
            who.failed(case_id, exc)
            failed[who.name] = f"baseline '{who.name}' failed on {case_id}: {exc.reason}"

    for r in range(rounds):
        for who in (order[i] for i in round_order(len(order), r)):
            if who.name in failed or who.name in out:
                continue
            if isinstance(who, Member):
                time_member(who, r)
            else:
                time_partner(who, r)
    # Those whose code failed in the rounds take their own turns after them.
    lost = [m for m in members if m.name in same and (same[m.name] in out
                                                      or same[m.name] in failed)]
    for r in range(rounds):
        for who in lost:
            if who.name not in out:
                time_member(who, r)
    for who in lost:
        del same[who.name]
    for name, target in same.items():
        mine[name] = mine[target] if target in mine else theirs[target]
    timed = [m for m in members if m.name not in out]
    for m in timed:
        # its own maps: a member not timed shares its rounds (and their first result) with another
        result = pool(mine[m.name]).model_copy(update={"baselines": {}, "fellows": {}})
        for p in partners:
            result.baselines[p.name] = (
                BaselineTiming(reason=failed[p.name]) if p.name in failed
                else paired(mine[m.name], [yardstick_only(p.name, r) for r in theirs[p.name]]))
        for other in members:
            if other.name == m.name:
                continue
            result.fellows[other.name] = (
                paired(mine[m.name], mine[other.name]) if other in timed
                else BaselineTiming(reason=f"'{other.name}' failed on {case_id}: "
                                           f"{_reason(out[other.name])}"))
        out[m.name] = Outcome(result=result)
    _one_code(same, out)
    return out


def _usable(same: Mapping[str, str], members: list[Member],
            partners: list[Partner]) -> dict[str, str]:
    """The entries of ``same`` this case can honour: a member's, naming another member or a
    kernel timed beside as the candidates' kind, that is not itself standing in."""
    names = {m.name for m in members}
    kernels = names | {p.name for p in partners if p.full_sample}
    return {k: v for k, v in same.items()
            if k in names and v in kernels and v != k and v not in same}


def _one_code(same: Mapping[str, str], out: dict[str, Outcome]) -> None:
    """Mark the members not timed (``timed_as``) and make every speedup between two kernels
    that run one code here exactly 1."""
    code = {name: same.get(name, name) for name in out}
    for name, outcome in out.items():
        result = outcome.result
        if result is None:
            continue
        if name in same:
            result.timed_as = same[name]
        for timings in (result.fellows, result.baselines):
            for other, timing in timings.items():
                if code.get(other, other) == code[name] and timing.speedup is not None:
                    timings[other] = timing.model_copy(update={
                        "speedup": 1.0, "speedup_low": 1.0, "speedup_high": 1.0,
                        "round_speedups": [1.0] * len(timing.round_speedups)})


# The rounds a task's per-round minimums are written for (``BenchSpec.rounds_on``, a GPU's).
SPREAD_FROM = GPU_ROUNDS


def spread(per_round: int, rounds: int) -> int:
    """A round's share of ``per_round`` (a warm-up count, ``min_runs``, ``verify_samples``)
    when a case has ``rounds`` rounds: as given up to SPREAD_FROM rounds; past them the
    SPREAD_FROM rounds' total spread over all, rounded down (at least one where the task asks
    for any). Sixteen rounds read two copies of a kernel within 5% more often than four on
    the 2-core CPU (notes/timing.md, section 4), but while every round took the whole
    minimum they cost about twice the time (16 s a run against 8-11 s)."""
    if rounds <= SPREAD_FROM or per_round <= 0:
        return per_round
    return max(1, per_round * SPREAD_FROM // rounds)


def round_quota(spec: BenchSpec, rounds: int) -> dict[str, int]:
    """A round's warm-up calls, least calls, verified outputs (``spread``) and the fewest calls
    after which a precise median ends it, as ``Evaluator.bench`` takes them."""
    warmup, least, samples = (spread(n, rounds)
                              for n in (spec.warmup, spec.min_runs, spec.verify_samples))
    # Rounds are pooled: each may stop on a precise median after its share of the calls
    # (a generation of 3 took 86-93 s on the H200 when every round waited for 20), and never
    # on one call (whose range is nothing); a kernel that spends its round's budget on fewer
    # stops at ``least``.
    return {"warmup": warmup, "min_runs": least, "samples": samples,
            "precise_after": max(least, -(-PRECISE_AFTER // rounds), 2)}


def round_order(n: int, r: int) -> list[int]:
    """The order of ``n`` members in round ``r``: a Williams design (each of ``2n`` rounds a
    permutation, where every member takes every place twice and directly follows every other
    member equally often), its rounds taken as base, mirror, next base, next mirror, ... so
    that the first two rounds are the mirrored pair and four rounds already give every member
    the same mean place."""
    base = [0]
    low, high = 1, n - 1
    while len(base) < n:
        base.append(low)
        low += 1
        if len(base) < n:
            base.append(high)
            high -= 1
    seq = [(x + (r // 2)) % n for x in base]
    return seq if r % 2 == 0 else seq[::-1]


def _reason(outcome: Outcome) -> str:
    return outcome.failure.reason if outcome.failure else "no result"


def order_items(items: list[Any], is_bench: Callable[[Any], Any],
                is_after: Callable[[Any], bool]) -> list[Any]:
    """Items reordered so that the bench items of one case run back to back, after every
    check (so a candidate that failed one is left out of the rounds), and the items that read
    benchmark results (gates) after them; otherwise the collection order is kept.

    ``is_bench(item)``: the item's case key when it is a bench item, else None.
    """
    first: list[Any] = []
    by_case: dict[Any, list[Any]] = {}
    last: list[Any] = []
    for item in items:
        key = is_bench(item)
        if key is not None:
            by_case.setdefault(key, []).append(item)
        elif is_after(item):
            last.append(item)
        else:
            first.append(item)
    return [*first, *(i for group in by_case.values() for i in group), *last]
