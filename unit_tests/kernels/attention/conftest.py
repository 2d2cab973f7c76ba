"""Shared builders for the kernel tests: a scattered paged-KV layout and its dense attention oracle."""

from dataclasses import dataclass

import pytest
import torch


@dataclass
class PagedKV:
    k_buffer: torch.Tensor  # [P, Hkv, D]
    v_buffer: torch.Tensor
    req_to_token: torch.Tensor  # [R, M] int32
    b_req_idx: torch.Tensor  # [B] int32
    b_seq_len: torch.Tensor  # [B] int32
    keys: list  # per request contiguous K [L, Hkv, D]
    values: list


def build_paged_kv(seq_lens, hkv, d, dtype, seed, dv=None):
    """K/V of each request at scattered, non-contiguous pool slots. Unused pool rows hold large junk and page-table
    entries past a request's length are out of range, so reading either is caught."""
    gen = torch.Generator().manual_seed(seed)
    dv = d if dv is None else dv
    total = sum(seq_lens)
    pool = 2 * total + 7
    k_buffer = (torch.randn(pool, hkv, d, generator=gen) * 50).to(dtype)  # junk rows would dominate if read
    v_buffer = (torch.randn(pool, hkv, dv, generator=gen) * 50).to(dtype)
    max_len = max(seq_lens) + 5
    num_slots = len(seq_lens) + 3
    req_to_token = torch.full((num_slots, max_len), pool + 10**6, dtype=torch.int32)
    b_req_idx = torch.randperm(num_slots, generator=gen)[: len(seq_lens)].to(torch.int32)
    slots = torch.randperm(pool, generator=gen)[:total]
    keys, values, start = [], [], 0
    for r, length in zip(b_req_idx.tolist(), seq_lens):
        s = slots[start : start + length]
        start += length
        k = torch.randn(length, hkv, d, generator=gen).to(dtype)
        v = torch.randn(length, hkv, dv, generator=gen).to(dtype)
        k_buffer[s], v_buffer[s] = k, v
        req_to_token[r, :length] = s.to(torch.int32)
        keys.append(k)
        values.append(v)
    b_seq_len = torch.tensor(seq_lens, dtype=torch.int32)
    return PagedKV(k_buffer, v_buffer, req_to_token, b_req_idx, b_seq_len, keys, values)


def dense_causal_attention(q, k, v, scale):
    """q [n, Hq, D] = the last n positions of a sequence with contiguous k, v [L, Hkv, D]; fp64, explicit mask."""
    n, hq, _ = q.shape
    length, hkv, _ = k.shape
    k = k.double().repeat_interleave(hq // hkv, dim=1)
    v = v.double().repeat_interleave(hq // hkv, dim=1)
    scores = torch.einsum("qhd,khd->hqk", q.double(), k) * scale
    q_pos = torch.arange(length - n, length)
    allowed = torch.arange(length)[None, :] <= q_pos[:, None]  # [n, L]
    scores = scores.masked_fill(~allowed, float("-inf"))
    return torch.einsum("hqk,khd->qhd", torch.softmax(scores, dim=-1), v)


@pytest.fixture
def paged_kv():
    return build_paged_kv


@pytest.fixture
def dense_attention():
    return dense_causal_attention
