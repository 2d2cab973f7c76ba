"""The draft window: the one input-preparation kernel of every proposer's draft pass (eagle, multi-layer MTP,
parallel drafting), built on the device from a verified (or virtual, after a prompt) block.

Per request b the window is `rows` consecutive positions w0 .. w0 + rows - 1, w0 = max(start - num_prepend, 0),
start the position of the block's row 0 and N = start + accept_len the position of the newest committed token:
  committed rows  (pos < N): KV slot from the page table; hidden from the block's target rows (pos >= start) or
      the per-request context cache (pos < start, entry num_prepend - (start - pos)); next tokens: the committed
      token 1 + m positions after pos, m < lookahead, -1 past N.
  mask rows (N <= pos < N + num_masks; parallel drafting): page-table slot, the mask hidden, next tokens -1.
  padding rows (the rest): the padding KV slot, the mask hidden, next tokens -1; always after the live rows, so
      causal attention never reads them.
Also: the anchor row (pos N - 1, whose next token is the newest one), and the rows whose hidden becomes the new
context cache (positions N - num_prepend .. N - 1; -1 below position 0).

`hidden_index` indexes one hidden source laid out as [target rows | context cache (slot-major) | mask row].

Draft models (`position_shift` = 1) read tokens, not hidden states: each row moves one position on, to the position
of the token it reads (row p above becomes position p + 1, with that position's KV slot), so the committed rows are
the tokens after `start` up to the newest one (the anchor, at N), then the mask rows (PARD) at N + 1 ...
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from lightllm_mtp.kernels._validate import check_device, check_index, check_shape
from lightllm_mtp.kernels.triton_utils import triton_available, unspecialized, use_triton

_OP = "draft_window"


@dataclass(frozen=True)
class DraftWindow:
    positions: torch.Tensor  # [B * rows] int64
    mem_index: torch.Tensor  # [B * rows] int32
    hidden_index: torch.Tensor  # [B * rows] int64 rows of the hidden source
    next_tokens: torch.Tensor  # [B * rows, lookahead] int64, -1 where not committed
    b_seq_len: torch.Tensor  # [B] int32 = w0 + rows (+ position_shift)
    b_anchor: torch.Tensor  # [B] int64 flat window row at position N - 1
    b_context_rows: torch.Tensor  # [B, num_prepend] int64 flat window rows of the new context cache, -1: none


def _check(b_start, b_accept_len, b_num_masks, b_req_idx, b_row0, b_tokens, req_to_token, rows, lookahead):
    bsz = b_start.shape[0]
    for name, t in (("b_start", b_start), ("b_accept_len", b_accept_len), ("b_num_masks", b_num_masks),
                    ("b_req_idx", b_req_idx), ("b_row0", b_row0)):  # fmt: skip
        check_shape(_OP, name, t, (bsz,), "[B]")
        check_index(_OP, name, t)
    check_shape(_OP, "b_tokens", b_tokens, (bsz, None), "[B, C]")
    check_index(_OP, "b_tokens", b_tokens)
    check_shape(_OP, "req_to_token", req_to_token, (None, None), "[R, W]")
    check_device(_OP, b_start=b_start, b_accept_len=b_accept_len, b_num_masks=b_num_masks, b_req_idx=b_req_idx,
                 b_row0=b_row0, b_tokens=b_tokens, req_to_token=req_to_token)  # fmt: skip
    if rows < 1 or lookahead < 1:
        raise ValueError(f"{_OP}: rows and lookahead must be >= 1, got {rows}, {lookahead}")


def draft_window(
    *,
    b_start: torch.Tensor,
    b_accept_len: torch.Tensor,
    b_num_masks: torch.Tensor,
    b_req_idx: torch.Tensor,
    b_row0: torch.Tensor,
    b_tokens: torch.Tensor,
    req_to_token: torch.Tensor,
    hold_slot: int,
    num_prepend: int,
    rows: int,
    lookahead: int,
    context_base: int,
    mask_index: int,
    position_shift: int = 0,
) -> DraftWindow:
    """b_start [B] block row 0 positions; b_accept_len [B] committed block rows (>= 1); b_num_masks [B] mask rows
    after the anchor; b_req_idx [B] request slots; b_row0 [B] target-hidden row of each block's row 0;
    b_tokens [B, C] the committed tokens at positions start - num_prepend + 1 .. (-1: not committed);
    req_to_token [R, W] the page table. context_base / mask_index: where the context cache and the mask row start
    in the hidden source. position_shift: 0 (MTP rows) or 1 (draft-model rows, see above). No host sync."""
    _check(b_start, b_accept_len, b_num_masks, b_req_idx, b_row0, b_tokens, req_to_token, rows, lookahead)
    if position_shift not in (0, 1):
        raise ValueError(f"{_OP}: position_shift must be 0 or 1, got {position_shift}")
    args = (b_start, b_accept_len, b_num_masks, b_req_idx, b_row0, b_tokens, req_to_token, hold_slot, num_prepend,
            rows, lookahead, context_base, mask_index, position_shift)  # fmt: skip
    if use_triton(b_start):
        return draft_window_triton(*args)
    return draft_window_ref(*args)


def draft_window_ref(b_start, b_accept_len, b_num_masks, b_req_idx, b_row0, b_tokens, req_to_token, hold_slot,
                     num_prepend, rows, lookahead, context_base, mask_index,
                     position_shift=0) -> DraftWindow:  # fmt: skip
    dev, bsz, width = b_start.device, b_start.shape[0], b_tokens.shape[1]
    start, accept = b_start.to(torch.int64), b_accept_len.to(torch.int64)
    req = b_req_idx.to(torch.int64)
    newest = start + accept  # N
    w0 = (start - num_prepend).clamp_min(0)
    pos = w0[:, None] + torch.arange(rows, device=dev)[None, :]  # [B, rows]
    committed = pos < newest[:, None]
    mask_row = ~committed & (pos < (newest + b_num_masks.to(torch.int64))[:, None])
    table_pos = (pos + position_shift).clamp(max=req_to_token.shape[1] - 1)
    slot = req_to_token[req[:, None], table_pos].to(torch.int64)
    mem = torch.where(committed | mask_row, slot, hold_slot).to(torch.int32)
    from_block = b_row0.to(torch.int64)[:, None] + (pos - start[:, None])
    from_context = context_base + req[:, None] * num_prepend + num_prepend - (start[:, None] - pos)
    hidden = torch.where(pos >= start[:, None], from_block, from_context)
    hidden = torch.where(committed, hidden, mask_index)
    ahead = pos[..., None] + 1 + torch.arange(lookahead, device=dev)  # [B, rows, M] positions of the next tokens
    idx = ahead - (start - num_prepend + 1)[:, None, None]
    valid = committed[..., None] & (idx >= 0) & (idx < width) & (ahead <= newest[:, None, None])
    tokens = b_tokens.to(torch.int64).gather(1, idx.clamp(0, width - 1).view(bsz, -1)).view_as(idx)
    next_tokens = torch.where(valid, tokens, -1)
    flat0 = torch.arange(bsz, device=dev) * rows
    ctx_pos = newest[:, None] - num_prepend + torch.arange(num_prepend, device=dev)[None, :]
    ctx_rows = torch.where(ctx_pos >= 0, flat0[:, None] + ctx_pos - w0[:, None], -1)
    return DraftWindow(
        positions=(pos + position_shift).flatten(),
        mem_index=mem.flatten(),
        hidden_index=hidden.flatten(),
        next_tokens=next_tokens.view(bsz * rows, lookahead),
        b_seq_len=(w0 + rows + position_shift).to(torch.int32),
        b_anchor=flat0 + newest - 1 - w0,
        b_context_rows=ctx_rows,
    )


def draft_window_triton(b_start, b_accept_len, b_num_masks, b_req_idx, b_row0, b_tokens, req_to_token, hold_slot,
                        num_prepend, rows, lookahead, context_base, mask_index,
                        position_shift=0) -> DraftWindow:  # fmt: skip
    dev, bsz = b_start.device, b_start.shape[0]
    out = DraftWindow(
        positions=torch.empty(bsz * rows, dtype=torch.int64, device=dev),
        mem_index=torch.empty(bsz * rows, dtype=torch.int32, device=dev),
        hidden_index=torch.empty(bsz * rows, dtype=torch.int64, device=dev),
        next_tokens=torch.empty(bsz * rows, lookahead, dtype=torch.int64, device=dev),
        b_seq_len=torch.empty(bsz, dtype=torch.int32, device=dev),
        b_anchor=torch.empty(bsz, dtype=torch.int64, device=dev),
        b_context_rows=torch.empty(bsz, num_prepend, dtype=torch.int64, device=dev),
    )
    if bsz == 0:
        return out
    # the kernel indexes every per-request input densely: callers pass column slices (DraftState rows)
    b_start, b_accept_len, b_num_masks, b_req_idx, b_row0, b_tokens = (
        t.contiguous() for t in (b_start, b_accept_len, b_num_masks, b_req_idx, b_row0, b_tokens)
    )
    if req_to_token.stride(1) != 1:
        req_to_token = req_to_token.contiguous()
    _draft_window_kernel[(bsz,)](
        b_start, b_accept_len, b_num_masks, b_req_idx, b_row0, b_tokens, req_to_token,
        out.positions, out.mem_index, out.hidden_index, out.next_tokens, out.b_seq_len, out.b_anchor,
        out.b_context_rows, b_tokens.shape[1], req_to_token.stride(0), req_to_token.shape[1], hold_slot,
        context_base, mask_index,
        P=num_prepend, ROWS=rows, M=lookahead, SHIFT=position_shift, BLOCK_R=triton.next_power_of_2(rows),
        BLOCK_P=triton.next_power_of_2(max(num_prepend, 1)), num_warps=1,
    )  # fmt: skip
    return out


if triton_available():
    import triton
    import triton.language as tl

    @triton.jit(**unspecialized(  # an index kernel of one warp: every step's offsets and views, one compile
        "start_ptr", "accept_ptr", "masks_ptr", "req_ptr", "row0_ptr", "tokens_ptr", "req_to_token_ptr", "pos_out",
        "mem_out", "hidden_out", "next_out", "seq_len_out", "anchor_out", "ctx_out", "C", "stride_table", "W",
        "hold_slot", "context_base", "mask_index"))
    def _draft_window_kernel(
        start_ptr, accept_ptr, masks_ptr, req_ptr, row0_ptr, tokens_ptr, req_to_token_ptr,
        pos_out, mem_out, hidden_out, next_out, seq_len_out, anchor_out, ctx_out,
        C, stride_table, W, hold_slot, context_base, mask_index,
        P: tl.constexpr, ROWS: tl.constexpr, M: tl.constexpr, SHIFT: tl.constexpr, BLOCK_R: tl.constexpr,
        BLOCK_P: tl.constexpr,
    ):  # fmt: skip
        b = tl.program_id(0).to(tl.int64)
        start = tl.load(start_ptr + b).to(tl.int64)
        newest = start + tl.load(accept_ptr + b).to(tl.int64)
        masks_end = newest + tl.load(masks_ptr + b).to(tl.int64)
        req = tl.load(req_ptr + b).to(tl.int64)
        row0 = tl.load(row0_ptr + b).to(tl.int64)
        w0 = tl.maximum(start - P, 0)
        r = tl.arange(0, BLOCK_R)
        live = r < ROWS
        pos = w0 + r
        committed = pos < newest
        in_table = committed | (pos < masks_end)
        table_pos = tl.minimum(pos + SHIFT, W - 1)
        slot = tl.load(req_to_token_ptr + req * stride_table + table_pos, mask=live & in_table, other=0)
        mem = tl.where(in_table, slot.to(tl.int64), hold_slot)
        hidden = tl.where(pos >= start, row0 + pos - start, context_base + req * P + P - (start - pos))
        hidden = tl.where(committed, hidden, mask_index)
        out_row = b * ROWS + r
        tl.store(pos_out + out_row, pos + SHIFT, mask=live)
        tl.store(mem_out + out_row, mem.to(tl.int32), mask=live)
        tl.store(hidden_out + out_row, hidden, mask=live)
        first = start - P + 1  # position of b_tokens[b, 0]
        for m in tl.static_range(M):
            ahead = pos + 1 + m
            idx = ahead - first
            valid = live & committed & (idx >= 0) & (idx < C) & (ahead <= newest)
            tok = tl.load(tokens_ptr + b * C + idx, mask=valid, other=-1)
            tl.store(next_out + out_row * M + m, tl.where(valid, tok, -1), mask=live)
        tl.store(seq_len_out + b, (w0 + ROWS + SHIFT).to(tl.int32))
        tl.store(anchor_out + b, b * ROWS + newest - 1 - w0)
        if P > 0:
            j = tl.arange(0, BLOCK_P)
            ctx_pos = newest - P + j
            ctx = tl.where(ctx_pos >= 0, b * ROWS + ctx_pos - w0, -1)
            tl.store(ctx_out + b * P + j, ctx, mask=j < P)
