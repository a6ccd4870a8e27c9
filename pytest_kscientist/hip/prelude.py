"""load_inline's prelude (torch's and HIP's headers) precompiled once per target and flags.

Parsing ``<torch/types.h>`` and ``<hip/hip_runtime.h>`` is most of a HIP compile item's time:
on the 2-core CPU a ten-line kernel took 10.1 s to compile and the HIP seed 12.8 s; with the
prelude precompiled (9.8 s, once) they took 2.0 and 2.2 s (clang 22, gfx942). The precompiled
header (clang's PCH, built by the driver with ``-S -Xclang -emit-pch`` for the target's device
side) is kept beside the compile results (``harness/compiles.py``: not kept when
``KS_COMPILE_CACHE=off``), keyed by the compiler's and headers' versions and the whole command
line, so it answers only a compile of the same target and flags. Built in the candidate's
sandbox (its flags are on the command line), under a file lock (compile items run at once).

A compile that uses it defines ``TORCH_EXTENSION_NAME`` in its unit instead of on the command
line (a PCH refuses a macro that differs from its own). A header that changed since the PCH
was built makes clang refuse the PCH: the compile then runs again without it
(``refused``) and the PCH is built anew next time. Flags the headers do not compile with
leave a ``.failed`` mark, so their compiles parse the headers without trying the PCH again.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

from filelock import FileLock, Timeout

from pytest_kscientist.harness import compiles
from pytest_kscientist.harness.compiles import cache_folder, cache_key, compiler_sandbox
from pytest_kscientist.harness.files import atomic_target

# clang's words when it will not use a PCH (another compiler, a header changed since).
REFUSALS = ("precompiled header", "PCH file", "precompiled file")


def built(text: str, command: Callable[[Path, Path], list[str]], versions: tuple[str, ...],
          candidate: Path, timeout_s: float, env: dict[str, str] | None = None) -> Path | None:
    """The PCH of ``text`` (the prelude) for ``command(header, output)`` (the unit's command
    line with the PCH's action: see ``hip.compile_gate.pch_command``), built now if it is not
    kept yet, in ``env`` as the compiles that read it; None where results are not kept or it
    does not build (the compile then parses the headers itself, and says why if they fail).
    The header stays beside its PCH: clang checks that a PCH's inputs are still there when it
    reads it."""
    folder = cache_folder()
    if folder is None:
        return None
    key = cache_key("prelude", *versions, text, *command(Path("<header>"), Path("<pch>")))
    target = folder / "prelude" / f"{key}.pch"
    if target.is_file():
        return target
    header, failed = target.with_suffix(".h"), target.with_suffix(".failed")
    if failed.exists():
        return None  # these flags broke the headers before: do not try again each compile
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        with FileLock(str(target.with_suffix(".lock")), timeout=timeout_s):
            if target.is_file():
                return target  # another compile item built it while this one waited
            header.write_text(text, encoding="utf-8")
            with tempfile.TemporaryDirectory(prefix="ks-prelude-") as tmp:
                out = Path(tmp) / "prelude.pch"
                code, _ = compiles.run([*compiler_sandbox(candidate), *command(header, out)],
                                       Path(tmp), timeout_s, env)
                if code != 0 or not out.is_file():
                    if code is not None and code > 0:  # not a timeout or a kill
                        failed.touch()
                    return None
                with atomic_target(target) as part:
                    shutil.copyfile(out, part)
    except (OSError, Timeout):
        return None  # a folder that cannot be written, or a build that never finished
    return target


def refused(output: str, pch: Path) -> bool:
    """Whether clang would not use ``pch`` (then it is removed, to be built anew)."""
    if not any(word in output for word in REFUSALS) or pch.name not in output:
        return False
    try:
        pch.unlink()
    except OSError:
        pass
    return True
