"""The grammar masks of a step's rows (sampling/grammar.py), for the requests of the step that have a grammar.

Plain sampling: one row per request, after its committed output. A verify block: q rows, row i after the drafts
d_1..d_i the host collected with the step that opened the block (Request.next_drafts). A draft position: after the
tokens the verify of the same launch emitted and the drafts chosen before it; those are on the device, so building
these masks reads them back (a sync inside the launch, only in launches holding a grammar request). Such requests
are never in a step launched while one of theirs is in flight (SamplingParams.reads_history): the matcher is
always the committed output's.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from lightllm_mtp.engine.request import Request
from lightllm_mtp.sampling.grammar import new_bitmask, row_masks
from lightllm_mtp.sampling.logits_processing import RowMasks


def sampling_masks(reqs: list[Request], vocab_size: int, device: torch.device) -> RowMasks | None:
    """One row per request: the tokens its grammar allows next; None when no request has a grammar."""
    if not any(r.grammar is not None for r in reqs):
        return None
    bitmask = new_bitmask(len(reqs), vocab_size)
    for b, r in enumerate(reqs):
        if r.grammar is not None:
            r.grammar.fill_after([], bitmask, b)
    return row_masks(bitmask, vocab_size, device)


def verify_masks(reqs: list[Request], q: int, vocab_size: int, device: torch.device) -> RowMasks | None:
    """q rows per request (its verify block); None when no request has a grammar."""
    if not any(r.grammar is not None for r in reqs):
        return None
    bitmask = new_bitmask(len(reqs) * q, vocab_size)
    for b, r in enumerate(reqs):
        if r.grammar is not None:
            r.grammar.fill_block(r.next_drafts[: q - 1], bitmask, b * q)
    return row_masks(bitmask, vocab_size, device)


def draft_masks(reqs: list[Request], emitted: torch.Tensor, vocab_size: int,
                device: torch.device) -> Callable[[list[torch.Tensor]], RowMasks | None] | None:  # fmt: skip
    """For DraftChooser.masks: the masks of a draft position given the drafts before it (one row per request);
    emitted [B, E]: the tokens committed in this launch, -1 padded. None when no request has a grammar."""
    if not any(r.grammar is not None for r in reqs):
        return None
    host: list[list[int]] = []

    def masks(before: list[torch.Tensor]) -> RowMasks:
        if not host:
            host.extend([t for t in row if t >= 0] for row in emitted.tolist())
        chosen = torch.stack(before, dim=1).tolist() if before else [[] for _ in reqs]
        bitmask = new_bitmask(len(reqs), vocab_size)
        for b, r in enumerate(reqs):
            if r.grammar is not None:
                r.grammar.fill_after(host[b] + chosen[b], bitmask, b)
        return row_masks(bitmask, vocab_size, device)

    return masks
