"""The requests' logits processing, written once for every place that chooses a token: plain sampling, every row of
a verify block, and every proposer's draft choice (spec_decode/), so that under speculative decoding each verify row
scores the distribution plain decoding would have used at that position.

What a row's logits go through, in this order (vLLM's semantics for each):
  repetition_penalty r: the logit of every token in the prompt or the output so far is divided by r when positive,
      multiplied by r otherwise;
  frequency_penalty f, presence_penalty p: minus f x (its count in the output) and p x (whether it occurs);
  logit_bias: added per token id;
  min_tokens: eos and the stop token ids are masked while the output is shorter;
  grammar: tokens the request's grammar does not allow at this row are masked (sampling/grammar.py; plain sampling
      and verify rows: a draft's grammar is applied on the host, draft_choice.py).
The output "so far" of a row is the request's committed output (the host's, at launch) followed by the row's extra
tokens on the device: for verify row i the drafts d_1..d_i, for a draft choice the tokens the verify emitted in the
same launch and the drafts chosen before it. A request whose processing reads its history is therefore never
launched while a step of it is still in flight (the engine leaves it out of the overlapped step).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from lightllm_mtp.sampling_params import SamplingParams


@dataclass(frozen=True)
class RowMasks:
    """Per logits row, the tokens a grammar allows ([N, V] bool); rows of requests without a grammar allow all."""

    allowed: torch.Tensor


def process_logits(logits: torch.Tensor, processing: LogitsProcessing | None, rows: torch.Tensor,
                   extra: torch.Tensor | None = None, token_map: torch.Tensor | None = None,
                   masks: RowMasks | None = None) -> torch.Tensor:  # fmt: skip
    """The one entry point: `processing.apply` (see there), or only the grammar masks without processing."""
    if processing is not None:
        return processing.apply(logits, rows, extra, token_map, masks)
    if masks is None:
        return logits
    allowed = masks.allowed if token_map is None else masks.allowed.index_select(1, token_map)
    return logits.float().masked_fill(~allowed, float("-inf"))


@dataclass
class LogitsProcessing:
    """The device tensors of one batch's processing (B requests); build it with `for_requests`."""

    vocab_size: int
    out_counts: torch.Tensor  # [B, V] float32: each token's count in the committed output
    in_prompt: torch.Tensor  # [B, V] bool: tokens of the prompt (repetition penalty)
    repetition: torch.Tensor  # [B] float32 (1: off)
    frequency: torch.Tensor  # [B]
    presence: torch.Tensor  # [B]
    bias: torch.Tensor | None  # [B, V] float32
    min_left: torch.Tensor  # [B] int64: output tokens still needed before eos / stop ids are allowed
    stop_ids: torch.Tensor  # [B, V] bool: eos and the request's stop token ids

    @staticmethod
    def needed(params: SamplingParams) -> bool:
        return params.uses_logits_processing

    @classmethod
    def for_requests(cls, histories: list[tuple[list[int], list[int], SamplingParams]], eos_ids: frozenset[int],
                     vocab_size: int, device: torch.device) -> LogitsProcessing | None:  # fmt: skip
        """histories: per request (prompt ids, committed output ids, params). None when no request needs any."""
        if not any(p.uses_logits_processing for _, _, p in histories):
            return None
        b, v = len(histories), vocab_size
        out_counts = torch.zeros(b, v, dtype=torch.float32)
        in_prompt = torch.zeros(b, v, dtype=torch.bool)
        stop_ids = torch.zeros(b, v, dtype=torch.bool)
        bias = None
        scalars = []
        for i, (prompt, output, p) in enumerate(histories):
            if p.repetition_penalty != 1.0 and prompt:
                in_prompt[i, torch.tensor(prompt)] = True
            if output and (p.repetition_penalty != 1.0 or p.frequency_penalty or p.presence_penalty):
                out_counts[i] = torch.bincount(torch.tensor(output), minlength=v)[:v].float()
            if p.logit_bias:
                bias = torch.zeros(b, v, dtype=torch.float32) if bias is None else bias
                ids, values = zip(*p.logit_bias)
                bias[i, torch.tensor(ids)] = torch.tensor(values, dtype=torch.float32)
            left = max(0, p.min_tokens - len(output))
            if left:
                stops = [t for t in (*(() if p.ignore_eos else eos_ids), *p.stop_token_ids) if t < v]
                if stops:
                    stop_ids[i, torch.tensor(stops)] = True
            scalars.append((p.repetition_penalty, p.frequency_penalty, p.presence_penalty, left))
        s = torch.tensor(scalars, dtype=torch.float64)

        def dev(t: torch.Tensor) -> torch.Tensor:
            return t.to(device, non_blocking=True)

        return cls(v, dev(out_counts), dev(in_prompt), dev(s[:, 0].float()), dev(s[:, 1].float()),
                   dev(s[:, 2].float()), None if bias is None else dev(bias), dev(s[:, 3].long()),
                   dev(stop_ids))  # fmt: skip

    def apply(self, logits: torch.Tensor, rows: torch.Tensor, extra: torch.Tensor | None = None,
              token_map: torch.Tensor | None = None, masks: RowMasks | None = None) -> torch.Tensor:  # fmt: skip
        """logits [N, V'] (V' = V, or the draft vocabulary's size with token_map [V'] of its ids); rows [N] int64:
        each row's request in this batch; extra [N, E] int64: the output tokens after the committed ones that
        precede each row (-1 padded), None: none. Returns processed fp32 logits (a new tensor)."""
        cols = (lambda t: t) if token_map is None else (lambda t: t.index_select(1, token_map))
        counts = self.out_counts.index_select(0, rows)
        num_extra = torch.zeros(rows.shape[0], dtype=torch.int64, device=rows.device)
        if extra is not None and extra.shape[1]:
            valid = extra >= 0
            counts.scatter_add_(1, extra.clamp_min(0), valid.to(counts.dtype))
            num_extra = valid.sum(dim=1)
        counts = cols(counts)
        out = logits.float().clone()
        rep = self.repetition[rows][:, None]
        seen = cols(self.in_prompt.index_select(0, rows)) | (counts > 0)
        out = torch.where(seen & (rep != 1.0), torch.where(out > 0, out / rep, out * rep), out)
        out = out - self.frequency[rows][:, None] * counts - self.presence[rows][:, None] * (counts > 0).float()
        if self.bias is not None:
            out = out + cols(self.bias.index_select(0, rows))
        blocked = (self.min_left[rows] > num_extra)[:, None] & cols(self.stop_ids.index_select(0, rows))
        out = out.masked_fill(blocked, float("-inf"))
        if masks is not None:
            out = out.masked_fill(~cols(masks.allowed), float("-inf"))
        return out
