"""The logprobs of emitted tokens: the log-softmax of the target's raw logits at the row that emitted each token
(vLLM's default, `raw_logprobs`), and its top alternatives. Under speculative decoding a token emitted from an
accepted draft takes the logprob of the verify row that accepted it, which is the row plain decoding computes."""

from __future__ import annotations

import torch

TokenLogprob = tuple[float, tuple[tuple[int, float], ...]]  # (logprob of the token, ((id, logprob) top ones))


def emitted_logprobs(logits: torch.Tensor, tokens: torch.Tensor, num_top: int) -> torch.Tensor:
    """logits [N, V], tokens [N] int64 (negative: no token, any value) -> [N, 1 + 2 * num_top] float64: the token's
    logprob, then num_top (id, logprob) pairs, best first; ids are exact in float64."""
    lp = torch.log_softmax(logits.float(), dim=-1)
    chosen = lp.gather(1, tokens.clamp_min(0)[:, None])
    parts = [chosen.double()]
    if num_top:
        values, ids = lp.topk(num_top, dim=-1)
        parts.append(torch.stack([ids.double(), values.double()], dim=2).flatten(1))
    return torch.cat(parts, dim=1)


def unpack(row: list[float], num_top: int) -> TokenLogprob:
    """One row of emitted_logprobs on the host, with a request's own number of top alternatives."""
    top = tuple((int(row[1 + 2 * j]), row[2 + 2 * j]) for j in range(num_top))
    return row[0], top
