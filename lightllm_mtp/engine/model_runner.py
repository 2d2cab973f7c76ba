"""Turns a scheduled step into a ForwardBatch (KV slots, page-table rows), runs the model, samples."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from lightllm_mtp.common.basemodel.basemodel import TpPartBaseModel
from lightllm_mtp.common.basemodel.forward_batch import ForwardBatch, ForwardMode, ModelOutput
from lightllm_mtp.common.basemodel.cuda_graph import CudaGraphSet, GraphedForward
from lightllm_mtp.common.basemodel.prefill_graph import PrefillGraphSet, prefill_graph_set
from lightllm_mtp.common.basemodel.stage_graphs import StageGraphedForward, graphed_model_forward, model_graph_set
from lightllm_mtp.common.parallel_state import pp_broadcast_from_last
from lightllm_mtp.engine.image_rows import ImageRows
from lightllm_mtp.engine.prefix_cache import PrefixCache
from lightllm_mtp.engine.step import DecodeStep, HostCopy, kv_lookahead_slots
from lightllm_mtp.engine.request import EndState, Request
from lightllm_mtp.engine.scheduler import ScheduledRequest
from lightllm_mtp.kernels.sampling.sampling import greedy_sample, sample
from lightllm_mtp.engine.grammar_rows import sampling_masks
from lightllm_mtp.sampling.logits_processing import LogitsProcessing, process_logits
from lightllm_mtp.sampling.logprobs import emitted_logprobs, unpack


@dataclass(frozen=True)
class ModelGraphs:
    """The target's decode / verify CUDA graphs, captured at start-up (none on CPU or with graph_max_batch_size 0)."""

    forward: GraphedForward | StageGraphedForward  # the model's forward, replayed from a graph when one fits
    max_batch_size: int  # 0: no graphs
    pool: object | None  # the memory pool every graph of the engine shares (the drafts' and the prefill graphs too)


def capture_model_graphs(model: TpPartBaseModel, graph_max_batch_size: int = 0, num_draft_tokens: int = 0,
                         adaptive: bool = False) -> ModelGraphs:  # fmt: skip
    """CUDA graphs (on GPU, graph_max_batch_size > 0) of the step's uniform layout: decode rows, or with MTP
    (num_draft_tokens = k) verify blocks of k+1 rows (adaptive speculation: of every 1..k+1 rows)."""
    max_batch_size = graph_max_batch_size if model.rt.device.type == "cuda" else 0
    pool = torch.cuda.graph_pool_handle() if max_batch_size > 0 else None
    graph_sets = []
    if max_batch_size > 0:
        if not num_draft_tokens:
            layouts = [(ForwardMode.DECODE, 1)]
        else:
            first = 1 if adaptive else num_draft_tokens + 1
            layouts = [(ForwardMode.VERIFY, q) for q in range(num_draft_tokens + 1, first - 1, -1)]
        graph_sets.extend(
            model_graph_set(model, mode, rows, max_batch_size, pool) for mode, rows in layouts
        )  # under pp: this stage's layers, send / recv outside the graphs (common/basemodel/stage_graphs.py)
    return ModelGraphs(graphed_model_forward(model, graph_sets), max_batch_size, pool)


