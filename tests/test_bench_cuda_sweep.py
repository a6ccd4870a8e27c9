"""bench/cuda_sweep.py's patched builds of the CUDA seed (no GPU needed): every probe and
variant applies to the seed as committed (or to the file --seed gives), and the seed's
turn-taking and each turn variant's, run on a model of the named barriers and the ring of
stages, neither deadlock nor let an arrival complete a barrier alone."""

from __future__ import annotations

import random
import re
import subprocess
import sys

import pytest
from helpers import REPO, fixup_text, load_file


def _module():
    return load_file(REPO / "bench" / "cuda_sweep.py", "cuda_sweep")


def test_every_probe_and_variant_applies_under_its_own_build_name(tmp_path) -> None:
    sweep = _module()
    for name in [*sweep.PROBES, *sweep.VARIANTS]:
        source = sweep.probe_file(name, tmp_path).read_text()
        assert f'name="ks_{name}' in source and 'name="ks_cuda_wgmma' not in source


def test_the_control_is_the_seed_under_another_build_name(tmp_path) -> None:
    """`control` times the seed's own kernels as a variant is timed (built apart, measured in
    its row's turn): all that may differ from the seed is the build's name."""
    sweep = _module()
    control = sweep.probe_file("control", tmp_path).read_text()
    assert control == sweep.CUDA_SEED.read_text().replace('name="ks_cuda_wgmma',
                                                          'name="ks_control')


def test_the_pads_add_only_nanosleeps_where_the_ring_is_set_up(tmp_path) -> None:
    """pad48, pad80 and pad128 are the seed plus 3, 5 and 8 `nanosleep 0` after the barriers'
    init fence (thread 0, once a CTA), so they move the K loop in the code and nothing else;
    a_ahead_pad is a_ahead plus 5 of them."""
    sweep = _module()
    seed = sweep.CUDA_SEED.read_text()
    sleep = sweep.PAD_LINE
    assert "nanosleep.u32 0;" in sleep
    for name, n in (("pad48", 3), ("pad80", 5), ("pad128", 8)):
        source = sweep.probe_file(name, tmp_path).read_text()
        assert source.count(sleep) == n and sleep not in seed
        assert source.replace(sleep, "") == seed.replace('name="ks_cuda_wgmma',
                                                         f'name="ks_{name}')
        fence = source.index(sweep.PAD_AFTER) + len(sweep.PAD_AFTER)
        assert source[fence:fence + n * len(sleep)] == sleep * n
    ahead = sweep.probe_file("a_ahead", tmp_path).read_text()
    padded = sweep.probe_file("a_ahead_pad", tmp_path).read_text()
    assert padded.replace(sleep, "") == ahead.replace('name="ks_a_ahead', 'name="ks_a_ahead_pad')
    assert padded.count(sleep) == 5


def test_fence_once_fences_in_thread_0_alone_around_its_count(tmp_path) -> None:
    """fence_once: the seed's fixup fences in every thread after its stores and before its
    reads; the variant leaves one fence before thread 0's count and one after it, both inside
    thread 0's block, and keeps the barriers that order the other threads around them."""
    sweep = _module()
    seed = fixup_text(sweep.CUDA_SEED.read_text())
    once = fixup_text(sweep.probe_file("fence_once", tmp_path).read_text())
    assert seed.count("__threadfence();") == 2 and once.count("__threadfence();") == 2
    thread_0 = once[once.index("    if (t == 0) {\n"):]
    thread_0 = thread_0[:thread_0.index("\n    }\n")]
    assert thread_0.count("__threadfence();") == 2
    fence, count, fence_after = (thread_0.index("__threadfence();"),
                                 thread_0.index("atomicAdd(count, 1)"),
                                 thread_0.rindex("__threadfence();"))
    assert fence < count < fence_after
    assert once.count("named_sync(1 + half, 128);") == seed.count("named_sync(1 + half, 128);")
    stores, count_at = once.index("__stcg(mine"), once.index("if (t == 0) {")
    assert "named_sync(1 + half, 128);" in once[stores:count_at]


