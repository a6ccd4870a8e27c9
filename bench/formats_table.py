"""Summarise --ks-json files of the format runs (bench/formats_device.sh) as one table:
task, candidate, expected verdict, checks passed/failed, benchmarks passed, geomean, first
failure reason. Usage: python bench/formats_table.py OUT/*.json"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def rows(path: Path):
    data = json.loads(path.read_text())
    runs = data if isinstance(data, list) else [data]
    for run in runs:
        for cand in run["candidates"]:
            if cand["name"] == "reference":
                continue
            expect = "wrong" if "wrong" in f"{path.stem}/{cand['name']}" else "correct"
            cases = cand["cases"]
            checks = [c for c in cases if c["kind"] == "check"]
            benches = [c for c in cases if c["kind"] == "bench"]
            passed = sum(c["outcome"] == "passed" for c in checks)
            failed = [c for c in cases if c["outcome"] == "failed"]
            verdict = "fails" if failed else "passes"
            ok = (verdict == "passes") == (expect == "correct")
            bench_ok = sum(c["outcome"] == "passed" for c in benches)
            geo = cand.get("geomean_us")
            reason = failed[0]["reason"][:90] if failed else ""
            yield (run["task"], cand["name"], expect, f"{passed}/{len(checks)}",
                   f"{bench_ok}/{len(benches)}", f"{geo:.1f}" if geo else "-",
                   "ok" if ok else "UNEXPECTED", reason)


def main(paths: list[str]) -> None:
    table = [r for p in sorted(paths) for r in rows(Path(p))]
    head = ("task", "candidate", "expect", "checks", "benches", "geomean_us", "as expected",
            "first failure")
    print("| " + " | ".join(head) + " |")
    print("|" + "---|" * len(head))
    for r in table:
        print("| " + " | ".join(r) + " |")


if __name__ == "__main__":
    main(sys.argv[1:])
