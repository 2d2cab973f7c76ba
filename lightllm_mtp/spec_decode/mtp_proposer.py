"""The MTP proposers: the checkpoint's MTP layer(s) draft from the target's hidden states.

Every module's KV holds, at position p, its pass over (the hidden at p, the token after p): prompt chunks write it
over the chunk rows, verify steps over a draft window (StepBuilder.draft_window: the committed block rows, with
context rows before them, mask rows or padding after them).
  eagle (`eagle_with_att`): one module; d_1 from its window pass at the anchor row (position N - 1, whose next token
      is the newest one, at N), then k-1 chain steps, one row per request inside the next block, each fed the
      previous draft and the module's own hidden.
  parallel drafting (`eagle_with_att` + parallel_drafting): one module, one forward: the window holds k-1 mask
      rows after the anchor (the trained mask embedding and mask hidden as inputs); anchor and mask rows predict
      d_1..d_k.
  multi-layer (`vanilla_with_att`, M modules, k = M): module m drafts d_{m+1}. Training convention (train_tiny):
      module m at position p reads module m-1's hidden at p (the target's for m = 0) and the token m+1 positions
      after p, or module m-1's prediction of it where that token is not committed yet (newest token at N): its
      last m rows N-m..N-1 are provisional. Each verify window therefore starts P = M - 1 committed rows before
      the verified block (the target's hidden of those rows is kept in DraftState), so a provisional row is
      recomputed once its tokens are committed, and every module's KV at every position whose inputs are all
      committed equals a from-scratch pass over the committed sequence (unit_tests/spec_decode/test_draft_kv.py).
"""

from __future__ import annotations

import dataclasses

import torch

from lightllm_mtp.common.basemodel.cuda_graph import GraphedForward
from lightllm_mtp.common.basemodel.forward_batch import ForwardBatch, ForwardMode, ModelOutput
from lightllm_mtp.sampling.draft_choice import choose_draft
from lightllm_mtp.spec_decode.proposer import DraftInput, Proposer
from lightllm_mtp.spec_decode.step_builder import StepBuilder, draft_pass_batch


