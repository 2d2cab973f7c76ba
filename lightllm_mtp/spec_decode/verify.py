"""Verification of a draft block: which drafted tokens the target model accepts, and what it emits.

A request's verify block has q = 1 + k rows: row 0 is the last committed token, rows 1..k the drafts
d_1..d_k. The target's row i predicts the token after row i's input, so row i is compared with d_{i+1}.

Greedy (temperature 0): accept d_{i+1} while it equals argmax(target row i); the first mismatching row m
emits its argmax instead (all k accepted -> row k emits a bonus token). Emitted: d_1..d_m, t_m.

Sampling (temperature > 0), the speculative-sampling rule that leaves the target distribution unchanged:
with p = target probabilities of row i and q = draft probabilities (one-hot at d when drafts are greedy),
accept d = d_{i+1} with probability min(1, p(d) / q(d)); on the first rejection emit a token drawn from
norm(max(0, p - q)) and stop; if every draft is accepted emit a draw from the last row's p. All rows of a
batch are decided together on the device (no host round trip); a temperature-0 row in a mixed batch has a
one-hot p, for which this rule is exactly the greedy one.

Forced acceptance (benchmarking, `mtp_force_acceptance`, config/forced_acceptance.py): draft d_{i+1} is accepted,
without being checked, when a uniform draw is below the rate of position i, up to the first draw that is not; the
first row m not accepted emits the target's token (greedy: its argmax; sampling: a draw from its p), so the emitted
tokens are d_1..d_m, t_m. The device work of the real rule (the target's rows processed as it processes them; the
draft probabilities are not read) plus one row of uniforms per request under greedy, no host sync: the step costs
what real acceptance at that length costs.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from lightllm_mtp.config.forced_acceptance import ForcedAcceptance
from lightllm_mtp.kernels.sampling.sampling import processed_probs

FORCED_ACCEPTANCE_SEED = 0  # the coin of requests without a seed: the same on every rank of a tp / pp group


@dataclass(frozen=True)
class ForcedAcceptRule:
    """The device side of ForcedAcceptance: its rates, and the generator drawing the coin of requests without a seed
    (their own generator otherwise). Every rank builds it with the same seed and replays the same verify steps, so the
    tp ranks of a group draw the same accept lengths."""

    rates: torch.Tensor  # [k] float32: conditional acceptance rate of each draft position
    generator: torch.Generator

    @classmethod
    def on_device(cls, forced: ForcedAcceptance, device: torch.device) -> ForcedAcceptRule:
        rates = torch.tensor(forced.rates, dtype=torch.float32, device=device)
        return cls(rates, torch.Generator(device=device).manual_seed(FORCED_ACCEPTANCE_SEED))


@dataclass
class VerifyResult:
    b_accept_len: torch.Tensor  # [B] int32: tokens emitted by each request (accepted drafts + 1), >= 1
    emitted: torch.Tensor  # [B, max_q] int64: emitted tokens, row-padded with -1


def verify_block(
    target_logits: torch.Tensor,
    b_draft_tokens: torch.Tensor,
    b_num_drafts: torch.Tensor,
    temperatures: torch.Tensor,
    top_ps: torch.Tensor,
    top_ks: torch.Tensor,
    generators: list[torch.Generator | None],
    draft_probs: torch.Tensor | None = None,
    greedy_only: bool = False,
    draw_width: int | None = None,
    forced: ForcedAcceptRule | None = None,
    min_ps: torch.Tensor | None = None,
) -> VerifyResult:
    """target_logits [B, max_q, V] fp32 (rows past 1 + b_num_drafts[b] are ignored);
    b_draft_tokens [B, max_q - 1] int64; b_num_drafts [B]; temperatures, top_ps, top_ks [B];
    draft_probs [B, max_q - 1, V] or None for greedy (one-hot) drafts. greedy_only: the caller knows every
    temperature is 0 (no host round trip to find the sampling rows). draw_width: uniforms drawn per request and
    step (>= max_q - 1; None: max_q - 1), so that a seeded request's random stream does not depend on how many
    drafts a step verifies (adaptive speculation). forced: accept by the rule's coin instead (benchmarking)."""
    bsz, max_q, vocab = target_logits.shape
    if b_draft_tokens.shape != (bsz, max_q - 1):
        raise ValueError(f"verify_block: b_draft_tokens must be [{bsz}, {max_q - 1}], got {tuple(b_draft_tokens.shape)}")
    if draft_probs is not None and draft_probs.shape != (bsz, max_q - 1, vocab):
        raise ValueError(f"verify_block: draft_probs must be [{bsz}, {max_q - 1}, {vocab}]")
    width = max(max_q - 1, draw_width or 0)
    if forced is not None:
        return _forced_rows(target_logits, b_draft_tokens, b_num_drafts, temperatures, top_ps, top_ks, generators,
                            forced, greedy_only, width, min_ps)  # fmt: skip
    if greedy_only:
        target = target_logits.argmax(dim=-1)
        m = _leading_matches(target, b_draft_tokens, b_num_drafts)
        keep = torch.arange(max_q, device=target.device)[None, :] <= m[:, None]
        return VerifyResult(b_accept_len=(m + 1).to(torch.int32), emitted=torch.where(keep, target, -1))
    return _speculative_rows(target_logits, b_draft_tokens, b_num_drafts, temperatures, top_ps, top_ks, generators,
                             draft_probs, width, min_ps)


