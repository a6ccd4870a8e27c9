"""What became of the load_inline calls of every run under a folder (a population, or
--ks-json files): one line per call, from each record's ``inline_builds`` (schema 10).

    python3 bench/inline_builds.py POPULATION_OR_FOLDER

Prints the candidate, the module, built / reused / failed / declined (and why), and the
seconds its load waited for the answer; then a count per outcome. Read by device call 0
(``KS_PART=owed bash bench/device_timing.sh``): generation 1's CUDA children of an
``--evolve 1`` should read ``reused`` (their parent's build from generation 0).
"""

from __future__ import annotations

import argparse
import collections
import json
from pathlib import Path
from typing import Any


def calls(node: Any, name: str = "?") -> list[tuple[str, dict[str, Any]]]:
    """(candidate name, call) for every inline_builds entry anywhere in ``node``."""
    found: list[tuple[str, dict[str, Any]]] = []
    if isinstance(node, dict):
        name = str(node.get("name", name))
        for entry in node.get("inline_builds") or []:
            if isinstance(entry, dict):
                found.append((name, entry))
        for key, value in node.items():
            if key != "inline_builds":
                found += calls(value, name)
    elif isinstance(node, list):
        for value in node:
            found += calls(value, name)
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("folder", type=Path)
    args = parser.parse_args()
    counts: collections.Counter[str] = collections.Counter()
    for path in sorted(args.folder.rglob("*.json")):
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        for name, call in calls(data):
            counts[call.get("outcome", "?")] += 1
            why = f" ({call['why']})" if call.get("why") else ""
            print(f"{path.relative_to(args.folder)}  {name}  {call.get('module')}  "
                  f"{call.get('outcome')}{why}  {call.get('seconds', 0.0):.2f} s")
    print("load_inline calls: " + (", ".join(f"{k} {v}" for k, v in sorted(counts.items()))
                                   or "none found"))


if __name__ == "__main__":
    main()
