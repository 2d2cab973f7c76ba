"""Scatter of new K/V rows into the token-granular paged KV pool."""

from __future__ import annotations

import torch

from lightllm_mtp.kernels._validate import check_device, check_dtype, check_float, check_index, check_shape
from lightllm_mtp.kernels.attention.paged_attention import KV_DTYPES, KV_FP8_DTYPE, check_kv_scales

_OP = "store_kv"
FP8_MAX = float(torch.finfo(KV_FP8_DTYPE).max)


def to_pool(x: torch.Tensor, scale: float, dtype: torch.dtype) -> torch.Tensor:
    """x as a pool of `dtype` stores it: cast; an FP8 pool stores x / scale, saturated to +-448."""
    if dtype == KV_FP8_DTYPE:
        return (x.float() * (1.0 / scale)).clamp(-FP8_MAX, FP8_MAX).to(dtype)  # as the kernels: times 1 / scale
    return x.to(dtype)


def store_kv_ref(
    k_buffer: torch.Tensor, v_buffer: torch.Tensor, mem_index: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
    k_scale: float = 1.0, v_scale: float = 1.0,
) -> None:  # fmt: skip
    idx = mem_index.long()
    k_buffer[idx] = to_pool(k, k_scale, k_buffer.dtype)
    v_buffer[idx] = to_pool(v, v_scale, v_buffer.dtype)


def store_kv(
    k_buffer: torch.Tensor, v_buffer: torch.Tensor, mem_index: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
    *, k_scale: float = 1.0, v_scale: float = 1.0,
) -> None:  # fmt: skip
    """k_buffer, v_buffer [P, Hkv, D]; mem_index [T] int32/int64 pool slots (distinct); k, v [T, Hkv, D].

    In place: k_buffer[mem_index[t]] = k[t], v_buffer[mem_index[t]] = v[t] (cast to the buffer dtype; an FP8 pool
    stores k / k_scale and v / v_scale)."""
    check_store_kv_args(_OP, k_buffer, v_buffer, mem_index, k, v)
    check_kv_scales(_OP, k_buffer, k_scale, v_scale)
    store_kv_ref(k_buffer, v_buffer, mem_index, k, v, k_scale, v_scale)


def check_store_kv_args(
    op: str, k_buffer: torch.Tensor, v_buffer: torch.Tensor, mem_index: torch.Tensor, k: torch.Tensor, v: torch.Tensor
) -> None:
    """The checks of store_kv's arguments (also those of the fused qk_norm_rope_store_kv)."""
    check_shape(op, "k_buffer", k_buffer, (None, None, None), "[P, Hkv, D]")
    check_shape(op, "v_buffer", v_buffer, tuple(k_buffer.shape), "[P, Hkv, D] like k_buffer")
    check_shape(op, "mem_index", mem_index, (None,), "[T]")
    check_index(op, "mem_index", mem_index)
    t = mem_index.shape[0]
    check_shape(op, "k", k, (t, k_buffer.shape[1], k_buffer.shape[2]), "[T, Hkv, D]")
    check_shape(op, "v", v, (t, k_buffer.shape[1], k_buffer.shape[2]), "[T, Hkv, D]")
    for name, x in (("k_buffer", k_buffer), ("v_buffer", v_buffer)):
        check_dtype(op, name, x, KV_DTYPES)
    for name, x in (("k", k), ("v", v)):
        check_float(op, name, x)
    check_device(op, k_buffer=k_buffer, v_buffer=v_buffer, mem_index=mem_index, k=k, v=v)
