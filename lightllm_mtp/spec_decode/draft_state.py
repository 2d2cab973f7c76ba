"""The speculative state of every request slot, on the device: its next verify block and the accept length of its
last one. Proposers and the verify rule write it; the step builder reads it. The host never needs it to build a
step, so a verify step can be queued before the previous one's results reach the host (overlap scheduling).

One int64 row per request slot, so that building a step is one gather and opening blocks one scatter:
    [start, num_drafts, accept_len, last_token, d_1..d_k, slot_0..slot_k]   (the block's input ids are contiguous)

Multi-layer MTP also keeps, per slot, the context of its draft window (the P = modules - 1 committed rows before
`start` that every draft pass recomputes): the target's hidden at positions start-P..start-1 and the tokens at
start-P+1..start-1.
"""

from __future__ import annotations

import torch

START, NUM_DRAFTS, ACCEPT_LEN, LAST_TOKEN, DRAFTS = 0, 1, 2, 3, 4


class DraftState:
    def __init__(
        self,
        max_reqs: int,
        num_draft_tokens: int,
        device: torch.device,
        num_context_rows: int = 0,
        hidden_size: int = 0,
        dtype: torch.dtype = torch.float32,
    ):
        """Rows are request slots (ReqManager), the last one the padding slot of CUDA-graph batches."""
        k = self.num_draft_tokens = num_draft_tokens
        self.slots_col = DRAFTS + k  # first of the k+1 KV-slot columns
        self.table = torch.zeros(max_reqs + 1, DRAFTS + 2 * k + 1, dtype=torch.int64, device=device)
        self.table[:, ACCEPT_LEN] = 1
        p = self.num_context_rows = num_context_rows
        self.context_hidden = torch.zeros(max_reqs + 1, p, hidden_size, dtype=dtype, device=device)
        self.context_tokens = torch.full((max_reqs + 1, max(p - 1, 0)), -1, dtype=torch.int64, device=device)

    # views, for readers and tests
    @property
    def start(self) -> torch.Tensor:  # [R] position of block row 0 (the newest emitted token)
        return self.table[:, START]

    @property
    def last_token(self) -> torch.Tensor:  # [R] the token at `start`
        return self.table[:, LAST_TOKEN]

    @property
    def num_drafts(self) -> torch.Tensor:  # [R] drafts that count (fewer than k near max_model_len)
        return self.table[:, NUM_DRAFTS]

    @property
    def accept_len(self) -> torch.Tensor:  # [R] tokens the last verify emitted (accepted drafts + 1); 1 after prefill
        return self.table[:, ACCEPT_LEN]

    @property
    def drafts(self) -> torch.Tensor:  # [R, k] d_1..d_k
        return self.table[:, DRAFTS : self.slots_col]

    @property
    def block_slots(self) -> torch.Tensor:  # [R, k+1] KV slot of each block row (the padding slot past num_drafts)
        return self.table[:, self.slots_col :]

    def write_drafts(self, b_req_idx: torch.Tensor, drafts: torch.Tensor) -> None:
        """drafts [B, n], n <= k: d_1..d_n of each request (the rest of its row is left as it was)."""
        self.table[b_req_idx.to(torch.int64), DRAFTS : DRAFTS + drafts.shape[1]] = drafts

    def replace_drafts(self, b_req_idx: torch.Tensor, drafts: torch.Tensor, counts: torch.Tensor) -> None:
        """Drafts chosen again on the host (a grammar's, engine/grammar_rows.py): drafts [B, k] replace each request's
        d_1..d_k, of which the first counts [B] count (never more than its block held)."""
        idx = b_req_idx.to(torch.int64)
        self.table[idx, DRAFTS : self.slots_col] = drafts
        self.table[idx, NUM_DRAFTS] = torch.minimum(self.table[idx, NUM_DRAFTS], counts)

    def block_drafts(self, b_req_idx: torch.Tensor) -> torch.Tensor:
        """[B, 1 + k]: each request's draft count, then d_1..d_k (a copy)."""
        idx = b_req_idx.to(torch.int64)
        return torch.cat([self.table[idx, NUM_DRAFTS : NUM_DRAFTS + 1], self.table[idx, DRAFTS : self.slots_col]], 1)

    def set_block_drafts(self, b_req_idx: torch.Tensor, rows: torch.Tensor) -> None:
        """The inverse of block_drafts: rows [B, 1 + k] (count, d_1..d_k) written back."""
        idx = b_req_idx.to(torch.int64)
        self.table[idx, NUM_DRAFTS] = rows[:, 0]
        self.table[idx, DRAFTS : self.slots_col] = rows[:, 1:]
