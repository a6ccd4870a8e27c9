"""The population store: ids, dedupe, records, events, corrupt records, concurrent writers."""

from __future__ import annotations

import json
import multiprocessing
from pathlib import Path

import pytest

from pytest_kscientist.evolve.population import (
    SCHEMA_VERSION,
    EvaluationRecord,
    Population,
    PopulationError,
    PopulationWarning,
    now,
    source_sha,
)
from pytest_kscientist.harness.files import atomic_target

SRC = "def custom_kernel(data):\n    return data\n"


def _record(cid: str, geomean: float | None = 10.0) -> EvaluationRecord:
    return EvaluationRecord(
        id=cid,
        evaluated_at=now(),
        status="passed" if geomean else "failed",
        geomean_us=geomean,
        bench_median_us={"b1": geomean or 0.0},
        failure="" if geomean else "check n16-s1: mismatch",
    )


def test_ids_are_sequential_and_the_source_is_named_by_id(tmp_path: Path) -> None:
    pop = Population(tmp_path / "toy", "toy")
    first = pop.add(SRC, generation=0, origin="seed", seed_file="a.py")
    second = pop.add(SRC + "# v2\nX = 2\n", generation=1, origin="writer", parents=[first.id])
    assert (first.id, second.id) == ("c0001", "c0002")
    assert pop.source_path("c0002").read_text().endswith("X = 2\n")
    members = pop.members()
    assert [m.meta.parents for m in members] == [[], ["c0001"]]
    assert [m.status for m in members] == ["pending", "pending"]
    meta = json.loads((tmp_path / "toy" / "c0002" / "meta.json").read_text())
    assert meta["schema_version"] == SCHEMA_VERSION and meta["sha256"] == source_sha(SRC + "X = 2")


def test_identical_code_is_stored_once(tmp_path: Path) -> None:
    pop = Population(tmp_path / "toy", "toy")
    pop.add(SRC, generation=0, origin="seed")
    reformatted = "# a comment\ndef custom_kernel( data ):\n\n    return data  # same code\n"
    again = pop.add(reformatted, generation=1, origin="writer")
    assert again.duplicate and again.id == "c0001"
    assert pop.ids() == ["c0001"]


def test_records_give_status_and_summary(tmp_path: Path) -> None:
    pop = Population(tmp_path / "toy", "toy")
    a = pop.add(SRC, generation=0, origin="seed").id
    b = pop.add(SRC + "Y = 1\n", generation=0, origin="seed").id
    pop.record(_record(a, 12.5))
    pop.record(_record(b, None))
    by_id = {m.id: m for m in pop.members()}
    assert by_id[a].summary().geomean_us == 12.5
    assert by_id[b].summary().status == "failed"
    assert "mismatch" in by_id[b].summary().failure
    with pytest.raises(PopulationError, match="c0099 is not in"):
        pop.record(_record("c0099"))


@pytest.mark.parametrize(
    ("name", "text", "why"),
    [
        ("meta.json", "{not json", "JSONDecodeError"),
        ("meta.json", '{"id": "c0001"}', "ValidationError"),
        ("meta.json", json.dumps({"schema_version": SCHEMA_VERSION + 1}), "is newer"),
        ("results.json", "[1, 2", "JSONDecodeError"),
    ],
)
def test_corrupt_record_warns_and_is_skipped(
    tmp_path: Path, name: str, text: str, why: str
) -> None:
    pop = Population(tmp_path / "toy", "toy")
    a = pop.add(SRC, generation=0, origin="seed").id
    b = pop.add(SRC + "Y = 1\n", generation=0, origin="seed").id
    pop.record(_record(a))
    pop.record(_record(b))
    (tmp_path / "toy" / a / name).write_text(text)
    with pytest.warns(PopulationWarning, match=why):
        members = {m.id: m for m in pop.members()}
    assert members[b].status == "passed"
    if name == "meta.json":
        assert a not in members
    else:
        assert members[a].status == "pending"  # its results are unreadable: evaluate again
    assert len(pop.skipped) == 1 and a in pop.skipped[0]


def test_torn_event_line_warns_and_later_appends_stay_readable(tmp_path: Path) -> None:
    pop = Population(tmp_path / "toy", "toy")
    pop.log("first", 0, n=1)
    with open(tmp_path / "toy" / "events.jsonl", "ab") as f:
        f.write(b'{"kind": "torn", "at": "x", "da')  # a writer killed mid-line
    pop.log("second", 1)
    with pytest.warns(PopulationWarning, match="line 2"):
        events = pop.events()
    assert [e.kind for e in events] == ["first", "second"]
    assert events[0].data == {"n": 1}


