"""ForwardBatch builders for the speculative path: verify blocks, draft passes, eagle chain steps."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch

from lightllm_mtp.common.basemodel.forward_batch import ForwardBatch, ForwardMode
from lightllm_mtp.engine.request import Request


def verify_batch(reqs: list[Request], device: torch.device) -> tuple[ForwardBatch, list[int]]:
    """Each request's block [last committed token, drafts...] at positions p0..p0+k over its cached context.

    Example, two requests with p0 = 5 and 9, drafts [a, b] and [c]:
        input_ids = [x5, a, b, y9, c], positions = [5, 6, 7, 9, 10], b1_cu_q_len = [0, 3, 5], b_seq_len = [8, 11]
    The block slots were allocated (and written into req_to_token) when the drafts were made. Returns the batch
    and a host copy of its positions.
    """
    ids: list[int] = []
    positions: list[int] = []
    cu = [0]
    seq_len: list[int] = []
    for r in reqs:
        assert r.draft is not None and r.draft.start == r.num_tokens - 1
        p0 = r.draft.start
        block = [r.token_at(p0), *r.draft.tokens]
        ids += block
        positions += range(p0, p0 + len(block))
        cu.append(cu[-1] + len(block))
        seq_len.append(p0 + len(block))
    t, bsz = cu[-1], len(reqs)
    # one host-to-device copy: [ids | positions | slots | req_idx | seq_len | cu]
    packed = torch.tensor(ids + positions + [r.req_idx for r in reqs] + seq_len + cu, dtype=torch.int64)
    packed = torch.cat([packed[: 2 * t], torch.cat([r.draft.slots for r in reqs]).to(torch.int64), packed[2 * t :]])
    dev = packed.to(device, non_blocking=True)
    ints = dev[2 * t :].to(torch.int32)  # slots, req_idx, seq_len, cu
    batch = ForwardBatch(
        mode=ForwardMode.VERIFY,
        input_ids=dev[:t],
        positions=dev[t : 2 * t],
        mem_index=ints[:t],
        b_req_idx=ints[t : t + bsz],
        b_seq_len=ints[t + bsz : t + 2 * bsz],
        b1_cu_q_len=ints[t + 2 * bsz :],
        b_has_initial_state=torch.ones(bsz, dtype=torch.bool, device=device),
        b_logits_index=torch.arange(t, dtype=torch.int64, device=device),
        max_q_len=max(b - a for a, b in zip(cu, cu[1:])),
        keep_all_hidden=True,
    )
    return batch, positions


def draft_pass_batch(main: ForwardBatch, input_ids: torch.Tensor, logits_rows: list[int] | None) -> ForwardBatch:
    """The main batch's rows (same positions, slots, page table) with the draft's inputs: for row i the token
    that follows row i's input. The draft writes its KV into its own pool layer at the same slots. Logits for
    `logits_rows` (None: every row)."""
    mode = ForwardMode.EXTEND if main.mode is ForwardMode.VERIFY else main.mode
    logits_index = torch.arange(main.num_tokens, device=input_ids.device) if logits_rows is None else (
        torch.tensor(logits_rows, dtype=torch.int64).to(input_ids.device, non_blocking=True)
    )
    return dataclasses.replace(main, mode=mode, input_ids=input_ids, b_logits_index=logits_index, keep_all_hidden=True)


def chain_step_batch(reqs: list[Request], tokens: list[int], positions: list[int], device) -> ForwardBatch:
    """One row per request: a draft token at `position`, inside the request's next verify block."""
    slots = []
    for r, pos in zip(reqs, positions):
        assert r.draft is not None
        row = pos - r.draft.start
        slots.append(r.draft.slots[row : row + 1])
    n = len(reqs)
    packed = torch.tensor(
        [tokens, positions, torch.cat(slots).tolist(), [r.req_idx for r in reqs], [p + 1 for p in positions]],
        dtype=torch.int64,
    ).to(device, non_blocking=True)
    ints = packed[2:].to(torch.int32)
    return ForwardBatch(
        mode=ForwardMode.DECODE,
        input_ids=packed[0],
        positions=packed[1],
        mem_index=ints[0],
        b_req_idx=ints[1],
        b_seq_len=ints[2],
        b1_cu_q_len=torch.arange(n + 1, dtype=torch.int32, device=device),
        b_has_initial_state=torch.ones(n, dtype=torch.bool, device=device),
        b_logits_index=torch.arange(n, dtype=torch.int64, device=device),
        max_q_len=1,
    )


