"""Routed experts (and the shared expert) with block-FP8 weights: kernels/moe/fused_moe.py's contracts over
Fp8BlockWeight gate_up [E, 2I, H] / down [E, H, I] (shared [2I_s, H] / [H, I_s]).

The experts run w8a8, the checkpoints' "activation_scheme: dynamic" as vLLM / SGLang run block-FP8 MoE: x and the
intermediate activation (stored in x's dtype first) are rounded to e4m3 per token in 1 x block_k groups of the
weight they multiply (kernels/quant/fp8_gemm.py's activation quantization), and each scale block's e4m3 product is
scaled by the row's group scale times the weight block's scale, on the FP8 tensor cores instead of dequantizing
every weight element to 16 bits in registers (the former weight-only mode, ALU-bound). H200 (benchmark/NOTES.md
"Stop 40"): the 35B-A3B-FP8 step 2.86 -> 2.73 ms at B=1 (bf16 2.60), 10.98 -> 10.14 ms at B=32 (bf16 14.02); its
prefill stayed 2x slower than bf16's, for a reason not found yet (not this pass's dots). The rounding costs at most
2^-4 of each activation element (e4m3 keeps 3 mantissa bits; unit_tests/kernels/moe/test_fp8_moe.py bounds the
whole pass against the dequantized experts).

On CUDA every size runs the expert-major pass (kernels/moe/moe_expert_pass.py) in its w8a8 mode: each tile of an
expert's FP8 weight is read once per BLOCK_M rows of that expert. Decode / verify sizes use its decode tiles; prefill
sizes 64-row tiles (an expert's weights are then re-read once per 64 of its rows, from L2 mostly; no FP8 grouped GEMM
yet); the K step is the weights' scale block (128 in the checkpoints, the tiles' K). `fp8_moe_ref` is that rounding
with fp32 products (the kernels' oracle). Off CUDA the experts run `fp8_moe_exact_ref`: exact activations, fp32
products of the dequantized experts, as the dense projections' CPU path (kernels/quant/fp8_linear.py says why: the
CPU forward stays the exact oracle for MTP == plain and tp == one process)."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from lightllm_mtp.kernels._validate import check_device, check_float, check_index, check_shape
from lightllm_mtp.kernels.moe.moe_expert_pass import DECODE_TILES, ExpertPassTiles, expert_pass_ref, expert_pass_triton
from lightllm_mtp.kernels.quant.fp8_block import Fp8BlockWeight
from lightllm_mtp.kernels.quant.fp8_gemm import quantize_activations_ref
from lightllm_mtp.kernels.triton_utils import use_triton

_OP = "fp8_fused_moe"
DECODE_MAX_PAIRS = 1024  # (token, slot) pairs up to which the decode tiles run (fused_moe's EXPERT_PASS_MAX_ROWS)
PREFILL_TILES = ExpertPassTiles(block_m=64, gate_up_block_n=64, down_block_n=64)


def fp8_moe_ref(x, w_gate_up: Fp8BlockWeight, w_down: Fp8BlockWeight, topk_weights, topk_ids,
                shared_gate_up: Fp8BlockWeight | None = None, shared_down: Fp8BlockWeight | None = None):  # fmt: skip
    """The kernel's w8a8 rounding with fp32 products: each projection's input rows rounded to x's dtype (the
    activation as the kernel stores it; exact for x), then to e4m3 per 1 x block_k group (quantize_activations_ref),
    times the expert's dequantized weight."""

    def w8a8_linear(a: torch.Tensor, w: Fp8BlockWeight) -> torch.Tensor:
        group = w.block[1]
        q, scale = quantize_activations_ref(a.to(x.dtype), group)
        rounded = q.float() * scale.repeat_interleave(group, dim=1)[:, : a.shape[1]]
        return F.linear(rounded, w.dequantize(torch.float32))

    return expert_pass_ref(x, w_gate_up, w_down, topk_weights, topk_ids, shared_gate_up, shared_down,
                           linear=w8a8_linear)  # fmt: skip


def fp8_moe_exact_ref(x, w_gate_up: Fp8BlockWeight, w_down: Fp8BlockWeight, topk_weights, topk_ids,
                      shared_gate_up: Fp8BlockWeight | None = None,
                      shared_down: Fp8BlockWeight | None = None):  # fmt: skip
    """fp32 products of the dequantized experts, activations exact (no e4m3 rounding): the CPU engine path."""
    return expert_pass_ref(x, w_gate_up, w_down, topk_weights, topk_ids, shared_gate_up, shared_down,
                           linear=lambda a, w: F.linear(a, w.dequantize(torch.float32)))  # fmt: skip


