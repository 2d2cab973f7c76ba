"""The one builder of speculative steps. Every verify block, draft pass and eagle chain step is made here, on the
device, from DraftState: the first block after a prompt, steady decode, blocks near max_model_len or
max_new_tokens, steps beside prompt chunks, steps queued ahead by overlap scheduling. Blocks are always k+1 rows
(the CUDA-graph layout); near max_model_len a request's rows past its draft count are padding that writes the
padding KV slot."""

from __future__ import annotations

import dataclasses

import torch

from lightllm_mtp.common.basemodel.forward_batch import ForwardBatch, ForwardMode
from lightllm_mtp.kernels.speculative.draft_inputs import DraftWindow, draft_window
from lightllm_mtp.spec_decode.draft_state import ACCEPT_LEN, DRAFTS, LAST_TOKEN, START, DraftState
from lightllm_mtp.spec_decode.proposer import CommittedBlocks


class StepBuilder:
    def __init__(self, state: DraftState, req_to_token: torch.Tensor, max_model_len: int, hold_slot: int):
        self.state = state
        self.num_draft_tokens = state.num_draft_tokens
        self.req_to_token = req_to_token
        self.max_model_len = max_model_len
        self.hold_slot = hold_slot
        self.device = req_to_token.device
        self._block_rows = torch.arange(self.num_draft_tokens + 1, device=self.device)
        self._constants: dict[tuple[int, int], tuple[torch.Tensor, ...]] = {}

    def _batch_constants(self, bsz: int, rows_per_req: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(b1_cu_q_len, b_has_initial_state, b_logits_index) of a uniform batch, made once per shape."""
        key = (bsz, rows_per_req)
        if key not in self._constants:
            dev = self.device
            self._constants[key] = (
                torch.arange(bsz + 1, dtype=torch.int32, device=dev) * rows_per_req,
                torch.ones(bsz, dtype=torch.bool, device=dev),
                torch.arange(bsz * rows_per_req, dtype=torch.int64, device=dev),
            )
        return self._constants[key]

    def open_blocks(
        self,
        b_req_idx: torch.Tensor,
        start: torch.Tensor,
        last_token: torch.Tensor,
        slots: torch.Tensor,
        accept_len: torch.Tensor | None = None,
        max_drafts: int | None = None,
    ) -> None:
        """The next verify blocks of requests `b_req_idx` [B]: rows at positions start..start+k ([B] int64) holding
        [last_token, d_1..d_k], KV slots `slots` [B, k+1] int32 written into the page table. A request keeps
        min(k, max_model_len - 2 - start) drafts (no emitted token may pass max_model_len); its rows past them are
        padding: their KV goes to the padding slot and their positions (up to max_model_len - 1 + k) to the page
        table's padding columns. accept_len [B]: what the verify that made these blocks emitted (None: 1, a
        first block after the prompt). max_drafts: the drafts these blocks hold at most (adaptive speculation: slots
        [B, max_drafts + 1], the rows past them padding; None: k)."""
        idx = b_req_idx.to(torch.int64)
        k = self.num_draft_tokens
        max_drafts = k if max_drafts is None else max_drafts
        if slots.shape[1] < k + 1:
            slots = torch.nn.functional.pad(slots, (0, k + 1 - slots.shape[1]), value=self.hold_slot)
        # a live request starts at most at max_model_len - 2; a request that finished while its next step was
        # already queued (overlap) may run past that once, on rows nobody reads: keep its positions in the table
        start = start.clamp(max=self.max_model_len - 1)
        num_drafts = (self.max_model_len - 2 - start).clamp(0, max_drafts)
        mem = torch.where(self._block_rows[None, :] <= num_drafts[:, None], slots, self.hold_slot)
        self.req_to_token[idx[:, None], start[:, None] + self._block_rows[None, :]] = mem.to(torch.int32)
        if accept_len is None:
            accept_len = torch.ones_like(start)
        head = torch.stack([start, num_drafts, accept_len.to(torch.int64), last_token], dim=1)
        s = self.state
        s.table[idx, START:DRAFTS] = head
        s.table[idx, s.slots_col :] = mem.to(torch.int64)

    def verify_batch(self, b_req_idx: torch.Tensor, rows: int | None = None) -> tuple[ForwardBatch, torch.Tensor]:
        """The open blocks of requests `b_req_idx` [B] int32 (device) as one VERIFY batch of B x `rows` rows (None:
        k+1; fewer under adaptive speculation, at least 1 + every block's draft count), and their DraftState rows as
        gathered (drafts and draft counts for the accept rule)."""
        s, idx = self.state, b_req_idx.to(torch.int64)
        q = self.num_draft_tokens + 1 if rows is None else rows
        rows = s.table[idx]  # one gather: [B, 4 + k + k+1]
        start = rows[:, START]
        cu, has_state, logits_index = self._batch_constants(idx.shape[0], q)
        batch = ForwardBatch(
            mode=ForwardMode.VERIFY,
            input_ids=rows[:, LAST_TOKEN : LAST_TOKEN + q].flatten(),  # [last token, d_1..d_{q-1}] per request
            positions=(start[:, None] + self._block_rows[None, :q]).flatten(),
            mem_index=rows[:, s.slots_col : s.slots_col + q].to(torch.int32).flatten(),
            b_req_idx=b_req_idx,
            b_seq_len=(start + q).to(torch.int32),
            b1_cu_q_len=cu,
            b_has_initial_state=has_state,
            b_logits_index=logits_index,
            b_accept_len=rows[:, ACCEPT_LEN].to(torch.int32),
            max_q_len=q,
            keep_all_hidden=True,
        )
        return batch, rows

    def chain_batch(self, b_req_idx: torch.Tensor, tokens: torch.Tensor, row: int) -> ForwardBatch:
        """One DECODE row per request at block row `row` of its open block (eagle chain step: input draft
        d_{row+1}, predicting d_{row+2}); the draft module writes its KV at that row's slot."""
        s, idx = self.state, b_req_idx.to(torch.int64)
        rows = s.table[idx]  # slices only below: a list index would copy it from the host (a sync)
        positions = rows[:, START] + row
        cu, has_state, logits_index = self._batch_constants(idx.shape[0], 1)
        return ForwardBatch(
            mode=ForwardMode.DECODE,
            input_ids=tokens,
            positions=positions,
            mem_index=rows[:, s.slots_col + row].to(torch.int32),
            b_req_idx=b_req_idx,
            b_seq_len=(positions + 1).to(torch.int32),
            b1_cu_q_len=cu,
            b_has_initial_state=has_state,
            b_logits_index=logits_index,
            max_q_len=1,
        )


    def draft_window(
        self,
        blocks: CommittedBlocks,
        b_req_idx: torch.Tensor,
        hidden: torch.Tensor | None,
        rows: int,
        lookahead: int = 1,
        num_masks: torch.Tensor | None = None,
        mask_hidden: torch.Tensor | None = None,
        position_shift: int = 0,
    ) -> tuple[ForwardBatch, torch.Tensor | None, DraftWindow]:
        """A draft pass over committed blocks: the state's context rows, the committed block rows, `num_masks` [B]
        mask rows and padding, `rows` per request (kernels/speculative/draft_inputs.py). Returns the EXTEND batch
        (its input_ids are next-token column 0: -1 on mask and padding rows), the hidden of its rows and the
        window. Multi-layer MTP: the state's context moves on to the rows before the newest token. Draft models
        (hidden None, position_shift 1): rows at the positions of the tokens they read, after `start`."""
        s, idx = self.state, b_req_idx.to(torch.int64)
        p = s.num_context_rows
        # the kernel's tokens start at position start - p + 1: p - 1 context tokens, then the block's from `start`
        b_tokens = torch.cat([s.context_tokens[idx], blocks.b_tokens], dim=1) if p else blocks.b_tokens[:, 1:]
        if hidden is not None:
            h = hidden.shape[1]
            mask_row = mask_hidden if mask_hidden is not None else hidden.new_zeros(h)
            source = torch.cat([hidden, s.context_hidden.view(-1, h), mask_row[None]])
        if num_masks is None:
            num_masks = torch.zeros_like(blocks.b_start)
        w = draft_window(
            b_start=blocks.b_start, b_accept_len=blocks.b_accept_len, b_num_masks=num_masks, b_req_idx=b_req_idx,
            b_row0=blocks.b_row0, b_tokens=b_tokens, req_to_token=self.req_to_token, hold_slot=self.hold_slot,
            num_prepend=p, rows=rows, lookahead=lookahead, context_base=0 if hidden is None else hidden.shape[0],
            mask_index=0 if hidden is None else source.shape[0] - 1, position_shift=position_shift,
        )  # fmt: skip
        window_hidden = None if hidden is None else source[w.hidden_index]
        cu, has_state, logits_index = self._batch_constants(idx.shape[0], rows)
        batch = ForwardBatch(
            mode=ForwardMode.EXTEND,
            input_ids=w.next_tokens[:, 0],
            positions=w.positions,
            mem_index=w.mem_index,
            b_req_idx=b_req_idx,
            b_seq_len=w.b_seq_len,
            b1_cu_q_len=cu,
            b_has_initial_state=has_state,
            b_logits_index=logits_index,
            max_q_len=rows,
            keep_all_hidden=True,
        )
        if p:
            valid = (w.b_context_rows >= 0)[..., None]
            new = window_hidden[w.b_context_rows.clamp_min(0)]
            s.context_hidden[idx] = torch.where(valid, new, s.context_hidden[idx])
            cols = blocks.b_accept_len.to(torch.int64)[:, None] + torch.arange(p - 1, device=self.device)
            s.context_tokens[idx] = b_tokens.gather(1, cols)
        return batch, window_hidden, w

    def prompt_context(
        self, req_idx: list[int], rows: list[range], chunk_ends: list[int], prompts: list[list[int]],
        hidden: torch.Tensor,
    ) -> None:  # fmt: skip
        """Multi-layer MTP after prompt chunks: each request's context moves on to its last P prompt rows so far
        (`req_idx`: the requests' slots, host ints; `rows`: its rows of the chunk batch, `hidden` the target hidden
        of every row; `chunk_ends`: the position after its chunk)."""
        s, p = self.state, self.state.num_context_rows
        if p == 0 or not rows:
            return
        h, base = hidden.shape[1], hidden.shape[0]
        index, tokens = [], []
        for req, chunk, end, prompt in zip(req_idx, rows, chunk_ends, prompts):
            n = len(chunk)  # entry j <- old entry n + j while that exists, else chunk row n + j - p
            index.append([base + req * p + n + j if n + j < p else chunk.start + n + j - p for j in range(p)])
            tokens.append([prompt[q] if q >= 0 else -1 for q in range(end - p + 1, end)])
        source = torch.cat([hidden, s.context_hidden.view(-1, h)])
        idx = torch.tensor(req_idx, dtype=torch.int64).to(self.device, non_blocking=True)
        s.context_hidden[idx] = source[torch.tensor(index, device=self.device)]
        if p > 1:
            s.context_tokens[idx] = torch.tensor(tokens, dtype=torch.int64, device=self.device)


def draft_pass_batch(main: ForwardBatch, input_ids: torch.Tensor, logits_rows: torch.Tensor | None,
                     ahead: int = 1) -> ForwardBatch:  # fmt: skip
    """A draft module's pass over the target's rows (same positions, KV slots, page table; its own KV layer): row i
    reads the token `ahead` positions after row i's input (its vision embedding at an image token). Logits of
    `logits_rows` (None: every row, the verify-block graph layout)."""
    mode = ForwardMode.EXTEND if main.mode is ForwardMode.VERIFY else main.mode
    index = main.b_logits_index if logits_rows is None else logits_rows  # a VERIFY batch's logits rows are all rows
    embeds = main.ahead_embeds[ahead - 1] if ahead <= len(main.ahead_embeds) else None
    return dataclasses.replace(
        main, mode=mode, input_ids=input_ids, b_logits_index=index, b_accept_len=None, keep_all_hidden=True,
        input_embeds=embeds, ahead_embeds=(),
    )
