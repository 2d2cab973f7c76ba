"""Scatter of new K/V rows into the token-granular paged KV pool."""

from __future__ import annotations

import torch

from lightllm_mtp.kernels._validate import check_device, check_float, check_index, check_shape

_OP = "store_kv"


def store_kv_ref(
    k_buffer: torch.Tensor, v_buffer: torch.Tensor, mem_index: torch.Tensor, k: torch.Tensor, v: torch.Tensor
) -> None:
    idx = mem_index.long()
    k_buffer[idx] = k.to(k_buffer.dtype)
    v_buffer[idx] = v.to(v_buffer.dtype)


def store_kv(
    k_buffer: torch.Tensor, v_buffer: torch.Tensor, mem_index: torch.Tensor, k: torch.Tensor, v: torch.Tensor
) -> None:
    """k_buffer, v_buffer [P, Hkv, D]; mem_index [T] int32/int64 pool slots (distinct); k, v [T, Hkv, D].

    In place: k_buffer[mem_index[t]] = k[t], v_buffer[mem_index[t]] = v[t] (cast to the buffer dtype)."""
    check_store_kv_args(_OP, k_buffer, v_buffer, mem_index, k, v)
    store_kv_ref(k_buffer, v_buffer, mem_index, k, v)


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
    for name, x in (("k_buffer", k_buffer), ("v_buffer", v_buffer), ("k", k), ("v", v)):
        check_float(op, name, x)
    check_device(op, k_buffer=k_buffer, v_buffer=v_buffer, mem_index=mem_index, k=k, v=v)
