"""Verification of a draft block: which drafted tokens the target model accepts, and what it emits.

A request's verify block has q = 1 + k rows: row 0 is the last committed token, rows 1..k the drafts
d_1..d_k. The target's row i predicts the token after row i's input, so row i is compared with d_{i+1}.

Greedy (temperature 0): accept d_{i+1} while it equals argmax(target row i); the first mismatching row m
emits its argmax instead (all k accepted -> row k emits a bonus token). Emitted: d_1..d_m, t_m.

Sampling (temperature > 0), the speculative-sampling rule that leaves the target distribution unchanged:
with p = target probabilities of row i and q = draft probabilities (one-hot at d when drafts are greedy),
accept d = d_{i+1} with probability min(1, p(d) / q(d)); on the first rejection emit a token drawn from
norm(max(0, p - q)) and stop; if every draft is accepted emit a draw from the last row's p.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from lightllm_mtp.kernels.sampling import processed_probs


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
) -> VerifyResult:
    """target_logits [B, max_q, V] fp32 (rows past 1 + b_num_drafts[b] are ignored);
    b_draft_tokens [B, max_q - 1] int64; b_num_drafts [B]; temperatures, top_ps, top_ks [B];
    draft_probs [B, max_q - 1, V] or None for greedy (one-hot) drafts. greedy_only: the caller knows every
    temperature is 0 (no host round trip to find the sampling rows)."""
    bsz, max_q, vocab = target_logits.shape
    if b_draft_tokens.shape != (bsz, max_q - 1):
        raise ValueError(f"verify_block: b_draft_tokens must be [{bsz}, {max_q - 1}], got {tuple(b_draft_tokens.shape)}")
    if draft_probs is not None and draft_probs.shape != (bsz, max_q - 1, vocab):
        raise ValueError(f"verify_block: draft_probs must be [{bsz}, {max_q - 1}, {vocab}]")
    emitted = torch.full((bsz, max_q), -1, dtype=torch.int64, device=target_logits.device)
    accept_len = torch.ones(bsz, dtype=torch.int32, device=target_logits.device)
    if greedy_only:
        target = target_logits.argmax(dim=-1)
        m = _leading_matches(target, b_draft_tokens, b_num_drafts)
        keep = torch.arange(max_q, device=target.device)[None, :] <= m[:, None]
        return VerifyResult(b_accept_len=(m + 1).to(torch.int32), emitted=torch.where(keep, target, -1))
    greedy = temperatures <= 0
    if bool(greedy.any()):
        _greedy_rows(target_logits, b_draft_tokens, b_num_drafts, greedy, emitted, accept_len)
    for b in torch.nonzero(~greedy).flatten().tolist():
        probs = processed_probs(
            target_logits[b], temperatures[b].expand(max_q), top_ps[b].expand(max_q), top_ks[b].expand(max_q)
        )
        q = None if draft_probs is None else draft_probs[b]
        tokens = _sample_block(probs, b_draft_tokens[b], int(b_num_drafts[b]), q, generators[b])
        emitted[b, : len(tokens)] = torch.tensor(tokens, device=emitted.device)
        accept_len[b] = len(tokens)
    return VerifyResult(b_accept_len=accept_len, emitted=emitted)


def _greedy_rows(logits, drafts, num_drafts, rows_mask, emitted, accept_len) -> None:
    bsz, max_q, _ = logits.shape
    target = logits.argmax(dim=-1)  # [B, max_q]
    m = _leading_matches(target, drafts, num_drafts)
    keep = torch.arange(max_q, device=logits.device)[None, :] <= m[:, None]
    out = torch.where(keep, target, torch.full_like(target, -1))
    emitted[rows_mask] = out[rows_mask]
    accept_len[rows_mask] = (m + 1).to(torch.int32)[rows_mask]


def _leading_matches(target: torch.Tensor, drafts: torch.Tensor, num_drafts: torch.Tensor) -> torch.Tensor:
    """target [B, max_q] argmax per row, drafts [B, max_q - 1] -> [B] number of leading drafts equal to target."""
    col = torch.arange(drafts.shape[1], device=target.device)
    match = (target[:, :-1] == drafts) & (col[None, :] < num_drafts[:, None])
    return torch.cumprod(match.to(torch.int64), dim=1).sum(dim=1)


def _sample_block(probs, drafts, num_drafts, draft_probs, generator) -> list[int]:
    tokens: list[int] = []
    for i in range(num_drafts):
        p, d = probs[i], int(drafts[i])
        q_d = 1.0 if draft_probs is None else float(draft_probs[i, d])
        u = float(torch.rand((), generator=generator, device=probs.device))
        if u * q_d <= float(p[d]):
            tokens.append(d)
            continue
        if draft_probs is None:
            residual = p.clone()
            residual[d] = 0.0
        else:
            residual = (p - draft_probs[i]).clamp_min(0.0)
        total = residual.sum()
        residual = residual / total if float(total) > 0 else p
        tokens.append(int(torch.multinomial(residual, 1, generator=generator)))
        return tokens
    tokens.append(int(torch.multinomial(probs[num_drafts], 1, generator=generator)))
    return tokens
