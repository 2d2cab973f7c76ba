"""Token-granular (page size 1) KV pool for the full-attention layers (main model, then the MTP draft modules').

The target's layers and the draft modules' may have different dtypes (kv_cache_dtype / draft_kv_cache_dtype): an
FP8 (e4m3) layer stores K / k_scale and V / v_scale with per-tensor scales (1.0 unless the checkpoint provides
them; common/kv_scales.py), which the attention kernels multiply back. With one dtype for all, one buffer."""

from __future__ import annotations

import torch

from lightllm_mtp.common.slot_allocator import SlotAllocator

FP8_KV_DTYPE = torch.float8_e4m3fn


class KvPool:
    def __init__(
        self, num_layers: int, size: int, num_kv_heads: int, head_dim: int, dtype: torch.dtype, device: torch.device,
        *, draft_layers: int = 0, draft_dtype: torch.dtype | None = None,
    ):  # fmt: skip
        """num_layers: the model's own full-attention layers; draft_layers: the MTP draft modules' after them, in
        draft_dtype (default dtype)."""
        self.size = size
        # Slot `size` is never handed out: padding rows (CUDA graphs, DP) write there.
        self.hold_slot = size
        draft_dtype = draft_dtype or dtype
        self.num_model_layers = num_layers
        self.dtypes = [dtype] * num_layers + [draft_dtype] * draft_layers
        shape = (size + 1, num_kv_heads, head_dim)
        together = draft_dtype == dtype or draft_layers == 0
        self.k_buffer = torch.zeros(num_layers + (draft_layers if together else 0), *shape, dtype=dtype, device=device)
        self.v_buffer = torch.zeros_like(self.k_buffer)
        self.draft_k_buffer = self.draft_v_buffer = None  # the draft layers when their dtype differs
        if not together:
            self.draft_k_buffer = torch.zeros(draft_layers, *shape, dtype=draft_dtype, device=device)
            self.draft_v_buffer = torch.zeros_like(self.draft_k_buffer)
        self._scales = [(1.0, 1.0)] * len(self.dtypes)
        self.allocator = SlotAllocator(size, "kv pool")

    @property
    def num_free(self) -> int:
        return self.allocator.num_free

    @property
    def bytes_per_token(self) -> int:
        """K and V of one token slot in every layer."""
        buffers = [self.k_buffer] + ([self.draft_k_buffer] if self.draft_k_buffer is not None else [])
        return sum(2 * b[:, 0].numel() * b.element_size() for b in buffers)

    def alloc(self, n: int) -> torch.Tensor:
        """[n] int32 host tensor of token slots (with the prefix cache, RadixCache.alloc_kv evicts for room first)."""
        return self.allocator.alloc(n)

    def free(self, slots: torch.Tensor) -> None:
        self.allocator.free(slots)

    def layer(self, kv_layer: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(k, v) buffers of one layer, each [size+1, Hkv, D]."""
        if self.draft_k_buffer is not None and kv_layer >= self.num_model_layers:
            j = kv_layer - self.num_model_layers
            return self.draft_k_buffer[j], self.draft_v_buffer[j]
        return self.k_buffer[kv_layer], self.v_buffer[kv_layer]

    def scales(self, kv_layer: int) -> tuple[float, float]:
        """(k_scale, v_scale) of one layer: K = stored * k_scale in an FP8 layer, (1.0, 1.0) elsewhere."""
        return self._scales[kv_layer]

    def set_scales(self, kv_layer: int, k_scale: float, v_scale: float) -> None:
        if self.dtypes[kv_layer] != FP8_KV_DTYPE:
            raise ValueError(f"kv layer {kv_layer} is {self.dtypes[kv_layer]}: KV scales apply to FP8 layers only")
        if not (k_scale > 0 and v_scale > 0):
            raise ValueError(f"kv layer {kv_layer}: k_scale / v_scale must be > 0, got {k_scale} / {v_scale}")
        self._scales[kv_layer] = (float(k_scale), float(v_scale))

    def is_fp8(self, kv_layer: int) -> bool:
        return self.dtypes[kv_layer] == FP8_KV_DTYPE
