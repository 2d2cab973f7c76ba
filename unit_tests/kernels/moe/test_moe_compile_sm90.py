"""The MoE Triton kernels compile for the H100 (sm_90) on a CPU machine, with the arguments' 16-divisibility hints the
launcher derives at the 35B-A3B decode shapes: catches what the interpreter does not (types merged across the
shared-expert branch, histogram lowering, dot shapes, shared memory over the SM's 227 KB), and checks that the
expert GEMMs' weight loads are software-pipelined (cp.async), which a bandwidth-bound pass needs."""

import re

import pytest

triton = pytest.importorskip("triton")

from lightllm_mtp.kernels.moe import moe_align, moe_expert_pass, moe_routing  # noqa: E402
from unit_tests.kernels.sm90_compile import compile_sm90  # noqa: E402

# the expert pass's block-FP8 (w8a8) arguments, unused with 16 / 32-bit weights (kernels/moe/fp8_moe.py compiles
# W8A8): the activations' group scales, the weights' block scales
NO_SCALES = dict(xs_ptr="*fp32", stride_xs=16, as_ptr="*fp32", stride_as=16, s_ptr="*fp32", shared_s_ptr="*fp32",
                 stride_se=64, stride_sn=16, stride_shared_sn=16)
NO_FP8 = dict(W8A8=False, SCALE_N=1)


def test_routing_and_alignment_compile():
    compile_sm90(moe_routing._route_topk_kernel, dict(logits_ptr="*bf16", weights_ptr="*fp32", ids_ptr="*i32", E=256,
                                                  stride_l=264),
             dict(TOP_K=8, SLOTS=9, BLOCK_E=256, BLOCK_S=16, RENORMALIZE=True, SHARED_GATE=True),
             num_warps=1)  # fmt: skip
    compile_sm90(moe_routing._route_topk_kernel, dict(logits_ptr="*bf16", weights_ptr="*bf16", ids_ptr="*i64", E=256,
                                                  stride_l=264),
             dict(TOP_K=8, SLOTS=8, BLOCK_E=256, BLOCK_S=8, RENORMALIZE=True, SHARED_GATE=False),
             num_warps=1)  # fmt: skip
    for pairs, blocks in ((9, 9), (576, 277), (1152, 313)):
        compile_sm90(moe_align._moe_align_kernel, dict(ids_ptr="*i32", sorted_ptr="*i32", block_expert_ptr="*i32",
                                                   scratch_ptr="*i32", P=pairs, E=257, MAX_BLOCKS=blocks),
                 dict(BLOCK_M=16, NUM_BINS=512, CHUNK=128, BLOCK_B=triton.next_power_of_2(blocks)))  # fmt: skip


