"""Per-request Gated DeltaNet state: causal-conv window and fp32 SSM state, one slot per request slot."""

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
    ):
        # conv[layer, slot]: [conv_dim, K-1] most recent inputs, oldest first (model dtype).
        self.conv = torch.zeros(num_layers, num_slots, conv_dim, conv_kernel - 1, dtype=dtype, device=device)
        # ssm[layer, slot]: [nv, dk, dv] recurrent state, always fp32.
        self.ssm = torch.zeros(
            num_layers, num_slots, num_value_heads, key_head_dim, value_head_dim, dtype=torch.float32, device=device
        )

    def layer(self, gdn_layer: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.conv[gdn_layer], self.ssm[gdn_layer]

    def bytes_per_slot(self) -> int:
        return (self.conv[:, 0].numel() * self.conv.element_size()) + (self.ssm[:, 0].numel() * 4)