class ModelRunner:
    def __init__(self, model: TpPartBaseModel, graphs: ModelGraphs, prefix_cache: PrefixCache | None = None,
                 eos_token_ids: frozenset[int] = frozenset(), image_rows: ImageRows | None = None):  # fmt: skip
        """image_rows: models with a vision tower (engine/image_rows.py)."""
        self.model = model
        self.image_rows = image_rows
        self.eos_token_ids = eos_token_ids  # min_tokens masks them
        self.device = model.rt.device
        self.kv_pool = model.caches.kv_pool
        self.req_manager = model.caches.req_manager
        self.graph_max_batch_size = graphs.max_batch_size
        self.graph_pool = graphs.pool
        self.graphed = graphs.forward
        self.prefix_cache = prefix_cache

    @property
    def graphs(self) -> list[CudaGraphSet | PrefillGraphSet]:
        """The decode / verify graph sets, then the prefill graphs (add_prefill_graphs)."""
        return self.graphed.graph_sets

    def add_prefill_graphs(self, keep_all_hidden: bool, max_chunk_rows: int, max_model_len: int) -> None:
        """CUDA graphs for one request's short prompt chunk (common/basemodel/prefill_graph.py), captured after the
        prefix cache's snapshot pool exists; one process (no tp / pp) with graphs and the prefix cache on."""
        model = self.model
        if self.graph_max_batch_size == 0 or model.rt.rank.parallel.world_size > 1 or model.caches.snapshots is None:
            return
        graphs = prefill_graph_set(model.forward, model.caches, keep_all_hidden, self.graph_pool, max_chunk_rows,
                                   max_model_len)  # fmt: skip
        if graphs is not None:
            self.graphed.graph_sets.append(graphs)

    def forward(self, batch: ForwardBatch) -> ModelOutput:
        """The model forward, replayed from a CUDA graph when one fits the batch."""
        return self.graphed.forward(batch)

    def build_batch(
        self, scheduled: list[ScheduledRequest], after: DecodeStep | None = None
    ) -> tuple[ForwardBatch, list[Request]]:
        """Allocates slots for the new tokens and writes them into req_to_token.

        after: a step whose sampled tokens have not reached the host: the decode rows of its requests take their
        input ids from its tokens on the device. Returns the batch and the requests that get a new token from this
        step (those whose pending tokens all fit in it), in the order of the batch's logits rows."""
        on_device = {}
        if after is not None and after.tokens is not None:
            on_device = {id(r): i for i, r in enumerate(after.reqs)}
        from_device: list[tuple[int, int]] = []  # (row, index into after.tokens)
        input_ids: list[int] = []
        positions: list[int] = []
        req_idx: list[int] = []
        seq_len: list[int] = []
        cu_q_len = [0]
        has_state: list[bool] = []
        logits_rows: list[int] = []
        sampled: list[Request] = []
        slots: list[torch.Tensor] = []
        starts: list[int] = []
        for s in scheduled:
            req, n = s.request, s.num_new_tokens
            if req.req_idx is None:
                req.req_idx = self.req_manager.alloc()
                if self.image_rows is not None:
                    self.image_rows.admit(req)
                if self.prefix_cache is not None:
                    self.prefix_cache.restore(req)
            start = req.num_computed
            starts.append(start)
            if id(req) in on_device:  # its pending token is the one `after` sampled
                assert n == 1
                from_device.append((len(input_ids), on_device[id(req)]))
                input_ids.append(0)
            else:
                input_ids += req.tokens(start, start + n)
            positions += range(start, start + n)
            req_idx.append(req.req_idx)
            seq_len.append(start + n)
            cu_q_len.append(cu_q_len[-1] + n)
            has_state.append(start > 0)
            new_slots = self.alloc_kv(n)
            req.kv_slots.append(new_slots)
            slots.append(new_slots)
            if id(req) in on_device or start + n == req.num_tokens:  # every pending token is in
                logits_rows.append(cu_q_len[-1] - 1)
                sampled.append(req)
        decode = all(s.num_new_tokens == 1 for s in scheduled) and all(has_state)
        dev = self.device

        def to_dev(values, dtype):
            return torch.tensor(values, dtype=dtype).to(dev, non_blocking=True)

        b_req_idx = to_dev(req_idx, torch.int32)
        b1_cu_q_len = to_dev(cu_q_len, torch.int32)
        positions_t = torch.tensor(positions, dtype=torch.int64)
        mem_index = torch.cat(slots).to(dev, non_blocking=True)
        q_lens = torch.tensor([b - a for a, b in zip(cu_q_len, cu_q_len[1:])])
        rows = torch.tensor(req_idx, dtype=torch.int64).repeat_interleave(q_lens).to(dev, non_blocking=True)
        positions_dev = positions_t.to(dev, non_blocking=True)
        self.req_manager.req_to_token[rows, positions_dev] = mem_index
        input_ids_dev = to_dev(input_ids, torch.int64)
        if from_device:
            same = len(from_device) == len(input_ids) == after.tokens.shape[0]
            if same and all(i == j for i, j in from_device):
                input_ids_dev = after.tokens  # steady decode: the same requests in the same order
            else:
                rows_dev = to_dev([i for i, _ in from_device], torch.int64)
                input_ids_dev[rows_dev] = after.tokens[to_dev([j for _, j in from_device], torch.int64)]
        plan, image_fields = None, {}
        chunks = [(s.request, p0, s.num_new_tokens) for s, p0 in zip(scheduled, starts)]
        if self.prefix_cache is not None:  # GDN snapshots at the prompt chunks' boundaries (an EXTEND forward)
            plan = self.prefix_cache.plan(chunks, len(input_ids), dev)
            decode = decode and plan is None
        if self.image_rows is not None:  # vision embeddings and M-RoPE rows of image prompts
            image_fields = self.image_rows.batch_fields(chunks)
            decode = decode and not image_fields  # one-row prompt chunks over an image token look like decode rows
        batch = ForwardBatch(
            mode=ForwardMode.DECODE if decode else ForwardMode.EXTEND,
            input_ids=input_ids_dev,
            positions=positions_dev,
            mem_index=mem_index,
            b_req_idx=b_req_idx,
            b_seq_len=to_dev(seq_len, torch.int32),
            b1_cu_q_len=b1_cu_q_len,
            b_has_initial_state=to_dev(has_state, torch.bool),
            b_logits_index=to_dev(logits_rows, torch.int64),
            max_q_len=max(b - a for a, b in zip(cu_q_len, cu_q_len[1:])),
            snapshot_plan=plan,
            host_q_lens=tuple(s.num_new_tokens for s in scheduled),
            **image_fields,
        )
        return batch, sampled

    max_tokens_per_step = 1
    lookahead_slots = kv_lookahead_slots(0)

    @torch.inference_mode()
    def launch(self, scheduled: list[ScheduledRequest], after: DecodeStep | None = None) -> DecodeStep:
        """Queues one forward and its sampling on the device; the tokens reach the host in `collect`. after: the step
        queued before this one whose tokens the host has not read yet (overlap scheduling)."""
        return self._launch(scheduled, *self.build_batch(scheduled, after))

    def _launch(self, scheduled: list[ScheduledRequest], batch: ForwardBatch, sampled: list[Request]) -> DecodeStep:
        out = self.forward(batch)
        for s in scheduled:
            s.request.num_computed += s.num_new_tokens
        self.after_prompt_chunks(scheduled)
        if not sampled:
            return DecodeStep([])
        tokens = self.sample_on_last_stage(out.logits, sampled)
        return DecodeStep(sampled, tokens, HostCopy(tokens), self.logprobs_copy(out.logits, tokens, sampled))

    def collect(self, step: DecodeStep) -> list[tuple[Request, list[int]]]:
        """(request, [sampled token]) for the requests that produced a token; waits for the step's tokens only."""
        if step.host_tokens is None:
            return []
        self.deliver_logprobs(step.reqs, step.host_logprobs)
        return [(r, [t]) for r, t in zip(step.reqs, step.host_tokens.tolist())]

    def sampling_tensors(self, reqs: list[Request]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(temperatures [B] fp32, top_ps [B] fp32, top_ks [B] int32) on the device."""
        dev = self.device
        values = [[r.params.temperature, r.params.top_p, r.params.top_k] for r in reqs]
        values = torch.tensor(values, dtype=torch.float32).to(dev, non_blocking=True)
        return values[:, 0], values[:, 1], values[:, 2].to(torch.int32)

    def min_ps(self, reqs: list[Request]) -> torch.Tensor | None:
        """[B] fp32 min-p of each request on the device; None when no request uses it."""
        if not any(r.params.min_p for r in reqs):
            return None
        return torch.tensor([r.params.min_p for r in reqs], dtype=torch.float32).to(self.device, non_blocking=True)

    def processing(self, reqs: list[Request], vocab_size: int) -> LogitsProcessing | None:
        """The requests' logits processing (penalties, bias, min_tokens) from their committed output; None: none."""
        histories = [(r.prompt_ids, r.output_ids, r.params) for r in reqs]
        return LogitsProcessing.for_requests(histories, self.eos_token_ids, vocab_size, self.device)

    def sample(self, logits: torch.Tensor, reqs: list[Request]) -> torch.Tensor:
        """Tokens [B] on the device, without a host sync: each request's processed logits (and grammar), sampled."""
        processing = self.processing(reqs, logits.shape[-1])
        masks = sampling_masks(reqs, logits.shape[-1], self.device)
        if processing is not None or masks is not None:
            logits = process_logits(logits, processing, torch.arange(len(reqs), device=logits.device), masks=masks)
        sampled_rows = [i for i, r in enumerate(reqs) if r.params.temperature > 0]
        if not sampled_rows:
            return greedy_sample(logits)
        temps, top_ps, top_ks = self.sampling_tensors(reqs)
        return sample(logits, temps, top_ps, top_ks, [r.generator for r in reqs], sampled_rows=sampled_rows,
                      min_ps=self.min_ps(reqs))  # fmt: skip

    def logprobs_copy(self, logits: torch.Tensor | None, tokens: torch.Tensor, reqs: list[Request]) -> HostCopy | None:
        """The sampled tokens' logprobs (sampling/logprobs.py) on their way to the host, when a request asks."""
        rows = self.logprobs_on_every_stage(reqs, lambda num_top: emitted_logprobs(logits, tokens, num_top),
                                            len(reqs))  # fmt: skip
        return HostCopy(rows) if rows is not None else None

    def logprobs_on_every_stage(self, reqs: list[Request], compute, num_rows: int) -> torch.Tensor | None:
        """compute(num_top) on the last stage (where the logits are), broadcast to the others, so that the driver
        (the first stage) delivers them; None when no request asks for logprobs."""
        asked = [r.params.logprobs for r in reqs if r.params.logprobs is not None]
        if not asked:
            return None
        if self.model.is_last_stage:
            return pp_broadcast_from_last(compute(max(asked)))
        rows = torch.empty(num_rows, 1 + 2 * max(asked), dtype=torch.float64, device=self.device)
        return pp_broadcast_from_last(rows)

    @staticmethod
    def deliver_logprobs(reqs: list[Request], host: HostCopy | None, counts: list[int] | None = None) -> None:
        """Leaves each asking request's logprobs of this step in pending_logprobs (the engine keeps those of the
        tokens it appends). host rows: one per request, or (counts) one per emitted token of a verify block."""
        if host is None:
            return
        rows = host.tolist()
        for b, r in enumerate(reqs):
            if r.params.logprobs is not None:
                mine = rows[b] if counts is not None else [rows[b]]
                n = counts[b] if counts is not None else 1
                r.pending_logprobs = [unpack(row, r.params.logprobs) for row in mine[:n]]

    def sample_on_last_stage(self, logits: torch.Tensor | None, reqs: list[Request]) -> torch.Tensor:
        """Tokens [B] on every pipeline stage: sampled where the logits are (the last stage), broadcast to the
        others, so that each stage's next step takes the tokens the last one confirmed (identity without PP)."""
        if self.model.is_last_stage:
            tokens = self.sample(logits, reqs)
        else:
            tokens = torch.empty(len(reqs), dtype=torch.int64, device=self.device)
        return pp_broadcast_from_last(tokens)

    def after_prompt_chunks(self, scheduled: list[ScheduledRequest] = ()) -> None:
        """A launched forward's prompt chunks (num_computed counted) leave their boundaries in the prefix cache, and
        the vision embeddings they no longer need."""
        if self.prefix_cache is not None:
            self.prefix_cache.after_launch()
        for s in scheduled:
            if s.request.images is not None:
                s.request.images.drop_embeds_before(s.request.num_computed)

    def settle(self, step: DecodeStep) -> None:
        pass

    def alloc_kv(self, n: int) -> torch.Tensor:
        """n KV slots ([n] int32, host); the prefix cache evicts unlocked cached prefixes when too few are free."""
        return self.prefix_cache.alloc_kv(n) if self.prefix_cache is not None else self.kv_pool.alloc(n)

    def end_state(self, req: Request) -> EndState:
        """Plain decoding: the committed GDN state is column / row 0 of its slot (covering its num_computed tokens);
        earlier states are not kept, and a queued decode row's KV is in req.kv_slots already."""
        return EndState(committed=0, committed_row=0)

    def release(self, req: Request) -> None:
        """Returns the request's KV slots and request slot (its linear state slot goes with it)."""
        if req.kv_slots:
            self.kv_pool.free(torch.cat(req.kv_slots))
            req.kv_slots = []
        if req.blocks:
            self.kv_pool.free(torch.cat(req.blocks))
            req.blocks = []
        if req.req_idx is not None:
            self.req_manager.free(req.req_idx)
            req.req_idx = None
        if req.images is not None:
            req.images.embeds.clear()
