"""The population's token and cost ledger with the hard spending cap (``--ks-llm-budget-usd``).

One ledger per population (``<population>/<task>/llm/llm-ledger.json``), shared by every run
of it: a resume starts from the spent total and two runs at once draw on one cap (issue 13:
each process kept its own). A call is allowed only when what is spent, plus the worst case of
the calls in flight (in any thread or process), plus the worst case of this call (its prompt
and its full output cap) stays within the cap; the call's worst case is reserved under the
file lock until it is charged or released, so the cap holds even for concurrent last calls.
A reservation left by a killed process on this host is dropped when seen.
"""

from __future__ import annotations

import json
import os
import socket
import threading
import uuid
import warnings
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import asdict, dataclass
from pathlib import Path

from filelock import FileLock
from pydantic import BaseModel, Field, ValidationError

from pytest_kscientist.evolve.llm.llm_errors import BudgetExhausted
from pytest_kscientist.evolve.llm.settings import Prices
from pytest_kscientist.harness.files import atomic_write, owner_alive
from pytest_kscientist.kswarnings import KsWarning

LEDGER_SCHEMA_VERSION = 2
# Tokens per prompt character, rounded up: English and Python run at ~4 characters per
# token; 1/3 over-estimates so the pre-call worst case errs on the side of the cap.
TOKENS_PER_CHAR = 1 / 3
HOST = socket.gethostname()


class Usage(BaseModel):
    """Token counts of one call, as the provider reported them."""

    input_tokens: int = 0
    output_tokens: int = 0  # visible output, thinking excluded
    thoughts_tokens: int = 0  # billed as output

    @property
    def billed_output(self) -> int:
        return self.output_tokens + self.thoughts_tokens


class RoleTotals(BaseModel):
    """What one role has used so far."""

    calls: int = 0
    input_tokens: int = 0
    output_tokens: int = 0
    thoughts_tokens: int = 0
    cost_usd: float = 0.0


class LedgerRecord(BaseModel):
    """``llm-ledger.json``: the population's totals per role and overall, all runs together."""

    schema_version: int = LEDGER_SCHEMA_VERSION
    task: str = ""
    provider: str  # of the latest run
    model: str
    budget_usd: float  # the latest run's cap
    prices: dict[str, float]
    spent_usd: float = 0.0
    runs: int = 0  # runs that have opened this ledger
    roles: dict[str, RoleTotals] = Field(default_factory=dict)
    # Worst cases of the calls in flight, by "host:pid:id"; charged or released when they end.
    reserved: dict[str, float] = Field(default_factory=dict)

    def reserved_usd(self) -> float:
        return sum(self.reserved.values())


class LedgerWarning(KsWarning):
    """The ledger file could not be read: it is set aside and a new one begins."""


