"""The Triton attention kernels under the Triton interpreter (CPU, fp32, tiny shapes) against the PyTorch references.

TRITON_INTERPRET must be set before triton is imported and other tests may have imported it already, so every case
runs in one subprocess (this file run as a script) that prints each case's max abs error and kernel path as JSON."""

import json

import pytest
import torch

from lightllm_mtp.kernels.triton_utils import triton_available
from unit_tests.triton_interpreter import allow_tensor_loop_bounds, run_interpreted

TOL = 2e-5


def _setup(seq_lens, q_lens, hq, hkv, d, seed, dv=None):
    from conftest import build_paged_kv  # this directory's builder (sys.path[0] when run as a script)

    kv = build_paged_kv(seq_lens, hkv, d, torch.float32, seed, dv=dv)
    cu = torch.tensor([0, *q_lens]).cumsum(0).to(torch.int32)
    q = torch.randn(int(cu[-1]), hq, d, generator=torch.Generator().manual_seed(seed + 1))
    return q, cu, (kv.k_buffer, kv.v_buffer, kv.req_to_token, kv.b_req_idx), kv.b_seq_len


def _decode(seq_lens, hq, hkv, d, seed, dv=None, strided_q=False, **kw):
    from lightllm_mtp.kernels.attention.decode_attention import decode_attention_ref, splitk_attention_triton

    q, _, kv, seq = _setup(seq_lens, [1] * len(seq_lens), hq, hkv, d, seed, dv)
    if strided_q:  # rows and heads not packed, as a view of a wider projection
        q = torch.cat([q, torch.randn_like(q)], dim=-1)[..., :d]
    return splitk_attention_triton(q, *kv, seq, 0.3, **kw), decode_attention_ref(q, *kv, seq, 0.3)


def _blocks(seq_lens, q_lens, hq, hkv, d, seed, splitk, dv=None, **kw):
    from lightllm_mtp.kernels.attention.decode_attention import splitk_attention_triton
    from lightllm_mtp.kernels.attention.prefill_attention import flash_attention_triton, prefill_attention_ref

    q, cu, kv, seq = _setup(seq_lens, q_lens, hq, hkv, d, seed, dv)
    if splitk:
        out = splitk_attention_triton(q, *kv, seq, 0.3, b1_cu_q_len=cu, max_q_len=max(q_lens), **kw)
    else:
        out = flash_attention_triton(q, *kv[:4], cu, seq, 0.3, max_q_len=max(q_lens), **kw)
    return out, prefill_attention_ref(q, *kv[:4], cu, seq, 0.3)


def _wrapper_decode():
    from lightllm_mtp.kernels.attention.decode_attention import decode_attention, decode_attention_ref

    q, _, kv, seq = _setup([3, 40, 17], [1, 1, 1], 4, 2, 16, 61)
    return decode_attention(q, *kv, seq, 0.3, max_kv_len=40), decode_attention_ref(q, *kv, seq, 0.3)


def _wrapper_blocks(seq_lens, q_lens, **kw):
    from lightllm_mtp.kernels.attention.prefill_attention import prefill_attention, prefill_attention_ref

    q, cu, kv, seq = _setup(seq_lens, q_lens, 4, 2, 16, 71)
    return prefill_attention(q, *kv, cu, seq, 0.3, **kw), prefill_attention_ref(q, *kv, cu, seq, 0.3)


