"""The FP8 Triton kernels compile for the H100 / H200 (sm_90) on a CPU machine at the 27B / 35B-A3B shapes: catches
what the interpreter does not (e4m3 conversions and FP8 tensor-core dots lowering, dtype mismatches in tl.dot, shared
memory over the SM's 227 KB): the tiled GEMM in both modes (prefill tiles, and decode tiles with split K and in-kernel
activation rounding) and the activation quantization, the
FP8 expert pass, and the attention kernels over an FP8 KV pool."""

import pytest

triton = pytest.importorskip("triton")

from lightllm_mtp.kernels.attention import decode_attention, prefill_attention, qk_norm_rope  # noqa: E402
from lightllm_mtp.kernels.moe import moe_expert_pass  # noqa: E402
from lightllm_mtp.kernels.quant import fp8_gemm  # noqa: E402
from unit_tests.kernels.sm90_compile import compile_sm90  # noqa: E402



@pytest.mark.parametrize("act_fp8,quantize_a,block_m,block_n,split_k", [
    (False, False, 64, 128, 1), (True, False, 64, 128, 1),  # prefill tiles
    (False, False, 16, 64, 8), (True, True, 16, 64, 8),  # decode rows: the 27B down projection's split K
])  # fmt: skip
def test_fp8_gemm_and_activation_quantization_compile(act_fp8, quantize_a, block_m, block_n, split_k):
    a_type = "*fp8e4nv" if act_fp8 and not quantize_a else "*bf16"
    kernel = compile_sm90(fp8_gemm._fp8_gemm_kernel,
                      dict(a_ptr=a_type, a_s_ptr="*fp32", w_ptr="*fp8e4nv", w_s_ptr="*fp32", out_ptr="*bf16",
                           partial_ptr="*fp32", arrival_ptr="*i32", M=4096, N=12288, K=5120, stride_a=5120,
                           stride_as=40, stride_w=5120, stride_ws=40, stride_out=12288),
                      dict(SCALE_N=128, BLOCK_K=128, ACT_FP8=act_fp8, QUANTIZE_A=quantize_a, BLOCK_M=block_m,
                           BLOCK_N=block_n, SPLIT_K=split_k, DOT_PRECISION="tf32", MIN_SCALE=1e-10,
                           FP8_MAX_VALUE=448.0, **({"M": 1} if split_k > 1 else {})),  # 1 row: M a constexpr
                      num_warps=4, num_stages=4 if split_k > 1 else 3)  # fmt: skip
    if act_fp8:  # the FP8 tensor cores: wgmma / mma on e4m3 operands
        assert "e4m3" in kernel.asm["ptx"]
    compile_sm90(fp8_gemm._quantize_act_kernel,
             dict(x_ptr="*bf16", q_ptr="*fp8e4nv", s_ptr="*fp32", K=5120, stride_x=5120, stride_q=5120, stride_s=40),
             dict(MIN_SCALE=1e-10, FP8_MAX_VALUE=448.0, GROUP=128))  # fmt: skip


