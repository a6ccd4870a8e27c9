"""The root of pytest-kscientist's warnings: filter them all with
``-W ignore::pytest_kscientist.kswarnings.KsWarning`` (errors derive from ``errors.KsError``).

Kept apart from ``errors.py`` because the candidate worker loads that one and must not import
pytest.
"""

from __future__ import annotations

import pytest


class KsWarning(pytest.PytestWarning):
    """Base class of pytest-kscientist's warnings."""


class KsTaskHole(KsWarning):
    """A task lets a trivial kernel pass (task validation), reported as a warning because of
    ``--ks-lenient-task``."""


class KsUnlikeOutput(KsWarning):
    """A candidate's output passed its problem's own check (GPU MODE) with another dtype or
    shape than the reference's."""


class KsGateDeselected(KsWarning):
    """A performance gate was deselected (``-k``/``-m``) while its candidate's benchmarks ran:
    the gate the command line asked for was not judged."""


class KsGateUndecided(KsWarning):
    """A regression gate passed although its measured change is past the limit, because the
    change's interval still holds no change: too few calls to decide."""


class KsNoSavedRun(KsWarning):
    """The saved run the ini file's ``ks_compare`` names does not exist (yet): this run
    compares with nothing, its regression gate included."""


class KsNoDeviceLock(KsWarning):
    """A GPU session could not open its GPU's machine-wide lock (harness/device_lock.py): its
    items do not take turns with other sessions on that GPU."""
