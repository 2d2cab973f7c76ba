"""Split-K attention with the keys-major stage 1 (`splitk_attention_triton(..., keys_major=True)`) under the Triton
interpreter (CPU) against the PyTorch references: decode rows and causal verify blocks of 1-4 rows at 6 query heads
per KV head (tile columns R = 6..24), D = 64 and 256, several splits, uneven lengths, an FP8 pool with scales.

TRITON_INTERPRET must be set before triton is imported, so every case runs in one subprocess (this file run as a
script) that prints each case's max abs error as JSON."""

import json
import re

import pytest
import torch

from lightllm_mtp.kernels.triton_utils import triton_available, use_triton
from unit_tests.triton_interpreter import allow_tensor_loop_bounds, run_interpreted
from unit_tests.kernels.cuda_graphs import capture
from unit_tests.kernels.sm90_compile import compile_sm90

TOL = 2e-5
HQ, HKV = 12, 2  # G = 6, as the 27B (24 / 4)
FP8 = torch.float8_e4m3fn


def _inputs(seq_lens, q_lens, hq, hkv, d, seed, kv_dtype=torch.float32, device="cpu"):
    from conftest import build_paged_kv  # this directory's builder (sys.path[0] as a script, rootdir in pytest)

    kv = build_paged_kv(seq_lens, hkv, d, kv_dtype, seed)
    cu = torch.tensor([0, *q_lens]).cumsum(0).to(torch.int32)
    q = torch.randn(int(cu[-1]), hq, d, generator=torch.Generator().manual_seed(seed + 1))
    tensors = (q, cu, kv.k_buffer, kv.v_buffer, kv.req_to_token, kv.b_req_idx, kv.b_seq_len)
    return (t.to(device) for t in tensors)


def _verify(seq_lens, q_lens, d, seed, kv_dtype=torch.float32, k_scale=1.0, v_scale=1.0, **kw):
    from lightllm_mtp.kernels.attention.decode_attention import splitk_attention_triton
    from lightllm_mtp.kernels.attention.prefill_attention import prefill_attention_ref

    q, cu, *kv, seq = _inputs(seq_lens, q_lens, HQ, HKV, d, seed, kv_dtype)
    scales = dict(k_scale=k_scale, v_scale=v_scale)
    out = splitk_attention_triton(q, *kv, seq, 0.3, b1_cu_q_len=cu, max_q_len=max(q_lens), keys_major=True,
                                  **scales, **kw)  # fmt: skip
    return out, prefill_attention_ref(q, *kv, cu, seq, 0.3, k_scale, v_scale)


def _decode(seq_lens, d, seed, kv_dtype=torch.float32, k_scale=1.0, v_scale=1.0, **kw):
    from lightllm_mtp.kernels.attention.decode_attention import decode_attention_ref, splitk_attention_triton

    q, _, *kv, seq = _inputs(seq_lens, [1] * len(seq_lens), HQ, HKV, d, seed, kv_dtype)
    out = splitk_attention_triton(q, *kv, seq, 0.3, keys_major=True, k_scale=k_scale, v_scale=v_scale, **kw)
    return out, decode_attention_ref(q, *kv, seq, 0.3, k_scale, v_scale)


RAGGED_SEQ = [9, 37, 4, 50, 23]
CASES = {
    # one request's rows 1..4 at a time (R = 6, 12, 18, 24: 16- and 32-column tiles), several splits, BLOCK_N 16
    **{
        f"verify_{rows}_rows_d64": lambda rows=rows: _verify([31, 50, 17], [rows] * 3, 64, rows, num_splits=3,
                                                             block_n=16)  # fmt: skip
        for rows in (1, 2, 3, 4)
    },
    # ragged blocks (one empty), uneven lengths, splits past the short requests and splits that start inside a block
    "verify_ragged_6splits": lambda: _verify(RAGGED_SEQ, [4, 1, 3, 0, 2], 64, 11, num_splits=6, block_n=16),
    "verify_ragged_default_launch": lambda: _verify(RAGGED_SEQ, [2, 4, 3, 1, 4], 64, 12),
    "verify_head_split2": lambda: _verify(RAGGED_SEQ, [3, 4, 2, 1, 4], 64, 13, block_n=16, head_split=2),
    # D = 256 (the 27B's head size) at 3-4 rows and 1-2 rows
    "verify_d256_rows34": lambda: _verify([40, 7, 26], [4, 3, 3], 256, 21, num_splits=2, block_n=16),
    "verify_d256_rows12": lambda: _verify([40, 7, 26], [1, 2, 2], 256, 22, num_splits=3, block_n=16),
    # decode rows (no q blocks)
    "decode_d64_4splits": lambda: _decode([1, 7, 30, 50], 64, 31, num_splits=4, block_n=16),
    "decode_d256": lambda: _decode([20, 65], 256, 32),
    # an FP8 pool with per-tensor scales (fp32 queries: the interpreter's bf16 tiles are wrong for either stage 1)
    "fp8_verify_scaled": lambda: _verify(RAGGED_SEQ, [4, 2, 3, 1, 4], 64, 41, FP8, 0.5, 2.0, num_splits=3, block_n=16),
    "fp8_decode_scaled": lambda: _decode([3, 44, 19], 64, 42, FP8, 0.25, 4.0, num_splits=3, block_n=16),
    "fp8_verify_d256_scaled": lambda: _verify([40, 7, 26], [4, 3, 2], 256, 43, FP8, 0.5, 2.0, num_splits=2, block_n=16),
}


