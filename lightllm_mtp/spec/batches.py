"""ForwardBatch builders for the speculative path: verify blocks, draft passes, eagle chain steps."""

from __future__ import annotations

import dataclasses

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
