"""Typed metadata of one forward pass, built before the forward and never extended during it."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from typing import Callable

import torch

from lightllm_mtp.common.state_snapshots import SnapshotPlan


class ForwardMode(Enum):
    # Ragged batch: every request brings q_len >= 1 new tokens after an optional cached prefix
    # (prefill, chunked prefill, and decode rows mixed into a prefill step).
    EXTEND = "extend"
    # Every request brings exactly one token.
    DECODE = "decode"
    # Speculative verify: each request brings a block [last committed token, draft_1..draft_k] (k may
    # differ per request); GDN layers keep per-position state so that any accepted prefix can continue.
    VERIFY = "verify"


@dataclass
class ForwardBatch:
    mode: ForwardMode
    input_ids: torch.Tensor  # [T] int64
    positions: torch.Tensor  # [T] int64 absolute position of each token
    mem_index: torch.Tensor  # [T] int32 KV pool slot of each new token
    b_req_idx: torch.Tensor  # [B] int32 request slot (page-table row, linear-state slot)
    b_seq_len: torch.Tensor  # [B] int32 KV length after this forward (cached prefix + new tokens)
    b1_cu_q_len: torch.Tensor  # [B+1] int32 prefix sums of new-token counts
    b_has_initial_state: torch.Tensor  # [B] bool: linear state carries a cached prefix
    b_logits_index: torch.Tensor  # [N] int64 rows of the T tokens whose logits are wanted
    max_q_len: int  # host copy, for kernels that size their grid by it
    # VERIFY only: tokens each request's previous verify emitted (accepted drafts + 1; 1 after prefill). The GDN
    # layers read their committed conv window and SSM row at index b_accept_len - 1.
    b_accept_len: torch.Tensor | None = None  # [B] int32
    # VERIFY only: the state position (conv column, SSM row) where the block's states are written; None: 0. A draft
    # model's chain step writes one position after the one it reads (b_accept_len - 1), keeping the committed one.
    b_state_write: torch.Tensor | None = None  # [B] int32
    keep_all_hidden: bool = False  # ModelOutput.hidden covers all T rows (MTP drafting) instead of the logits rows
    snapshot_plan: SnapshotPlan | None = None  # EXTEND: GDN state snapshots to fill (prefix cache)
    # EXTEND: each request's new-token count as the host knows it (None: unknown), for kernels that size work tables
    # on the host without reading b1_cu_q_len (the GDN prefill's chunk table)
    host_q_lens: tuple[int, ...] | None = None
    # EXTEND: rows past b1_cu_q_len[B] are a prefill graph bucket's padding (common/basemodel/prefill_graph.py):
    # their activations are garbage, which layers that route rows by value (MoE) zero first
    padded: bool = False
    # EXTEND over image tokens (multimodal/): the rows whose input embedding is not the token's but a vision embedding
    # (row indices [n] int64, vectors [n, H]); ahead_embeds[d - 1]: the same for the token d positions after each row's
    # input (the MTP modules' prompt pass reads those); mrope_positions [3, T] int64: every row's t / h / w rope
    # position (None: `positions` plus the request's rope delta, common/layers/rope_positions.py)
    input_embeds: tuple[torch.Tensor, torch.Tensor] | None = None
    ahead_embeds: tuple[tuple[torch.Tensor, torch.Tensor] | None, ...] = ()
    mrope_positions: torch.Tensor | None = None
    # device tensors derived from the fields once per forward and shared by the layers (see `derived`)
    _derived: dict = field(default_factory=dict, init=False, repr=False, compare=False)

    def derived(self, name: str, make: Callable[[], torch.Tensor]) -> torch.Tensor:
        """`make()` on the first call for `name` in this forward, the same tensor afterwards (e.g. the GDN
        layers' SSM rows: one kernel per forward instead of one per layer)."""
        if name not in self._derived:
            self._derived[name] = make()
        return self._derived[name]

    def real_rows(self) -> torch.Tensor:
        """[T, 1] bool: the rows before b1_cu_q_len[B] (a padded batch's real tokens), made once per forward."""
        return self.derived("real_rows", lambda: (torch.arange(self.num_tokens, device=self.b1_cu_q_len.device)
                                                  < self.b1_cu_q_len[-1]).unsqueeze(1))  # fmt: skip

    @property
    def has_image_rows(self) -> bool:
        """Rows with vision embeddings or M-RoPE grid positions: such forwards run eagerly, never from a graph."""
        return self.input_embeds is not None or self.mrope_positions is not None or any(self.ahead_embeds)

    @property
    def num_tokens(self) -> int:
        return self.input_ids.shape[0]

    @property
    def batch_size(self) -> int:
        return self.b_req_idx.shape[0]


@dataclass
class ModelOutput:
    logits: torch.Tensor  # [N, V] fp32, rows of b_logits_index
    hidden: torch.Tensor  # [N, H] final-norm hidden of the same rows ([T, H] with keep_all_hidden): MTP input
    # pipeline stages before the last: (delta, residual) [T, H] each, the residual stream the next stage receives
    to_next_stage: tuple[torch.Tensor, torch.Tensor] | None = None
