"""Depthwise causal conv1d (kernel K, no bias) + SiLU with a per-request conv state.

Conv state buffer: conv_state [S, C, W], W >= K-1. These kernels use columns [0, K-1) only, holding the last
K-1 inputs (pre-conv) of the request, oldest first; wider slots serve speculative decoding (causal_conv1d_spec).
Weight column K-1 multiplies the current token.

Triton paths. Decode update: one program per (request, channel block) reads its window (state columns [0, K-1)
plus the new input), writes silu(conv) and the shifted state; also used by the fused GDN decode. Prefill: two
launches, no host sync. (1) one program per (tile of BLOCK_T rows of the ragged batch, channel block): each row
finds its request by a binary search over b1_cu_q_len, and each of the K taps reads x (same request) or the
request's state column (before the request's first row; zeros without an initial state); silu fused. (2) one
program per (request, channel block) then writes the last K-1 inputs of [history, x_b] into the slot; launch (1)
has read every history column by then (same stream). `causal_conv1d_prefill_qkv` runs the same launches with the
Gated DeltaNet epilogue: q, k, v written as three contiguous planes, q and k L2-normalised per head (what the
chunked delta-rule kernel wants: no split copies, no separate l2norm pass)."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from lightllm_mtp.kernels._validate import check_device, check_dtype, check_float, check_index, check_shape
from lightllm_mtp.kernels.pdl import pdl_args
from lightllm_mtp.kernels.triton_utils import triton_available, unspecialized, use_triton


def causal_conv1d_prefill_ref(
    x: torch.Tensor,
    weight: torch.Tensor,
    conv_state: torch.Tensor,
    b_state_idx: torch.Tensor,
    b1_cu_q_len: torch.Tensor,
    b_has_initial_state: torch.Tensor,
) -> torch.Tensor:
    t, c = x.shape
    cu = b1_cu_q_len.long()
    real = int(cu[-1]) if cu.numel() else t
    if real < t:  # rows past b1_cu_q_len[B]: a prefill graph's padding (common/basemodel/prefill_graph.py), left zero
        out = torch.zeros_like(x)
        out[:real] = causal_conv1d_prefill_ref(x[:real], weight, conv_state, b_state_idx, b1_cu_q_len, b_has_initial_state)
        return out
    hist_len = weight.shape[1] - 1
    bsz = b_state_idx.shape[0]
    dev = x.device
    idx = b_state_idx.long()
    batch = torch.arange(bsz, device=dev)
    hist_cols = torch.arange(hist_len, device=dev)
    history = conv_state[idx, :, :hist_len].float()  # [B, C, K-1]
    history = torch.where(b_has_initial_state[:, None, None], history, torch.zeros_like(history))
    # One extended sequence, per request [history_b, x_b]; every conv window then stays inside one request.
    req_of_token = torch.repeat_interleave(batch, cu[1:] - cu[:-1], output_size=t)
    token_pos = torch.arange(t, device=dev) + (req_of_token + 1) * hist_len  # [T]
    hist_pos = (cu[:-1] + batch * hist_len)[:, None] + hist_cols[None, :]  # [B, K-1]
    ext = torch.empty(t + bsz * hist_len, c, dtype=torch.float32, device=dev)
    ext[token_pos] = x.float()
    ext[hist_pos.reshape(-1)] = history.transpose(1, 2).reshape(-1, c)
    # y[:, i] is the conv of the window ext[i : i + K], i.e. the output of ext row i + K - 1.
    y = F.conv1d(ext.t().unsqueeze(0), weight.float().unsqueeze(1), groups=c)[0]
    out = F.silu(y[:, token_pos - hist_len]).t().contiguous().to(x.dtype)
    last_pos = (cu[1:] + batch * hist_len)[:, None] + hist_cols[None, :]  # last K-1 rows of each segment
    conv_state[idx, :, :hist_len] = ext[last_pos].transpose(1, 2).to(conv_state.dtype)
    return out


def l2norm_heads_ref(x: torch.Tensor, head_dim: int) -> torch.Tensor:
    """x [T, H * head_dim] -> each head_dim group scaled by 1 / sqrt(sum of squares + 1e-6), fp32 math from x's
    values, rounded to x.dtype (fla's l2norm)."""
    xf = x.float().reshape(x.shape[0], -1, head_dim)
    y = xf * torch.rsqrt((xf * xf).sum(-1, keepdim=True) + 1e-6)
    return y.reshape(x.shape).to(x.dtype)


def causal_conv1d_prefill_qkv_ref(
    x: torch.Tensor,
    weight: torch.Tensor,
    conv_state: torch.Tensor,
    b_state_idx: torch.Tensor,
    b1_cu_q_len: torch.Tensor,
    b_has_initial_state: torch.Tensor,
    key_dim: int,
    head_dim: int,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    y = causal_conv1d_prefill_ref(x, weight, conv_state, b_state_idx, b1_cu_q_len, b_has_initial_state)
    q, k, v = y.split([key_dim, key_dim, y.shape[1] - 2 * key_dim], dim=-1)
    return l2norm_heads_ref(q, head_dim), l2norm_heads_ref(k, head_dim), v.contiguous()


def causal_conv1d_update_ref(
    x: torch.Tensor, weight: torch.Tensor, conv_state: torch.Tensor, b_state_idx: torch.Tensor
) -> torch.Tensor:
    hist_len = weight.shape[1] - 1
    idx = b_state_idx.long()
    window = torch.cat([conv_state[idx, :, :hist_len].float(), x.float().unsqueeze(-1)], dim=-1)  # [B, C, K]
    y = (window * weight.float()).sum(-1)
    conv_state[idx, :, :hist_len] = window[:, :, 1:].to(conv_state.dtype)
    return F.silu(y).to(x.dtype)


def _check_common(op: str, x: torch.Tensor, weight: torch.Tensor, conv_state: torch.Tensor, b_state_idx) -> None:
    check_shape(op, "x", x, (None, None), "[T, C]")
    check_float(op, "x", x)
    check_shape(op, "weight", weight, (x.shape[1], None), "[C, K]")
    check_float(op, "weight", weight)
    if weight.shape[1] < 1:
        raise ValueError(f"{op}: weight kernel size K must be >= 1, got shape {list(weight.shape)}")
    check_shape(op, "conv_state", conv_state, (None, x.shape[1], None), "[S, C, W]")
    check_float(op, "conv_state", conv_state)
    if conv_state.shape[2] < weight.shape[1] - 1:
        raise ValueError(f"{op}: conv_state width W={conv_state.shape[2]} < K-1={weight.shape[1] - 1}")
    check_shape(op, "b_state_idx", b_state_idx, (None,), "[B]")
    check_index(op, "b_state_idx", b_state_idx)


def _check_prefill(op, x, weight, conv_state, b_state_idx, b1_cu_q_len, b_has_initial_state) -> None:
    _check_common(op, x, weight, conv_state, b_state_idx)
    bsz = b_state_idx.shape[0]
    check_shape(op, "b1_cu_q_len", b1_cu_q_len, (bsz + 1,), "[B+1]")
    check_index(op, "b1_cu_q_len", b1_cu_q_len)
    check_shape(op, "b_has_initial_state", b_has_initial_state, (bsz,), "[B]")
    check_dtype(op, "b_has_initial_state", b_has_initial_state, (torch.bool,))
    check_device(
        op, x=x, weight=weight, conv_state=conv_state, b_state_idx=b_state_idx, b1_cu_q_len=b1_cu_q_len,
        b_has_initial_state=b_has_initial_state,
    )


def causal_conv1d_prefill(
    x: torch.Tensor,
    weight: torch.Tensor,
    conv_state: torch.Tensor,
    *,
    b_state_idx: torch.Tensor,
    b1_cu_q_len: torch.Tensor,
    b_has_initial_state: torch.Tensor,
) -> torch.Tensor:
    """Ragged prefill -> y [T, C] in x.dtype; updates conv_state in place.

    x [T, C]; weight [C, K]; conv_state [S, C, W >= K-1]; b_state_idx [B] state slots; b1_cu_q_len [B+1];
    b_has_initial_state [B] bool. Request b's history is conv_state[slot, :, :K-1] when it has an initial
    state, else zeros; y = silu(causal conv over [history, x_b]) for its new rows, and afterwards
    conv_state[slot, :, :K-1] = the last K-1 inputs of [history, x_b] (also when x_b has < K-1 rows).
    fp32 compute; the state is stored in conv_state.dtype."""
    _check_prefill("causal_conv1d_prefill", x, weight, conv_state, b_state_idx, b1_cu_q_len, b_has_initial_state)
    if use_triton(x):
        return causal_conv1d_prefill_triton(x, weight, conv_state, b_state_idx, b1_cu_q_len, b_has_initial_state)
    return causal_conv1d_prefill_ref(x, weight, conv_state, b_state_idx, b1_cu_q_len, b_has_initial_state)


def causal_conv1d_prefill_qkv(
    x: torch.Tensor,
    weight: torch.Tensor,
    conv_state: torch.Tensor,
    *,
    b_state_idx: torch.Tensor,
    b1_cu_q_len: torch.Tensor,
    b_has_initial_state: torch.Tensor,
    key_dim: int,
    head_dim: int,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """causal_conv1d_prefill of the Gated DeltaNet's q|k|v channels -> (q [T, key_dim], k [T, key_dim],
    v [T, C - 2 key_dim]), each contiguous, q and k L2-normalised per head of head_dim channels (from the conv
    output rounded to x.dtype, eps 1e-6 inside the square root, rounded back to x.dtype); conv_state as there."""
    op = "causal_conv1d_prefill_qkv"
    c = x.shape[1] if x.ndim == 2 else 0
    if head_dim <= 0 or key_dim <= 0 or key_dim % head_dim or 2 * key_dim > c:
        raise ValueError(
            f"{op}: need head_dim > 0 dividing key_dim > 0 and 2 * key_dim <= channels; got head_dim={head_dim}, "
            f"key_dim={key_dim}, x shape {list(x.shape)}"
        )
    _check_prefill(op, x, weight, conv_state, b_state_idx, b1_cu_q_len, b_has_initial_state)
    if use_triton(x) and head_dim == triton.next_power_of_2(head_dim):
        return causal_conv1d_prefill_qkv_triton(
            x, weight, conv_state, b_state_idx, b1_cu_q_len, b_has_initial_state, key_dim, head_dim
        )
    return causal_conv1d_prefill_qkv_ref(
        x, weight, conv_state, b_state_idx, b1_cu_q_len, b_has_initial_state, key_dim, head_dim
    )


def causal_conv1d_prefill_triton(
    x: torch.Tensor,
    weight: torch.Tensor,
    conv_state: torch.Tensor,
    b_state_idx: torch.Tensor,
    b1_cu_q_len: torch.Tensor,
    b_has_initial_state: torch.Tensor,
    block_t: int = 8,
    block_c: int = 256,
    num_warps: int = 4,
) -> torch.Tensor:
    """Arguments as causal_conv1d_prefill (validated by the caller; b1_cu_q_len[0] = 0, b1_cu_q_len[B] = T); x rows
    may be strided (unit column stride). Returns a contiguous [T, C]. Only shapes are read on the host; block_t,
    block_c, num_warps: the conv launch's tile (benchmark/check_conv1d_prefill_gpu.py sweeps them; on an H100 at the
    27B shape, 16k rows x 10240 channels bf16, tiles of 8-32 rows x 64-256 channels all take 0.60-0.69 ms vs 7.6 ms
    for the reference)."""
    t, c = x.shape
    out = torch.empty(t, c, dtype=x.dtype, device=x.device)
    _launch_prefill(x, weight, conv_state, b_state_idx, b1_cu_q_len, b_has_initial_state, out, c, 1,
                    block_t, block_c, num_warps)  # fmt: skip
    return out


def causal_conv1d_prefill_qkv_triton(
    x: torch.Tensor,
    weight: torch.Tensor,
    conv_state: torch.Tensor,
    b_state_idx: torch.Tensor,
    b1_cu_q_len: torch.Tensor,
    b_has_initial_state: torch.Tensor,
    key_dim: int,
    head_dim: int,
    block_t: int = 8,
    block_c: int = 256,
    num_warps: int = 4,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Triton path of causal_conv1d_prefill_qkv (validated by the caller; head_dim a power of two). One buffer
    holds the planes [q: T x key_dim | k: T x key_dim | v: T x (C - 2 key_dim)]; channel blocks are whole heads."""
    t, c = x.shape
    planes = torch.empty(t * c, dtype=x.dtype, device=x.device)
    block_c = max(block_c, head_dim)
    _launch_prefill(x, weight, conv_state, b_state_idx, b1_cu_q_len, b_has_initial_state, planes, key_dim, head_dim,
                    block_t, block_c, num_warps)  # fmt: skip
    q = planes[: t * key_dim].view(t, key_dim)
    k = planes[t * key_dim : 2 * t * key_dim].view(t, key_dim)
    v = planes[2 * t * key_dim :].view(t, c - 2 * key_dim)
    return q, k, v


def _launch_prefill(x, weight, conv_state, b_state_idx, b1_cu_q_len, b_has_initial_state, out, key_dim, head_dim,
                    block_t, block_c, num_warps) -> None:  # fmt: skip
    """head_dim 1: out is a [T, C] buffer; else the q | k | v planes of causal_conv1d_prefill_qkv_triton."""
    t, c = x.shape
    bsz = b_state_idx.shape[0]
    if bsz == 0 or c == 0:
        return
    x = x if x.stride(1) == 1 else x.contiguous()
    kw = weight.shape[1]
    # binary search over [0, B): ceil(log2 B) halvings suffice; rounded up to a multiple of 4 (extra halvings change
    # nothing) so that batches of 1..16 prompts share one compiled kernel
    search_steps = -(-max(bsz - 1, 1).bit_length() // 4) * 4
    if t > 0:
        _conv1d_prefill_kernel[(triton.cdiv(t, block_t), triton.cdiv(c, block_c))](
            x, weight, conv_state, b_state_idx, b1_cu_q_len, b_has_initial_state, out,
            x.stride(0), weight.stride(0), weight.stride(1), *conv_state.stride(), c if head_dim == 1 else 0, t, c,
            bsz, key_dim, KW=kw, SEARCH_STEPS=search_steps, BLOCK_T=block_t, BLOCK_C=block_c, HEAD_DIM=head_dim,
            num_warps=num_warps,
        )
    if kw > 1:
        _conv1d_prefill_state_kernel[(bsz, triton.cdiv(c, 256))](
            x, conv_state, b_state_idx, b1_cu_q_len, b_has_initial_state,
            x.stride(0), *conv_state.stride(), c,
            KW=kw, BLOCK_C=256, num_warps=4,
        )

def causal_conv1d_update(
    x: torch.Tensor, weight: torch.Tensor, conv_state: torch.Tensor, *, b_state_idx: torch.Tensor
) -> torch.Tensor:
    """One new token per request -> y [B, C] in x.dtype; shifts conv_state[slot, :, :K-1] left by one, in place.

    x [B, C]; weight [C, K]; conv_state [S, C, W >= K-1]; b_state_idx [B] state slots."""
    op = "causal_conv1d_update"
    _check_common(op, x, weight, conv_state, b_state_idx)
    check_shape(op, "b_state_idx", b_state_idx, (x.shape[0],), "[B] (one row of x per request)")
    check_device(op, x=x, weight=weight, conv_state=conv_state, b_state_idx=b_state_idx)
    if use_triton(x):
        return causal_conv1d_update_triton(x, weight, conv_state, b_state_idx)
    return causal_conv1d_update_ref(x, weight, conv_state, b_state_idx)


def causal_conv1d_update_triton(
    x: torch.Tensor, weight: torch.Tensor, conv_state: torch.Tensor, b_state_idx: torch.Tensor
) -> torch.Tensor:
    """Arguments as causal_conv1d_update (validated by the caller); x rows may be strided (unit column stride)."""
    bsz, c = x.shape
    out = torch.empty(bsz, c, dtype=x.dtype, device=x.device)
    if out.numel() == 0:
        return out
    x = x if x.stride(1) == 1 else x.contiguous()
    kw = weight.shape[1]
    block_c = 256 if bsz >= 8 else 128
    _conv1d_update_kernel[(bsz, triton.cdiv(c, block_c))](
        x, weight, conv_state, b_state_idx, out,
        x.stride(0), weight.stride(0), weight.stride(1), *conv_state.stride(), out.stride(0), c,
        KW=kw, BLOCK_C=block_c, num_warps=4, **pdl_args(x),
    )
    return out


if triton_available():
    import triton
    import triton.language as tl

    from lightllm_mtp.kernels.pdl import pdl_wait

    @triton.jit
    def _conv1d_update_kernel(
        x_ptr, w_ptr, state_ptr, idx_ptr, out_ptr,
        stride_x, stride_wc, stride_wk, stride_ss, stride_sc, stride_sw, stride_o, C,
        KW: tl.constexpr, BLOCK_C: tl.constexpr, PDL: tl.constexpr,
    ):
        pdl_wait(PDL)
        b = tl.program_id(0).to(tl.int64)
        offs_c = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
        mask_c = offs_c < C
        slot = tl.load(idx_ptr + b).to(tl.int64)
        st = state_ptr + slot * stride_ss + offs_c * stride_sc
        w = w_ptr + offs_c * stride_wc
        x = tl.load(x_ptr + b * stride_x + offs_c, mask=mask_c, other=0.0).to(tl.float32)
        # Window [state col 0, ..., state col KW-2, x]. Column j is overwritten only after the same thread has read
        # columns j and j+1 (one 1-D layout throughout), so the in-place shift needs no barrier.
        acc = tl.zeros([BLOCK_C], dtype=tl.float32)
        if KW > 1:
            cur = tl.load(st, mask=mask_c, other=0.0).to(tl.float32)
            for j in tl.static_range(KW - 1):
                acc += cur * tl.load(w + j * stride_wk, mask=mask_c, other=0.0).to(tl.float32)
                if j + 1 < KW - 1:
                    nxt = tl.load(st + (j + 1) * stride_sw, mask=mask_c, other=0.0).to(tl.float32)
                else:
                    nxt = x
                tl.store(st + j * stride_sw, nxt.to(state_ptr.dtype.element_ty), mask=mask_c)
                cur = nxt
        acc += x * tl.load(w + (KW - 1) * stride_wk, mask=mask_c, other=0.0).to(tl.float32)
        y = acc / (1.0 + tl.exp(-acc))
        tl.store(out_ptr + b * stride_o + offs_c, y.to(out_ptr.dtype.element_ty), mask=mask_c)

    @triton.jit(**unspecialized("T", "B"))  # one compiled kernel for every chunk length and prompt count
    def _conv1d_prefill_kernel(
        x_ptr, w_ptr, state_ptr, idx_ptr, cu_ptr, init_ptr, out_ptr,
        stride_x, stride_wc, stride_wk, stride_ss, stride_sc, stride_sw, stride_o, T, C, B, KEY_DIM,
        KW: tl.constexpr, SEARCH_STEPS: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_C: tl.constexpr,
        HEAD_DIM: tl.constexpr,
    ):
        offs_t = tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)
        offs_c = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
        mask_t = offs_t < T
        mask_c = offs_c < C
        # request of each row: the largest r in [0, B) with cu[r] <= t (empty requests are skipped by the ties)
        # (cu[lo] <= t < cu[hi] throughout; once hi = lo + 1, mid = lo and nothing moves)
        lo = tl.zeros([BLOCK_T], dtype=tl.int32)
        hi = lo + B
        for _ in tl.static_range(SEARCH_STEPS):
            mid = (lo + hi) // 2
            go = tl.load(cu_ptr + mid, mask=mask_t, other=0) <= offs_t
            lo = tl.where(go, mid, lo)
            hi = tl.where(go, hi, mid)
        start = tl.load(cu_ptr + lo, mask=mask_t, other=0)
        slot = tl.load(idx_ptr + lo, mask=mask_t, other=0).to(tl.int64)
        has_init = tl.load(init_ptr + lo, mask=mask_t, other=0) != 0
        rows = offs_t.to(tl.int64)
        mask = mask_t[:, None] & mask_c[None, :]
        st = state_ptr + slot[:, None] * stride_ss + offs_c[None, :] * stride_sc
        acc = tl.zeros([BLOCK_T, BLOCK_C], dtype=tl.float32)
        for j in tl.static_range(KW):
            # tap j multiplies input t - (KW-1) + j; before the request's first row it is history column KW-1+rel
            rel = offs_t - start - (KW - 1 - j)
            in_x = rel >= 0
            xv = tl.load(x_ptr + (rows - (KW - 1 - j))[:, None] * stride_x + offs_c[None, :],
                         mask=mask & in_x[:, None], other=0.0).to(tl.float32)
            if j < KW - 1:
                hv = tl.load(st + (KW - 1 + rel)[:, None] * stride_sw,
                             mask=mask & (~in_x & has_init)[:, None], other=0.0).to(tl.float32)
                xv += hv
            wj = tl.load(w_ptr + offs_c * stride_wc + j * stride_wk, mask=mask_c, other=0.0).to(tl.float32)
            acc += xv * wj[None, :]
        y = (acc / (1.0 + tl.exp(-acc))).to(out_ptr.dtype.element_ty)
        if HEAD_DIM == 1:
            tl.store(out_ptr + rows[:, None] * stride_o + offs_c[None, :], y, mask=mask)
        else:
            # planes q [T, KEY_DIM] | k [T, KEY_DIM] | v [T, C - 2 KEY_DIM]; q and k heads L2-normalised (the block
            # holds whole heads: BLOCK_C is a multiple of HEAD_DIM, and so is KEY_DIM)
            yf = y.to(tl.float32)
            sq = tl.reshape(yf * yf, [BLOCK_T, BLOCK_C // HEAD_DIM, HEAD_DIM])
            inv = 1.0 / tl.sqrt(tl.sum(sq, axis=2) + 1e-6)
            inv = tl.reshape(tl.broadcast_to(inv[:, :, None], [BLOCK_T, BLOCK_C // HEAD_DIM, HEAD_DIM]),
                             [BLOCK_T, BLOCK_C])
            is_qk = offs_c < 2 * KEY_DIM
            y = tl.where(is_qk[None, :], (yf * inv).to(out_ptr.dtype.element_ty), y)
            plane = tl.minimum(offs_c // KEY_DIM, 2).to(tl.int64)
            width = tl.where(plane == 2, C - 2 * KEY_DIM, KEY_DIM).to(tl.int64)
            col = offs_c - plane * KEY_DIM
            dst = out_ptr + plane[None, :] * T * KEY_DIM + rows[:, None] * width[None, :] + col[None, :]
            tl.store(dst, y, mask=mask)

    @triton.jit
    def _conv1d_prefill_state_kernel(
        x_ptr, state_ptr, idx_ptr, cu_ptr, init_ptr,
        stride_x, stride_ss, stride_sc, stride_sw, C,
        KW: tl.constexpr, BLOCK_C: tl.constexpr,
    ):
        # slot[:, c] <- ext[q + c], c < KW-1, where ext = [history (KW-1 columns), x_b (q rows)].
        b = tl.program_id(0)
        offs_c = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
        mask_c = offs_c < C
        slot = tl.load(idx_ptr + b).to(tl.int64)
        start = tl.load(cu_ptr + b).to(tl.int64)
        q = tl.load(cu_ptr + b + 1) - tl.load(cu_ptr + b)
        has_init = tl.load(init_ptr + b) != 0
        st = state_ptr + slot * stride_ss + offs_c * stride_sc
        # Column c reads column q + c >= c; columns are written in increasing order by the thread that read them
        # (one 1-D layout), so no read sees a new value.
        for c in tl.static_range(KW - 1):
            p = q + c
            from_hist = p < KW - 1
            # scalar conditions folded into per-channel bounds (vector masks only)
            hist_lim = tl.where(from_hist & has_init, C, 0)
            x_lim = tl.where(from_hist, 0, C)
            hv = tl.load(st + p * stride_sw, mask=offs_c < hist_lim, other=0.0)
            xv = tl.load(x_ptr + (start + p - (KW - 1)) * stride_x + offs_c, mask=offs_c < x_lim, other=0.0)
            val = tl.where(from_hist, hv.to(tl.float32), xv.to(tl.float32))
            tl.store(st + c * stride_sw, val.to(state_ptr.dtype.element_ty), mask=mask_c)
