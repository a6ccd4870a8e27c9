"""What the LLM scientist will cost: the projection shown when a run starts, before the seeds
are evaluated (issue 13: the default cap stopped a 20-generation run near generation 10 without
saying so up front).

Per call, the tokens a role uses come from this population's ledger once the role has been
called; before that from ``TYPICAL_TOKENS``. A generation is one selector call, one designer
call, one writer call per candidate, and the repair calls (pre-GPU repair rounds and repairs
of candidates that failed when they ran) in the share this population has needed so far.
"""

from __future__ import annotations

from pytest_kscientist.evolve.llm.ledger import CostLedger, LedgerView

# The ledger itself, or a read-only view of it (``ledger.peek_ledger``: counts no run).
Ledger = CostLedger | LedgerView

# (input, billed output) tokens per call. Inputs: the prompts of tasks/fp8_gemm measured at
# generation 1 (selector 1.5k, designer 5k, writer 4.3k tokens, the system prompt included, at
# 4 characters a token), grown to where the findings and history bounds stop them. Outputs are
# a guess for a thinking model (Gemini 2.5 Pro bills thoughts as output): the answer (a plan
# list, a 2-3k-token kernel file) and its thinking. Measured averages replace them.
TYPICAL_TOKENS = {
    "selector": (4_000, 3_000),
    "designer": (8_000, 9_000),
    "writer": (6_000, 11_000),
    "repair": (7_000, 11_000),
}
TYPICAL_REPAIR_SHARE = 0.25  # repair calls per writer call, until this population has some


def per_call_usd(ledger: Ledger) -> tuple[dict[str, float], float, bool]:
    """(cost of one call per role, repair calls per writer call, whether measured)."""
    totals = ledger.totals().roles
    costs, measured = {}, False
    for role, (tokens_in, tokens_out) in TYPICAL_TOKENS.items():
        done = totals.get(role)
        if done is not None and done.calls:
            costs[role] = done.cost_usd / done.calls
            measured = True
        else:
            costs[role] = ledger.prices.cost_usd(tokens_in, tokens_out)
    writes, repairs = totals.get("writer"), totals.get("repair")
    share = (repairs.calls if repairs else 0) / writes.calls if writes and writes.calls else (
        TYPICAL_REPAIR_SHARE)
    return costs, share, measured


def generation_usd(ledger: Ledger, candidates: int) -> float:
    """The expected cost of one generation of ``candidates`` new kernels."""
    costs, share, _ = per_call_usd(ledger)
    writes = candidates * (costs["writer"] + share * costs["repair"])
    return costs["selector"] + costs["designer"] + writes


def project(ledger: Ledger, generations: int, candidates: int) -> str:
    """A line for the terminal: the projected cost of ``generations`` more generations and
    whether the cap covers them."""
    if generations <= 0:
        return ""
    each = generation_usd(ledger, candidates)
    _, share, measured = per_call_usd(ledger)
    basis = ("this population's average cost per call" if measured else
             "typical prompt sizes and a thinking model's output; an estimate")
    total, spent, cap = each * generations, ledger.spent_usd, ledger.budget_usd
    line = (f"kscientist: {generations} more generation(s) of {candidates} candidate(s) would "
            f"cost about ${total:.2f} (${each:.2f} each: a selector, a designer, {candidates} "
            f"writer and ~{candidates * share:.1f} repair calls, from {basis})")
    if each <= 0:
        return line + "; the prices are 0, so the cap does not stop the run"
    if spent + total <= cap:
        return line + f"; the cap of ${cap:.2f} (${spent:.2f} spent) covers them"
    covered = max(0, int((cap - spent) // each))
    return (line + f"; the cap of ${cap:.2f} (${spent:.2f} spent) covers about {covered}: the "
            "run stops cleanly before a call that could cross it; raise --ks-llm-budget-usd "
            "(ini ks_llm_budget_usd) to go further")
