"""Routed and shared experts with block-FP8 weights (kernels/quant/fp8_moe.py): the expert-major pass's FP8 tiles
against the dequantizing reference under Triton's interpreter; the wrappers' checks; on the GPU at 35B-A3B dims."""

import textwrap

import pytest
import torch

from lightllm_mtp.kernels.moe.moe_expert_pass import expert_pass_ref
from lightllm_mtp.kernels.moe.moe_routing import route_topk
from lightllm_mtp.kernels.quant.fp8_block import quantize_fp8_block
from lightllm_mtp.kernels.quant.fp8_moe import fp8_fused_moe, fp8_fused_moe_shared, fp8_moe_ref
from unit_tests.triton_interpreter import run_interpreted

INTERPRET_SCRIPT = textwrap.dedent(
    """
    import torch
    from lightllm_mtp.kernels.moe import moe_expert_pass as p
    from lightllm_mtp.kernels.moe.moe_routing import route_topk_ref
    from lightllm_mtp.kernels.quant.fp8_block import quantize_fp8_block
    from lightllm_mtp.kernels.quant.fp8_moe import PREFILL_TILES, fp8_moe_ref
    gen = torch.Generator().manual_seed(0)
    # (T, E, k, H, I, I_shared or None, block): blocks smaller than the tiles (16), as large (32), partial blocks
    # (H 48 of 32-blocks), routed-only, experts of more rows than a tile
    cases = ((1, 8, 2, 64, 32, 32, (16, 16)), (40, 4, 2, 64, 32, 16, (16, 32)), (7, 6, 3, 48, 64, None, (32, 32)),
             (20, 6, 3, 64, 32, 64, (32, 16)))
    for t, experts, top_k, hidden, inter, shared, block in cases:
        q = lambda w: quantize_fp8_block(w, block)
        x = torch.randn(t, hidden + 8, generator=gen)[:, 3 : 3 + hidden]  # strided rows
        w_gu = q(torch.randn(experts, 2 * inter, hidden, generator=gen) * 0.2)
        w_d = q(torch.randn(experts, hidden, inter, generator=gen) * 0.2)
        s_gu = q(torch.randn(2 * shared, hidden, generator=gen) * 0.2) if shared else None
        s_d = q(torch.randn(hidden, shared, generator=gen) * 0.2) if shared else None
        w, ids = route_topk_ref(torch.randn(t, experts + 1, generator=gen), num_experts=experts, top_k=top_k,
                                shared_gate=shared is not None)
        ref = fp8_moe_ref(x, w_gu, w_d, w, ids, s_gu, s_d)
        scales = (w_gu.scale, w_d.scale) + ((s_gu.scale, s_d.scale) if shared else ())
        for tiles in (p.DECODE_TILES, PREFILL_TILES):
            out = p.expert_pass_triton(x, w_gu.qweight, w_d.qweight, w, ids, s_gu.qweight if shared else None,
                                       s_d.qweight if shared else None, tiles, scales=scales,
                                       scale_blocks=(block, block))
            torch.testing.assert_close(out, ref, rtol=1e-4, atol=1e-4)
    print("OK")
    """
)


def test_fp8_expert_pass_under_the_interpreter():
    pytest.importorskip("triton")
    out = run_interpreted(INTERPRET_SCRIPT, timeout=600)
    assert "OK" in out, out[-3000:]


def _case(t, experts, top_k, hidden, inter, shared, device="cpu", seed=0):
    gen = torch.Generator(device=device).manual_seed(seed)

    def fp8(*shape):
        return quantize_fp8_block(torch.randn(*shape, generator=gen, device=device) * 0.03, (128, 128))

    x = torch.randn(t, hidden, generator=gen, device=device)
    logits = torch.randn(t, experts + 1, generator=gen, device=device)
    return x, fp8(experts, 2 * inter, hidden), fp8(experts, hidden, inter), fp8(2 * shared, hidden), \
        fp8(hidden, shared), logits


def test_reference_equals_the_dequantized_16_bit_pass():
    x, w_gu, w_d, s_gu, s_d, logits = _case(9, 8, 2, 256, 128, 192)
    weights, ids = route_topk(logits, num_experts=8, top_k=2, shared_gate=True)
    want = expert_pass_ref(x, w_gu.dequantize(), w_d.dequantize(), weights, ids, s_gu.dequantize(), s_d.dequantize())
    torch.testing.assert_close(fp8_fused_moe_shared(x, w_gate_up=w_gu, w_down=w_d, shared_gate_up=s_gu, shared_down=s_d,
                                                    topk_weights=weights, topk_ids=ids), want)  # fmt: skip
    routed_w, routed_ids = weights[:, :2], ids[:, :2]
    torch.testing.assert_close(fp8_fused_moe(x, w_gate_up=w_gu, w_down=w_d, topk_weights=routed_w,
                                             topk_ids=routed_ids),
                               fp8_moe_ref(x, w_gu, w_d, routed_w, routed_ids))  # fmt: skip


def test_wrappers_check_their_weights():
    x, w_gu, w_d, s_gu, s_d, logits = _case(3, 4, 2, 128, 64, 64)
    weights, ids = route_topk(logits, num_experts=4, top_k=2, shared_gate=True)
    with pytest.raises(ValueError, match="stacked"):
        fp8_fused_moe(x, w_gate_up=w_gu.qweight, w_down=w_d, topk_weights=weights, topk_ids=ids)
    with pytest.raises(ValueError, match="do not fit"):
        fp8_fused_moe(x, w_gate_up=w_gu, w_down=w_gu, topk_weights=weights, topk_ids=ids)
    with pytest.raises(ValueError, match="shared weights"):
        fp8_fused_moe_shared(x, w_gate_up=w_gu, w_down=w_d, shared_gate_up=s_d, shared_down=s_d,
                             topk_weights=weights, topk_ids=ids)  # fmt: skip


@pytest.mark.gpu
@pytest.mark.parametrize("t", [1, 8, 64, 128, 2048])
def test_fp8_experts_gpu_35b_a3b(t):
    """35B-A3B dims (256 experts, top-8, H 2048, I 512, shared 512) in bf16 activations: decode / verify sizes take
    the decode tiles, 2048 rows the prefill tiles."""
    x, w_gu, w_d, s_gu, s_d, logits = _case(t, 256, 8, 2048, 512, 512, device="cuda", seed=t)
    x = x.bfloat16()
    weights, ids = route_topk(logits, num_experts=256, top_k=8, shared_gate=True)
    out = fp8_fused_moe_shared(x, w_gate_up=w_gu, w_down=w_d, shared_gate_up=s_gu, shared_down=s_d,
                               topk_weights=weights, topk_ids=ids)  # fmt: skip
    ref = fp8_moe_ref(x.float(), w_gu, w_d, weights, ids, s_gu, s_d)
    torch.testing.assert_close(out.float(), ref, rtol=2e-2, atol=2e-2)
    routed = fp8_fused_moe(x, w_gate_up=w_gu, w_down=w_d, topk_weights=weights[:, :8], topk_ids=ids[:, :8])
    torch.testing.assert_close(routed.float(), fp8_moe_ref(x.float(), w_gu, w_d, weights[:, :8], ids[:, :8]),
                               rtol=2e-2, atol=2e-2)  # fmt: skip
