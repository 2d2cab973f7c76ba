"""The speculative step runner: one target forward per step kind, the accept rule and the proposer, all queued on
the device from DraftState (spec_decode/), so that no step needs the host between its launch and its collect.

One step = [prompt chunks] + [verify blocks]:
  prompt chunks: the target forward over the chunks; requests that finish their prompt sample a first token, get
      their first verify block opened at it, and the proposer drafts from the prompt rows.
  verify blocks: StepBuilder.verify_batch gathers each request's open block; the target runs it (VERIFY, CUDA
      graph on GPU); verify_block accepts a prefix; the next blocks open at start + accept length; the proposer
      drafts from the verified rows. The host later commits the accepted rows' KV slots and frees the rest.
With adaptive speculation (SpecLengthController) each launch picks the drafts k' <= k of the blocks it opens; a
verify step runs blocks of 1 + the most drafts any of its blocks holds (a CUDA graph per row count).
A request whose previous step may still be in flight is verified from the device state alone, so overlap
scheduling is "do not read back yet" and the synchronous loop is the same code read back at once.
"""

from __future__ import annotations

import dataclasses

import torch

from lightllm_mtp.common.parallel_state import pp_broadcast_from_last
from lightllm_mtp.engine.model_runner import ModelRunner
from lightllm_mtp.engine.request import EndState, Request, RequestStatus
from lightllm_mtp.engine.request_end import verify_arrived
from lightllm_mtp.engine.scheduler import ScheduledRequest
from lightllm_mtp.engine.step import HostCopy, PromptChunksLaunch, SpecStep, VerifyLaunch, kv_lookahead_slots
from lightllm_mtp.engine.grammar_rows import (
    grammar_drafts_from_last_stage, take_candidates, verify_masks, write_grammar_drafts,
)
from lightllm_mtp.sampling.draft_choice import DraftChooser, kept_candidates
from lightllm_mtp.sampling.logits_processing import process_logits
from lightllm_mtp.sampling.logprobs import emitted_logprobs
from lightllm_mtp.spec_decode.adaptive import SpecLengthController
from lightllm_mtp.spec_decode.draft_state import DRAFTS, NUM_DRAFTS, START
from lightllm_mtp.spec_decode.proposer import CommittedBlocks, DraftInput, Proposer
from lightllm_mtp.spec_decode.step_builder import StepBuilder
from lightllm_mtp.spec_decode.verify import ForcedAcceptRule, verify_block

_NOT_COMMITTED = -1
GRAMMAR_DRAFT_CANDIDATES = 256  # ids kept per draft position of a grammar request, for the host's choice