def _interpret_main() -> None:
    """Runs in the subprocess (TRITON_INTERPRET=1)."""
    allow_tensor_loop_bounds()
    results = {}
    for name, run in CASES.items():
        out, expected = run()
        ok_shape = out.shape == expected.shape and out.dtype == expected.dtype
        results[name] = (out.double() - expected.double()).abs().max().item() if ok_shape else float("inf")
    print(json.dumps(results))


@pytest.fixture(scope="module")
def interpreted():
    if not triton_available():
        pytest.skip("triton is not importable")
    return json.loads(run_interpreted(file=__file__, timeout=900).strip().splitlines()[-1])


@pytest.mark.parametrize("name", list(CASES))
def test_keys_major_stage1_matches_reference(interpreted, name):
    assert interpreted[name] <= TOL, f"{name}: max abs error {interpreted[name]}"


@pytest.mark.parametrize("rows", [1, 2, 3, 4])
@pytest.mark.parametrize("kv", ["bf16", "fp8e4nv"])
def test_keys_major_stage1_compiles_for_sm90(kv, rows, record_property):
    """The 27B shape (24 query heads over 4 KV heads of 256, bf16 queries, a bf16 or FP8 pool) at the wrapper's
    default keys-major launch: compiles to PTX within the SM's shared memory. Whether its dots became wgmma is
    recorded (and printed), not asserted: it is Triton's choice."""
    from lightllm_mtp.kernels.attention.verify_attention_keys_major import (KEYS_MAJOR_BLOCK_N, keys_major_num_warps,
                                                                            keys_major_stage1_kernel)

    hq, hkv, d = 24, 4, 256
    strides = dict(stride_qt=hq * d, stride_qh=d, stride_qd=1, stride_kp=hkv * d, stride_kh=d, stride_kd=1,
                   stride_vp=hkv * d, stride_vh=d, stride_vd=1, stride_rt=4096, stride_ot=hq * 4 * d,
                   stride_oh=4 * d, stride_os=d, stride_lt=hq * 4, stride_lh=4)  # fmt: skip
    args = dict(Q="*bf16", K=f"*{kv}", V=f"*{kv}", req_to_token="*i32", b_req_idx="*i32", b_seq_len="*i32",
                b1_cu_q_len="*i32", mid_o="*fp32", mid_lse="*fp32", qk_scale=0.09, v_scale=0.5, num_splits=48,
                **strides)  # fmt: skip
    block_m = max(16, 1 << (rows * hq // hkv - 1).bit_length())
    constexprs = dict(G=hq // hkv, HEAD_SPLIT=1, D=d, DV=d, BLOCK_M=block_m, BLOCK_D=d, BLOCK_DV=d,
                      BLOCK_N=KEYS_MAJOR_BLOCK_N, HAS_CU=True, COMPUTE_FP32=False, KV_FP8=kv != "bf16", PDL=True)
    kernel = compile_sm90(keys_major_stage1_kernel, args, constexprs,
                           num_warps=keys_major_num_warps(KEYS_MAJOR_BLOCK_N, kv != "bf16"), num_stages=2)
    ptx = kernel.asm["ptx"]
    wgmma = sorted(set(re.findall(r"wgmma\.mma_async[\w.]*", ptx)))
    record_property("wgmma", wgmma)
    print(f"keys-major stage 1, {kv} pool, {rows} rows (BLOCK_M {block_m}): shared {kernel.metadata.shared} B, "
          f"wgmma {wgmma or 'none'}, mma.sync {ptx.count('mma.sync.aligned')}")  # fmt: skip


@pytest.mark.gpu
@pytest.mark.parametrize("kv_dtype", [torch.bfloat16, FP8])
@pytest.mark.parametrize("rows", [1, 2, 3, 4])
def test_keys_major_gpu_27b_heads_in_a_cuda_graph(paged_kv, rows, kv_dtype):
    """24 query heads over 4 KV heads of 256 (the 27B shape), bf16 queries, verify blocks of 1-4 rows over a bf16 or
    FP8 pool; captured once in a CUDA graph, replayed over shorter lengths, each against the reference."""
    from lightllm_mtp.kernels.attention.decode_attention import splitk_attention_triton
    from lightllm_mtp.kernels.attention.prefill_attention import prefill_attention_ref

    d, seq_lens = 256, [3000, 700 + rows, 64]
    kv = paged_kv(seq_lens, 4, d, kv_dtype, rows)
    *kv_args, b_seq_len = (t.cuda() for t in (kv.k_buffer, kv.v_buffer, kv.req_to_token, kv.b_req_idx, kv.b_seq_len))
    q = torch.randn(rows * len(seq_lens), 24, d, device="cuda", dtype=torch.bfloat16)
    if not use_triton(q):
        pytest.skip("the Triton path is off (triton missing or LIGHTLLM_MTP_FORCE_REFERENCE_KERNELS)")
    cu = torch.arange(0, rows * len(seq_lens) + 1, rows, dtype=torch.int32, device="cuda")
    scales = dict(k_scale=0.5, v_scale=2.0) if kv_dtype == FP8 else {}

    def run():
        return splitk_attention_triton(q, *kv_args, b_seq_len, d**-0.5, b1_cu_q_len=cu, max_q_len=rows,
                                       max_kv_len=max(seq_lens), keys_major=True, **scales)  # fmt: skip

    graph, out = capture(run)
    for lens in (seq_lens, [2999, 5, 64], [rows, 700, 33]):
        b_seq_len.copy_(torch.tensor(lens))
        graph.replay()
        want = prefill_attention_ref(q.float(), *kv_args, cu, b_seq_len, d**-0.5, *scales.values())
        torch.testing.assert_close(out.float(), want, rtol=2e-2, atol=2e-2)


if __name__ == "__main__":
    torch.set_num_threads(1)
    _interpret_main()
