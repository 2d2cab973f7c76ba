"""The MTP proposers: the checkpoint's MTP layer(s) draft from the target's hidden states.

Each MTP module first runs over the target's rows with (hidden of row i, the token after row i) and writes its KV
at the same slots, so its attention always sees the whole committed context.
  eagle (`eagle_with_att`): one module; d_1 from its pass at the anchor row, then k-1 chain steps, one row per
      request inside the next block, each fed the previous draft and the module's own hidden.
  vanilla (`vanilla_with_att`): module m (mtp.layers.m) drafts d_{m+1}; it reads the token m+1 positions after
      each row where that is committed, else module m-1's prediction at that row, and module m-1's hidden.
"""

from __future__ import annotations

import torch

from lightllm_mtp.common.basemodel.cuda_graph import GraphedForward
from lightllm_mtp.common.basemodel.forward_batch import ModelOutput
from lightllm_mtp.spec_decode.proposer import DraftInput, Proposer
from lightllm_mtp.spec_decode.step_builder import StepBuilder, draft_pass_batch


class _MtpProposer(Proposer):
    def __init__(self, modules: list[GraphedForward], builder: StepBuilder):
        self.modules = modules
        self.builder = builder
        self.num_draft_tokens = builder.num_draft_tokens

    def _pass(self, m: int, inp: DraftInput, tokens: torch.Tensor, hidden: torch.Tensor) -> ModelOutput:
        return self.modules[m].forward(draft_pass_batch(inp.batch, tokens, inp.logits_rows), hidden)


class EagleMtpProposer(_MtpProposer):
    lookahead = 1

    def propose(self, inp: DraftInput) -> torch.Tensor:
        out = self._pass(0, inp, inp.next_tokens[:, 0].clamp_min(0), inp.hidden)
        tokens = out.logits[inp.anchor_logits].argmax(dim=-1)
        hidden = out.hidden[inp.anchor_rows]
        drafts = [tokens]
        chain_steps = self.num_draft_tokens - 1 if inp.anchor_rows.shape[0] else 0  # prompt chunks may draft none
        for row in range(chain_steps):
            out = self.modules[0].forward(self.builder.chain_batch(inp.b_req_idx, tokens, row), hidden)
            tokens, hidden = out.logits.argmax(dim=-1), out.hidden
            drafts.append(tokens)
        return torch.stack(drafts, dim=1)


class VanillaMtpProposer(_MtpProposer):
    @property
    def lookahead(self) -> int:
        return len(self.modules)

    def propose(self, inp: DraftInput) -> torch.Tensor:
        drafts, hidden, predicted = [], inp.hidden, None
        for m in range(len(self.modules)):
            ahead = inp.next_tokens[:, m]
            tokens = ahead.clamp_min(0) if predicted is None else torch.where(ahead >= 0, ahead, predicted)
            out = self._pass(m, inp, tokens, hidden)
            argmax = out.logits.argmax(dim=-1)
            drafts.append(argmax[inp.anchor_logits])
            if inp.logits_rows is None:
                predicted = argmax
            else:  # rows without logits always have their next input committed
                predicted = torch.zeros_like(ahead).index_copy_(0, inp.logits_rows, argmax)
            hidden = out.hidden
        return torch.stack(drafts, dim=1)
