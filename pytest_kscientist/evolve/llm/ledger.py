"""The per-run token and cost ledger with the hard spending cap (``--ks-llm-budget-usd``).

A call is allowed only when what is already spent plus the worst case of that call (its prompt
plus its full output cap) stays within the cap, so the cap holds even for the last call.
"""

from __future__ import annotations

import json
import threading
from pathlib import Path

from filelock import FileLock
from pydantic import BaseModel, Field

from pytest_kscientist.evolve.llm.llm_errors import BudgetExhausted
from pytest_kscientist.evolve.llm.settings import Prices
from pytest_kscientist.files import atomic_write

LEDGER_SCHEMA_VERSION = 1
# Tokens per prompt character, rounded up: English and Python run at ~4 characters per
# token; 1/3 over-estimates so the pre-call worst case errs on the side of the cap.
TOKENS_PER_CHAR = 1 / 3


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
    """``llm-ledger.json``: the run's totals per role and overall."""

    schema_version: int = LEDGER_SCHEMA_VERSION
    task: str = ""
    provider: str
    model: str
    budget_usd: float
    prices: dict[str, float]
    spent_usd: float = 0.0
    roles: dict[str, RoleTotals] = Field(default_factory=dict)


class CostLedger:
    """Thread-safe running totals; written atomically to ``path`` after every call."""

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
        self._record = LedgerRecord(
            task=task,
            provider=provider,
            model=model,
            budget_usd=budget_usd,
            prices={
                "input_per_mtok": prices.input_per_mtok,
                "output_per_mtok": prices.output_per_mtok,
            },
        )

    @property
    def spent_usd(self) -> float:
        return self._record.spent_usd

    def totals(self) -> LedgerRecord:
        """A copy of the current totals."""
        with self._lock:
            return self._record.model_copy(deep=True)

    def worst_case_usd(self, prompt_chars: int, max_output_tokens: int) -> float:
        """The most a call with this prompt and output cap can cost."""
        return self.prices.cost_usd(int(prompt_chars * TOKENS_PER_CHAR) + 1, max_output_tokens)

    def ensure_room(self, role: str, worst_case_usd: float) -> None:
        """Raise ``BudgetExhausted`` unless a call costing up to ``worst_case_usd`` fits."""
        with self._lock:
            spent = self._record.spent_usd
        if spent + worst_case_usd > self.budget_usd:
            raise BudgetExhausted(
                role,
                f"--ks-llm-budget-usd: the next call could cost up to ${worst_case_usd:.4f} and "
                f"${spent:.4f} of the ${self.budget_usd:.2f} cap is spent; raise "
                "--ks-llm-budget-usd (ini ks_llm_budget_usd) to go on",
                spent_usd=spent,
                cap_usd=self.budget_usd,
            )

    def charge(self, role: str, usage: Usage, cost_usd: float | None = None) -> float:
        """Add one call; ``cost_usd`` overrides the price list (replay charges the logged cost)."""
        cost = (
            self.prices.cost_usd(usage.input_tokens, usage.billed_output)
            if cost_usd is None
            else cost_usd
        )
        with self._lock:
            totals = self._record.roles.setdefault(role, RoleTotals())
            totals.calls += 1
            totals.input_tokens += usage.input_tokens
            totals.output_tokens += usage.output_tokens
            totals.thoughts_tokens += usage.thoughts_tokens
            totals.cost_usd += cost
            self._record.spent_usd += cost
            # Written under the lock so a slower thread never overwrites newer totals.
            self._write(self._record.model_dump_json(indent=2))
        return cost

    def _write(self, text: str) -> None:
        if self.path is None:
            return
        with FileLock(str(self.path) + ".lock"):
            atomic_write(self.path, text + "\n")


def load_ledger(path: Path) -> LedgerRecord:
    """Read a ``llm-ledger.json`` written by ``CostLedger``."""
    return LedgerRecord.model_validate(json.loads(path.read_text(encoding="utf-8")))