def test_the_fixup_probes_take_away_only_their_part(tmp_path) -> None:
    """probe_fixup_free returns before storing anything, probe_fixup_no_store keeps the count
    and the reads but neither stores nor fences first, probe_fixup_no_read keeps the stores and
    the count but the last CTA adds its own part only (`add` returns at once)."""
    sweep = _module()
    seed = fixup_text(sweep.CUDA_SEED.read_text())
    free = fixup_text(sweep.probe_file("probe_fixup_free", tmp_path).read_text())
    assert free.index("if (true) return true;") < free.index("__stcg(")
    no_store = fixup_text(sweep.probe_file("probe_fixup_no_store", tmp_path).read_text())
    assert "if (false) __stcg(" in no_store and "atomicAdd(count, 1)" in no_store
    assert no_store.count("__threadfence();") == seed.count("__threadfence();") - 1
    assert no_store.index("__threadfence();") > no_store.index("atomicAdd(count, 1)")
    no_read = fixup_text(sweep.probe_file("probe_fixup_no_read", tmp_path).read_text())
    skip = no_read.index("return;\n        const long first_of")
    assert no_read.index("const auto add = [&](int cta,") < skip < no_read.index("__ldcg(")
    assert no_read.replace("        return;\n        const long first_of",
                           "        const long first_of") == seed


def test_reading_the_variants_needs_no_plugin() -> None:
    """bench/variants_device.sh checks the names against VARIANTS before the device's wheels
    are installed: importing cuda_sweep must not import the plugin (pydantic; the first device
    run of the script stopped there)."""
    code = ("import sys; sys.path.insert(0, 'bench'); import cuda_sweep; "
            "print(sorted(m for m in sys.modules if m.startswith('pytest_kscientist')))")
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True,
                          text=True, timeout=120, check=True)
    assert proc.stdout.strip() == "[]", proc.stdout


def test_a_seed_without_a_patchs_text_is_named(tmp_path, monkeypatch) -> None:
    sweep = _module()
    monkeypatch.setitem(sweep.VARIANTS, "broken", [("no such line\n", "")])
    with pytest.raises(SystemExit, match="0 copies of 'no such line"):
        sweep.probe_file("broken", tmp_path)


def _c_to_python(expr: str) -> str:
    """A C condition or integer expression of the seed's turn code as Python (ternaries,
    && and ||, integer division, the segment's bounds by their model names)."""
    expr = re.sub(r"\((\w+ == \d) \? (.+?) : (.+?)\)", r"((\2) if \1 else (\3))", expr)
    expr = expr.replace("&&", " and ").replace("||", " or ").replace(" / ", " // ")
    return expr.replace("g.kb0", "kb0").replace("g.kb1", "kb1")


def _condition(lines: list[str], comment: str):
    """The C condition of the first turn line before `comment` in `lines` (a variant's new
    lines, then the seed's), with the integers the lines define (`const int run = ...;`), as a
    Python function of half, kb, kb0, kb1 and the ring's stages."""
    text = next(line for line in lines if comment in line)
    head = text[:text.index(comment)]
    statement = head[head.rindex("if ("):]
    cond = _c_to_python(re.match(r"if \((.+)\)\s*named_", statement, re.S).group(1))
    defined = [(name, _c_to_python(value)) for line in lines
               for name, value in re.findall(r"const int (run|in_run) = (.+?);", line)]

    def holds(half: int, kb: int, kb0: int, kb1: int, stages: int) -> bool:
        scope = dict(pingpong=1, half=half, kb=kb, kb0=kb0, kb1=kb1, stages=stages, max=max)
        for name, value in defined:
            scope[name] = eval(value, {}, scope)
        return bool(eval(cond, {}, scope))
    return holds


def _turns(name: str | None, tmp_path):
    """(waits, arrives, first_turn) of the seed's turn-taking (name None) or a variant's; the
    first turn is given ahead (and taken back at the end) where the patched text keeps those
    lines."""
    sweep = _module()
    seed = sweep.CUDA_SEED.read_text()
    source = seed if name is None else sweep.probe_file(name, tmp_path).read_text()
    lines = [] if name is None else [new for _, new in sweep.VARIANTS[name]]
    turn_lines = [*lines, source]
    return (_condition(turn_lines, "// my turn"), _condition(turn_lines, "// the other's turn"),
            "named_arrive(3, 256);  // the first turn" in source)


