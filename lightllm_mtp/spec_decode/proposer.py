"""The proposer contract: what a draft method reads of a target forward and what it returns.

A proposer runs right after a target forward (a verify step or prompt chunks), on the device, before the host has
seen that forward's results. It reads the target's rows (batch, final-norm hidden of every row, the committed
tokens after each row) and returns k drafts for each request whose next verify block is open in DraftState (the
step builder placed block row 0 at the newest emitted token). Drafts are greedy: their distribution is one-hot,
which the verify rule takes as q when it samples. Each draft token is chosen by sampling/draft_choice.py's
`choose_draft` (the requests' penalties and bias applied in the verify row's context; a grammar's drafts are then
chosen on the host from the candidates it keeps).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass

import torch

from lightllm_mtp.common.basemodel.forward_batch import ForwardBatch
from lightllm_mtp.sampling.draft_choice import DraftChooser


@dataclass(frozen=True)
class CommittedBlocks:
    """What a target forward committed per drafting request, as a block: row 0 at position b_start, its first
    b_accept_len rows committed, the newest token at b_start + b_accept_len. After a verify these are the verified
    blocks; after a prompt, the last prompt row (accept length 1, the sampled token the newest)."""

    b_start: torch.Tensor  # [B] int64
    b_accept_len: torch.Tensor  # [B] int64
    b_row0: torch.Tensor  # [B] int64 the target row (of DraftInput.hidden) of block row 0
    b_tokens: torch.Tensor  # [B, C] int64 tokens at positions b_start, b_start + 1, ..; -1 where not committed


@dataclass(frozen=True)
class DraftInput:
    batch: ForwardBatch  # the target forward's rows (VERIFY blocks, or EXTEND prompt chunks)
    hidden: torch.Tensor  # [T, H] the target's final-norm hidden of every row
    # prompt chunks: [T, lookahead] int64, the committed token 1, 2, .. positions after each row's input, -1 past
    # the newest token; None for verify steps, whose proposers read `blocks` through the draft window
    next_tokens: torch.Tensor | None
    logits_rows: torch.Tensor | None  # [N] rows whose draft logits are needed (None: every row)
    anchor_rows: torch.Tensor  # [B] per drafting request: the row whose next token is the newest emitted one
    anchor_logits: torch.Tensor  # [B] the same rows as indices into logits_rows (== anchor_rows when None)
    b_req_idx: torch.Tensor  # [B] int32 the drafting requests' slots (their next blocks are open)
    blocks: CommittedBlocks | None = None  # per drafting request; None for prompt chunks that finish no prompt
    num_drafts: int | None = None  # drafts the new blocks hold at most (adaptive speculation); None: k
    chooser: DraftChooser | None = None  # the drafting requests' logits processing (None: plain argmax)


class Proposer(ABC):
    """Draft k tokens per request. Implementations (mtp_proposer.py): MTP eagle, parallel drafting, multi-layer MTP."""

    num_draft_tokens: int  # k
    lookahead: int  # columns of DraftInput.next_tokens it reads

    @abstractmethod
    def propose(self, inp: DraftInput) -> torch.Tensor:
        """[B, n] int64 drafts d_1..d_n (n >= inp.num_drafts, at most k) for the anchor rows' requests, on the
        device, without a host sync. Also writes
        whatever state the method keeps (the MTP modules' KV over the target's rows)."""

