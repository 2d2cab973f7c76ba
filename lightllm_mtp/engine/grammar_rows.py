"""The grammar rows of a step (sampling/grammar.py), for the requests of the step that have a grammar; all of it
host work on what the host already holds, so a launch never waits for the device because of a grammar.

Plain sampling: one mask row per request, after its committed output. A verify block: its drafts first, chosen on
the host from the candidates the proposer kept (sampling/draft_choice.py) when the step that opened the block was
collected (`take_candidates`, `write_grammar_drafts`), then q mask rows, row i after the drafts d_1..d_i. Such requests
are never in a step launched while one of theirs is in flight (SamplingParams.reads_history): the matcher is always
the committed output's; the other requests of the batch keep their overlap.

Under pp the candidates and the matchers are on the last stage (its tp ranks), which chooses; the drafts and counts
it chose reach the other stages' DraftState with a broadcast in the same launch (`grammar_drafts_from_last_stage`),
since the first stage embeds the block's tokens: every stage verifies the same block.
"""

from __future__ import annotations

import torch

from lightllm_mtp.common.parallel_state import pp_broadcast_from_last
from lightllm_mtp.engine.request import Request
from lightllm_mtp.engine.step import HostCopy
from lightllm_mtp.sampling.grammar import new_bitmask, row_masks
from lightllm_mtp.sampling.logits_processing import RowMasks
from lightllm_mtp.spec_decode.draft_state import DraftState


def sampling_masks(reqs: list[Request], vocab_size: int, device: torch.device) -> RowMasks | None:
    """One row per request: the tokens its grammar allows next; None when no request has a grammar."""
    if not any(r.grammar is not None for r in reqs):
        return None
    bitmask = new_bitmask(len(reqs), vocab_size)
    for b, r in enumerate(reqs):
        if r.grammar is not None:
            r.grammar.fill_after([], bitmask, b)
    return row_masks(bitmask, vocab_size, device)


def verify_masks(reqs: list[Request], q: int, vocab_size: int, device: torch.device) -> RowMasks | None:
    """q rows per request (its verify block); None when no request has a grammar."""
    if not any(r.grammar is not None for r in reqs):
        return None
    bitmask = new_bitmask(len(reqs) * q, vocab_size)
    for b, r in enumerate(reqs):
        if r.grammar is not None:
            r.grammar.fill_block(r.next_drafts[: q - 1], bitmask, b * q)
    return row_masks(bitmask, vocab_size, device)


def take_candidates(reqs: list[Request], host_candidates: HostCopy | None) -> None:
    """At collect: each grammar request of `reqs` (in order) gets its draft candidates for its newest block
    ([k][num_candidates] ids, best first), kept until the launch that verifies the block."""
    if host_candidates is None:
        return
    grammar_reqs = [r for r in reqs if r.grammar is not None]
    for r, candidates in zip(grammar_reqs, host_candidates.tolist(), strict=True):
        r.draft_candidates = candidates


def write_grammar_drafts(reqs: list[Request], b_req_idx: torch.Tensor, state: DraftState) -> None:
    """At the launch that verifies each request's newest block, for the requests of `reqs` with a grammar: the drafts
    it allows, chosen on the host from the candidates collected with the step that opened the block
    (RequestGrammar.choose_drafts: a legal prefix of at most the block's draft count), written with their count into
    DraftState (a copy to the device, nothing read back); each one's next_drafts becomes its drafts (verify_masks
    reads them). b_req_idx [B]: the request slots of `reqs` on the device."""
    picked, chosen = [], []
    for b, r in enumerate(reqs):
        if r.grammar is not None and r.draft_candidates is not None:
            drafts = r.grammar.choose_drafts(r.draft_candidates[: len(r.blocks[-1]) - 1])
            r.draft_candidates, r.next_drafts = None, drafts
            picked.append(b)
            chosen.append(drafts)
    if not picked:
        return
    k, device = state.num_draft_tokens, b_req_idx.device
    padded = [c + [c[-1] if c else 0] * (k - len(c)) for c in chosen]  # rows past the count are not read
    drafts = _on(device, [t for row in padded for t in row]).view(len(picked), k)
    state.replace_drafts(b_req_idx[_on(device, picked)], drafts, _on(device, [len(c) for c in chosen]))


def grammar_drafts_from_last_stage(reqs: list[Request], b_req_idx: torch.Tensor, state: DraftState) -> None:
    """Under pp, after the last stage's write_grammar_drafts: its grammar requests' draft counts and drafts copied
    into every stage's DraftState (a device broadcast, nothing read back; on the last stage a copy onto itself).
    Every stage names the same rows, the requests with a structured output (the first stage's ranks hold no matcher
    and no candidates)."""
    rows = [b for b, r in enumerate(reqs) if r.params.structured is not None]
    if not rows:
        return
    idx = b_req_idx[_on(b_req_idx.device, rows)]
    state.set_block_drafts(idx, pp_broadcast_from_last(state.block_drafts(idx)))


def _on(device: torch.device, values: list[int]) -> torch.Tensor:
    """Host ints as an int64 tensor on `device` (a copy to the device, nothing read back)."""
    return torch.tensor(values, dtype=torch.int64).to(device, non_blocking=True)