def fp8_fused_moe(x: torch.Tensor, *, w_gate_up: Fp8BlockWeight, w_down: Fp8BlockWeight, topk_weights: torch.Tensor,
                  topk_ids: torch.Tensor) -> torch.Tensor:  # fmt: skip
    """x [T, H] -> [T, H] in x.dtype: sum_k w_k * down_e(silu(gate_e x) * up_e x) over the routed experts."""
    _check(x, w_gate_up, w_down, topk_weights, topk_ids)
    if not use_triton(x):
        return fp8_moe_exact_ref(x, w_gate_up, w_down, topk_weights, topk_ids)
    tiles = DECODE_TILES if topk_ids.numel() <= DECODE_MAX_PAIRS else PREFILL_TILES
    return expert_pass_triton(_rows(x), w_gate_up.qweight, w_down.qweight, topk_weights, topk_ids, tiles=tiles,
                              scales=(w_gate_up.scale, w_down.scale),
                              scale_blocks=(w_gate_up.block, w_down.block))  # fmt: skip


def fp8_fused_moe_shared(
    x: torch.Tensor, *, w_gate_up: Fp8BlockWeight, w_down: Fp8BlockWeight, shared_gate_up: Fp8BlockWeight,
    shared_down: Fp8BlockWeight, topk_weights: torch.Tensor, topk_ids: torch.Tensor,
    alignment: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> torch.Tensor:  # fmt: skip
    """Routed experts plus the shared expert (slot k, id E) in one pass; decode / verify sizes (fused_moe_shared's
    contract; `alignment` from route_align at the decode tiles)."""
    _check(x, w_gate_up, w_down, topk_weights, topk_ids)
    for name, w, want in (("shared_gate_up", shared_gate_up, 2), ("shared_down", shared_down, 2)):
        if not isinstance(w, Fp8BlockWeight) or w.ndim != want:
            raise ValueError(f"{_OP}: {name} must be a 2-D Fp8BlockWeight")
    if shared_gate_up.shape[1] != x.shape[1] or shared_down.shape != (x.shape[1], shared_gate_up.shape[0] // 2):
        raise ValueError(f"{_OP}: shared weights {list(shared_gate_up.shape)} / {list(shared_down.shape)} do not "
                         f"fit [2I_s, {x.shape[1]}] / [{x.shape[1]}, I_s]")  # fmt: skip
    if topk_ids.shape[1] < 2:
        raise ValueError(f"{_OP}: topk_ids must hold k routed slots and the shared slot, got {list(topk_ids.shape)}")
    if not use_triton(x):
        return fp8_moe_exact_ref(x, w_gate_up, w_down, topk_weights, topk_ids, shared_gate_up, shared_down)
    blocks = (_block("gate_up", w_gate_up, shared_gate_up), _block("down", w_down, shared_down))
    scales = (w_gate_up.scale, w_down.scale, shared_gate_up.scale, shared_down.scale)
    return expert_pass_triton(_rows(x), w_gate_up.qweight, w_down.qweight, topk_weights, topk_ids,
                              shared_gate_up.qweight, shared_down.qweight, alignment=alignment, scales=scales,
                              scale_blocks=blocks)  # fmt: skip


def _check(x, w_gate_up, w_down, topk_weights, topk_ids) -> None:
    check_shape(_OP, "x", x, (None, None), "[T, H]")
    check_float(_OP, "x", x)
    for name, w in (("w_gate_up", w_gate_up), ("w_down", w_down)):
        if not isinstance(w, Fp8BlockWeight) or w.ndim != 3:
            raise ValueError(f"{_OP}: {name} must be a stacked (3-D) Fp8BlockWeight")
    e, rows, hidden = w_gate_up.shape
    if hidden != x.shape[1] or rows % 2 or tuple(w_down.shape) != (e, hidden, rows // 2):
        raise ValueError(f"{_OP}: w_gate_up {list(w_gate_up.shape)} / w_down {list(w_down.shape)} do not fit "
                         f"[E, 2I, {x.shape[1]}] / [E, {x.shape[1]}, I]")  # fmt: skip
    check_shape(_OP, "topk_ids", topk_ids, (x.shape[0], None), "[T, k]")
    check_index(_OP, "topk_ids", topk_ids)
    check_shape(_OP, "topk_weights", topk_weights, tuple(topk_ids.shape), "[T, k]")
    check_device(_OP, x=x, w_gate_up=w_gate_up.qweight, w_down=w_down.qweight, topk_ids=topk_ids)


def _block(name: str, routed: Fp8BlockWeight, shared: Fp8BlockWeight) -> tuple[int, int]:
    """The one scale block of a projection in the pass: the shared expert's on the routed experts' grid (the layer
    regroups them at load: fp8_blocks.common_grid)."""
    if routed.block != shared.block:
        raise ValueError(f"{_OP}: the routed and shared {name} weights must share one scale block, got "
                         f"{routed.block} and {shared.block}")  # fmt: skip
    return routed.block


def _rows(x: torch.Tensor) -> torch.Tensor:
    return x if x.stride(-1) == 1 else x.contiguous()
