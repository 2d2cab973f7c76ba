"""Token-granular (page size 1) KV pool for the full-attention layers (main model, later draft layers too)."""

from __future__ import annotations

import torch

from lightllm_mtp.common.slot_allocator import SlotAllocator


class KvPool:
    def __init__(
        self, num_layers: int, size: int, num_kv_heads: int, head_dim: int, dtype: torch.dtype, device: torch.device
    ):
        self.size = size
        # Slot `size` is never handed out: padding rows (CUDA graphs, DP) write there.
        self.hold_slot = size
        self.k_buffer = torch.zeros(num_layers, size + 1, num_kv_heads, head_dim, dtype=dtype, device=device)
        self.v_buffer = torch.zeros_like(self.k_buffer)
        self.allocator = SlotAllocator(size, "kv pool")

    @property
    def num_free(self) -> int:
        return self.allocator.num_free

    def alloc(self, n: int) -> torch.Tensor:
        """[n] int32 host tensor of token slots (with the prefix cache, RadixCache.alloc_kv evicts for room first)."""
        return self.allocator.alloc(n)

    def free(self, slots: torch.Tensor) -> None:
        self.allocator.free(slots)

    def layer(self, kv_layer: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(k, v) buffers of one layer, each [size+1, Hkv, D]."""
        return self.k_buffer[kv_layer], self.v_buffer[kv_layer]
