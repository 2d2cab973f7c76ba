"""CUDA graphs for fixed-layout forwards, captured at start-up and replayed with padding.

A layout is (mode, rows per request): (DECODE, 1) for plain decode and eagle chain steps, (VERIFY, k+1) for the
target's verify block, (EXTEND, k+1) for a draft module's pass over the verify rows. One graph per batch-size
bucket; a batch of B requests runs in the smallest bucket >= B, and requests B.. are padding that point at
the reserved request slot (ReqManager.hold_req) and KV slot (KvPool.hold_slot), so they touch no live state.
Ragged batches and batches above the largest bucket run eagerly. Every graph returns the logits and hidden of
all rows (a pipeline stage before the last: its residual stream, ModelOutput.to_next_stage). All graphs of an
engine share one memory pool. Hidden-state inputs (an MTP draft's hidden; a later pipeline stage's received delta
and residual) are static buffers too: copied in by `run`, or filled in place through `hidden_inputs`.
"""

from __future__ import annotations

from typing import Callable

import torch

from lightllm_mtp.common.basemodel.forward_batch import ForwardBatch, ForwardMode, ModelOutput
from lightllm_mtp.common.layers.base import ModelCaches

ForwardFn = Callable[..., ModelOutput]  # fn(batch), fn(batch, hidden) for MTP drafts, fn(batch, delta, residual)


def graph_batch_sizes(max_batch_size: int) -> list[int]:
    """1, 2, 4, 8, then every 8 up to max_batch_size (always included)."""
    sizes = [s for s in (1, 2, 4) if s < max_batch_size]
    sizes += list(range(8, max_batch_size, 8))
    return sorted(set(sizes + [max_batch_size]))