@pytest.mark.parametrize("pdl", [False, True])
@pytest.mark.parametrize("tiles", ["decode", "prefill"])
def test_fp8_expert_pass_compiles(tiles, pdl):
    """35B-A3B experts (E 256, H 2048, I 512, shared 512) in block-FP8, w8a8: e4m3 x / act with their group scales,
    the FP8 tensor-core dot, K steps of one 128 scale block; decode and prefill tiles."""
    from lightllm_mtp.kernels.moe.fp8_moe import PREFILL_TILES

    tiles = moe_expert_pass.DECODE_TILES if tiles == "decode" else PREFILL_TILES
    common = dict(sorted_ptr="*i32", block_expert_ptr="*i32", P=9, H=2048, INTER=512, INTER_SHARED=512, E=256,
                  w_ptr="*fp8e4nv", shared_w_ptr="*fp8e4nv", s_ptr="*fp32", shared_s_ptr="*fp32")  # fmt: skip
    fp8 = dict(W8A8=True, SCALE_N=128, DOT_PRECISION="tf32", PDL=pdl)
    kernels = [
        compile_sm90(moe_expert_pass._gate_up_act_kernel,
                 dict(common, x_ptr="*fp8e4nv", xs_ptr="*fp32", act_ptr="*bf16", stride_x=2048, stride_xs=16,
                      stride_we=1024 * 2048, stride_wn=2048, stride_shared_wn=2048, stride_act=512,
                      stride_se=8 * 16, stride_sn=16, stride_shared_sn=16),
                 dict(fp8, SLOTS=9, BLOCK_M=tiles.block_m, BLOCK_N=tiles.gate_up_block_n, BLOCK_K=128),
                 num_warps=tiles.num_warps, num_stages=tiles.gate_up_stages),
        compile_sm90(moe_expert_pass._down_weighted_kernel,
                 dict(common, act_ptr="*fp8e4nv", as_ptr="*fp32", weights_ptr="*fp32", rows_ptr="*fp32",
                      stride_act=512, stride_as=4, stride_we=2048 * 512, stride_wn=512, stride_shared_wn=512,
                      stride_rows=2048, stride_se=16 * 4, stride_sn=4, stride_shared_sn=4),
                 dict(fp8, BLOCK_M=tiles.block_m, BLOCK_N=tiles.down_block_n, BLOCK_K=128),
                 num_warps=tiles.num_warps, num_stages=tiles.down_stages),
    ]  # fmt: skip
    for kernel in kernels:  # the FP8 tensor cores: wgmma / mma on e4m3 operands
        assert "e4m3" in kernel.asm["ptx"]


def test_attention_over_an_fp8_pool_compiles():
    """27B heads (24 query, 4 KV, D 256), bf16 queries, e4m3 K/V: split-K decode, flash prefill, the fused store."""
    strides = dict(stride_qt=24 * 256, stride_qh=256, stride_qd=1, stride_kp=1024, stride_kh=256, stride_kd=1,
                   stride_vp=1024, stride_vh=256, stride_vd=1, stride_rt=4096)  # fmt: skip
    kv = dict(Q="*bf16", K="*fp8e4nv", V="*fp8e4nv", req_to_token="*i32", b_req_idx="*i32", b_seq_len="*i32",
              b1_cu_q_len="*i32", qk_scale=0.09, v_scale=1.0)  # fmt: skip
    compile_sm90(decode_attention._splitk_stage1_kernel,
             dict(kv, **strides, mid_o="*fp32", mid_lse="*fp32", num_splits=4, stride_ot=6 * 4 * 256,
                  stride_oh=4 * 256, stride_os=256, stride_lt=24 * 4, stride_lh=4),
             dict(G=6, HEAD_SPLIT=1, D=256, DV=256, BLOCK_M=16, BLOCK_D=256, BLOCK_DV=256, BLOCK_N=32, HAS_CU=False,
                  COMPUTE_FP32=False, KV_FP8=True, PDL=False), num_warps=4, num_stages=2)  # fmt: skip
    compile_sm90(prefill_attention._flash_prefill_kernel,
             dict(kv, **strides, O="*bf16", stride_ot=24 * 256, stride_oh=256, stride_od=1),
             dict(G=6, D=256, DV=256, BLOCK_M=64, BLOCK_D=256, BLOCK_DV=256, BLOCK_N=64, COMPUTE_FP32=False,
                  KV_FP8=True), num_warps=8, num_stages=2)  # fmt: skip
    compile_sm90(qk_norm_rope._qk_norm_rope_kernel,
             dict(q_ptr="*bf16", k_ptr="*bf16", v_ptr="*bf16", qo_ptr="*bf16", kd_ptr="*fp8e4nv", vd_ptr="*fp8e4nv",
                  qw_ptr="*bf16", kw_ptr="*bf16", pos_ptr="*i64", slot_ptr="*i32", cos_ptr="*fp32", sin_ptr="*fp32",
                  sq0=1024, sq1=512, sk0=1024, sk1=256, sv0=1024, sv1=256, skd0=1024, skd1=256, svd0=1024, svd1=256,
                  sc0=32, sc1=1, ss0=32, ss1=1, HQ=24, HK=4, D=256, HALF=32, eps=1e-6, inv_k_scale=1.0,
                  inv_v_scale=1.0),
             dict(TO_POOL=True, POOL_FP8=True, FP8_MAX_VALUE=448.0, BLOCK_D=256, PDL=False), num_warps=2)  # fmt: skip