@pytest.mark.parametrize("pdl", [False, True])
@pytest.mark.parametrize("tiles", [moe_expert_pass.DECODE_TILES, moe_expert_pass.ExpertPassTiles(block_m=32)])
def test_expert_pass_compiles_pipelined(tiles, pdl):
    common = dict(sorted_ptr="*i32", block_expert_ptr="*i32", P=9, H=2048, INTER=512, INTER_SHARED=512, E=256,
                  stride_we=2 * 512 * 2048, **NO_SCALES)  # fmt: skip
    gate_up = compile_sm90(
        moe_expert_pass._gate_up_act_kernel,
        dict(common, x_ptr="*bf16", w_ptr="*bf16", shared_w_ptr="*bf16", act_ptr="*bf16", stride_x=2048,
             stride_wn=2048, stride_shared_wn=2048, stride_act=512),
        dict(SLOTS=9, BLOCK_M=tiles.block_m, BLOCK_N=tiles.gate_up_block_n, BLOCK_K=tiles.gate_up_block_k,
             DOT_PRECISION="tf32", PDL=pdl, **NO_FP8),
        num_warps=tiles.num_warps, num_stages=tiles.gate_up_stages,
    )  # fmt: skip
    down = compile_sm90(
        moe_expert_pass._down_weighted_kernel,
        dict(common, act_ptr="*bf16", w_ptr="*bf16", shared_w_ptr="*bf16", weights_ptr="*fp32", rows_ptr="*fp32",
             stride_act=512, stride_wn=512, stride_shared_wn=512, stride_rows=2048, stride_we=2048 * 512),
        dict(BLOCK_M=tiles.block_m, BLOCK_N=tiles.down_block_n, BLOCK_K=tiles.down_block_k, DOT_PRECISION="tf32",
             PDL=pdl, **NO_FP8),
        num_warps=tiles.num_warps, num_stages=tiles.down_stages,
    )  # fmt: skip
    for kernel in (gate_up, down):
        assert re.search(r"cp\.async\.", kernel.asm["ptx"]), "weight loads not pipelined"
        if pdl:
            assert_waits_first(kernel.asm["ptx"])
    compile_sm90(moe_expert_pass._sum_slots_kernel, dict(rows_ptr="*fp32", out_ptr="*bf16", H=2048, stride_out=2048),
             dict(SLOTS=9, BLOCK_S=16, BLOCK_H=512, PDL=False))  # fmt: skip


def test_expert_pass_compiles_fp32_ieee():
    """fp32 models on the GPU (the tiny-checkpoint GPU-vs-CPU token tests) take the ieee dot; tiny dims, shared I
    differing from the routed I as in the tiny checkpoints."""
    tiles = moe_expert_pass.DECODE_TILES
    common = dict(sorted_ptr="*i32", block_expert_ptr="*i32", w_ptr="*fp32", shared_w_ptr="*fp32", P=6, H=64, INTER=32,
                  INTER_SHARED=48, E=8, **NO_SCALES)  # fmt: skip
    compile_sm90(moe_expert_pass._gate_up_act_kernel,
             dict(common, x_ptr="*fp32", act_ptr="*fp32", stride_x=64, stride_we=4096, stride_wn=64,
                  stride_shared_wn=64, stride_act=48),
             dict(SLOTS=3, BLOCK_M=tiles.block_m, BLOCK_N=tiles.gate_up_block_n, BLOCK_K=tiles.gate_up_block_k,
                  DOT_PRECISION="ieee", PDL=False, **NO_FP8),
             num_warps=tiles.num_warps, num_stages=tiles.gate_up_stages)  # fmt: skip
    compile_sm90(moe_expert_pass._down_weighted_kernel,
             dict(common, act_ptr="*fp32", weights_ptr="*fp32", rows_ptr="*fp32", stride_act=48, stride_we=2048,
                  stride_wn=32, stride_shared_wn=48, stride_rows=64),
             dict(BLOCK_M=tiles.block_m, BLOCK_N=tiles.down_block_n, BLOCK_K=tiles.down_block_k, DOT_PRECISION="ieee",
                  PDL=False, **NO_FP8),
             num_warps=tiles.num_warps, num_stages=tiles.down_stages)  # fmt: skip


# 35B-A3B (bf16 logits, E 256, top-8 + shared) and the tiny MoE checkpoint on the GPU tests (fp32, E 8, top-2 + shared)
@pytest.mark.parametrize("t,experts,top_k,dtype", [(1, 256, 8, "*bf16"), (2, 256, 8, "*bf16"), (7, 256, 8, "*bf16"),
                                                   (21, 8, 2, "*fp32"), (1, 8, 2, "*fp32")])  # fmt: skip
