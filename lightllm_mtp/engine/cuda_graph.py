"""CUDA graphs for decode forwards, one per batch-size bucket, captured at start-up and replayed with padding.

A batch of B decode rows runs in the smallest bucket >= B; rows B.. are padding that point at the reserved
request slot (ReqManager.hold_req) and KV slot (KvPool.hold_slot), so they touch no live state. Batches
above the largest bucket run eagerly. All buckets share one memory pool.
"""

from __future__ import annotations

import torch

from lightllm_mtp.common.basemodel.basemodel import TpPartBaseModel
from lightllm_mtp.common.basemodel.forward_batch import ForwardBatch, ForwardMode, ModelOutput


def graph_batch_sizes(max_batch_size: int) -> list[int]:
    """1, 2, 4, 8, then every 8 up to max_batch_size (always included)."""
    sizes = [s for s in (1, 2, 4) if s < max_batch_size]
    sizes += list(range(8, max_batch_size, 8))
    return sorted(set(sizes + [max_batch_size]))


class DecodeCudaGraphs:
    def __init__(self, model: TpPartBaseModel, max_batch_size: int):
        self.model = model
        dev = model.rt.device
        self.sizes = graph_batch_sizes(max_batch_size)
        n = self.sizes[-1]
        caches = model.caches
        # static inputs, padded rows pre-filled with the reserved slots
        self.input_ids = torch.zeros(n, dtype=torch.int64, device=dev)
        self.positions = torch.zeros(n, dtype=torch.int64, device=dev)
        self.mem_index = torch.full((n,), caches.kv_pool.hold_slot, dtype=torch.int32, device=dev)
        self.b_req_idx = torch.full((n,), caches.req_manager.hold_req, dtype=torch.int32, device=dev)
        self.b_seq_len = torch.ones(n, dtype=torch.int32, device=dev)
        self.b1_cu_q_len = torch.arange(n + 1, dtype=torch.int32, device=dev)
        self.has_state = torch.ones(n, dtype=torch.bool, device=dev)
        self.logits_index = torch.arange(n, dtype=torch.int64, device=dev)
        self.graphs: dict[int, tuple[torch.cuda.CUDAGraph, ModelOutput]] = {}
        self.pool = torch.cuda.graph_pool_handle()
        for size in reversed(self.sizes):  # largest first so smaller graphs reuse its pool memory
            self._capture(size)

    def _batch(self, size: int) -> ForwardBatch:
        return ForwardBatch(
            mode=ForwardMode.DECODE,
            input_ids=self.input_ids[:size],
            positions=self.positions[:size],
            mem_index=self.mem_index[:size],
            b_req_idx=self.b_req_idx[:size],
            b_seq_len=self.b_seq_len[:size],
            b1_cu_q_len=self.b1_cu_q_len[: size + 1],
            b_has_initial_state=self.has_state[:size],
            b_logits_index=self.logits_index[:size],
            max_q_len=1,
        )

    @torch.inference_mode()
    def _capture(self, size: int) -> None:
        batch = self._batch(size)
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            for _ in range(2):  # warm-up: Triton compilation and autotuning happen outside the capture
                self.model.forward(batch)
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.pool):
            out = self.model.forward(batch)
        self.graphs[size] = (graph, out)

    def can_run(self, batch: ForwardBatch) -> bool:
        return batch.mode is ForwardMode.DECODE and batch.batch_size <= self.sizes[-1]

    def run(self, batch: ForwardBatch) -> ModelOutput:
        b = batch.batch_size
        size = next(s for s in self.sizes if s >= b)
        self.input_ids[:b].copy_(batch.input_ids)
        self.positions[:b].copy_(batch.positions)
        self.mem_index[:b].copy_(batch.mem_index)
        self.b_req_idx[:b].copy_(batch.b_req_idx)
        self.b_seq_len[:b].copy_(batch.b_seq_len)
        self._reset_padding(b, size)
        graph, out = self.graphs[size]
        graph.replay()
        return ModelOutput(logits=out.logits[:b], hidden=out.hidden[:b])

    def _reset_padding(self, b: int, size: int) -> None:
        if b == size:
            return
        caches = self.model.caches
        self.input_ids[b:size].zero_()
        self.positions[b:size].zero_()
        self.mem_index[b:size].fill_(caches.kv_pool.hold_slot)
        self.b_req_idx[b:size].fill_(caches.req_manager.hold_req)
        self.b_seq_len[b:size].fill_(1)
