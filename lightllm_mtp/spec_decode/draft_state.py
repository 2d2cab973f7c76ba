"""The speculative state of every request slot, on the device: its next verify block and the accept length of its
last one. Proposers and the verify rule write it; the step builder reads it. The host never needs it to build a
step, so a verify step can be queued before the previous one's results reach the host (overlap scheduling)."""

from __future__ import annotations

import torch


class DraftState:
    def __init__(self, max_reqs: int, num_draft_tokens: int, device: torch.device):
        """Rows are request slots (ReqManager), the last one the padding slot of CUDA-graph batches."""
        rows, k = max_reqs + 1, num_draft_tokens
        self.num_draft_tokens = k
        self.start = torch.zeros(rows, dtype=torch.int64, device=device)  # position of block row 0 (newest token)
        self.last_token = torch.zeros(rows, dtype=torch.int64, device=device)  # the token at `start`
        self.drafts = torch.zeros(rows, k, dtype=torch.int64, device=device)  # d_1..d_k
        self.num_drafts = torch.zeros(rows, dtype=torch.int32, device=device)  # drafts that count (< k near the end)
        self.block_slots = torch.zeros(rows, k + 1, dtype=torch.int32, device=device)  # KV slot of each block row
        # tokens the slot's last verify emitted (accepted drafts + 1); 1 after prefill
        self.accept_len = torch.ones(rows, dtype=torch.int32, device=device)