class SpecRunner:
    def __init__(self, runner: ModelRunner, proposer: Proposer | None, builder: StepBuilder,
                 controller: SpecLengthController | None = None, forced: ForcedAcceptRule | None = None):  # fmt: skip
        self.runner = runner
        self.model = runner.model
        self.proposer = proposer  # None on pipeline stages before the last (they receive the drafts)
        self.lookahead = proposer.lookahead if proposer is not None else 1
        self.builder = builder
        self.state = builder.state
        self.num_draft_tokens = builder.num_draft_tokens
        self.block_rows = self.num_draft_tokens + 1  # a verify block: the newest token, then the drafts
        self.device = runner.device
        self.max_tokens_per_step = self.block_rows
        self.controller = controller
        self.lookahead_slots = kv_lookahead_slots(self.num_draft_tokens)
        self.forced = forced  # benchmarking: drafts accepted by a coin (mtp_force_acceptance), not checked

    @torch.inference_mode()
    def launch(self, scheduled: list[ScheduledRequest], after: SpecStep | None = None) -> SpecStep:
        """after: unused. A speculative step needs nothing of the step before it on the host: every generating
        request's next block is open on the device once that step is launched."""
        chunks = [s for s in scheduled if s.request.in_prefill]
        generating = [s.request for s in scheduled if not s.request.in_prefill]
        num_drafts = self._choose_num_drafts([s.request for s in scheduled])
        prompt = self._launch_prompt_chunks(chunks, num_drafts) if chunks else None
        verify = self._launch_verify(generating, num_drafts) if generating else None
        return SpecStep((prompt.sampled if prompt else []) + generating, prompt, verify)

    @torch.inference_mode()
    def collect(self, step: SpecStep) -> list[tuple[Request, list[int]]]:
        out = []
        if step.prompt is not None and step.prompt.host_tokens is not None:
            self.runner.deliver_logprobs(step.prompt.sampled, step.prompt.host_logprobs)
            take_candidates(step.prompt.sampled, step.prompt.host_candidates)
            for r, row in zip(step.prompt.sampled, step.prompt.host_tokens.tolist()):
                r.next_drafts = row[1:]
                out.append((r, row[:1]))
        if step.verify is not None:
            out += self._collect_verify(step.verify)
        return out

    def release(self, req: Request) -> None:
        self.runner.release(req)

    def _choose_num_drafts(self, reqs: list[Request]) -> int:
        """Drafts of the blocks this launch opens: k, or the adaptive controller's pick for these requests."""
        if self.controller is None:
            return self.num_draft_tokens
        return self.controller.choose([r.acceptance for r in reqs], sum(r.num_tokens for r in reqs))

    def end_state(self, req: Request) -> EndState:
        """Where the request's committed conv window / SSM row sits: 0 during its prompt, accept_len - 1 after a verify
        (a device scalar; the host's row index of it, last_accept - 1, reaches the verify rows before it, which
        multi-layer MTP's tree end needs); not known when a verify of it is queued (overlap): its state is then past
        what the host knows. That verify's row 0 (its newest token, committed) keeps its KV slot out of the blocks
        release frees: the prefix cache takes it (`held`)."""
        if not req.blocks:
            return EndState(committed=0, committed_row=0)
        if len(req.blocks) > 1:
            held, req.blocks[0] = req.blocks[0][:1], req.blocks[0][1:]
            return EndState(committed=None, committed_row=-1, held=held)
        return EndState(committed=self.state.accept_len[req.req_idx] - 1, committed_row=req.last_accept - 1)

    def settle(self, step: SpecStep) -> None:
        """A queued step the engine drops unread (all its requests ended): requests awaiting its verify results get
        them now (this waits for the step)."""
        v = step.verify
        if v is None or not any(r.status is RequestStatus.AWAITING_VERIFY for r in v.reqs):
            return
        for r, row in zip(v.reqs, v.host.tolist()):
            if r.status is RequestStatus.AWAITING_VERIFY:
                verify_arrived(r, row[1 : 1 + row[0]], self.runner.prefix_cache)

    def _device(self, values: list[int], dtype=torch.int32) -> torch.Tensor:
        return torch.tensor(values, dtype=dtype).to(self.device, non_blocking=True)

    def _open_blocks(self, reqs: list[Request], num_drafts: int, **kwargs) -> torch.Tensor:
        """KV slots for each request's next block (num_drafts + 1 each, one allocation), opened by the builder."""
        q = num_drafts + 1
        slots = self.runner.alloc_kv(len(reqs) * q)
        for b, r in enumerate(reqs):
            r.blocks.append(slots[b * q : (b + 1) * q])
        b_req_idx = kwargs.pop("b_req_idx")
        slots_dev = slots.to(self.device, non_blocking=True).view(len(reqs), q)
        self.builder.open_blocks(b_req_idx, slots=slots_dev, max_drafts=num_drafts, **kwargs)
        return b_req_idx

    # ---- prompt chunks ------------------------------------------------------------------------------
    def _launch_prompt_chunks(self, chunks: list[ScheduledRequest], num_drafts: int) -> PromptChunksLaunch:
        batch, sampled = self.runner.build_batch(chunks)
        batch = dataclasses.replace(batch, keep_all_hidden=True)
        out = self.runner.forward(batch)  # one request's short chunk: a prefill CUDA graph
        tokens = self.runner.sample_on_last_stage(out.logits, sampled) if sampled else None
        ahead, rows_per_req = self._prompt_next_tokens(chunks, sampled)
        for s in chunks:
            s.request.num_computed += s.num_new_tokens
        self.runner.after_prompt_chunks(chunks)
        finished = {id(r) for r in sampled}
        last = [int(id(s.request) in finished) for s in chunks]  # 1: the prompt ends in this chunk
        if self.model.is_last_stage:  # the context rows feed the drafts, which run on the last stage only
            self.builder.prompt_context(
                [s.request.req_idx for s in chunks],
                [range(rows.start, rows.stop - drop) for rows, drop in zip(rows_per_req, last)],
                [s.request.num_computed - drop for s, drop in zip(chunks, last)],
                [s.request.prompt_ids for s in chunks],
                out.hidden,
            )  # context rows (multi-layer MTP): before the chunk's end, or before the last prompt row, whose window
        # recomputes them once the sampled token is known (spec_decode/mtp_proposer.py)
        if not sampled:
            if self.model.is_last_stage:
                self._propose(batch, out.hidden, ahead, [], [], None)  # MTP KV over the chunk rows only
            return PromptChunksLaunch([], None)
        row_of = dict(zip(map(id, (s.request for s in chunks)), rows_per_req))
        anchors = [row_of[id(r)][-1] for r in sampled]  # the last prompt row: its next token is the sampled one
        b_req_idx = self._open_blocks(
            sampled,
            num_drafts,
            b_req_idx=self._device([r.req_idx for r in sampled]),
            start=self._device([len(r.prompt_ids) for r in sampled], torch.int64),
            last_token=tokens,
        )
        blocks = CommittedBlocks(
            b_start=self._device([len(r.prompt_ids) - 1 for r in sampled], torch.int64),
            b_accept_len=torch.ones(len(sampled), dtype=torch.int64, device=self.device),
            b_row0=self._device(anchors, torch.int64),
            b_tokens=torch.stack([self._device([r.prompt_ids[-1] for r in sampled], torch.int64), tokens], dim=1),
        )
        chooser = None
        if self.model.is_last_stage:
            chooser = self._chooser(sampled, out.logits.shape[-1], tokens[:, None])
        drafts = self._propose(batch, out.hidden, ahead, anchors, sampled, b_req_idx, sampled_tokens=tokens,
                               blocks=blocks, num_drafts=num_drafts, chooser=chooser)  # fmt: skip
        host = HostCopy(torch.cat([tokens[:, None], drafts], dim=1))  # the first token, the first block's drafts
        return PromptChunksLaunch(sampled, host, self.runner.logprobs_copy(out.logits, tokens, sampled),
                                  self._candidates_copy(chooser))  # fmt: skip

    def _chooser(self, reqs: list[Request], vocab_size: int, emitted: torch.Tensor, processing="build"
                 ) -> DraftChooser | None:  # fmt: skip
        """How the proposer chooses the drafts of `reqs`: their logits processing after the `emitted` tokens ([B, E],
        -1 padded), and with a grammar in the batch the candidates each position keeps for the host's choice; None
        when they need neither."""
        if processing == "build":
            processing = self.runner.processing(reqs, vocab_size)
        grammar_rows = [b for b, r in enumerate(reqs) if r.grammar is not None]
        if processing is None and not grammar_rows:
            return None
        return DraftChooser(processing, torch.arange(len(reqs), device=self.device), emitted,
                            self._device(grammar_rows, torch.int64) if grammar_rows else None,
                            GRAMMAR_DRAFT_CANDIDATES)  # fmt: skip

    def _candidates_copy(self, chooser: DraftChooser | None) -> HostCopy | None:
        """The grammar requests' draft candidates on their way to the host (engine/grammar_rows.py)."""
        candidates = kept_candidates(chooser, self.num_draft_tokens)
        return HostCopy(candidates) if candidates is not None else None

    def _prompt_next_tokens(self, chunks, sampled) -> tuple[list[list[int]], list[range]]:
        """Per row, the tokens 1..lookahead positions after its input: the prompt's, the sampled first token
        (encoded -2 - its index in `sampled`), or _NOT_COMMITTED past it."""
        sampled_index = {id(r): i for i, r in enumerate(sampled)}
        ahead, rows, first = [], [], 0
        for s in chunks:
            r, n = s.request, s.num_new_tokens
            prompt = r.prompt_ids
            for pos in range(r.num_computed, r.num_computed + n):
                row = []
                for t in range(pos + 1, pos + 1 + self.lookahead):
                    if t < len(prompt):
                        row.append(prompt[t])
                    elif t == len(prompt) and id(r) in sampled_index:
                        row.append(-2 - sampled_index[id(r)])
                    else:
                        row.append(_NOT_COMMITTED)
                ahead.append(row)
            rows.append(range(first, first + n))
            first += n
        return ahead, rows

    def _propose(self, batch, hidden, ahead, anchors, reqs, b_req_idx, sampled_tokens=None, blocks=None,
                 num_drafts=None, chooser=None) -> None:  # fmt: skip
        """Proposer pass over prompt-chunk rows; drafts for `reqs` (anchor rows `anchors`) into DraftState."""
        need = sorted(set(anchors) | {i for i, row in enumerate(ahead) if row[-1] == _NOT_COMMITTED})
        position = {row: i for i, row in enumerate(need)}
        next_tokens = self._device([t for row in ahead for t in row], torch.int64).view(len(ahead), -1)
        if sampled_tokens is not None:
            marker = next_tokens <= -2
            next_tokens = torch.where(marker, sampled_tokens[(-2 - next_tokens).clamp_min(0)], next_tokens)
        inp = DraftInput(
            batch=batch,
            hidden=hidden,
            next_tokens=next_tokens,
            logits_rows=self._device(need, torch.int64),
            anchor_rows=self._device(anchors, torch.int64),
            anchor_logits=self._device([position[a] for a in anchors], torch.int64),
            b_req_idx=b_req_idx if b_req_idx is not None else self._device([]),
            blocks=blocks,
            num_drafts=num_drafts,
            chooser=chooser,
        )
        drafts = self._drafts_on_every_stage(lambda: self.proposer.propose(inp), len(reqs))
        if reqs:
            self.state.write_drafts(b_req_idx, drafts)
        return drafts

    def _drafts_on_every_stage(self, propose, num_reqs: int) -> torch.Tensor:
        """The proposer runs where the final hidden is (the last pipeline stage); its drafts [B, k] reach every
        stage's DraftState, from which each stage builds its next verify batch (identity without PP)."""
        if self.model.is_last_stage:
            drafts = propose()  # [B, n], n <= k (adaptive speculation: fewer): padded to k for the broadcast
            if drafts.shape[1] < self.num_draft_tokens:
                drafts = torch.nn.functional.pad(drafts, (0, self.num_draft_tokens - drafts.shape[1]))
        else:
            drafts = torch.empty(num_reqs, self.num_draft_tokens, dtype=torch.int64, device=self.device)
        return pp_broadcast_from_last(drafts) if num_reqs else drafts

    # ---- verify blocks ------------------------------------------------------------------------------
    def _launch_verify(self, reqs: list[Request], next_drafts: int) -> VerifyLaunch:
        bsz = len(reqs)
        b_req_idx = self._device([r.req_idx for r in reqs])
        blocks = [r.blocks[-1] for r in reqs]  # the block each request verifies: the newest one opened
        q = max(len(b) for b in blocks)  # k + 1, or fewer when every block holds fewer drafts (adaptive)
        write_grammar_drafts(reqs, b_req_idx, self.state)  # before the batch gathers them (candidates: last stage)
        if not (self.model.is_first_stage and self.model.is_last_stage):
            grammar_drafts_from_last_stage(reqs, b_req_idx, self.state)  # every stage verifies the same block
        batch, rows = self.builder.verify_batch(b_req_idx, rows=q)
        out = self.runner.forward(batch)
        drafts, num_drafts = rows[:, DRAFTS : DRAFTS + q - 1], rows[:, NUM_DRAFTS]
        result = chooser = None
        if self.model.is_last_stage:  # verify where the logits are
            greedy = all(r.params.temperature <= 0 for r in reqs)
            temps, top_ps, top_ks = (None, None, None) if greedy else self.runner.sampling_tensors(reqs)
            vocab = out.logits.shape[-1]
            logits, processing = out.logits.view(bsz, q, -1), self.runner.processing(reqs, vocab)
            masks = verify_masks(reqs, q, vocab, self.device)
            if processing is not None or masks is not None:  # row i sees the drafts d_1..d_i as output
                logits = self._process_rows(processing, logits, drafts, masks)
            result = verify_block(
                logits, drafts, num_drafts, temps, top_ps, top_ks, [r.generator for r in reqs],
                greedy_only=greedy, draw_width=self.num_draft_tokens, forced=self.forced,
                min_ps=None if greedy else self.runner.min_ps(reqs),
            )  # fmt: skip
            chooser = self._chooser(reqs, vocab, result.emitted, processing)
            verified = torch.cat([result.b_accept_len[:, None].to(torch.int64), result.emitted], dim=1)
        else:
            verified = torch.empty(bsz, 1 + q, dtype=torch.int64, device=self.device)
        per_row = self.runner.logprobs_on_every_stage(  # each verify row's, from the last stage
            reqs, lambda num_top: emitted_logprobs(out.logits.view(bsz * q, -1), result.emitted.reshape(-1), num_top),
            bsz * q)  # fmt: skip
        logprobs = HostCopy(per_row.view(bsz, q, -1)) if per_row is not None else None
        # accept lengths and emitted tokens reach every stage before it opens its next block: each stage's
        # positions, KV slots, conv slot offset and SSM row follow the accepted tokens only (no optimistic state)
        verified = pp_broadcast_from_last(verified)
        accept, emitted = verified[:, 0], verified[:, 1:]
        last_token = emitted.gather(1, (accept - 1)[:, None]).squeeze(1)
        self._open_blocks(reqs, next_drafts, b_req_idx=b_req_idx, start=rows[:, START] + accept,
                          last_token=last_token, accept_len=accept)  # fmt: skip
        drafts = self._drafts_on_every_stage(
            lambda: self.proposer.propose(dataclasses.replace(
                self._verified_rows(batch, q, rows, out.hidden, result, b_req_idx), num_drafts=next_drafts,
                chooser=chooser)),
            bsz,
        )  # fmt: skip
        self.state.write_drafts(b_req_idx, drafts)
        host = torch.cat([verified, num_drafts[:, None], drafts], dim=1)  # and the next block's drafts
        return VerifyLaunch(list(reqs), blocks, batch, HostCopy(host), logprobs, self._candidates_copy(chooser))

    @staticmethod
    def _process_rows(processing, logits: torch.Tensor, drafts: torch.Tensor, masks) -> torch.Tensor:
        """Every verify row's logits processed as plain decoding processes that position: row i's output so far
        ends with the drafts d_1..d_i (logits [B, q, V], drafts [B, q-1]; masks: q grammar rows per request)."""
        bsz, q, vocab = logits.shape
        cols = torch.arange(q - 1, device=drafts.device)
        before = torch.where(cols[None, :] < torch.arange(q, device=drafts.device)[:, None], drafts[:, None, :], -1)
        rows = torch.arange(bsz, device=logits.device).repeat_interleave(q)
        flat = logits.reshape(bsz * q, vocab)
        return process_logits(flat, processing, rows, before.reshape(bsz * q, q - 1), masks=masks).view(bsz, q, -1)

    def _verified_rows(self, batch, q, rows, hidden, result, b_req_idx) -> DraftInput:
        """The proposer's view of a verify step: the verified blocks (`rows`: their DraftState rows, row 0 at
        START, the first accept-length rows committed, emitted tokens after them); proposers build their draft
        pass from these with StepBuilder.draft_window. The anchor is row accept - 1."""
        bsz = result.emitted.shape[0]
        accept = result.b_accept_len.to(torch.int64)
        row0 = batch.b1_cu_q_len[:-1].to(torch.int64)
        anchors = row0 + accept - 1
        blocks = CommittedBlocks(
            b_start=rows[:, START],
            b_accept_len=accept,
            b_row0=row0,
            b_tokens=torch.cat([batch.input_ids.view(bsz, q)[:, :1], result.emitted], dim=1),
        )
        return DraftInput(batch, hidden, None, None, anchors, anchors, b_req_idx, blocks)

    def _collect_verify(self, v: VerifyLaunch) -> list[tuple[Request, list[int]]]:
        """Commits accepted rows' KV slots, frees the others, records acceptance; waits for this step's copy only."""
        out, rejected = [], []
        rows = v.host.tolist()
        self.runner.deliver_logprobs(v.reqs, v.host_logprobs, [row[0] for row in rows])
        q = len(rows[0]) - 2 - self.num_draft_tokens  # a row: accept, emitted (q), num_drafts, the next drafts (k)
        take_candidates(v.reqs, v.host_candidates)
        for r, block, row in zip(v.reqs, v.blocks, rows):
            num_drafts = row[1 + q]
            if r.ended:  # ended since the launch: release freed its blocks
                if r.status is RequestStatus.AWAITING_VERIFY:  # the prefix cache waits for the token after its newest
                    verify_arrived(r, row[1 : 1 + row[0]], self.runner.prefix_cache)
                continue
            accept = row[0]
            assert r.blocks[0] is block, "blocks are verified and committed in the order they were opened"
            r.blocks.pop(0)
            r.kv_slots.append(block[:accept])
            rejected.append(block[accept:])
            r.num_computed += accept
            r.last_accept = accept
            r.spec_stats = r.spec_stats.after_step(num_drafts, accept - 1, len(block) - 1)
            r.next_drafts = row[2 + q :]
            if self.controller is not None:
                self.controller.observe(r.acceptance, num_drafts, accept - 1)
            out.append((r, row[1 : 1 + accept]))
        if rejected:
            self.runner.kv_pool.free(torch.cat(rejected))
        return out
