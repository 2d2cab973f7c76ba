import pytest
import torch

from lightllm_mtp.common.slot_allocator import OutOfSlotsError, SlotAllocator


def test_alloc_free_roundtrip():
    a = SlotAllocator(8, "kv")
    x = a.alloc(5)
    assert a.num_free == 3 and len(set(x.tolist())) == 5
    with pytest.raises(OutOfSlotsError, match="asked for 4 slots, 3 free"):
        a.alloc(4)
    a.free(x[:2])
    y = a.alloc(5)
    assert a.num_free == 0 and not set(y.tolist()) & set(x[2:].tolist())
    a.free(torch.cat([x[2:], y]))
    assert a.num_free == 8


def test_double_free_is_rejected():
    a = SlotAllocator(4, "kv")
    x = a.alloc(2)
    a.free(x)
    with pytest.raises(RuntimeError, match="double free"):
        a.free(x[:1])
    assert a.num_free == 4