def test_route_align_compiles(t, experts, top_k, dtype):
    from lightllm_mtp.kernels.moe import moe_route_align

    slots = top_k + 1
    blocks = moe_align.max_blocks(t * slots, experts + 1, 16)
    compile_sm90(moe_route_align._route_align_kernel,
             dict(logits_ptr=dtype, weights_ptr="*fp32", ids_ptr="*i32", sorted_ptr="*i32", block_expert_ptr="*i32",
                  T=t, E=experts, stride_l=-(-(experts + 1) // 8) * 8, MAX_BLOCKS=blocks),
             dict(TOP_K=top_k, SLOTS=slots, SHARED_GATE=True, BLOCK_M=16, BLOCK_T=triton.next_power_of_2(t),
                  BLOCK_E=triton.next_power_of_2(experts), BLOCK_S=triton.next_power_of_2(slots),
                  BLOCK_B=triton.next_power_of_2(blocks), PDL=False),
             num_warps=4)  # fmt: skip


_MEMORY_OP = re.compile(r"\b(ld\.global|cp\.async|st\.global|atom\.|red\.)")


def assert_waits_first(ptx: str) -> None:
    """griddepcontrol.wait, then launch_dependents, both before the first global memory access."""
    wait = ptx.index("griddepcontrol.wait")
    assert wait < ptx.index("griddepcontrol.launch_dependents")
    first = _MEMORY_OP.search(ptx)
    assert first is not None and wait < first.start(), f"{first.group(0)} before the wait"


@pytest.mark.parametrize("pdl", [False, True])
def test_pdl_kernels_wait_first(pdl):
    """With PDL the MoE chain's kernels and the GEMV wait on the grid dependency before any global memory access;
    without, no such instruction."""
    from lightllm_mtp.kernels.linear import gemv
    from lightllm_mtp.kernels.moe import moe_route_align

    tiles = moe_expert_pass.DECODE_TILES
    common = dict(sorted_ptr="*i32", block_expert_ptr="*i32", P=9, H=2048, INTER=512, INTER_SHARED=512, E=256,
                  **NO_SCALES)
    kernels = [
        compile_sm90(moe_expert_pass._gate_up_act_kernel,
                 dict(common, x_ptr="*bf16", w_ptr="*bf16", shared_w_ptr="*bf16", act_ptr="*bf16", stride_x=2048,
                      stride_we=2 * 512 * 2048, stride_wn=2048, stride_shared_wn=2048, stride_act=512),
                 dict(SLOTS=9, BLOCK_M=tiles.block_m, BLOCK_N=tiles.gate_up_block_n, BLOCK_K=tiles.gate_up_block_k,
                      DOT_PRECISION="tf32", PDL=pdl, **NO_FP8),
                 num_warps=tiles.num_warps, num_stages=tiles.gate_up_stages),
        compile_sm90(moe_expert_pass._sum_slots_kernel,
                 dict(rows_ptr="*fp32", out_ptr="*bf16", H=2048, stride_out=2048),
                 dict(SLOTS=9, BLOCK_S=16, BLOCK_H=512, PDL=pdl)),
        compile_sm90(moe_route_align._route_align_kernel,
                 dict(logits_ptr="*bf16", weights_ptr="*fp32", ids_ptr="*i32", sorted_ptr="*i32",
                      block_expert_ptr="*i32", T=1, E=256, stride_l=264, MAX_BLOCKS=9),
                 dict(TOP_K=8, SLOTS=9, SHARED_GATE=True, BLOCK_M=16, BLOCK_T=1, BLOCK_E=256, BLOCK_S=16, BLOCK_B=16,
                      PDL=pdl),
                 num_warps=1),
        compile_sm90(gemv._gemv_kernel,
                 dict(x_ptr="*bf16", w_ptr="*bf16", out_ptr="*bf16", T=1, N=12352, K=2048, stride_x=2048,
                      stride_w=2048, stride_out=12352),
                 dict(T_PAD=1, BLOCK_N=2, BLOCK_K=2048, PDL=pdl), num_warps=4),
    ]  # fmt: skip
    for kernel in kernels:
        ptx = kernel.asm["ptx"]
        if pdl:
            assert_waits_first(ptx)
        else:
            assert "griddepcontrol" not in ptx
