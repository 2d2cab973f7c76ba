"""MTP speculative decoding, written once and called by every backend (offline engine, server workers).

One step = [prefill forward for prompt chunks] + [verify forward for generating requests], each followed by
drafting. The life of a generating request per step:
  1. verify: its block [x_p0, d_1..d_k] runs through the target (ForwardMode.VERIFY); spec_decode/verify.py
     accepts a prefix and emits accept_len = m + 1 tokens; req_to_accept_len is scattered on the device so
     the next verify's GDN layers pick the committed conv window / SSM row by index.
  2. draft pass: each MTP module runs over the same rows with (target hidden of row i, token after row i)
     and writes its KV at the same slots; the row of the last accepted token gives draft d'_1 (vanilla
     mode: module j gives d'_j from the same row).
  3. commit: accepted rows' KV slots join the request, rejected ones go back to the pool.
  4. next block: slots for [last emitted token, d'_1..d'_k'] are allocated and written into req_to_token;
     eagle mode runs its single MTP module k'-1 more times, one row per request, inside that block.
Drafts are capped so that a block never passes max_model_len (k' <= k); near max_new_tokens blocks stay full
(the engine truncates what they emit), so batches stay uniform for the verify CUDA graphs.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch

from lightllm_mtp.common.basemodel.forward_batch import ForwardBatch, ForwardMode, ModelOutput
from lightllm_mtp.engine.cuda_graph import CudaGraphSet, GraphedForward
from lightllm_mtp.engine.launched_step import HostCopy, LaunchedStep
from lightllm_mtp.engine.model_runner import ModelRunner
from lightllm_mtp.engine.request import DraftBlock, Request, RequestStatus
from lightllm_mtp.engine.scheduler import ScheduledRequest
from lightllm_mtp.spec_decode.batches import (
    chain_batch_on_device,
    chain_step_batch,
    draft_pass_batch,
    next_blocks_on_device,
    verify_batch,
    verify_batch_on_device,
)
from lightllm_mtp.config.spec_config import MtpMode, SpecConfig
from lightllm_mtp.spec_decode.verify import VerifyResult, verify_block


@dataclass
class RowGroup:
    """The rows of one request inside a main forward, and what that forward emitted for it."""

    req: Request
    first_row: int
    num_rows: int
    emitted: list[int]
    block: DraftBlock | None = None  # the verify block these rows ran (None: prompt rows)

    @property
    def last_position(self) -> int:  # position of the newest committed token once `emitted` is appended
        return self.req.num_tokens - 1 + len(self.emitted)


@dataclass
class VerifyLaunch:
    """A verify step queued on the device: what `_collect_verify` reads back and `launch_after` starts from."""

    reqs: list[Request]
    blocks: list[DraftBlock]  # the block each request verifies
    batch: ForwardBatch
    hidden: torch.Tensor  # [T, H] target final-norm hidden of every row
    result: VerifyResult  # accept lengths and emitted tokens, on the device
    draft_out: ModelOutput | None  # the first draft module's pass over the rows (uniform blocks only)
    draft_argmax: torch.Tensor | None  # [B, k+1] its argmax per row
    start: torch.Tensor | None  # [B] block start positions on the device (uniform blocks only)
    host: HostCopy  # [B, 1 + max_q + (max_q - 1) (+ max_q)]: accept length, emitted, drafts (, draft argmax)
    followed: bool = False  # launch_after built the next step from this one (draft passes, next blocks)


def _padded(rows: list[list[int]]) -> torch.Tensor:
    """[B, max len] int64 host tensor, -1 padded."""
    out = torch.full((len(rows), max(map(len, rows))), -1, dtype=torch.int64)
    for b, row in enumerate(rows):
        out[b, : len(row)] = torch.tensor(row, dtype=torch.int64)
    return out


class SpecRunner:
    def __init__(self, runner: ModelRunner, drafts: list, spec: SpecConfig, max_model_len: int):
        self.runner = runner
        self.model = runner.model
        self.drafts = drafts
        self.k = spec.num_steps
        self.eagle = spec.mode is MtpMode.EAGLE_WITH_ATT
        self.max_model_len = max_model_len
        self.device = runner.device
        self.draft_forwards = [GraphedForward(d.forward, self._draft_graphs(j, d)) for j, d in enumerate(drafts)]

    def _draft_graphs(self, j: int, draft) -> list[CudaGraphSet]:
        """Draft module j's graphs: its pass over the verify blocks (EXTEND, k+1 rows per request) and, for the
        eagle module, its chain steps (DECODE, one row per request)."""
        n = self.runner.graph_max_batch_size
        if n <= 0:
            return []
        main = self.model
        layouts = [(ForwardMode.EXTEND, self.k + 1)]
        if self.eagle and j == 0 and self.k > 1:
            layouts.append((ForwardMode.DECODE, 1))
        return [
            CudaGraphSet(draft.forward, main.caches, mode, rows, n, self.runner.graph_pool,
                         hidden_size=main.cfg.hidden_size, hidden_dtype=main.rt.dtype)
            for mode, rows in layouts
        ]  # fmt: skip

    @property
    def max_tokens_per_step(self) -> int:
        return self.k + 1

    @torch.inference_mode()
    def launch(self, scheduled: list[ScheduledRequest]) -> LaunchedStep:
        """Prompt chunks run to the end here (prefill + drafting); verify blocks are queued on the device and read
        back in `collect`."""
        prefill = [s for s in scheduled if s.request.in_prefill]
        generating = [s.request for s in scheduled if not s.request.in_prefill]
        results = self._prefill(prefill) if prefill else []
        verify = None
        if generating:
            batch, _ = verify_batch(generating, self.device)
            drafts = [r.draft.tokens for r in generating]
            verify = self._launch_verify(generating, batch, _padded(drafts).to(self.device, non_blocking=True))
        return LaunchedStep([r for r, _ in results] + generating, results=results, spec=verify)

    @torch.inference_mode()
    def launch_after(self, prev: LaunchedStep, reqs: list[Request]) -> LaunchedStep | None:
        """The verify step after `prev` for `reqs` (a subsequence of prev's requests), queued before prev's accept
        lengths reach the host: every input of the next blocks is on the device (emitted tokens, first drafts from
        the draft pass, start positions). Uniform blocks of k drafts only (eagle chain or vanilla passes on the
        device); None otherwise."""
        v: VerifyLaunch | None = prev.spec
        if prev.results or v is None or v.draft_argmax is None:
            return None
        if any(self.max_model_len - r.num_tokens < 2 * self.k + 2 for r in reqs):
            return None  # the next block might need fewer drafts (_num_drafts): it is built on the host instead
        rows = {id(r): i for i, r in enumerate(v.reqs)}
        index = [rows[id(r)] for r in reqs]
        sel = slice(None)
        if index != list(range(len(v.reqs))):
            sel = torch.tensor(index).to(self.device, non_blocking=True)
        nxt = next_blocks_on_device(v, sel, self.runner.kv_pool, self.runner.req_manager, self.k)
        for b, r in enumerate(reqs):
            r.draft = DraftBlock(start=-1, slots=nxt.slots[b * (self.k + 1) : (b + 1) * (self.k + 1)])
        v.followed = True
        drafts = self._chain_on_device(nxt) if self.eagle else self._vanilla_passes_on_device(v, sel)
        drafts_t = torch.stack([nxt.first_drafts, *drafts], dim=1)
        batch = verify_batch_on_device(nxt, drafts_t, self.k)
        return LaunchedStep(list(reqs), spec=self._launch_verify(list(reqs), batch, drafts_t, nxt.start))

    @torch.inference_mode()
    def collect(self, step: LaunchedStep) -> list[tuple[Request, list[int]]]:
        return step.results + (self._collect_verify(step.spec) if step.spec is not None else [])

    def _chain_on_device(self, nxt) -> list[torch.Tensor]:
        """Eagle: the one MTP module run k-1 more times inside the next blocks -> [d_2, ..., d_k], each [B]."""
        drafts, tokens, hidden = [], nxt.first_drafts, nxt.anchor_hidden
        for j in range(self.k - 1):
            out = self.draft_forwards[0].forward(chain_batch_on_device(nxt, tokens, j), hidden)
            tokens, hidden = out.logits.argmax(dim=-1), out.hidden
            drafts.append(tokens)
        return drafts

    def _vanilla_passes_on_device(self, v: VerifyLaunch, sel) -> list[torch.Tensor]:
        """Vanilla: modules 1..k-1 over the verified rows (as `_draft` does on the host) -> [d_2, ..., d_k], each [B]
        from the anchor row. Module m's input at block row r is the token m + 1 positions ahead: emitted[r + m]
        where that is committed (r + m < accept length), else module m-1's prediction at row r."""
        bsz, q = len(v.reqs), self.k + 1
        accept = v.result.b_accept_len.to(torch.int64)
        rows = torch.arange(q, device=accept.device)[None, :]
        emitted = torch.nn.functional.pad(v.result.emitted.clamp_min(0), (0, self.k))
        out, argmax, drafts = v.draft_out, v.draft_argmax, []
        anchor = (accept[sel] - 1)[:, None]
        for m in range(1, self.k):
            ahead = emitted[:, m : m + q]
            tokens = torch.where(rows + m < accept[:, None], ahead, argmax).flatten()
            out = self.draft_forwards[m].forward(draft_pass_batch(v.batch, tokens, None), out.hidden)
            argmax = out.logits.argmax(dim=-1).view(bsz, q)
            drafts.append(argmax[sel].gather(1, anchor).squeeze(1))
        return drafts

    # ---- prefill -----------------------------------------------------------------------------------
    def _prefill(self, scheduled: list[ScheduledRequest]) -> list[tuple[Request, list[int]]]:
        batch, sampled = self.runner.build_batch(scheduled)
        batch = dataclasses.replace(batch, keep_all_hidden=True)
        out = self.model.forward(batch)
        tokens = self.runner._sample(out.logits, sampled).tolist() if sampled else []
        new_token = dict(zip(map(id, sampled), tokens))
        groups, row_next, first = [], [], 0
        for s in scheduled:
            req, n = s.request, s.num_new_tokens
            emitted = [new_token[id(req)]] if id(req) in new_token else []
            start = req.num_computed
            for pos in range(start + 1, start + n + 1):  # token after each row
                row_next.append(req.token_at(pos) if pos < req.num_tokens else emitted[0])
            groups.append(RowGroup(req, first, n, emitted))
            first += n
            req.num_computed += n
        self._draft(batch, batch.positions.tolist(), out.hidden, row_next, groups, commit=None)
        return [(g.req, g.emitted) for g in groups if g.emitted]

    # ---- verify ------------------------------------------------------------------------------------
    def _launch_verify(
        self, reqs: list[Request], batch: ForwardBatch, drafts: torch.Tensor, start: torch.Tensor | None = None
    ) -> VerifyLaunch:
        """Target forward over the blocks, the accept rule and the accept-length scatter on the device; with uniform
        blocks also the first draft module's pass (its inputs, the emitted tokens, are on the device already).
        One device-to-host copy then carries accept lengths, emitted tokens, the pass's argmax and the drafts.
        drafts [B, max_q - 1] int64 on the device (-1 padded); start [B] block start positions on the device
        (None: taken from the batch)."""
        blocks = [r.draft for r in reqs]
        out = self.runner.forward(batch)
        q_lens = [len(b.slots) for b in blocks]
        max_q, bsz = max(q_lens), len(reqs)
        uniform = min(q_lens) == max_q
        if uniform:  # a view, no copy
            logits = out.logits.view(bsz, max_q, -1)
        else:
            logits = out.logits.new_zeros(bsz, max_q, out.logits.shape[-1])
            first = 0
            for b, q in enumerate(q_lens):
                logits[b, :q] = out.logits[first : first + q]
                first += q
        temps, top_ps, top_ks = self.runner.sampling_tensors(reqs)
        result = verify_block(
            logits,
            drafts,
            torch.tensor([q - 1 for q in q_lens]).to(self.device, non_blocking=True),
            temps,
            top_ps,
            top_ks,
            [r.generator for r in reqs],
            greedy_only=all(r.params.temperature <= 0 for r in reqs),
        )
        self.runner.req_manager.req_to_accept_len[batch.b_req_idx] = result.b_accept_len
        parts = [result.b_accept_len[:, None].to(torch.int64), result.emitted, drafts]
        draft_out = argmax = None
        if uniform:
            tokens = result.emitted.clamp_min(0).flatten()  # 0 on rejected rows: their draft inputs do not matter
            draft_out = self.draft_forwards[0].forward(draft_pass_batch(batch, tokens, None), out.hidden)
            argmax = draft_out.logits.argmax(dim=-1).view(bsz, max_q)
            parts.append(argmax)
        if start is None:
            start = batch.positions.view(bsz, max_q)[:, 0] if uniform else None
        return VerifyLaunch(
            reqs, blocks, batch, out.hidden, result, draft_out, argmax, start, HostCopy(torch.cat(parts, dim=1))
        )

    def _collect_verify(self, v: VerifyLaunch) -> list[tuple[Request, list[int]]]:
        """The host half of a verify step: commit accepted KV slots, then draft passes and next blocks for the
        requests whose next step was not queued already (`launch_after` made theirs on the device)."""
        host = v.host.tolist()  # waits for this step's copy only
        max_q = max(len(b.slots) for b in v.blocks)
        groups, row_next, positions, first = [], [], [], 0
        for r, block, row in zip(v.reqs, v.blocks, host):
            q = len(block.slots)
            if r.status is not RequestStatus.FINISHED:  # finished since the launch: its slots are released
                if not block.tokens:  # drafts made on the device: the host sees them now
                    block.tokens = row[1 + max_q : 1 + max_q + q - 1]
                emitted = row[1 : 1 + row[0]]
                groups.append(RowGroup(r, first, q, emitted, block))
            else:
                emitted = [0]
            row_next += emitted + [0] * (q - len(emitted))  # rows past the accepted prefix are rejected
            positions += range(block.start, block.start + q)
            first += q
        if v.followed:  # the draft passes and the next blocks already ran on the device (launch_after)
            self._commit_verified(groups)
            return [(g.req, g.emitted) for g in groups]
        first_pass = None
        if v.draft_argmax is not None:
            first_pass = (v.draft_out, [t for row in host for t in row[2 * max_q :]])
        self._draft(v.batch, positions, v.hidden, row_next, groups, commit=self._commit_verified, first_pass=first_pass)
        return [(g.req, g.emitted) for g in groups]

    def _commit_verified(self, groups: list[RowGroup]) -> None:
        rejected = []
        for g in groups:
            r, a, block = g.req, len(g.emitted), g.block
            assert block is not None
            r.kv_slots.append(block.slots[:a])
            rejected.append(block.slots[a:])
            r.spec_stats.record(len(block.tokens), a - 1, self.k)
            r.num_computed += a
            if r.draft is block:
                r.draft = None
            else:  # the next block was made on the device by launch_after: its start is known now
                r.draft.start = g.last_position
        if rejected:
            self.runner.kv_pool.free(torch.cat(rejected))

    # ---- drafting ----------------------------------------------------------------------------------
    def _draft(
        self, batch: ForwardBatch, positions: list[int], hidden: torch.Tensor, row_next: list[int],
        groups: list[RowGroup], commit, first_pass: tuple | None = None,
    ):  # fmt: skip
        """Draft passes over the main rows (positions: host copy of batch.positions), then `commit`, then the
        next verify blocks (+ eagle chain). first_pass: module 0's pass when the caller already ran it
        (output, argmax of every row on the host)."""
        if batch.mode is ForwardMode.VERIFY:  # every row (a uniform layout the draft graphs can replay)
            logits_rows = None
        else:  # prompt chunks: only where a module's next input is not committed yet, the last k+1 positions
            logits_rows = [
                i
                for g in groups
                for i in range(g.first_row, g.first_row + g.num_rows)
                if positions[i] >= g.last_position - self.k
            ]
        # anchor: the row whose next token is the newest emitted one; its predictions become the drafts
        anchors = {
            id(g.req): g.first_row + g.last_position - 1 - positions[g.first_row] for g in groups if g.emitted
        }
        proposals: dict[int, list[int]] = {key: [] for key in anchors}
        last_hidden: dict[int, torch.Tensor] = {}
        tokens = torch.tensor(row_next, dtype=torch.int64)
        for j, draft in enumerate(self.draft_forwards):
            if j == 0 and first_pass is not None:
                out, argmax = first_pass
            else:
                batch_j = draft_pass_batch(batch, tokens.to(self.device, non_blocking=True), logits_rows)
                out = draft.forward(batch_j, hidden)
                argmax = out.logits.argmax(dim=-1).tolist()
            pred = dict(enumerate(argmax)) if logits_rows is None else dict(zip(logits_rows, argmax))
            for g in groups:
                if id(g.req) in anchors:
                    proposals[id(g.req)].append(pred[anchors[id(g.req)]])
                    last_hidden[id(g.req)] = out.hidden[anchors[id(g.req)]]
            if j + 1 < len(self.draft_forwards):  # vanilla: module j+1 sees the token j+2 ahead of each row
                hidden = out.hidden
                ahead = [0] * len(positions)  # rows of a request that finished since the launch keep 0
                for g in groups:
                    for i in range(g.first_row, g.first_row + g.num_rows):
                        ahead[i] = self._token_ahead(g, positions[i], j + 2, pred.get(i))
                tokens = torch.tensor(ahead, dtype=torch.int64)
        if commit is not None:
            commit(groups)
        self._next_blocks(
            [g for g in groups if g.emitted and g.req.draft is None and self._continues(g)], proposals, last_hidden
        )

    def _next_blocks(self, groups: list[RowGroup], proposals: dict, last_hidden: dict) -> None:
        """KV slots and page-table entries for each request's next verify block [last token, d_1..d_k'] (one
        allocation, one device write), then the eagle chain fills d_2..d_k'."""
        if not groups:
            return
        k_next = [self._num_drafts(g) for g in groups]
        slots = self.runner.kv_pool.alloc(sum(k_next) + len(groups))
        rows: list[int] = []
        cols: list[int] = []
        chain, first = [], 0
        for g, k in zip(groups, k_next):
            start = g.last_position
            rows += [g.req.req_idx] * (1 + k)
            cols += range(start, start + 1 + k)
            g.req.draft = DraftBlock(start=start, slots=slots[first : first + 1 + k], tokens=proposals[id(g.req)][:k])
            first += 1 + k
            if self.eagle and k > 1:
                chain.append((g.req, k, last_hidden[id(g.req)]))
        index = torch.tensor([rows, cols], dtype=torch.int64).to(self.device, non_blocking=True)
        self.runner.req_manager.req_to_token[index[0], index[1]] = slots.to(self.device, non_blocking=True)
        self._eagle_chain(chain)

    def _eagle_chain(self, chain: list[tuple[Request, int, torch.Tensor]]) -> None:
        step = 2
        while chain:
            reqs = [r for r, _, _ in chain]
            batch = chain_step_batch(
                reqs, [r.draft.tokens[-1] for r in reqs], [r.draft.start + step - 2 for r in reqs], self.device
            )
            out = self.draft_forwards[0].forward(batch, torch.stack([h for _, _, h in chain]))
            for (r, _, _), tok in zip(chain, out.logits.argmax(dim=-1).tolist()):
                r.draft.tokens.append(tok)
            chain = [(r, k, out.hidden[i]) for i, (r, k, _) in enumerate(chain) if k > step]
            step += 1

    def _token_ahead(self, g: RowGroup, position: int, ahead: int, predicted: int | None) -> int:
        pos = position + ahead
        if pos <= g.last_position:
            n = g.req.num_tokens
            return g.req.token_at(pos) if pos < n else g.emitted[pos - n]
        return predicted if predicted is not None else 0

    def _continues(self, g: RowGroup) -> bool:
        produced = len(g.req.output_ids) + len(g.emitted)
        return produced < g.req.params.max_new_tokens and g.last_position + 1 < self.max_model_len

    def _num_drafts(self, g: RowGroup) -> int:
        """Drafts are capped only by max_model_len (a block never writes past it). Near max_new_tokens a request
        keeps k drafts: the engine stops emitting at the limit anyway, and uniform blocks keep the whole batch on
        the verify CUDA graphs (a ragged batch runs eagerly)."""
        room = self.max_model_len - (g.last_position + 1)
        return max(0, min(self.k, room - 1))
