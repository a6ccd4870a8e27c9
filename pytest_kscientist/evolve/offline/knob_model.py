"""The offline designer's knob model: log(time) as a sum of per-knob value effects, learned
from the kernels of one family and used to predict the gain of an untried knob move."""

from __future__ import annotations

import math
from collections import Counter, defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TypeAlias

from pytest_kscientist.evolve.offline.knobs import Knob

RIDGE = 0.5  # pulls effects seen in few kernels towards "no effect" (log units)
UNSEEN_SPREAD = 0.35  # +-42% speed-up range for a value no kernel of the family has used
SEEN_ONCE_SPREAD = 0.12
MIN_SPREAD = 0.03  # CPU timings on 2 shared cores vary by a few percent between sessions

# One measurement: the knob point a kernel ran, its status and its time (geomean, us) or None.
Observation: TypeAlias = tuple[Mapping[str, Knob], str, float | None]


@dataclass
class KnobModel:
    """log(geomean) = intercept + sum of per-knob value effects, fitted by ridge backfitting."""

    space: dict[str, list[Knob]]
    intercept: float = 0.0
    effects: dict[str, dict[Knob, float]] = field(default_factory=dict)
    counts: dict[str, Counter[Knob]] = field(default_factory=dict)
    failures: dict[str, Counter[Knob]] = field(default_factory=dict)
    spread: float = MIN_SPREAD

    @classmethod
    def fit(cls, family: Sequence[Observation], space: dict[str, list[Knob]]) -> KnobModel:
        """The model of ``family``'s measurements over ``space``."""
        model = cls(space)
        knobs = list(space)
        model.counts = {k: Counter() for k in knobs}
        model.failures = {k: Counter() for k in knobs}
        rows = []
        for values, status, time_us in family:
            for k in knobs:
                model.counts[k][values.get(k)] += 1
                if status == "failed":
                    model.failures[k][values.get(k)] += 1
            if status == "passed" and time_us:
                rows.append((values, math.log(time_us)))
        model.effects = {k: {} for k in knobs}
        if not rows:
            return model
        model.intercept = sum(y for _, y in rows) / len(rows)
        for _ in range(50):
            for k in knobs:
                sums: dict[Knob, float] = defaultdict(float)
                n: Counter[Knob] = Counter()
                for values, y in rows:
                    others = sum(model.effects[j].get(values.get(j), 0.0) for j in knobs if j != k)
                    sums[values.get(k)] += y - model.intercept - others
                    n[values.get(k)] += 1
                model.effects[k] = {v: sums[v] / (n[v] + RIDGE) for v in n}
        residuals = [y - model.predict(values)[0] for values, y in rows]
        if len(rows) > 2:
            variance = sum(r * r for r in residuals) / (len(rows) - 1)
            model.spread = max(MIN_SPREAD, math.sqrt(variance))
        return model

    def effect(self, knob: str, value: Knob) -> tuple[float, float]:
        """(effect, uncertainty) of a knob value; unseen values continue the neighbours' trend."""
        seen = self.effects.get(knob, {})
        if value in seen:
            return seen[value], SEEN_ONCE_SPREAD if self.counts[knob][value] < 2 else 0.0
        options = self.space.get(knob, [])
        if value not in options or not seen:
            return 0.0, UNSEEN_SPREAD
        at = options.index(value)
        known = sorted(options.index(v) for v in seen if v in options)
        left = [i for i in known if i < at]
        right = [i for i in known if i > at]
        eff = lambda i: seen[options[i]]  # noqa: E731
        if left and right:
            i, j = left[-1], right[0]
            return eff(i) + (eff(j) - eff(i)) * (at - i) / (j - i), UNSEEN_SPREAD / 2
        near = left[-1] if left else right[0]
        inner = left[-2:-1] if left else right[1:2]
        trend = (eff(near) - eff(inner[0])) / 2 if inner else 0.0
        return eff(near) + trend, UNSEEN_SPREAD

    def predict(self, values: Mapping[str, Knob]) -> tuple[float, float]:
        """(predicted log geomean, uncertainty in log units) of a knob configuration."""
        total, unc = self.intercept, 0.0
        for k in self.space:
            e, u = self.effect(k, values.get(k))
            total, unc = total + e, unc + u
        return total, unc

    def risky(self, change: Mapping[str, Knob]) -> bool:
        """Whether a changed value has only ever been seen in failing kernels."""
        return any(0 < self.failures[k][v] == self.counts[k][v] for k, v in change.items())

    def forecast(self, values: Mapping[str, Knob], change: Mapping[str, Knob]) -> Forecast:
        """What the model says of moving ``values`` by ``change``."""
        base_pred, _ = self.predict(values)
        pred, _ = self.predict({**values, **change})
        novelty = [1.0 / (1 + self.counts[k][v]) for k, v in change.items()]
        return Forecast(
            gain=base_pred - pred,
            spread=self.spread + sum(self.effect(k, v)[1] for k, v in change.items()),
            risky=self.risky(change),
            innovation=min(10.0, 10.0 * sum(novelty) / len(novelty) + (len(change) - 1) * 0.5),
            seen=", ".join(f"{k}={v!r} in {self.counts[k][v]} kernel(s)"
                           for k, v in change.items()),
        )


@dataclass(frozen=True)
class Forecast:
    """A knob move's predicted log speed-up (``gain``) and its uncertainty (``spread``), whether
    a value in it has only failed so far, its innovation score (0-10) and how often each value
    was seen."""

    gain: float
    spread: float
    risky: bool
    innovation: float
    seen: str

    def bounds(self, share: float = 1.0) -> tuple[float, float]:
        """The gain's range in percent, scaled by ``share`` (the part of the geomean the move
        touches); an untried-failing value has no lower bound (-100%)."""
        low = pct(share * (self.gain - self.spread))
        return (-100.0 if self.risky else low), pct(share * (self.gain + self.spread))


def pct(log_ratio: float) -> float:
    """A log speed-up as a percentage: +100 is twice as fast."""
    return (math.exp(log_ratio) - 1.0) * 100.0


def title(base: Mapping[str, Knob], change: Mapping[str, Knob]) -> str:
    """``tile 16 -> 32, unroll 1 -> 2``: a knob move in words."""
    return ", ".join(f"{k} {base[k]!r} -> {v!r}" for k, v in sorted(change.items()))


def effects_text(point: Mapping[str, Knob], model: KnobModel, where: str = "") -> str:
    """Findings lines: each knob's fitted speed-ups against ``point``'s value (``where``: the
    class of shapes the model is of)."""
    lines = []
    at = f" in {where}" if where else ""
    for k, effects in model.effects.items():
        if len(effects) < 2:
            continue
        ref = effects.get(point.get(k), 0.0)
        ordered = sorted(effects.items(), key=lambda kv: kv[1])
        parts = [f"{v!r} {pct(ref - e):+.0f}%" for v, e in ordered]
        lines.append(f"- `{k}` vs {point.get(k)!r}{at} (speed-up, fitted): " + ", ".join(parts))
    return "\n".join(lines)