def _speculative_rows(logits, drafts, num_drafts, temps, top_ps, top_ks, generators, draft_probs,
                      draw_width, min_ps=None) -> VerifyResult:  # fmt: skip
    """The sampling rule for every row at once, on the device, no host sync. Temperature-0 rows get one-hot
    target probabilities, for which the rule (strict u * q(d) < p(d)) is exactly greedy first-mismatch."""
    bsz, max_q, vocab = logits.shape
    k, dev = max_q - 1, logits.device
    probs = processed_probs(
        logits.reshape(-1, vocab), temps.repeat_interleave(max_q), top_ps.repeat_interleave(max_q),
        top_ks.repeat_interleave(max_q), None if min_ps is None else min_ps.repeat_interleave(max_q),
    ).view(bsz, max_q, vocab)  # fmt: skip
    rows = torch.arange(bsz, device=dev)
    d = drafts.clamp_min(0)  # [B, k]
    m = torch.zeros(bsz, dtype=torch.int64, device=dev)
    if k > 0:
        p_d = probs[:, :k].gather(2, d[..., None]).squeeze(-1)  # [B, k]
        q_d = torch.ones_like(p_d) if draft_probs is None else draft_probs.gather(2, d[..., None]).squeeze(-1)
        u = _per_row(lambda g, r: torch.rand(r.stop - r.start, draw_width, device=dev, generator=g), generators)
        u = u[:, :k]
        accept = (u * q_d < p_d) & (torch.arange(k, device=dev)[None, :] < num_drafts[:, None])
        m = torch.cumprod(accept.to(torch.int64), dim=1).sum(dim=1)
    row_p = probs[rows, m]  # [B, V] target distribution after the last accepted draft
    final = row_p
    if k > 0:
        rejected = m < num_drafts
        d_m = d[rows, m.clamp(max=k - 1)]
        if draft_probs is None:  # one-hot draft: p with the rejected token removed
            residual = row_p.scatter(1, d_m[:, None], 0.0)
        else:
            residual = (row_p - draft_probs[rows, m.clamp(max=k - 1)]).clamp_min(0.0)
        total = residual.sum(dim=1, keepdim=True)
        residual = torch.where(total > 0, residual / total.clamp_min(1e-30), row_p)
        final = torch.where(rejected[:, None], residual, row_p)
    last = _per_row(lambda g, r: torch.multinomial(final[r], 1, generator=g).squeeze(1), generators)
    cols = torch.arange(max_q, device=dev)[None, :]
    emitted = torch.where(cols < m[:, None], torch.nn.functional.pad(d, (0, 1)), -1)
    emitted[rows, m] = last
    return VerifyResult(b_accept_len=(m + 1).to(torch.int32), emitted=emitted)


def _forced_rows(logits, drafts, num_drafts, temps, top_ps, top_ks, generators, forced: ForcedAcceptRule,
                 greedy_only: bool, draw_width: int, min_ps=None) -> VerifyResult:  # fmt: skip
    """Forced acceptance for every row at once, on the device, no host sync: m = the leading draws below their
    position's rate (capped by each request's draft count); rows < m emit the drafts, row m the target's token."""
    bsz, max_q, vocab = logits.shape
    k, dev = max_q - 1, logits.device
    rows = torch.arange(bsz, device=dev)
    u = _per_row(lambda g, r: torch.rand(r.stop - r.start, draw_width, device=dev, generator=g), generators,
                 forced.generator)[:, :k]  # fmt: skip
    accept = (u < forced.rates[None, :k]) & (torch.arange(k, device=dev)[None, :] < num_drafts[:, None])
    m = torch.cumprod(accept.to(torch.int64), dim=1).sum(dim=1)
    if greedy_only:  # every row's argmax, as the greedy rule computes it
        last = logits.argmax(dim=-1)[rows, m]
    else:  # every row processed, as the sampling rule does; the token of row m drawn from its p
        probs = processed_probs(
            logits.reshape(-1, vocab), temps.repeat_interleave(max_q), top_ps.repeat_interleave(max_q),
            top_ks.repeat_interleave(max_q), None if min_ps is None else min_ps.repeat_interleave(max_q),
        ).view(bsz, max_q, vocab)  # fmt: skip
        row_p = probs[rows, m]
        last = _per_row(lambda g, r: torch.multinomial(row_p[r], 1, generator=g).squeeze(1), generators)
    cols = torch.arange(max_q, device=dev)[None, :]
    emitted = torch.where(cols < m[:, None], torch.nn.functional.pad(drafts, (0, 1)), -1)
    emitted[rows, m] = last
    return VerifyResult(b_accept_len=(m + 1).to(torch.int32), emitted=emitted)


def _per_row(draw, generators: list[torch.Generator | None], default: torch.Generator | None = None) -> torch.Tensor:
    """draw(generator, rows: slice) -> random tensor for those rows. Rows of requests with their own generator (a
    seed) are drawn from it, the others from `default` (None: torch's default generator) in one call."""
    out = draw(default, slice(0, len(generators)))
    for b, g in enumerate(generators):
        if g is not None:
            out[b] = draw(g, slice(b, b + 1))[0]
    return out


def _leading_matches(target: torch.Tensor, drafts: torch.Tensor, num_drafts: torch.Tensor) -> torch.Tensor:
    """target [B, max_q] argmax per row, drafts [B, max_q - 1] -> [B] number of leading drafts equal to target."""
    col = torch.arange(drafts.shape[1], device=target.device)
    match = (target[:, :-1] == drafts) & (col[None, :] < num_drafts[:, None])
    return torch.cumprod(match.to(torch.int64), dim=1).sum(dim=1)