class CostLedger:
    """Totals and reservations kept in ``path`` (or in memory without one); thread- and
    process-safe: every change re-reads the file under its lock and writes it back."""

    def __init__(
        self,
        prices: Prices,
        budget_usd: float,
        path: Path | None = None,
        provider: str = "",
        model: str = "",
        task: str = "",
    ) -> None:
        self.prices = prices
        self.budget_usd = budget_usd
        self.path = path
        self._lock = threading.Lock()
        self._file_lock = FileLock(str(path) + ".lock") if path is not None else None
        self._record = LedgerRecord(
            task=task, provider=provider, model=model, budget_usd=budget_usd,
            prices=asdict(prices),
        )
        self.spent_before_usd = 0.0  # what earlier and other runs had spent when this one began
        with self._locked() as record:
            self.spent_before_usd, self.runs_before = record.spent_usd, record.runs
            record.runs += 1
            record.task = task or record.task
            record.provider, record.model, record.budget_usd = provider, model, budget_usd
            record.prices = dict(self._record.prices)

    @property
    def spent_usd(self) -> float:
        """What the population's runs have spent, as the ledger holds it now."""
        return self.totals().spent_usd

    def totals(self) -> LedgerRecord:
        """A copy of the current totals."""
        with self._lock:
            if self.path is not None and self.path.exists():
                with self._file_lock or nullcontext():
                    self._record = self._read()
            return self._record.model_copy(deep=True)

    def worst_case_usd(self, prompt_chars: int, max_output_tokens: int) -> float:
        """The most a call with this prompt and output cap can cost."""
        return self.prices.cost_usd(int(prompt_chars * TOKENS_PER_CHAR) + 1, max_output_tokens)

    def reserve(self, role: str, worst_case_usd: float) -> str:
        """Hold ``worst_case_usd`` for a call about to be made and return the key to charge or
        release it with; raise ``BudgetExhausted`` when it does not fit under the cap."""
        key = f"{HOST}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        with self._locked() as record:
            spent, held = record.spent_usd, record.reserved_usd()
            if spent + held + worst_case_usd > self.budget_usd:
                in_flight = f" and ${held:.4f} held by calls in flight" if held else ""
                raise BudgetExhausted(
                    role,
                    f"--ks-llm-budget-usd: the next call could cost up to ${worst_case_usd:.4f}; "
                    f"${spent:.4f} of the population's ${self.budget_usd:.2f} cap is spent"
                    f"{in_flight}; raise --ks-llm-budget-usd (ini ks_llm_budget_usd) to go on",
                    spent_usd=spent,
                    cap_usd=self.budget_usd,
                )
            record.reserved[key] = worst_case_usd
        return key

    def release(self, key: str) -> None:
        """Give back a reservation whose call failed before any answer (nothing billed)."""
        with self._locked() as record:
            record.reserved.pop(key, None)

    def ensure_room(self, role: str, worst_case_usd: float) -> None:
        """Raise ``BudgetExhausted`` unless a call costing up to ``worst_case_usd`` fits now."""
        self.release(self.reserve(role, worst_case_usd))

    def charge(self, role: str, usage: Usage, cost_usd: float | None = None,
               reservation: str = "") -> float:
        """Add one call (ending its reservation); ``cost_usd`` overrides the price list (replay
        charges the logged cost)."""
        cost = (
            self.prices.cost_usd(usage.input_tokens, usage.billed_output)
            if cost_usd is None
            else cost_usd
        )
        with self._locked() as record:
            record.reserved.pop(reservation, None)
            totals = record.roles.setdefault(role, RoleTotals())
            totals.calls += 1
            totals.input_tokens += usage.input_tokens
            totals.output_tokens += usage.output_tokens
            totals.thoughts_tokens += usage.thoughts_tokens
            totals.cost_usd += cost
            record.spent_usd += cost
        return cost

    # -- the file ------------------------------------------------------------------------------
    @contextmanager
    def _locked(self) -> Iterator[LedgerRecord]:
        """The record to change, read under both locks and written back (reservations of dead
        processes dropped) when the block ends without an error."""
        with self._lock, self._file_lock or nullcontext():
            if self.path is not None:
                self._record = self._read()
            yield self._record
            if self.path is not None:
                self._record.reserved = {k: v for k, v in self._record.reserved.items()
                                         if _live(k)}
                atomic_write(self.path, self._record.model_dump_json(indent=2) + "\n")

    def _read(self) -> LedgerRecord:
        """The record on disk (the file lock held), or this run's fresh one when there is none;
        an unreadable file is set aside with a warning."""
        assert self.path is not None
        try:
            return load_ledger(self.path)
        except FileNotFoundError:
            return self._record
        except (OSError, ValueError, ValidationError) as exc:
            aside = self.path.with_suffix(f".unreadable-{uuid.uuid4().hex[:6]}.json")
            os.replace(self.path, aside)
            warnings.warn(LedgerWarning(
                f"LLM ledger {self.path} could not be read ({type(exc).__name__}); moved to "
                f"{aside.name} and a new ledger begins at $0: check what it held against the "
                "provider's billing"), stacklevel=4)
            return self._record.model_copy(update={"spent_usd": 0.0, "roles": {},
                                                   "reserved": {}, "runs": 0})


def _live(key: str) -> bool:
    """Whether the process holding a reservation may still run (another host: assume so)."""
    host, _, rest = key.partition(":")
    pid = int(rest.partition(":")[0] or 0) if rest.partition(":")[0].isdigit() else 0
    if host != HOST or pid <= 0 or pid == os.getpid():
        return True
    return owner_alive(pid)


@dataclass(frozen=True)
class LedgerView:
    """A read-only look at a population's ledger: what ``cost.project`` reads from a
    ``CostLedger`` (prices, this run's cap, the totals), with no run counted."""

    prices: Prices
    budget_usd: float
    record: LedgerRecord

    @property
    def spent_usd(self) -> float:
        return self.record.spent_usd

    def totals(self) -> LedgerRecord:
        """A copy of the totals."""
        return self.record.model_copy(deep=True)


def peek_ledger(prices: Prices, budget_usd: float, path: Path) -> LedgerView | None:
    """The ledger in ``path`` as a run with these prices and cap would see it, without
    opening it as a run does: no run is counted and nothing is written, moved or created.

    No file: a fresh record ($0 spent). A file that cannot be read: None (spent unknown), and
    the file stays where it is; the run that opens the ledger sets it aside with a warning.
    No lock is taken: every write is an atomic ``os.replace``, so a read sees one whole version,
    and taking the lock could create its file.
    """
    try:
        record = load_ledger(path)
    except FileNotFoundError:
        record = LedgerRecord(provider="", model="", budget_usd=budget_usd, prices=asdict(prices))
    except (OSError, ValueError, ValidationError):
        return None
    return LedgerView(prices, budget_usd, record)


def load_ledger(path: Path) -> LedgerRecord:
    """Read a ``llm-ledger.json`` written by ``CostLedger`` (schema 1 reads as schema 2)."""
    return LedgerRecord.model_validate(json.loads(path.read_text(encoding="utf-8")))
