"""Speculative-decoding counts: one frozen type for a request's acceptance, a worker's sum, the offline API's
`RequestOutput.spec`, the server's /metrics and `usage.mtp`."""

from __future__ import annotations

from dataclasses import dataclass


def _add(a: tuple[int, ...], b: tuple[int, ...]) -> tuple[int, ...]:
    n = max(len(a), len(b))
    return tuple((a[j] if j < len(a) else 0) + (b[j] if j < len(b) else 0) for j in range(n))


@dataclass(frozen=True)
class SpecStats:
    verify_steps: int = 0
    drafts: int = 0  # draft tokens verified
    accepted_drafts: int = 0  # draft tokens accepted (a step emits accepted_drafts + 1 tokens)
    proposed_at: tuple[int, ...] = ()  # [k] drafts verified at draft position j
    accepted_at: tuple[int, ...] = ()  # [k] drafts accepted at draft position j
    steps_at_k: tuple[int, ...] = ()  # [k+1] verify steps whose block was opened for k' drafts (adaptive: chosen k')

    def after_step(self, num_drafts: int, accepted_drafts: int, block_drafts: int | None = None) -> SpecStats:
        """These counts plus one verify step that checked `num_drafts` drafts and accepted the first
        `accepted_drafts` of them; its block was opened for `block_drafts` drafts (None: num_drafts)."""
        accepted_at = (1,) * accepted_drafts + (0,) * (num_drafts - accepted_drafts)
        k = num_drafts if block_drafts is None else block_drafts
        at_k = (0,) * k + (1,)
        return self + SpecStats(1, num_drafts, accepted_drafts, (1,) * num_drafts, accepted_at, at_k)

    def __add__(self, other: SpecStats) -> SpecStats:
        return SpecStats(
            self.verify_steps + other.verify_steps,
            self.drafts + other.drafts,
            self.accepted_drafts + other.accepted_drafts,
            _add(self.proposed_at, other.proposed_at),
            _add(self.accepted_at, other.accepted_at),
            _add(self.steps_at_k, other.steps_at_k),
        )

    @property
    def accepted_drafts_per_step(self) -> float:
        return self.accepted_drafts / self.verify_steps if self.verify_steps else 0.0

    @property
    def tokens_per_step(self) -> float:
        """Tokens emitted per verify step (accepted drafts + 1); 0 without verify steps."""
        return (self.accepted_drafts + self.verify_steps) / self.verify_steps if self.verify_steps else 0.0

    @property
    def acceptance_per_position(self) -> list[float]:
        return [a / p if p else 0.0 for a, p in zip(self.accepted_at, self.proposed_at)]
