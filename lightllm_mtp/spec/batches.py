"""ForwardBatch builders for the speculative path: verify blocks, draft passes, eagle chain steps."""

from __future__ import annotations

import dataclasses

import torch

from lightllm_mtp.common.basemodel.forward_batch import ForwardBatch, ForwardMode
from lightllm_mtp.engine.request import Request


def verify_batch(reqs: list[Request], device: torch.device) -> ForwardBatch:
    """Each request's block [last committed token, drafts...] at positions p0..p0+k over its cached context.

    Example, two requests with p0 = 5 and 9, drafts [a, b] and [c]:
        input_ids = [x5, a, b, y9, c], positions = [5, 6, 7, 9, 10], b1_cu_q_len = [0, 3, 5], b_seq_len = [8, 11]
    The block slots were allocated (and written into req_to_token) when the drafts were made.
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
    slots = torch.cat([r.draft.slots for r in reqs])
    return ForwardBatch(
        mode=ForwardMode.VERIFY,
        input_ids=torch.tensor(ids, dtype=torch.int64).to(device),
        positions=torch.tensor(positions, dtype=torch.int64).to(device),
        mem_index=slots.to(device),
        b_req_idx=torch.tensor([r.req_idx for r in reqs], dtype=torch.int32).to(device),
        b_seq_len=torch.tensor(seq_len, dtype=torch.int32).to(device),
        b1_cu_q_len=torch.tensor(cu, dtype=torch.int32).to(device),
        b_has_initial_state=torch.ones(len(reqs), dtype=torch.bool, device=device),
        b_logits_index=torch.arange(cu[-1], dtype=torch.int64, device=device),
        max_q_len=max(b - a for a, b in zip(cu, cu[1:])),
        keep_all_hidden=True,
    )


def draft_pass_batch(main: ForwardBatch, input_ids: torch.Tensor, logits_rows: list[int]) -> ForwardBatch:
    """The main batch's rows (same positions, slots, page table) with the draft's inputs: for row i the token
    that follows row i's input. The draft writes its KV into its own pool layer at the same slots."""
    mode = ForwardMode.EXTEND if main.mode is ForwardMode.VERIFY else main.mode
    return dataclasses.replace(
        main,
        mode=mode,
        input_ids=input_ids,
        b_logits_index=torch.tensor(logits_rows, dtype=torch.int64).to(input_ids.device),
        keep_all_hidden=True,
    )


def chain_step_batch(reqs: list[Request], tokens: list[int], positions: list[int], device) -> ForwardBatch:
    """One row per request: a draft token at `position`, inside the request's next verify block."""
    slots = []
    for r, pos in zip(reqs, positions):
        assert r.draft is not None
        row = pos - r.draft.start
        slots.append(r.draft.slots[row : row + 1])
    n = len(reqs)
    return ForwardBatch(
        mode=ForwardMode.DECODE,
        input_ids=torch.tensor(tokens, dtype=torch.int64).to(device),
        positions=torch.tensor(positions, dtype=torch.int64).to(device),
        mem_index=torch.cat(slots).to(device),
        b_req_idx=torch.tensor([r.req_idx for r in reqs], dtype=torch.int32).to(device),
        b_seq_len=torch.tensor([p + 1 for p in positions], dtype=torch.int32).to(device),
        b1_cu_q_len=torch.arange(n + 1, dtype=torch.int32).to(device),
        b_has_initial_state=torch.ones(n, dtype=torch.bool, device=device),
        b_logits_index=torch.arange(n, dtype=torch.int64, device=device),
        max_q_len=1,
    )