def schedule(waits, arrives, first_turn: bool, segments: list[int], stages: int,
             rng: random.Random) -> None:
    """Both consumer warpgroups and the producer of one CTA as the seed runs them, their steps
    in a random order. Per K step j a consumer waits for stage j to be full (at a segment's
    first step; a later step's stage was waited for under the step before), waits for its turn
    (named barrier 3 + half) where `waits` holds, issues, gives the turn (arrives on 4 - half)
    where `arrives` holds, waits for stage j + 1 to be full if the segment goes on, and gives
    stage j back. The producer puts step j into the ring once both consumers gave back step
    j - stages. A barrier's phase completes once both consumers are in it. Fails on a deadlock,
    and on an arrival by a consumer already in the pending phase (it would complete the phase
    without the other: 256 arrivals from one side's 128 threads twice)."""
    steps = [(kb, 0, n) for n in segments for kb in range(n)]
    given_back: list[set[int]] = [set() for _ in steps]
    filled = 0  # steps the producer has put into the ring
    pending: dict[int, set[int]] = {3: set(), 4: set()}  # barrier -> consumers in its phase
    waiting: dict[int, int | None] = {0: None, 1: None}  # consumer -> barrier it waits on
    pc, stage = {0: 0, 1: 0}, {0: "full", 1: "full"}

    def join(h: int, bar: int, wait: bool) -> None:
        assert h not in pending[bar], f"{h} is in barrier {bar}'s phase twice: {segments}"
        pending[bar].add(h)
        if wait:
            waiting[h] = bar
        if pending[bar] == {0, 1}:  # the phase completes: its waiter goes on
            pending[bar] = set()
            for c in (0, 1):
                if waiting[c] == bar:
                    waiting[c] = None

    def blocked(h: int) -> bool:
        if pc[h] == len(steps) or waiting[h] is not None:
            return True
        j = pc[h]
        kb, _, kb1 = steps[j]
        return ((stage[h] == "full" and kb == 0 and filled <= j)
                or (stage[h] == "next" and kb + 1 < kb1 and filled <= j + 1))

    if first_turn:  # half 1 gives the first turn to half 0
        join(1, 3, wait=False)
    while pc[0] < len(steps) or pc[1] < len(steps):
        can_fill = filled < len(steps) and (
            filled < stages or given_back[filled - stages] == {0, 1})
        ready: list[int | str] = [h for h in (0, 1) if not blocked(h)]
        ready += ["producer"] if can_fill else []
        assert ready, (f"deadlock: consumers at steps {pc} ({stage}), waiting on {waiting}, "
                       f"{filled} steps filled, segments {segments} on {stages} stages")
        who = rng.choice(ready)
        if who == "producer":
            filled += 1
            continue
        h = int(who)
        j = pc[h]
        kb, kb0, kb1 = steps[j]
        if stage[h] == "full":
            stage[h] = "give"
            if waits(h, kb, kb0, kb1, stages):
                join(h, 3 + h, wait=True)
        elif stage[h] == "give":
            stage[h] = "next"
            if arrives(h, kb, kb0, kb1, stages):
                join(h, 4 - h, wait=False)
        else:  # past "next": the step's stage goes back
            given_back[j].add(h)
            pc[h], stage[h] = j + 1, "full"
    if first_turn:  # half 0 takes the last turn half 1 gave
        join(0, 3, wait=True)
    assert pending == {3: set(), 4: set()} and waiting == {0: None, 1: None}, (segments, pending)


SEGMENTS = [[2] * 5, [1, 3, 1, 4], [56], [3, 2, 2, 7, 1], [12, 12], [4, 4, 4]]


@pytest.mark.parametrize("name", [None, "turns_lapse", "turns_runs"])
@pytest.mark.parametrize("stages", [2, 3, 4, 6])
def test_the_seeds_turns_and_each_variants_neither_deadlock_nor_fill_a_barrier_alone(
        name, stages, tmp_path) -> None:
    """The seed's turn-taking and each turn variant's, read from their C text, run to the end
    on rings of the stage counts the seed builds (BLOCK_N 128: 2-4, BLOCK_N 64: 4-6) with
    segments short and long, in 30 random orders each."""
    waits, arrives, first = _turns(name, tmp_path)
    for segments in SEGMENTS:
        for seed in range(30):
            schedule(waits, arrives, first, segments, stages, random.Random(seed))


