"""Forced acceptance (`mtp_force_acceptance`), for benchmarking only: the verify step accepts drafts by a weighted
coin instead of checking them against the target, so that speculative decoding on random weights (published shapes,
`load_format dummy`) runs at a realistic acceptance instead of none. Outputs are then NOT the model's: the accepted
drafts are emitted as they are, followed by the target's token at the first row not accepted.

Two spellings, parsed once against the configured k (mtp_step):
  "0.8,0.6,0.4"  per-position rates: the i-th value is the probability that draft i is accepted given that drafts
                 1..i-1 were (vLLM's synthetic acceptance rates, TensorRT-LLM's forced accepted tokens). At most k
                 values, each in [0, 1]; drafts past the list are never accepted.
  "mean=2.2"     a mean accept length (accepted drafts + the one token every verify step emits, 1..k+1): every
                 position gets the same conditional rate a, the root in [0, 1] of 1 + a + a^2 + ... + a^k = mean
                 (monotone in a, solved by bisection), so that the expected accept length per verify step is `mean`.

Each block's accept length is capped by the drafts it holds, so with fewer drafts than k (mtp_adaptive, or near
max_model_len) the measured mean is below the expected one.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

_MEAN_PREFIX = "mean="
_BISECTION_STEPS = 60  # halves [0, 1] below 1e-18: exact in float64


def expected_accept_length(rates: tuple[float, ...]) -> float:
    """1 + E[accepted drafts] of a block with len(rates) drafts: sum over i of P(drafts 1..i accepted)."""
    total, reach = 1.0, 1.0
    for rate in rates:
        reach *= rate
        total += reach
    return total


def constant_rate_for_mean(mean: float, num_draft_tokens: int) -> float:
    """The conditional rate a in [0, 1] with 1 + a + ... + a^k = mean (k = num_draft_tokens, 1 <= mean <= k + 1)."""
    if mean <= 1.0:
        return 0.0
    if mean >= num_draft_tokens + 1:
        return 1.0
    lo, hi = 0.0, 1.0
    for _ in range(_BISECTION_STEPS):
        mid = 0.5 * (lo + hi)
        if expected_accept_length((mid,) * num_draft_tokens) < mean:
            lo = mid
        else:
            hi = mid
    return 0.5 * (lo + hi)


@dataclass(frozen=True)
class ForcedAcceptance:
    setting: str  # as given (whitespace removed): "0.8,0.6,0.4" or "mean=2.2"
    rates: tuple[float, ...]  # [k] conditional acceptance rate of each draft position, zeros past a short list

    @classmethod
    def parse(cls, text: str, num_draft_tokens: int) -> ForcedAcceptance:
        """Any malformed or out-of-range value: ValueError naming mtp_force_acceptance and the accepted forms."""
        if not isinstance(text, str):
            raise ValueError(f"mtp_force_acceptance must be a string such as '0.8,0.6,0.4' or 'mean=2.2', got "
                             f"{text!r}")  # fmt: skip
        setting = "".join(text.split())
        k = num_draft_tokens
        if setting.startswith(_MEAN_PREFIX):
            mean = _number(setting[len(_MEAN_PREFIX) :], text)
            if not 1.0 <= mean <= k + 1:
                raise ValueError(f"mtp_force_acceptance {text!r}: the mean accept length (accepted drafts + 1 per "
                                 f"verify step) must be in [1, {k + 1}] for mtp_step {k}")  # fmt: skip
            return cls(setting, (constant_rate_for_mean(mean, k),) * k)
        values = [_number(part, text) for part in setting.split(",")]
        if len(values) > k:
            raise ValueError(f"mtp_force_acceptance {text!r}: {len(values)} per-position rates for mtp_step {k} "
                             f"(at most one per draft)")  # fmt: skip
        if not all(0.0 <= v <= 1.0 for v in values):
            raise ValueError(f"mtp_force_acceptance {text!r}: every per-position rate must be in [0, 1]")
        return cls(setting, tuple(values) + (0.0,) * (k - len(values)))

    @property
    def mean_accept_length(self) -> float:
        """Expected tokens per verify step (accepted drafts + 1) when every block holds k drafts."""
        return expected_accept_length(self.rates)


def _number(part: str, text: str) -> float:
    try:
        value = float(part)
    except ValueError:
        value = math.nan
    if not math.isfinite(value):
        raise ValueError(f"mtp_force_acceptance {text!r}: expected comma-separated rates in [0, 1] such as "
                         f"'0.8,0.6,0.4', or 'mean=X' with X the mean accept length, e.g. 'mean=2.2'")  # fmt: skip
    return value
