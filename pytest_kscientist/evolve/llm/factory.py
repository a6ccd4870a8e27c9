"""Build the LLM scientist for a run: ``make_llm_roles(config, task, log_dir)``.

Returns ``LLMRoles`` (a named tuple ``(selector, designer, writer)`` that unpacks like a
3-tuple) or ``None`` when the run is offline. ``llm_notice(config)`` gives the one line to show
when ``--ks-llm auto`` fell back to offline ("" otherwise); ``LLMRoles.describe()`` one line
naming the provider, model, cap and log folder.

The three roles share one ``Session``: a call log ``log_dir/llm-calls.jsonl`` (every prompt and
response, keys redacted; ``--ks-replay`` reads it back), a ledger ``log_dir/llm-ledger.json``
(tokens and dollars per role) and the cap. Role methods raise only these (all ``LLMError``):
``BudgetExhausted`` (stop the loop cleanly), ``ProviderError`` (service failed after retries),
``MalformedOutput`` (no usable structured answer), ``DraftRejected`` (writer file failed the
pre-GPU checks after one repair) and ``ReplayMiss`` (replay diverged from its log).

Outside pytest, ``build_roles(settings, task, log_dir)`` does the same from an ``LLMSettings``
(see ``settings.resolve_settings``).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple

from pytest_kscientist.evolve.llm.settings import LLMSettings
from pytest_kscientist.evolve.llm.transcript import CALLS_FILE, LEDGER_FILE

if TYPE_CHECKING:
    import pytest

    from pytest_kscientist.evolve.llm.ledger import CostLedger
    from pytest_kscientist.evolve.llm.provider import Provider
    from pytest_kscientist.evolve.llm.scientist import LLMDesigner, LLMSelector, LLMWriter
    from pytest_kscientist.evolve.llm.session import Session
    from pytest_kscientist.evolve.llm.transcript import Redactor
    from pytest_kscientist.evolve.roles import TaskBrief


class LLMRoles(NamedTuple):
    """The three roles over one session; unpacks as ``selector, designer, writer``."""

    selector: LLMSelector
    designer: LLMDesigner
    writer: LLMWriter

    @property
    def session(self) -> Session:
        return self.selector.session

    @property
    def ledger(self) -> CostLedger:
        return self.selector.session.ledger

    def describe(self) -> str:
        """One line for the terminal: provider, model, cap, where the calls are logged."""
        s = self.session
        return (
            f"kscientist: LLM scientist {s.provider.name}:{s.provider.model}, budget "
            f"${s.ledger.budget_usd:.2f} for this population (${s.ledger.spent_usd:.2f} spent "
            f"so far), calls logged in {s.log.path}"
        )

    def projection(self, generations: int, candidates: int) -> str:
        """One line: what ``generations`` more generations of ``candidates`` will cost, and
        how far the cap goes (an estimate: see ``cost.project``)."""
        from pytest_kscientist.evolve.llm.cost import project

        return project(self.ledger, generations, candidates)


def llm_notice(config: pytest.Config) -> str:
    """The one-line notice when ``--ks-llm auto`` chose offline, else ""."""
    from pytest_kscientist.evolve.llm import llm_options

    return llm_options.settings(config).notice


def make_llm_roles(config: pytest.Config, task: TaskBrief, log_dir: Path) -> LLMRoles | None:
    """The LLM roles for this pytest run, or None when the scientist runs offline."""
    from pytest_kscientist.evolve.llm import llm_options

    return build_roles(llm_options.settings(config), task, log_dir)


def check_provider(settings: LLMSettings) -> str:
    """The provider's start check (``Provider.check``: a free lookup, no tokens) before the run
    evaluates or spends anything: raises ``ProviderOutage`` when the service refuses the key or
    the model; returns a warning when it cannot be reached (the run goes on under
    ``--ks-llm-outage-s``) or answers oddly, "" when all is well or the run is offline."""
    from pytest_kscientist.evolve.llm.llm_errors import ProviderError, ProviderOutage
    from pytest_kscientist.evolve.llm.provider import CHECK_REFUSED

    if settings.provider == "offline":  # no provider to reach (else _provider makes a replay)
        return ""
    try:
        return _provider(settings, _redactor(settings)).check()
    except ProviderError as exc:
        if exc.status in CHECK_REFUSED:
            raise ProviderOutage("start check", (
                f"{exc.reason}; the provider refuses the key or the model (HTTP {exc.status}): "
                "check the API key, --ks-model and --ks-llm-base-url; nothing was evaluated or "
                "spent"), exc.status) from None
        return (f"{exc.reason}; generation 0 is evaluated all the same, and the run stops once "
                f"no LLM call has succeeded for --ks-llm-outage-s {settings.retry.outage_s:g} s")


def _redactor(settings: LLMSettings) -> Redactor:
    from pytest_kscientist.evolve.llm.transcript import Redactor

    return Redactor(settings.secrets + ((settings.api_key,) if settings.api_key else ()))


def _provider(settings: LLMSettings, redact: Redactor) -> Provider:
    if settings.provider == "gemini":
        from pytest_kscientist.evolve.llm.gemini import GeminiProvider

        return GeminiProvider(
            settings.model,
            settings.api_key or "",
            settings.retry,
            redact,
            base_url=settings.base_url,
        )
    if settings.provider == "openai":
        from pytest_kscientist.evolve.llm.openai_compat import OpenAICompatProvider

        return OpenAICompatProvider(
            settings.model,
            settings.base_url or "",
            settings.retry,
            redact,
            api_key=settings.api_key,
        )
    from pytest_kscientist.evolve.llm.replay import ReplayProvider

    return ReplayProvider(settings.replay_path or Path(CALLS_FILE), settings.model)


def build_roles(settings: LLMSettings, task: TaskBrief, log_dir: Path) -> LLMRoles | None:
    """The roles for ``settings`` logging under ``log_dir``, or None for offline."""
    if settings.provider == "offline":
        return None
    from pytest_kscientist.evolve.llm.ledger import CostLedger
    from pytest_kscientist.evolve.llm.scientist import LLMDesigner, LLMSelector, LLMWriter
    from pytest_kscientist.evolve.llm.session import Session
    from pytest_kscientist.evolve.llm.transcript import CallLog

    log_dir.mkdir(parents=True, exist_ok=True)
    redact = _redactor(settings)
    provider = _provider(settings, redact)
    ledger = CostLedger(
        settings.prices,
        settings.budget_usd,
        log_dir / LEDGER_FILE,
        provider=provider.name,
        model=provider.model,
        task=task.name,
    )
    calls = log_dir / CALLS_FILE
    replayed = settings.replay_path
    if replayed is not None and replayed.is_dir():
        replayed = replayed / CALLS_FILE
    if replayed is not None and calls.resolve() == replayed.resolve():
        calls = log_dir / "llm-calls.replay.jsonl"  # never append to the log being replayed
    session = Session(
        provider, ledger, CallLog(calls, redact), retry=settings.retry, limits=settings.limits
    )
    return LLMRoles(LLMSelector(session), LLMDesigner(session), LLMWriter(session))