def test_turns_runs_reads_as_runs_of_half_the_ring(tmp_path) -> None:
    """What the model runs for turns_runs is what the variant says: on four stages a turn
    starts every second step of a segment and ends at a run's last step or the segment's."""
    waits, arrives, _ = _turns("turns_runs", tmp_path)
    assert [waits(0, kb, 0, 5, 4) for kb in range(5)] == [True, False, True, False, True]
    assert [arrives(1, kb, 0, 5, 4) for kb in range(5)] == [False, True, False, True, True]
    seed_waits, seed_arrives, first = _turns(None, tmp_path)
    assert first and all(seed_waits(0, kb, 0, 3, 4) and seed_arrives(1, kb, 0, 3, 4)
                         for kb in range(3))


def test_a_turn_a_whole_tile_long_deadlocks_where_the_tile_outlasts_the_ring() -> None:
    """The first form of turns_runs, a turn a whole segment long, hung on an H100 at the first
    long-K shape: the model finds that, and passes it where every segment fits in half the
    ring."""
    def waits(half, kb, kb0, kb1, stages):
        return kb == kb0

    def arrives(half, kb, kb0, kb1, stages):
        return kb + 1 == kb1

    with pytest.raises(AssertionError, match="deadlock"):
        schedule(waits, arrives, True, [56], 4, random.Random(0))
    for seed in range(30):
        schedule(waits, arrives, True, [2, 2, 1, 2], 4, random.Random(seed))


def test_shapes_and_one_knob_point_as_the_profile_and_timeline_scripts_read_them() -> None:
    sweep = _module()
    cases = sweep.benchmark_cases(["m6144-n7168-k256", "m1024-n512-k7168"])
    assert [(c["m"], c["n"], c["k"]) for c in cases.values()] == [(6144, 7168, 256),
                                                                    (1024, 512, 7168)]
    with pytest.raises(SystemExit, match=r"\['m1-n2-k3'\]: not benchmark shapes"):
        sweep.benchmark_cases(["m1-n2-k3"])
    space = {"STREAM_K": [0, 1, 2], "PINGPONG": [0, 1]}
    assert sweep.one_point([], space) == {}
    assert sweep.one_point(["STREAM_K=0", "PINGPONG=1"], space) == {"STREAM_K": 0, "PINGPONG": 1}
    with pytest.raises(SystemExit, match="one value a knob"):
        sweep.one_point(["STREAM_K=0,1"], space)


def test_a_seed_given_in_the_seeds_place_is_what_probes_and_variants_patch(tmp_path) -> None:
    """--seed: the grid, probes and variants apply to the given file, and a file that is not
    there is named before anything is compiled."""
    sweep = _module()
    variant = tmp_path / "variant.py"
    variant.write_text(sweep.CUDA_SEED.read_text() + "\n# the variant's own line\n")
    sweep.use_seed(variant)
    for name in ["probe_half_b", "turns_runs"]:
        assert "# the variant's own line" in sweep.probe_file(name, tmp_path).read_text()
    proc = subprocess.run([sys.executable, "bench/cuda_sweep.py", str(tmp_path / "o.json"),
                           "--seed", str(tmp_path / "gone.py")], cwd=REPO, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 2 and "--seed" in proc.stderr and "gone.py: no such file" in (
        proc.stderr), proc.stderr
    assert "compiled" not in proc.stdout


def test_a_ahead_loads_nothing_the_upcast_writes_before_the_wait(tmp_path) -> None:
    """The a_ahead variant: before the producer thread's griddepcontrol.wait it loads only A and
    A's scales (task inputs), never B's fp16 copy or its scale slots (the upcast's writes), and
    every other thread still waits at the top."""
    source = _module().probe_file("a_ahead", tmp_path).read_text()
    producer = source[source.index("        if (threadIdx.x == 0) {\n            int ahead"):]
    before_wait = producer[:producer.index('asm volatile("griddepcontrol.wait;"')]
    assert "&map_a" in before_wait and "as + kb * lds" in before_wait
    assert "&map_b" not in before_wait and "bsq" not in before_wait
    assert 'if (threadIdx.x != 0) asm volatile("griddepcontrol.wait;"' in source
