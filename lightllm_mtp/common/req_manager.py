"""Request slots: the page table `req_to_token` and, for hybrid models, the per-request linear-attention state."""

from __future__ import annotations

import torch

from lightllm_mtp.common.linear_att_state import LinearAttState
from lightllm_mtp.common.slot_allocator import SlotAllocator


class ReqManager:
    def __init__(
        self,
        max_reqs: int,
        max_model_len: int,
        device: torch.device,
        linear_state: LinearAttState | None,
        padding_columns: int = 0,
    ):
        """padding_columns: page-table columns past max_model_len. A speculative verify block near max_model_len keeps
        its k+1 rows (uniform layout); rows past the end sit at positions max_model_len.. whose columns hold the
        padding KV slot and are never written by a live row."""
        self.max_reqs = max_reqs
        self.max_model_len = max_model_len
        # Row `max_reqs` is never handed out: padding rows point there.
        self.hold_req = max_reqs
        # req_to_token[req, pos] = KV pool slot of that request's token at position pos.
        self.req_to_token = torch.zeros(max_reqs + 1, max_model_len + padding_columns, dtype=torch.int32, device=device)
        self.linear_state = linear_state
        self.allocator = SlotAllocator(max_reqs, "request slots")

    @property
    def num_free(self) -> int:
        return self.allocator.num_free

    def alloc(self) -> int:
        return int(self.allocator.alloc(1)[0])

    def free(self, req_idx: int) -> None:
        self.allocator.free(torch.tensor([req_idx], dtype=torch.int32))
