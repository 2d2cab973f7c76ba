"""The draft-model proposer (`mtp_mode=draft_model`): a smaller checkpoint drafts from tokens alone, autoregressively
or, with parallel drafting, PARD-style in one forward. Both passes are built by the one input-preparation kernel
(StepBuilder.draft_window with position_shift=1: rows at the positions of the tokens they read).

After each window pass the draft has processed every position up to the newest token N with committed inputs, and
its committed GDN state (after N) sits at state position `accept_len - 1` of its speculative layout
(draft_model_loader.py), the index the target's next verify reads too. After a target forward (a verify, or a
prompt's last chunk: a virtual block with accept length 1):
  window pass (VERIFY, from the committed state): the tokens committed since (positions start+1 .. N, N the newest
      token, the anchor), then PARD's mask rows (N+1 .. N+k-1, the mask token), then padding. Its per-row states
      land at positions 0.., so the new committed state is at position accept - 1: the next window reads it.
      The anchor predicts d_1; PARD's mask rows predict d_2..d_k.
  chain steps (autoregressive, k-1 of them, VERIFY rows of one token): d_j at position N+j, reading the state
      position accept-2+j and writing accept-1+j (b_state_write), so the committed one is never touched; their
      KV goes into the new block's slots and the next window rewrites what was rejected.
Prompt chunks first run through the draft like through the target (same batch, its own KV and GDN state).
A prefix-cache hit whose snapshot lacks the draft's half first advances the draft's GDN state alone (`catch_up`).
"""

from __future__ import annotations

import dataclasses

import torch

from lightllm_mtp.common.basemodel.basemodel import TpPartBaseModel
from lightllm_mtp.common.basemodel.cuda_graph import GraphedForward
from lightllm_mtp.common.basemodel.forward_batch import ForwardBatch, ForwardMode
from lightllm_mtp.kernels.triton_utils import to_device_async
from lightllm_mtp.sampling.draft_choice import choose_draft
from lightllm_mtp.spec_decode.proposer import DraftInput, Proposer
from lightllm_mtp.spec_decode.step_builder import StepBuilder

CATCH_UP_ROWS = 4096  # rows of one catch-up pass (the engine's default prompt chunk)


class DraftModelProposer(Proposer):
    lookahead = 1  # unused: the draft reads the committed tokens through the draft window

    def __init__(
        self,
        draft: TpPartBaseModel,
        window: GraphedForward,
        chain: GraphedForward,
        builder: StepBuilder,
        mask_token_id: int | None = None,
        token_map: torch.Tensor | None = None,
    ):
        """draft: the draft model (prompt chunks run eagerly, like the target's); window / chain: its forward behind
        the graphs of the (VERIFY, window rows) pass and the (VERIFY, 1) chain steps. mask_token_id: PARD (one
        window pass drafts all k)."""
        self.draft, self.window, self.chain = draft, window, chain
        self.builder = builder
        self.num_draft_tokens = builder.num_draft_tokens
        self.mask_token_id = mask_token_id
        self.token_map = token_map

    @property
    def parallel(self) -> bool:
        return self.mask_token_id is not None

    @property
    def window_rows(self) -> int:
        """k+1 (the most tokens a verify commits), PARD 2k (then at most k-1 mask rows)."""
        return 2 * self.num_draft_tokens if self.parallel else self.num_draft_tokens + 1

    def catch_up(self, req_idx: int, tokens: list[int], start: int) -> None:
        """Prefix cache (engine/prefix_cache.py): advances request slot req_idx's draft GDN state, restored at
        position `start` (0: none), over `tokens` at positions start.., whose draft KV the page table already points
        at (the tree's slots): eager EXTEND passes of at most CATCH_UP_ROWS rows (a prompt chunk's activations at
        most) whose own KV writes go to the padding slot."""
        dev = self.draft.rt.device

        def on_dev(values, dtype):
            return to_device_async(torch.tensor(values, dtype=dtype), dev)

        for at in range(0, len(tokens), CATCH_UP_ROWS):
            piece, pos = tokens[at : at + CATCH_UP_ROWS], start + at
            n = len(piece)
            self.draft.forward(ForwardBatch(
                mode=ForwardMode.EXTEND, input_ids=on_dev(piece, torch.int64),
                positions=torch.arange(pos, pos + n, device=dev),
                mem_index=torch.full((n,), self.draft.caches.kv_pool.hold_slot, dtype=torch.int32, device=dev),
                b_req_idx=on_dev([req_idx], torch.int32), b_seq_len=on_dev([pos + n], torch.int32),
                b1_cu_q_len=on_dev([0, n], torch.int32), b_has_initial_state=on_dev([pos > 0], torch.bool),
                b_logits_index=on_dev([n - 1], torch.int64), max_q_len=n, host_q_lens=(n,),
            ))  # fmt: skip

    def _argmax(self, logits: torch.Tensor) -> torch.Tensor:
        best = logits.argmax(dim=-1)
        return best if self.token_map is None else self.token_map[best]

    def propose(self, inp: DraftInput) -> torch.Tensor:
        k, dev = self.num_draft_tokens, inp.b_req_idx.device
        if inp.batch.mode is ForwardMode.VERIFY:
            read = inp.batch.b_accept_len  # the committed state the target's verify read is the draft's too
        else:
            self.draft.forward(dataclasses.replace(inp.batch, keep_all_hidden=False))
            if inp.blocks is None:
                return torch.empty(0, k, dtype=torch.int64, device=dev)
            read = torch.ones_like(inp.b_req_idx, dtype=torch.int32)
        num_masks = None
        if self.parallel:
            num_masks = (self.builder.state.num_drafts[inp.b_req_idx.to(torch.int64)] - 1).clamp_min(0)
        batch, _, w = self.builder.draft_window(
            inp.blocks, inp.b_req_idx, None, self.window_rows, num_masks=num_masks, position_shift=1
        )
        ids = batch.input_ids
        ids = ids.clamp_min(0) if not self.parallel else torch.where(ids < 0, self.mask_token_id, ids)
        batch = dataclasses.replace(batch, mode=ForwardMode.VERIFY, input_ids=ids, b_accept_len=read.to(torch.int32))
        logits = self.window.forward(batch).logits
        if self.parallel:
            rows = w.b_anchor[:, None] + torch.arange(k, device=dev)
            if inp.chooser is None:
                return self._argmax(logits)[rows]
            drafts: list[torch.Tensor] = []
            for j in range(k):
                drafts.append(choose_draft(logits[rows[:, j]], self.token_map, inp.chooser, drafts))
            return torch.stack(drafts, dim=1)
        tokens = choose_draft(logits[w.b_anchor], self.token_map, inp.chooser, [])
        drafts = [tokens]
        committed = inp.blocks.b_accept_len.to(torch.int32) - 1  # the window's state position of the anchor
        for j in range(1, k):
            position = committed + j  # read position - 1 + 1 = b_accept_len; write one on
            step = dataclasses.replace(
                self.builder.chain_batch(inp.b_req_idx, tokens, j), mode=ForwardMode.VERIFY, b_accept_len=position,
                b_state_write=position,
            )  # fmt: skip
            tokens = choose_draft(self.chain.forward(step).logits, self.token_map, inp.chooser, drafts)
            drafts.append(tokens)
        return torch.stack(drafts, dim=1)
