"""store_kv writes exactly the given pool slots."""

import pytest
import torch

from lightllm_mtp.kernels.attention.store_kv import store_kv


@pytest.mark.parametrize("index_dtype", [torch.int32, torch.int64])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_scatter(index_dtype, dtype):
    torch.manual_seed(3)
    pool, hkv, d, t = 40, 2, 16, 11
    k_buf = torch.randn(pool, hkv, d).to(dtype)
    v_buf = torch.randn(pool, hkv, d).to(dtype)
    k_before, v_before = k_buf.clone(), v_buf.clone()
    slots = torch.randperm(pool)[:t]
    k = torch.randn(t, hkv, d).to(dtype)
    v = torch.randn(t, hkv, d).to(dtype)
    store_kv(k_buf, v_buf, slots.to(index_dtype), k, v)
    torch.testing.assert_close(k_buf[slots], k, rtol=0, atol=0)
    torch.testing.assert_close(v_buf[slots], v, rtol=0, atol=0)
    untouched = torch.ones(pool, dtype=torch.bool)
    untouched[slots] = False
    assert torch.equal(k_buf[untouched], k_before[untouched]) and torch.equal(v_buf[untouched], v_before[untouched])


def test_validation():
    k_buf, v_buf = torch.zeros(8, 2, 4), torch.zeros(8, 2, 4)
    idx = torch.tensor([1, 2], dtype=torch.int32)
    with pytest.raises(ValueError, match=": v must"):
        store_kv(k_buf, v_buf, idx, torch.randn(2, 2, 4), torch.randn(3, 2, 4))
    with pytest.raises(ValueError, match=": mem_index must"):
        store_kv(k_buf, v_buf, idx.float(), torch.randn(2, 2, 4), torch.randn(2, 2, 4))
    with pytest.raises(ValueError, match=": v_buffer must"):
        store_kv(k_buf, torch.zeros(8, 1, 4), idx, torch.randn(2, 2, 4), torch.randn(2, 2, 4))
