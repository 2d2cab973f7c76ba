"""Token sampling: greedy, temperature, top-k and top-p (nucleus), with per-request generators."""

from __future__ import annotations

import torch

from lightllm_mtp.kernels._validate import check_device, check_float, check_index, check_shape


def processed_probs_ref(
    logits: torch.Tensor, temperatures: torch.Tensor, top_ps: torch.Tensor, top_ks: torch.Tensor,
    min_ps: torch.Tensor | None = None,
) -> torch.Tensor:  # fmt: skip
    n, vocab = logits.shape
    dev = logits.device
    greedy = temperatures <= 0
    temps = torch.where(greedy, torch.ones_like(temperatures), temperatures).float()
    sorted_logits, sorted_idx = torch.sort(logits.float() / temps[:, None], dim=-1, descending=True, stable=True)
    rank = torch.arange(vocab, device=dev)[None, :]
    k = top_ks.long()[:, None]
    k = torch.where((k <= 0) | (k >= vocab), torch.full_like(k, vocab), k)
    drop_rank = rank >= k
    if min_ps is not None:  # min-p: tokens below min_p x the top token's probability (of the tempered softmax)
        full = torch.softmax(sorted_logits, dim=-1)
        drop_rank = drop_rank | ((full < min_ps.float()[:, None] * full[:, :1]) & (rank > 0))
    p = torch.softmax(sorted_logits.masked_fill(drop_rank, float("-inf")), dim=-1)
    # top-p: keep the smallest prefix whose mass reaches top_p, i.e. tokens whose preceding mass is < top_p.
    mass_before = torch.cumsum(p, dim=-1) - p
    top_p = top_ps.float()[:, None]
    drop = (mass_before >= top_p) & (rank > 0) & (top_p < 1.0)
    p = p.masked_fill(drop, 0.0)
    p = p / p.sum(dim=-1, keepdim=True)
    probs = torch.zeros_like(p).scatter_(-1, sorted_idx, p)
    one_hot = torch.zeros_like(probs).scatter_(-1, logits.argmax(dim=-1, keepdim=True), 1.0)
    return torch.where(greedy[:, None], one_hot, probs)


def sample_ref(
    logits: torch.Tensor,
    temperatures: torch.Tensor,
    top_ps: torch.Tensor,
    top_ks: torch.Tensor,
    generators: list[torch.Generator | None],
    sampled_rows: list[int] | None = None,
    min_ps: torch.Tensor | None = None,
) -> torch.Tensor:
    out = logits.argmax(dim=-1)
    rows = [i for i, t in enumerate(temperatures.tolist()) if t > 0] if sampled_rows is None else sampled_rows
    if not rows:
        return out
    dev = logits.device
    sel = torch.tensor(rows).to(dev, non_blocking=True)  # index tensors built on the host: no device sync
    probs = processed_probs_ref(logits[sel], temperatures[sel], top_ps[sel], top_ks[sel],
                                None if min_ps is None else min_ps[sel])  # fmt: skip
    shared = [j for j, i in enumerate(rows) if generators[i] is None]
    if shared:  # rows without their own generator draw together from the global RNG
        shared_t = torch.tensor(shared).to(dev, non_blocking=True)
        out[sel[shared_t]] = torch.multinomial(probs[shared_t], 1).squeeze(1)
    for j, i in enumerate(rows):
        if generators[i] is not None:
            out[i] = torch.multinomial(probs[j], 1, generator=generators[i])[0]
    return out


def _check_params(op: str, logits, temperatures, top_ps, top_ks) -> None:
    check_shape(op, "logits", logits, (None, None), "[B, V]")
    check_float(op, "logits", logits)
    n = logits.shape[0]
    check_shape(op, "temperatures", temperatures, (n,), "[B]")
    check_float(op, "temperatures", temperatures)
    check_shape(op, "top_ps", top_ps, (n,), "[B]")
    check_float(op, "top_ps", top_ps)
    check_shape(op, "top_ks", top_ks, (n,), "[B]")
    check_index(op, "top_ks", top_ks)
    check_device(op, logits=logits, temperatures=temperatures, top_ps=top_ps, top_ks=top_ks)


def processed_probs(
    logits: torch.Tensor, temperatures: torch.Tensor, top_ps: torch.Tensor, top_ks: torch.Tensor,
    min_ps: torch.Tensor | None = None,
) -> torch.Tensor:  # fmt: skip
    """logits [N, V]; temperatures, top_ps [N] fp32; top_ks [N] int -> probs [N, V] fp32, each row summing to 1:
    the distribution `sample` draws from. Rows with temperature <= 0 are one-hot at the argmax.

    softmax(logits / temperature) without the tokens below min_p x its top probability (min_ps [N], None: off),
    restricted to the top_k tokens (top_k <= 0 or >= V: off), renormalised, then
    to the smallest prefix of the sorted distribution whose mass reaches top_p (top_p >= 1: off; the top token
    is always kept), renormalised. Ties are ranked by token id."""
    _check_params("processed_probs", logits, temperatures, top_ps, top_ks)
    return processed_probs_ref(logits, temperatures, top_ps, top_ks, min_ps)


def sample(
    logits: torch.Tensor,
    temperatures: torch.Tensor,
    top_ps: torch.Tensor,
    top_ks: torch.Tensor,
    generators: list[torch.Generator | None],
    sampled_rows: list[int] | None = None,
    min_ps: torch.Tensor | None = None,
) -> torch.Tensor:
    """logits [B, V]; temperatures, top_ps [B] fp32; top_ks [B] int; generators: one per row -> tokens [B] int64.
    sampled_rows: the host's list of rows with temperature > 0, so that no host sync reads `temperatures`
    (None: read them).

    temperature <= 0: argmax (consumes no randomness). Otherwise one torch.multinomial draw from
    processed_probs(...) using that row's generator (None: the global RNG), so a seeded generator gives
    reproducible tokens."""
    _check_params("sample", logits, temperatures, top_ps, top_ks)
    if len(generators) != logits.shape[0]:
        raise ValueError(f"sample: generators must have one entry per row ({logits.shape[0]}), got {len(generators)}")
    return sample_ref(logits, temperatures, top_ps, top_ks, generators, sampled_rows, min_ps)


def greedy_sample(logits: torch.Tensor) -> torch.Tensor:
    """logits [B, V] -> argmax token ids [B] int64 (first index on ties)."""
    check_shape("greedy_sample", "logits", logits, (None, None), "[B, V]")
    return logits.argmax(dim=-1)