class _MtpProposer(Proposer):
    def __init__(self, modules: list[GraphedForward], builder: StepBuilder, token_map: torch.Tensor | None = None):
        """token_map: the reduced draft vocabulary (the modules' logits index it), None: the full vocabulary."""
        self.modules = modules
        self.builder = builder
        self.num_draft_tokens = builder.num_draft_tokens
        self.token_map = token_map

    def _argmax(self, logits: torch.Tensor) -> torch.Tensor:
        """The greedy draft token of each row of draft logits (rows that choose no draft: context predictions)."""
        best = logits.argmax(dim=-1)
        return best if self.token_map is None else self.token_map[best]

    def _choose(self, inp: DraftInput, logits: torch.Tensor, before: list[torch.Tensor]) -> torch.Tensor:
        """The draft of each request at one position ([B, V'] logits), after the drafts `before`."""
        return choose_draft(logits, self.token_map, inp.chooser, before)

    def _choose_all(self, inp: DraftInput, logits: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
        """rows [B, k]: the logits rows of draft positions 1..k -> drafts [B, k], one position after the other."""
        if inp.chooser is None:
            return self._argmax(logits)[rows]
        drafts: list[torch.Tensor] = []
        for j in range(rows.shape[1]):
            drafts.append(self._choose(inp, logits[rows[:, j]], drafts))
        return torch.stack(drafts, dim=1)

    def _pass(self, m: int, inp: DraftInput, tokens: torch.Tensor, hidden: torch.Tensor) -> ModelOutput:
        """Module m over the target's rows (prompt chunks)."""
        return self.modules[m].forward(draft_pass_batch(inp.batch, tokens, inp.logits_rows, ahead=m + 1), hidden)

    def _run(self, m: int, batch: ForwardBatch, tokens: torch.Tensor, hidden: torch.Tensor) -> ModelOutput:
        return self.modules[m].forward(dataclasses.replace(batch, input_ids=tokens), hidden)


def _is_verify(inp: DraftInput) -> bool:
    return inp.batch.mode is ForwardMode.VERIFY


def _kv_only(inp: DraftInput) -> bool:
    """A verify step whose new blocks hold no drafts (adaptive k = 0): the draft pass only writes the module's KV."""
    return inp.num_drafts == 0 and _is_verify(inp)


def _without_logits(batch: ForwardBatch) -> ForwardBatch:
    return dataclasses.replace(batch, b_logits_index=batch.b_logits_index[:0])


class EagleMtpProposer(_MtpProposer):
    lookahead = 1

    @property
    def window_rows(self) -> int:
        return self.num_draft_tokens + 1

    def propose(self, inp: DraftInput) -> torch.Tensor:
        if _is_verify(inp):
            batch, hidden, w = self.builder.draft_window(inp.blocks, inp.b_req_idx, inp.hidden, self.window_rows)
            if _kv_only(inp):
                self._run(0, _without_logits(batch), batch.input_ids.clamp_min(0), hidden)
                return torch.empty(w.b_anchor.shape[0], 0, dtype=torch.int64, device=hidden.device)
            out = self._run(0, batch, batch.input_ids.clamp_min(0), hidden)
            anchor_logits = anchor_rows = w.b_anchor
        else:
            out = self._pass(0, inp, inp.next_tokens[:, 0].clamp_min(0), inp.hidden)
            anchor_logits, anchor_rows = inp.anchor_logits, inp.anchor_rows
        tokens = self._choose(inp, out.logits[anchor_logits], [])
        hidden = out.hidden[anchor_rows]
        drafts = [tokens]
        k = self.num_draft_tokens if inp.num_drafts is None else inp.num_drafts
        chain_steps = k - 1 if inp.anchor_rows.shape[0] else 0  # prompt chunks may draft none
        for row in range(chain_steps):
            out = self.modules[0].forward(self.builder.chain_batch(inp.b_req_idx, tokens, row), hidden)
            tokens, hidden = self._choose(inp, out.logits, drafts), out.hidden
            drafts.append(tokens)
        return torch.stack(drafts, dim=1)


class ParallelMtpProposer(_MtpProposer):
    """One module; one window forward per step drafts all k tokens (prompt chunks: the chunk pass writes the
    module's KV, then the window over each finished prompt's last row drafts)."""

    lookahead = 1

    def __init__(self, modules: list[GraphedForward], builder: StepBuilder, mask_hidden: torch.Tensor,
                 token_map: torch.Tensor | None = None):  # fmt: skip
        super().__init__(modules, builder, token_map)
        self.mask_hidden = mask_hidden

    @property
    def window_rows(self) -> int:
        return 2 * self.num_draft_tokens  # at most k+1 committed block rows, then at most k-1 mask rows

    def propose(self, inp: DraftInput) -> torch.Tensor:
        k = self.num_draft_tokens
        if not _is_verify(inp):
            self._pass(0, inp, inp.next_tokens[:, 0].clamp_min(0), inp.hidden)
            if inp.blocks is None:
                return torch.empty(0, k, dtype=torch.int64, device=inp.hidden.device)
        idx = inp.b_req_idx.to(torch.int64)
        num_masks = (self.builder.state.num_drafts[idx] - 1).clamp_min(0)
        batch, hidden, w = self.builder.draft_window(
            inp.blocks, inp.b_req_idx, inp.hidden, self.window_rows, num_masks=num_masks, mask_hidden=self.mask_hidden
        )
        if _kv_only(inp):
            self._run(0, _without_logits(batch), batch.input_ids, hidden)
            return torch.empty(w.b_anchor.shape[0], 0, dtype=torch.int64, device=hidden.device)
        out = self._run(0, batch, batch.input_ids, hidden)  # -1 rows read the mask embedding
        rows = w.b_anchor[:, None] + torch.arange(k, device=w.b_anchor.device)
        return self._choose_all(inp, out.logits, rows)


class MultiLayerMtpProposer(_MtpProposer):
    @property
    def lookahead(self) -> int:
        return len(self.modules)

    @property
    def window_rows(self) -> int:
        return self.builder.state.num_context_rows + self.num_draft_tokens + 1

    def propose(self, inp: DraftInput) -> torch.Tensor:
        """Prompt chunks: every module over the chunk rows (their KV); a request that finished its prompt then
        drafts from a window over its last prompt row, whose context rows (the last P prompt rows before it) are
        recomputed now that the sampled token is known. Verify steps: the window over the verified blocks."""
        if not _is_verify(inp):
            self._modules_over(inp.next_tokens, inp.logits_rows, inp.hidden,
                               lambda m, tokens, hidden: self._pass(m, inp, tokens, hidden))  # fmt: skip
            if inp.blocks is None:
                return torch.empty(0, self.num_draft_tokens, dtype=torch.int64, device=inp.hidden.device)
        batch, hidden, w = self.builder.draft_window(
            inp.blocks, inp.b_req_idx, inp.hidden, self.window_rows, lookahead=self.lookahead
        )
        argmax = self._modules_over(w.next_tokens, None, hidden,
                                    lambda m, tokens, hidden: self._run(m, batch, tokens, hidden),
                                    anchors=w.b_anchor, inp=inp)  # fmt: skip
        return torch.stack([a[w.b_anchor] for a in argmax], dim=1)

    def _modules_over(self, next_tokens, logits_rows, hidden, run, anchors=None, inp=None) -> list[torch.Tensor]:
        """Module m reads the committed token m+1 positions ahead, or module m-1's prediction of it, and module
        m-1's hidden. Returns each module's argmax (of logits_rows; None: every row); at `anchors` (a window pass)
        module m's row is draft d_{m+1}, chosen through the requests' processing."""
        argmaxes, predicted, drafts = [], None, []
        for m in range(len(self.modules)):
            ahead = next_tokens[:, m]
            tokens = ahead.clamp_min(0) if predicted is None else torch.where(ahead >= 0, ahead, predicted)
            out = run(m, tokens, hidden)
            argmax = self._argmax(out.logits)
            if anchors is not None and inp.chooser is not None:
                drafts.append(self._choose(inp, out.logits[anchors], drafts))
                argmax = argmax.index_copy(0, anchors, drafts[-1])
            argmaxes.append(argmax)
            if logits_rows is None:
                predicted = argmax
            else:  # rows without logits always have their next input committed
                predicted = torch.zeros_like(ahead).index_copy_(0, logits_rows, argmax)
            hidden = out.hidden
        return argmaxes
