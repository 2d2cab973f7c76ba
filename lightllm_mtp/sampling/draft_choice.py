"""A proposer's choice of each draft token: the argmax of the draft logits after the requests' logits processing
(logits_processing.py), in the context the target's verify row will see: the committed output, the tokens the verify
emitted in the same launch, and the drafts chosen before it. Every proposer (spec_decode/) chooses through
`choose_draft`, so a penalty or bias shapes the drafts as it shapes the target, and acceptance holds.

A grammar's mask is not applied here: it depends on the tokens the verify emits in the same launch, which only the
host's matcher can read, and reading them back inside the launch would stall every request of the batch. Instead
each position of a grammar request keeps its best `num_candidates` ids (a small device tensor copied to the host
with the step's results); at the request's next launch the host takes the first one its grammar allows
(sampling/grammar.py `RequestGrammar.choose_drafts`): the masked argmax whenever it is among them."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from lightllm_mtp.sampling.logits_processing import LogitsProcessing, process_logits


@dataclass
class DraftChooser:
    """The processing of the drafting requests (B of them, in the proposer's order)."""

    processing: LogitsProcessing | None
    rows: torch.Tensor  # [B] int64: each drafting request's row in `processing`
    emitted: torch.Tensor | None  # [B, E] int64: tokens committed in this launch, -1 padded (None: none)
    candidate_rows: torch.Tensor | None = None  # [G] int64: the requests with a grammar (None: none)
    num_candidates: int = 0  # ids each of their draft positions keeps
    # per chosen position, [G, num_candidates] int64: the best ids of their processed logits, best first
    candidates: list[torch.Tensor] = field(default_factory=list)


def choose_draft(logits: torch.Tensor, token_map: torch.Tensor | None, chooser: DraftChooser | None,
                 before: list[torch.Tensor]) -> torch.Tensor:  # fmt: skip
    """logits [B, V'] of one draft position for every drafting request (V': the draft vocabulary, token_map its
    ids; None: the full one); before: the drafts already chosen, [B] each. Returns [B] int64 token ids."""
    if chooser is not None:
        parts = ([chooser.emitted] if chooser.emitted is not None else []) + [d[:, None] for d in before]
        extra = torch.cat(parts, dim=1) if parts else None
        logits = process_logits(logits, chooser.processing, chooser.rows, extra, token_map)
        if chooser.candidate_rows is not None:
            n = min(chooser.num_candidates, logits.shape[-1])
            best = logits.index_select(0, chooser.candidate_rows).topk(n, dim=-1).indices
            chooser.candidates.append(best if token_map is None else token_map[best])
    best = logits.argmax(dim=-1)
    return best if token_map is None else token_map[best]


def kept_candidates(chooser: DraftChooser | None, num_draft_tokens: int) -> torch.Tensor | None:
    """The candidates kept, [G, k, num_candidates] int64 (-1 past the positions chosen); None when none were."""
    if chooser is None or chooser.candidate_rows is None:
        return None
    g, n = chooser.candidate_rows.shape[0], chooser.num_candidates
    out = torch.full((g, num_draft_tokens, n), -1, dtype=torch.int64, device=chooser.candidate_rows.device)
    for j, ids in enumerate(chooser.candidates[:num_draft_tokens]):
        out[:, j, : ids.shape[1]] = ids
    return out