# name -> (run, kernel path the public wrapper must take or None)
CASES = {
    # decode (split-K): default heuristics; several tiles per split; splits past short requests exit early
    "decode_d16_g2": (lambda: _decode([1, 7, 30, 50], 4, 2, 16, 1), None),
    "decode_d32_g2_3splits": (lambda: _decode([1, 7, 30, 50], 4, 2, 32, 2, num_splits=3, block_n=16), None),
    "decode_8splits_early_exit": (lambda: _decode([1, 7, 30, 50, 2], 4, 2, 16, 3, num_splits=8, block_n=16), None),
    "decode_g1_dv8_strided_q": (lambda: _decode([5, 33], 3, 3, 16, 4, dv=8, strided_q=True, block_n=16), None),
    "decode_g4_d32": (lambda: _decode([20, 9], 4, 1, 32, 5, num_splits=2, block_n=16), None),
    # prefill / chunked prefill (flash): cached prefixes, ragged blocks, an empty block, tiles cut mid q row (G=3)
    "flash_chunked_d32_g2": (lambda: _blocks([9, 23, 1, 40], [9, 7, 1, 4], 4, 2, 32, 11, False), None),
    "flash_tiles16": (
        lambda: _blocks([9, 23, 1, 40], [9, 7, 1, 4], 4, 2, 32, 12, False, block_m=16, block_n=16), None
    ),
    "flash_long_prefix_empty_block": (
        lambda: _blocks([64, 3, 17, 6], [1, 3, 17, 0], 4, 2, 16, 13, False, block_m=16, block_n=16), None
    ),
    "flash_g3_dv8": (lambda: _blocks([30, 12], [30, 5], 6, 2, 16, 14, False, dv=8, block_m=16, block_n=16), None),
    # verify (split-K over short causal blocks): q_len 3; a split starting inside a block (neutral partials)
    "verify_q3": (lambda: _blocks([9, 23, 3, 40], [3, 3, 3, 3], 4, 2, 32, 21, True), None),
    "verify_q3_5splits": (
        lambda: _blocks([9, 23, 3, 33, 40], [3] * 5, 4, 2, 32, 22, True, num_splits=5, block_n=16), None
    ),
    "verify_ragged_g3": (lambda: _blocks([8, 30, 2, 19], [2, 4, 1, 3], 6, 2, 16, 23, True, block_n=16), None),
    # the query heads of each KV head over 2 / 3 programs (head_split), ragged blocks, G=6
    "verify_head_split2_g6": (
        lambda: _blocks([8, 30, 4, 19], [2, 4, 1, 3], 12, 2, 16, 24, True, block_n=16, head_split=2), None
    ),
    "verify_head_split3_g6": (lambda: _blocks([8, 30, 19], [2, 4, 3], 12, 2, 16, 25, True, head_split=3), None),
    # public wrappers with dispatch forced on for CPU tensors
    "wrapper_decode": (_wrapper_decode, "splitk"),
    "wrapper_verify": (lambda: _wrapper_blocks([9, 23, 40], [3, 2, 3]), "splitk"),
    "wrapper_prefill": (lambda: _wrapper_blocks([9, 40, 1], [9, 36, 1], max_q_len=36, max_kv_len=45), "flash"),
}


def _interpret_main() -> None:
    """Runs in the subprocess (TRITON_INTERPRET=1)."""
    import lightllm_mtp.kernels.attention.decode_attention as dmod
    import lightllm_mtp.kernels.attention.prefill_attention as pmod

    allow_tensor_loop_bounds()
    paths = []
    splitk, flash = dmod.splitk_attention_triton, pmod.flash_attention_triton
    traced_splitk = lambda *a, **k: paths.append("splitk") or splitk(*a, **k)  # noqa: E731
    dmod.splitk_attention_triton = pmod.splitk_attention_triton = traced_splitk  # prefill imports it by name
    pmod.flash_attention_triton = lambda *a, **k: paths.append("flash") or flash(*a, **k)
    dmod.use_triton = pmod.use_triton = lambda t: True
    results = {}
    for name, (run, _) in CASES.items():
        paths.clear()
        out, expected = run()
        err = (out.double() - expected.double()).abs().max().item() if out.numel() else 0.0
        results[name] = {"err": err if out.shape == expected.shape else float("inf"), "paths": list(paths)}
    print(json.dumps(results))


@pytest.fixture(scope="module")
def interpreted():
    if not triton_available():
        pytest.skip("triton is not importable")
    return json.loads(run_interpreted(file=__file__, timeout=600).strip().splitlines()[-1])


@pytest.mark.parametrize("name", list(CASES))
def test_interpreted_kernel_matches_reference(interpreted, name):
    result = interpreted[name]
    assert result["err"] <= TOL, f"{name}: max abs error {result['err']}"
    path = CASES[name][1]
    if path is not None:
        assert result["paths"] == [path]


if __name__ == "__main__":
    torch.set_num_threads(1)
    _interpret_main()