class CudaGraphSet:
    """The graphs of one forward function for one layout, one per batch-size bucket."""

    def __init__(
        self,
        fn: ForwardFn,
        caches: ModelCaches,
        mode: ForwardMode,
        rows_per_req: int,
        max_batch_size: int,
        pool,
        hidden_size: int | None = None,
        hidden_dtype: torch.dtype | None = None,
        logits: bool = True,
        state_write: bool = False,
        num_hidden_inputs: int = 1,
    ):
        """hidden_size: fn takes num_hidden_inputs [rows, hidden_size] tensors after the batch; logits=False: a
        forward that computes no logits (a draft pass kept only for the KV it writes); state_write: VERIFY batches
        that carry b_state_write (a draft model's chain steps)."""
        self.fn, self.caches, self.mode, self.q, self.logits = fn, caches, mode, rows_per_req, logits
        self.sizes = graph_batch_sizes(max_batch_size)
        self.pool = pool
        dev = caches.req_manager.req_to_token.device
        n, q = self.sizes[-1], rows_per_req
        # static inputs; padding requests are pre-filled with the reserved slots at positions 0..q-1
        self.input_ids = torch.zeros(n * q, dtype=torch.int64, device=dev)
        self.positions = torch.arange(q, device=dev).repeat(n)
        self.mem_index = torch.full((n * q,), caches.kv_pool.hold_slot, dtype=torch.int32, device=dev)
        self.b_req_idx = torch.full((n,), caches.req_manager.hold_req, dtype=torch.int32, device=dev)
        self.b_seq_len = torch.full((n,), q, dtype=torch.int32, device=dev)
        self.b1_cu_q_len = torch.arange(n + 1, dtype=torch.int32, device=dev) * q
        self.has_state = torch.ones(n, dtype=torch.bool, device=dev)
        self.logits_index = torch.arange(n * q, dtype=torch.int64, device=dev)
        self.b_accept_len = torch.ones(n, dtype=torch.int32, device=dev) if mode is ForwardMode.VERIFY else None
        self.b_state_write = torch.zeros(n, dtype=torch.int32, device=dev) if state_write else None
        self.hiddens: list[torch.Tensor] = []
        if hidden_size is not None:
            self.hiddens = [torch.zeros(n * q, hidden_size, dtype=hidden_dtype, device=dev)
                            for _ in range(num_hidden_inputs)]  # fmt: skip
        self.graphs: dict[int, tuple[torch.cuda.CUDAGraph, ModelOutput]] = {}
        for size in reversed(self.sizes):  # largest first so smaller graphs reuse its pool memory
            self._capture(size)

    def _batch(self, size: int) -> ForwardBatch:
        rows = size * self.q
        return ForwardBatch(
            mode=self.mode,
            input_ids=self.input_ids[:rows],
            positions=self.positions[:rows],
            mem_index=self.mem_index[:rows],
            b_req_idx=self.b_req_idx[:size],
            b_seq_len=self.b_seq_len[:size],
            b1_cu_q_len=self.b1_cu_q_len[: size + 1],
            b_has_initial_state=self.has_state[:size],
            b_logits_index=self.logits_index[: rows if self.logits else 0],
            b_accept_len=None if self.b_accept_len is None else self.b_accept_len[:size],
            b_state_write=None if self.b_state_write is None else self.b_state_write[:size],
            max_q_len=self.q,
            keep_all_hidden=True,
        )

    def _call(self, batch: ForwardBatch) -> ModelOutput:
        return self.fn(batch, *self.hidden_inputs(batch.num_tokens))

    def hidden_inputs(self, rows: int) -> list[torch.Tensor]:
        """The first `rows` rows of the static hidden inputs (contiguous): a receive may fill them in place before
        `run(batch)` without hidden arguments."""
        return [h[:rows] for h in self.hiddens]

    @torch.inference_mode()
    def _capture(self, size: int) -> None:
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            for _ in range(2):  # warm-up: Triton compilation and autotuning happen outside the capture
                self._call(self._batch(size))
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        # a fresh batch: tensors derived during the capture (ForwardBatch.derived) must be made inside it
        with torch.cuda.graph(graph, pool=self.pool):
            out = self._call(self._batch(size))
        self.graphs[size] = (graph, out)

    def can_run(self, batch: ForwardBatch) -> bool:
        # host-side checks only: the layout's mode, uniform blocks of q rows, logits of every row (or none), a captured
        # bucket. The graphs assume b_has_initial_state is all true: decode and verify rows always continue a
        # cached prefix, and EXTEND graphs serve attention-only draft modules, which never read it.
        return (
            batch.mode is self.mode
            and not batch.has_image_rows
            and batch.max_q_len == self.q
            and 0 < batch.batch_size <= self.sizes[-1]
            and batch.num_tokens == batch.batch_size * self.q
            and batch.b_logits_index.shape[0] == (batch.num_tokens if self.logits else 0)
            and (batch.b_state_write is None) == (self.b_state_write is None)
        )

    def run(self, batch: ForwardBatch, *hidden: torch.Tensor) -> ModelOutput:
        """hidden: the forward's hidden inputs, copied into the static buffers; none when they are filled already
        (hidden_inputs)."""
        b = batch.batch_size
        rows = b * self.q
        size = next(s for s in self.sizes if s >= b)
        self.input_ids[:rows].copy_(batch.input_ids)
        self.positions[:rows].copy_(batch.positions)
        self.mem_index[:rows].copy_(batch.mem_index)
        self.b_req_idx[:b].copy_(batch.b_req_idx)
        self.b_seq_len[:b].copy_(batch.b_seq_len)
        if self.b_accept_len is not None:
            self.b_accept_len[:b].copy_(batch.b_accept_len)
        if self.b_state_write is not None:
            self.b_state_write[:b].copy_(batch.b_state_write)
        assert len(hidden) in (0, len(self.hiddens)), "all hidden inputs, or none (filled in place)"
        for buffer, h in zip(self.hiddens, hidden):
            assert h.shape[0] == rows
            buffer[:rows].copy_(h)
        self._reset_padding(b, size)
        graph, out = self.graphs[size]
        graph.replay()
        return ModelOutput(
            logits=out.logits[:rows] if self.logits and out.logits is not None else out.logits,
            hidden=out.hidden[:rows] if out.hidden is not None else None,
            to_next_stage=tuple(t[:rows] for t in out.to_next_stage) if out.to_next_stage is not None else None,
        )

    def replay_ms(self, size: int, iters: int = 10, context: int = 0) -> float:
        """Median milliseconds of one replay of the bucket of `size` requests, every row padding (the reserved
        request and KV slots): the step-cost measurement of adaptive speculation. context > 0: each padding request
        holds `context` tokens before its rows, read from distinct KV slots through the reserved request's page-table
        row (restored afterwards), so that the time includes attending over that much KV."""
        self._reset_padding(0, size)
        table, hold = self.caches.req_manager.req_to_token, self.caches.req_manager.hold_req
        length = min(context + self.q, table.shape[1])
        saved = table[hold, :length].clone() if context > 0 else None
        if context > 0:
            slots = torch.arange(length, device=table.device) % self.caches.kv_pool.size
            table[hold, :length] = slots.to(table.dtype)
            self.b_seq_len[:size].fill_(length)
        try:
            graph = self.graphs[size][0]
            graph.replay()
            times = []
            for _ in range(iters):
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                graph.replay()
                end.record()
                end.synchronize()
                times.append(start.elapsed_time(end))
        finally:
            if saved is not None:
                table[hold, :length] = saved
                self.b_seq_len[:size].fill_(self.q)
        return sorted(times)[len(times) // 2]

    def _reset_padding(self, b: int, size: int) -> None:
        if b == size:
            return
        q, caches = self.q, self.caches
        self.input_ids[b * q : size * q].zero_()
        self.positions[b * q : size * q].copy_(torch.arange(q, device=self.positions.device).repeat(size - b))
        self.mem_index[b * q : size * q].fill_(caches.kv_pool.hold_slot)
        self.b_req_idx[b:size].fill_(caches.req_manager.hold_req)
        self.b_seq_len[b:size].fill_(q)
        if self.b_accept_len is not None:
            self.b_accept_len[b:size].fill_(1)
        if self.b_state_write is not None:
            self.b_state_write[b:size].zero_()


class GraphedForward:
    """A forward function behind its CUDA graphs: `forward` replays the first graph set that fits the batch and
    runs the function eagerly otherwise. Without graph sets (CPU, graphs off) it is the plain function."""

    def __init__(self, fn: ForwardFn, graph_sets: list[CudaGraphSet] | None = None):
        self.fn = fn
        self.graph_sets = graph_sets or []

    def forward(self, batch: ForwardBatch, *hidden: torch.Tensor) -> ModelOutput:
        for graphs in self.graph_sets:
            if graphs.can_run(batch):
                return graphs.run(batch, *hidden)
        return self.fn(batch, *hidden)