def test_population_folder_that_is_a_file_is_refused(tmp_path: Path) -> None:
    (tmp_path / "toy").write_text("")
    with pytest.raises(PopulationError, match="is a file"):
        Population(tmp_path / "toy", "toy")


def test_a_population_of_another_task_is_refused(tmp_path: Path) -> None:
    """An fp8_gemm population copied under axpy's name was evolved as axpy's: its kernels became
    axpy's parents, every child failed, and an fp8 kernel was named axpy's best."""
    Population(tmp_path / "fp8_gemm", "fp8_gemm").add(SRC, generation=0, origin="seed",
                                                       seed_file="a.py")
    (tmp_path / "fp8_gemm").rename(tmp_path / "axpy")
    with pytest.raises(PopulationError, match=r"holds candidates of task 'fp8_gemm' \(c0001\), "
                                              r"not of 'axpy'; point --ks-population"):
        Population(tmp_path / "axpy", "axpy")
    assert Population(tmp_path / "axpy", "fp8_gemm").ids() == ["c0001"]


def test_leftover_temp_folder_of_a_killed_writer_is_ignored_then_swept(tmp_path: Path) -> None:
    pop = Population(tmp_path / "toy", "toy")
    (tmp_path / "toy" / ".new-c0001-dead").mkdir()
    assert pop.members() == []
    assert pop.add(SRC, generation=0, origin="seed").id == "c0001"
    assert not list((tmp_path / "toy").glob(".new-*"))


def _writer(root: str, worker: int, n: int) -> None:
    pop = Population(Path(root), "toy")
    for i in range(n):
        added = pop.add(f"{SRC}W = {worker}\nI = {i}\n", generation=i, origin="writer")
        pop.record(_record(added.id, float(worker * 100 + i + 1)))
        pop.log("wrote", i, worker=worker, candidate=added.id)
        shared = pop.add(f"{SRC}SHARED = {i}\n", generation=i, origin="writer")
        pop.log("shared", i, worker=worker, candidate=shared.id, duplicate=shared.duplicate)


def test_concurrent_processes_lose_and_corrupt_nothing(tmp_path: Path) -> None:
    workers, n = 4, 6
    root = tmp_path / "toy"
    ctx = multiprocessing.get_context("spawn")
    procs = [ctx.Process(target=_writer, args=(str(root), w, n)) for w in range(workers)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
    assert [p.exitcode for p in procs] == [0] * workers
    pop = Population(root, "toy")
    members = pop.members()
    events = pop.events()
    assert pop.skipped == []
    ids = [m.id for m in members]
    assert ids == [f"c{i:04d}" for i in range(1, workers * n + n + 1)]  # no gap, no reuse
    own = [m for m in members if "W = " in m.source]
    assert len(own) == workers * n and all(m.status == "passed" for m in own)
    assert len({m.meta.sha256 for m in members}) == len(members)
    assert len([e for e in events if e.kind == "wrote"]) == workers * n
    shared = [e for e in events if e.kind == "shared"]
    assert len(shared) == workers * n
    for i in range(n):  # each shared source stored once, every worker saw the same id
        ids_i = {e.data["candidate"] for e in shared if e.generation == i}
        assert len(ids_i) == 1
        assert sum(not e.data["duplicate"] for e in shared if e.generation == i) == 1
    assert not list(root.glob(".*.tmp")) and not list(root.glob(".new-*"))


def test_two_runs_writing_one_document_at_once_both_succeed(tmp_path: Path) -> None:
    """Two ``--evolve`` runs on one population finish together: each writes lineage.md and
    progress.png. Overlapping writes must each land (last one wins), never rename the other's
    temp file away; a write that fails keeps the previous document."""
    path = tmp_path / "progress.png"
    with atomic_target(path, suffix=".tmp.png") as first:
        with atomic_target(path, suffix=".tmp.png") as second:
            assert first != second and first.name.endswith(".tmp.png")
            first.write_bytes(b"run A")
            second.write_bytes(b"run B")
        assert path.read_bytes() == b"run B"
    assert path.read_bytes() == b"run A"
    with pytest.raises(RuntimeError), atomic_target(path) as tmp:
        tmp.write_bytes(b"half")
        raise RuntimeError("savefig failed")
    assert path.read_bytes() == b"run A"
    assert [p.name for p in tmp_path.iterdir()] == ["progress.png"]
