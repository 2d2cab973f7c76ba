"""A proposer's choice of each draft token: the argmax of the draft logits after the requests' logits processing
(logits_processing.py), in the context the target's verify row will see: the committed output, the tokens the verify
emitted in the same launch, and the drafts chosen before it. Every proposer (spec_decode/) chooses through
`choose_draft`, so a penalty, bias or grammar shapes the drafts as it shapes the target, and acceptance holds."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from lightllm_mtp.sampling.logits_processing import LogitsProcessing, RowMasks, process_logits


@dataclass(frozen=True)
class DraftChooser:
    """The processing of the drafting requests (B of them, in the proposer's order)."""

    processing: LogitsProcessing | None
    rows: torch.Tensor  # [B] int64: each drafting request's row in `processing`
    emitted: torch.Tensor | None  # [B, E] int64: tokens committed in this launch, -1 padded (None: none)
    # the grammar masks of draft position j given the drafts before it (None: no grammar in the batch)
    masks: Callable[[list[torch.Tensor]], RowMasks | None] | None = None


def choose_draft(logits: torch.Tensor, token_map: torch.Tensor | None, chooser: DraftChooser | None,
                 before: list[torch.Tensor]) -> torch.Tensor:  # fmt: skip
    """logits [B, V'] of one draft position for every drafting request (V': the draft vocabulary, token_map its
    ids; None: the full one); before: the drafts already chosen, [B] each. Returns [B] int64 token ids."""
    if chooser is not None:
        parts = ([chooser.emitted] if chooser.emitted is not None else []) + [d[:, None] for d in before]
        extra = torch.cat(parts, dim=1) if parts else None
        masks = chooser.masks(before) if chooser.masks is not None else None
        logits = process_logits(logits, chooser.processing, chooser.rows, extra, token_map, masks)
    best = logits.argmax(dim=-1)
    return best if token_map is None else token_map[best]