# ---- the next verify step built on the device (overlap scheduling, eagle mode, uniform blocks) -------------
@dataclass
class NextBlocks:
    """The next verify blocks of a batch, derived on the device from a verify step that has not reached the host."""

    b_req_idx: torch.Tensor  # [B] int32
    start: torch.Tensor  # [B] int64: position of each block's row 0 (the newest emitted token)
    last_tokens: torch.Tensor  # [B] int64: that token
    first_drafts: torch.Tensor  # [B] int64: d_1, the draft pass's prediction at the anchor row
    anchor_hidden: torch.Tensor  # [B, H]: the draft module's hidden at the anchor row (eagle chain input)
    slots: torch.Tensor  # [B * (k+1)] int32 host: the blocks' KV slots, already in req_to_token
    slots_dev: torch.Tensor  # [B, k+1] int32


def next_blocks_on_device(v, sel, kv_pool, req_manager, k: int) -> NextBlocks:
    """v: the previous step's VerifyLaunch (uniform blocks of k+1 rows, first draft pass run); sel: its rows to
    continue (a slice or an index tensor). Allocates the new blocks' KV slots and writes them into req_to_token at
    positions start..start+k, all without a host sync.

    With accept length a (tokens emitted by the previous block, which started at s): the newest token sits at
    s + a, so the new block starts there; the anchor row is a - 1 (its input is that token), and its draft-pass
    argmax is d_1."""
    q = k + 1
    accept = v.result.b_accept_len[sel].to(torch.int64)
    bsz, dev = accept.shape[0], accept.device
    anchor = (accept - 1)[:, None]
    hidden = v.draft_out.hidden.view(len(v.reqs), q, -1)[sel]
    start = v.start[sel] + accept
    b_req_idx = v.batch.b_req_idx[sel]
    slots = kv_pool.alloc(bsz * q)
    slots_dev = slots.to(dev, non_blocking=True).view(bsz, q)
    positions = start[:, None] + torch.arange(q, device=dev)
    req_manager.req_to_token[b_req_idx.to(torch.int64)[:, None], positions] = slots_dev
    return NextBlocks(
        b_req_idx=b_req_idx,
        start=start,
        last_tokens=v.result.emitted[sel].gather(1, anchor).squeeze(1),
        first_drafts=v.draft_argmax[sel].gather(1, anchor).squeeze(1),
        anchor_hidden=hidden[torch.arange(bsz, device=dev), accept - 1],
        slots=slots,
        slots_dev=slots_dev,
    )


def chain_batch_on_device(nxt: NextBlocks, tokens: torch.Tensor, j: int) -> ForwardBatch:
    """Eagle chain step j (0-based) inside the next blocks: draft d_{j+1} (`tokens` [B]) at block row j, predicting
    d_{j+2}."""
    bsz = tokens.shape[0]
    dev = tokens.device
    positions = nxt.start + j
    return ForwardBatch(
        mode=ForwardMode.DECODE,
        input_ids=tokens,
        positions=positions,
        mem_index=nxt.slots_dev[:, j].contiguous(),
        b_req_idx=nxt.b_req_idx,
        b_seq_len=(positions + 1).to(torch.int32),
        b1_cu_q_len=torch.arange(bsz + 1, dtype=torch.int32, device=dev),
        b_has_initial_state=torch.ones(bsz, dtype=torch.bool, device=dev),
        b_logits_index=torch.arange(bsz, dtype=torch.int64, device=dev),
        max_q_len=1,
    )


def verify_batch_on_device(nxt: NextBlocks, drafts: torch.Tensor, k: int) -> ForwardBatch:
    """The next blocks [last token, d_1..d_k] (drafts [B, k] on the device) as a VERIFY batch."""
    bsz, q = drafts.shape[0], k + 1
    dev = drafts.device
    return ForwardBatch(
        mode=ForwardMode.VERIFY,
        input_ids=torch.cat([nxt.last_tokens[:, None], drafts], dim=1).flatten(),
        positions=(nxt.start[:, None] + torch.arange(q, device=dev)).flatten(),
        mem_index=nxt.slots_dev.flatten(),
        b_req_idx=nxt.b_req_idx,
        b_seq_len=(nxt.start + q).to(torch.int32),
        b1_cu_q_len=torch.arange(bsz + 1, dtype=torch.int32, device=dev) * q,
        b_has_initial_state=torch.ones(bsz, dtype=torch.bool, device=dev),
        b_logits_index=torch.arange(bsz * q, dtype=torch.int64, device=dev),
        max_q_len=q,
        keep_all_hidden=True,
    )
