"""Per-request Gated DeltaNet state: causal-conv window and fp32 SSM state.

Without speculation a request owns one conv slot of K-1 columns and one SSM row. With `num_draft_tokens` = k
draft tokens per step the conv slot is widened to K-1+k columns (see kernels/gdn/causal_conv1d_verify.py) and the
request owns k+1 consecutive SSM rows, one per verify position (see kernels/gdn/gated_delta_rule_verify.py); the
committed state is selected by the request's accept length (ForwardBatch.b_accept_len).
"""

from __future__ import annotations

import torch


class LinearAttState:
    def __init__(
        self,
        num_layers: int,
        num_slots: int,
        conv_dim: int,
        conv_kernel: int,
        num_value_heads: int,
        key_head_dim: int,
        value_head_dim: int,
        dtype: torch.dtype,
        device: torch.device,
        num_draft_tokens: int = 0,
    ):
        self.rows_per_req = 1 + num_draft_tokens
        self.conv_cols = conv_kernel - 1  # the committed window's columns
        # conv[layer, slot]: [conv_dim, K-1+k] most recent inputs, oldest first (model dtype).
        self.conv = torch.zeros(
            num_layers, num_slots, conv_dim, conv_kernel - 1 + num_draft_tokens, dtype=dtype, device=device
        )
        # ssm[layer, slot * rows_per_req + i]: [nv, dk, dv] recurrent state, always fp32.
        self.ssm = torch.zeros(
            num_layers,
            num_slots * self.rows_per_req,
            num_value_heads,
            key_head_dim,
            value_head_dim,
            dtype=torch.float32,
            device=device,
        )

    def layer(self, gdn_layer: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.conv[gdn_layer], self.ssm[gdn_layer]

    def bytes_per_slot(self) -> int:
        conv = self.conv[:, 0].numel() * self.conv.element_size()
        return conv + self.ssm[:, : self.rows_per_req].numel() * 4
