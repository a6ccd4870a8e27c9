"""The fused seed with a sweep's knobs: its best point, and per class of shapes the points that
win there (the offline scientist's composition, evolve/compose.py).

    python bench/sweep_seed.py SWEEP.json OUT.py

SWEEP.json is bench/fused_sweep.py's output. ``TUNABLES`` becomes the point with the lowest
geomean over the benchmarks; ``TUNABLES_BY_SHAPE`` the rules ``compose`` finds among the
passing fused points (classes that gain at least 3% over their sweep times; none: no rules).
The plain loop's times choose, so the harness must still judge OUT.py: bench/device_timing.sh
(KS_PART=sweep) runs it in the harness beside the seed, both cuBLAS baselines and the
reference right after the sweep.
Prints what it chose.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import tomllib

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
TASK = ROOT / "tasks" / "fp8_gemm"
SEED = TASK / "seeds" / "triton_fused.py"

from pytest_kscientist.api import (  # noqa: E402  (after the path)
    Point,
    compose,
    geomean,
    read_tunables,
    rewrite_tunables,
)


def cases() -> dict[str, dict[str, int]]:
    """Benchmark label (fused_sweep.py's ``m..-n..-k..``) -> its shape."""
    spec = tomllib.loads((TASK / "task.toml").read_text())
    shapes = spec["profiles"]["full"]["benchmarks"]
    return {f"m{c['m']}-n{c['n']}-k{c['k']}": {"m": c["m"], "n": c["n"], "k": c["k"]}
            for c in shapes}


def fused_points(sweep: dict, defaults: dict) -> list[Point]:
    """The sweep's fused points that passed on every shape ("seed" is the other family)."""
    return [Point(name, row.get("knobs") or {**defaults, **row["changes"]}, row["us"])
            for name, row in sweep.items()
            if not name.startswith("_") and name != "seed" and not row["failed"]]


def swept_source(sweep: dict, source: str) -> tuple[str, list[str]]:
    """``source`` with the sweep's knobs, and lines saying what was chosen."""
    defaults = read_tunables(source)
    swept = sweep.get("_env", {}).get("fused_defaults")  # older sweeps: changes to these
    if swept and swept != defaults:
        raise SystemExit("the sweep ran from other defaults than this seed's TUNABLES: "
                         f"{swept} != {defaults}; sweep again from this seed")
    shapes = cases()
    points = [p for p in fused_points(sweep, defaults) if set(shapes) <= set(p.times)]
    if not points:
        raise SystemExit("no fused point of the sweep passed on every benchmark")

    mean = {p.id: geomean([p.times[b] for b in shapes]) for p in points}
    best = min(points, key=lambda p: mean[p.id])
    comp = compose(points, shapes, ["m", "n", "k"], list(shapes), best.knobs)
    if comp is None:
        return rewrite_tunables(source, best.knobs, []), [
            f"TUNABLES: {best.id} ({mean[best.id]:.1f} us geomean in the sweep)",
            "no class gains 3%: no rules"]
    rules = comp.rules()
    composed = geomean([c.point.times[b] for c in (comp.default, *comp.ruled) for b in c.benches])
    said = [f"TUNABLES: {comp.default.point.id}; classes: {comp.text()}",
            f"composed {composed:.1f} us against the best single point's {mean[best.id]:.1f} "
            f"({best.id}) in the sweep"]
    by_shape = [r.model_dump(exclude={"note"}) for r in rules]
    out = rewrite_tunables(source, comp.default.point.knobs, by_shape, [r.note for r in rules])
    return out, said


def main(argv: list[str]) -> None:
    if len(argv) != 2:
        raise SystemExit(__doc__)
    sweep = json.loads(Path(argv[0]).read_text())
    out, said = swept_source(sweep, SEED.read_text())
    Path(argv[1]).write_text(out)
    print("\n".join(said))


if __name__ == "__main__":
    main(sys.argv[1:])
