"""Adaptive speculation length (`mtp_adaptive`): every launch picks how many drafts k in {0..K} the blocks it opens
hold, the k that maximizes the batch's expected tokens per millisecond.

Expected tokens of a request drafting k: E(k) = 1 + sum_{j<=k} prod_{i<=j} a_i, where a_i is its conditional
acceptance at draft position i (accepted / reached, decayed so that a request whose acceptance falls with its
context drafts less; a new request starts from the engine-wide estimate). Step cost: `StepCostTable`, milliseconds
per (batch-size bucket, k) plus milliseconds per context token (the KV the batch's requests hold: a verify row's
attention, and the drafts', grow with it), measured at start-up from the captured CUDA graphs
(spec_decode/step_cost.py). k = argmax_k sum_r E_r(k) / cost(B, k, C), C the batch's context tokens. k = 0 is a
verify block of one row (a plain decode step on the verify layout, with the draft pass that keeps the draft KV
current). Positions past the chosen k are never verified, so
every `probe_interval` launches one more draft is verified than chosen: estimates of longer drafts stay live and
a batch at k = 0 (drafts never accepted) finds out when they start being accepted.

Only what blocks hold changes; verification is the same accept rule, so outputs stay exact whatever k is chosen.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field

_REQUEST_DECAY = 0.9  # a request's estimate: about its last ten verify steps count
_ENGINE_DECAY = 0.98  # the engine-wide estimate (a new request's prior): about the last fifty
_PRIOR_WEIGHT = 2.0  # a request's own counts outweigh the engine-wide estimate after a few steps
_INITIAL_WEIGHT = 0.5  # the initial guess only counts until the first verify steps


@dataclass(frozen=True)
class StepCostTable:
    """cost_ms[i][k]: milliseconds of a step of batch_sizes[i] requests with blocks of k drafts (k = 0..K) at a short
    context; ms_per_context_token[i][k]: what each token of context the batch's requests hold adds to it (None:
    nothing)."""

    batch_sizes: tuple[int, ...]
    cost_ms: tuple[tuple[float, ...], ...]
    ms_per_context_token: tuple[tuple[float, ...], ...] | None = None

    def __post_init__(self) -> None:
        if not self.batch_sizes or len(self.batch_sizes) != len(self.cost_ms):
            raise ValueError("StepCostTable: one row of costs per batch size")
        if list(self.batch_sizes) != sorted(set(self.batch_sizes)):
            raise ValueError(f"StepCostTable: batch sizes must increase, got {self.batch_sizes}")
        widths = {len(row) for row in self.cost_ms}
        if len(widths) != 1 or min(min(row) for row in self.cost_ms) <= 0:
            raise ValueError("StepCostTable: every row holds K + 1 positive costs")
        slopes = self.ms_per_context_token
        if slopes is not None and (len(slopes) != len(self.cost_ms) or {len(r) for r in slopes} != widths
                                   or min(min(r) for r in slopes) < 0):  # fmt: skip
            raise ValueError("StepCostTable: ms_per_context_token holds K + 1 costs >= 0 per batch size")

    @property
    def max_drafts(self) -> int:
        return len(self.cost_ms[0]) - 1

    def row(self, batch_size: int, context_tokens: int = 0) -> tuple[float, ...]:
        """Costs by k of the smallest measured batch size >= batch_size (the CUDA-graph bucket it replays in), for
        a batch whose requests hold context_tokens tokens of KV in all."""
        i = min(bisect.bisect_left(self.batch_sizes, batch_size), len(self.batch_sizes) - 1)
        if self.ms_per_context_token is None or context_tokens <= 0:
            return self.cost_ms[i]
        return tuple(c + s * context_tokens for c, s in zip(self.cost_ms[i], self.ms_per_context_token[i]))


@dataclass
class AcceptanceEstimate:
    """Decayed counts of drafts reached and accepted at each position (1-based position j at index j - 1)."""

    reached: list[float] = field(default_factory=list)
    accepted: list[float] = field(default_factory=list)
    decay: float = _REQUEST_DECAY
    prior_weight: float = _PRIOR_WEIGHT

    def observe(self, num_drafts: int, accepted_drafts: int) -> None:
        """One verify step: positions 1..accepted_drafts accepted, position accepted_drafts + 1 rejected when it was
        drafted, later positions not reached."""
        reached = min(accepted_drafts + 1, num_drafts)
        while len(self.reached) < reached:
            self.reached.append(0.0)
            self.accepted.append(0.0)
        for j in range(reached):
            self.reached[j] = self.decay * self.reached[j] + 1.0
            self.accepted[j] = self.decay * self.accepted[j] + (1.0 if j < accepted_drafts else 0.0)

    def rates(self, max_drafts: int, prior: list[float]) -> list[float]:
        """Conditional acceptance at positions 1..max_drafts, each shrunk towards `prior`."""
        out = []
        for j in range(max_drafts):
            n = self.reached[j] if j < len(self.reached) else 0.0
            a = self.accepted[j] if j < len(self.accepted) else 0.0
            out.append((a + self.prior_weight * prior[j]) / (n + self.prior_weight))
        return out


def expected_tokens(rates: list[float], k: int) -> float:
    """Tokens a verify block with k drafts emits on average: 1 + sum over j <= k of prod_{i<=j} rates[i]."""
    total, alive = 1.0, 1.0
    for j in range(k):
        alive *= rates[j]
        total += alive
    return total


class SpecLengthController:
    def __init__(self, costs: StepCostTable, probe_interval: int = 8, initial_rate: float = 0.5):
        self.costs = costs
        self.max_drafts = costs.max_drafts
        self.probe_interval = probe_interval
        self._initial = [initial_rate] * self.max_drafts
        self.reset()

    def reset(self) -> None:
        """Forgets the acceptance seen so far (after the start-up warm-up's synthetic prompts)."""
        self.engine = AcceptanceEstimate(decay=_ENGINE_DECAY, prior_weight=_INITIAL_WEIGHT)
        self._launches = 0

    def prior(self) -> list[float]:
        return self.engine.rates(self.max_drafts, self._initial)

    def observe(self, request: AcceptanceEstimate, num_drafts: int, accepted_drafts: int) -> None:
        request.observe(num_drafts, accepted_drafts)
        self.engine.observe(num_drafts, accepted_drafts)

    def best(self, requests: list[AcceptanceEstimate], context_tokens: int = 0) -> int:
        """argmax_k of expected tokens per millisecond for these requests, which hold context_tokens tokens of KV in
        all (ties: the smaller k)."""
        prior = self.prior()
        rates = [r.rates(self.max_drafts, prior) for r in requests]
        cost = self.costs.row(len(requests), context_tokens)
        scores = [sum(expected_tokens(r, k) for r in rates) / cost[k] for k in range(self.max_drafts + 1)]
        return max(range(len(scores)), key=lambda k: (scores[k], -k))

    def choose(self, requests: list[AcceptanceEstimate], context_tokens: int = 0) -> int:
        """The k of the blocks this launch opens for `requests`: the best one, one more on probe launches."""
        self._launches += 1
        k = self.best(requests, context_tokens)
        if self._launches % self.probe_interval == 0:
            k = min(k + 1, self.max_drafts)
        return k
