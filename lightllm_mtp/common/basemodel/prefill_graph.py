"""CUDA graphs of one request's short prompt chunk: the warm prefix-cache hit (a resent conversation, a question
after a cached system prompt) recomputes a few hundred tokens, and eagerly its ~730 launches cost more host time
than the GPU needs for them (issue 16; benchmark/NOTES.md, stop 25).

A chunk of n rows runs in the graph of the smallest bucket N >= n. Rows n..N-1 are padding: their KV goes to the
reserved KV slot, and every kernel is told the real length by device tensors (b1_cu_q_len = [0, n] for the conv,
attention and fla's varlen kernels, whose chunk table covers N rows: chunks past n find no rows of the request).
Their outputs are garbage and never read: the logits row is n - 1, the hidden rows 0..n-1. An MoE layer zeroes
their activations before routing them (`ForwardBatch.padded`), so garbage never picks experts. Each bucket has one graph
without snapshots and one per snapshot layout (the GDN states saved at up to MAX_INNER_SAVES boundaries inside the
chunk and at its end); the layout's slots are copied in per replay. Chunks of several requests, longer ones, or
other snapshot layouts run eagerly. The graphs come with the prefix cache (the GDN layers run fla's forward step by
step through the snapshot path, whose chunk tables are made outside the graph).
"""

from __future__ import annotations

import dataclasses
import logging
import time
from itertools import product

import torch

from lightllm_mtp.common.basemodel.forward_batch import ForwardBatch, ForwardMode, ModelOutput
from lightllm_mtp.common.layers.base import ModelCaches
from lightllm_mtp.common.state_snapshots import SnapshotPiece, SnapshotPlan
from lightllm_mtp.kernels.gdn.fla_prefill import FLA_CHUNK_SIZE, PrefillChunks
from lightllm_mtp.kernels.gdn.gated_delta_rule_states import StateSaves, state_save_alignment

logger = logging.getLogger("lightllm_mtp.engine")

PREFILL_GRAPH_SIZES = (128, 256, 512)  # rows of the buckets (multiples of fla's chunk)
MAX_INNER_SAVES = 2  # snapshot boundaries inside a graphed chunk (an interval of 256 puts at most 2 in 512 rows)

Layout = tuple[int, int] | None  # (inner saves, end saves 0 / 1); None: no snapshot


class PrefillGraphSet:
    def __init__(self, fn, caches: ModelCaches, keep_all_hidden: bool, pool, sizes=PREFILL_GRAPH_SIZES,
                 capture: bool = True):  # fmt: skip
        """capture=False: `run` executes the padded static batch eagerly (tests of the padding on CPU)."""
        self.fn, self.caches, self.keep_all_hidden, self.pool, self.sizes = fn, caches, keep_all_hidden, pool, sizes
        self.capture = capture
        if caches.snapshots is None:
            raise ValueError("the prefill graphs need the prefix cache's snapshot pool")
        if not sizes or sizes[-1] > caches.req_manager.req_to_token.shape[1]:
            raise ValueError(f"prefill graph buckets {sizes} must be non-empty and fit the page table's "
                             f"{caches.req_manager.req_to_token.shape[1]} columns (bucket_sizes keeps them within "
                             "max_model_len)")
        dev = caches.req_manager.req_to_token.device
        n = sizes[-1]
        self.input_ids = torch.zeros(n, dtype=torch.int64, device=dev)
        self.positions = torch.zeros(n, dtype=torch.int64, device=dev)
        self.mem_index = torch.full((n,), caches.kv_pool.hold_slot, dtype=torch.int32, device=dev)
        self.b_req_idx = torch.full((1,), caches.req_manager.hold_req, dtype=torch.int32, device=dev)
        self.b_seq_len = torch.full((1,), n, dtype=torch.int32, device=dev)
        self.b1_cu_q_len = torch.tensor([0, n], dtype=torch.int32, device=dev)
        self.cu_seqlens = torch.tensor([0, n], dtype=torch.int64, device=dev)  # fla's copy of b1_cu_q_len
        self.has_state = torch.zeros(1, dtype=torch.bool, device=dev)
        self.logits_index = torch.zeros(1, dtype=torch.int64, device=dev)
        chunks = n // FLA_CHUNK_SIZE
        self.chunk_indices = torch.stack([torch.zeros(chunks, dtype=torch.int64), torch.arange(chunks)], 1).to(dev)
        self.chunk_offsets = {s: torch.tensor([0, s // FLA_CHUNK_SIZE], dtype=torch.int64, device=dev) for s in sizes}
        snaps = caches.snapshots
        layouts: list[Layout] = [None] + [(i, f) for i, f in product(range(MAX_INNER_SAVES + 1), (0, 1)) if i + f]
        k1 = snaps.conv_cols
        self.inner_chunk = torch.zeros(MAX_INNER_SAVES, dtype=torch.int64, device=dev)
        self.inner_dest = torch.zeros(MAX_INNER_SAVES, dtype=torch.int64, device=dev)
        self.final_b = torch.zeros(1, dtype=torch.int64, device=dev)
        self.final_dest = torch.zeros(1, dtype=torch.int64, device=dev)
        self.conv_index = torch.zeros(MAX_INNER_SAVES + 1, k1, dtype=torch.int64, device=dev)
        self.conv_slots = torch.zeros(MAX_INNER_SAVES + 1, dtype=torch.int64, device=dev)
        self.graphs: dict[tuple[int, Layout], tuple[torch.cuda.CUDAGraph, ModelOutput]] = {}
        for size in reversed(sizes):  # largest first so smaller graphs reuse its pool memory
            for layout in layouts:
                self._capture(size, layout)

    # ---- the static batch of a bucket and layout ----------------------------------------------------------------
    def _plan(self, size: int, layout: Layout) -> SnapshotPlan:
        """The static plan of a layout; with no snapshot an empty one: the GDN layers then run fla's forward step by
        step with the chunk offsets made here (fla's own wrapper makes them from a host list: no copy in a graph)."""
        inner, final = layout if layout is not None else (0, 0)
        saves = tuple((0, FLA_CHUNK_SIZE * (j + 1), -1) for j in range(inner)) + ((0, size, -1),) * final
        state_saves = StateSaves(
            q_lens=(size,), saves=saves, cu_seqlens=self.cu_seqlens, chunk_indices=self.chunk_indices[: size // FLA_CHUNK_SIZE],
            chunk_offsets=self.chunk_offsets[size], inner_chunk=self.inner_chunk[:inner],
            inner_dest=self.inner_dest[:inner], final_b=self.final_b[:final], final_dest=self.final_dest[:final],
        )  # fmt: skip
        return SnapshotPlan([SnapshotPiece(None, None, None, state_saves)], self.conv_index[: inner + final],
                            self.conv_slots[: inner + final])  # fmt: skip

    def _batch(self, size: int, layout: Layout) -> ForwardBatch:
        batch = ForwardBatch(
            mode=ForwardMode.EXTEND, input_ids=self.input_ids[:size], positions=self.positions[:size],
            mem_index=self.mem_index[:size], b_req_idx=self.b_req_idx, b_seq_len=self.b_seq_len,
            b1_cu_q_len=self.b1_cu_q_len, b_has_initial_state=self.has_state, b_logits_index=self.logits_index,
            max_q_len=size, keep_all_hidden=self.keep_all_hidden, snapshot_plan=self._plan(size, layout),
            host_q_lens=(size,), padded=True,
        )  # fmt: skip
        # made here, not inside the capture: prefill_chunks would copy a host table into the graph
        batch._derived["gdn_prefill_chunks"] = PrefillChunks(self.cu_seqlens, self.chunk_indices[: size // FLA_CHUNK_SIZE])
        return batch

    def _eager_batch(self, batch: ForwardBatch, size: int, layout: Layout) -> ForwardBatch:
        """capture=False: the static batch, with the live plan's host saves (the reference kernels read them) and
        the remapped conv windows."""
        padded = self._batch(size, layout)
        if layout is None:
            return padded  # its empty plan
        plan, n = batch.snapshot_plan, batch.num_tokens
        static = padded.snapshot_plan.pieces[0].saves
        saves = tuple((b, size if t == n else t, d) for b, t, d in plan.pieces[0].saves.saves)
        piece = SnapshotPiece(None, None, None, dataclasses.replace(static, saves=saves))
        return dataclasses.replace(padded, snapshot_plan=SnapshotPlan([piece], padded.snapshot_plan.conv_index,
                                                                      padded.snapshot_plan.conv_slots))

    @torch.inference_mode()
    def _capture(self, size: int, layout: Layout) -> None:
        # the warm-up runs the static batch as it is: its lengths must be this bucket's (a larger bucket's let every
        # kernel read and write past the bucket's rows)
        self.b_seq_len.fill_(size)
        self.b1_cu_q_len[1] = size
        self.cu_seqlens[1] = size
        if not self.capture:  # the static batch still runs once (the CPU test checks its lengths)
            self.fn(self._batch(size, layout))
            self.graphs[(size, layout)] = (None, None)
            return
        logger.debug("prefill graph bucket %d, snapshot layout %s: warm-up", size, layout)
        for _ in range(2):  # warm-up: Triton compilation and autotuning happen outside the capture
            self.fn(self._batch(size, layout))
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        logger.debug("prefill graph bucket %d, snapshot layout %s: capture", size, layout)
        with torch.cuda.graph(graph, pool=self.pool):
            out = self.fn(self._batch(size, layout))
        self.graphs[(size, layout)] = (graph, out)

    # ---- replay --------------------------------------------------------------------------------------------------
    def layout_of(self, batch: ForwardBatch) -> Layout | str:
        """The batch's snapshot layout, or "none" when no graph of this set has it."""
        plan = batch.snapshot_plan
        if plan is None:
            return None
        if len(plan.pieces) != 1 or plan.pieces[0].rows is not None:
            return "none"
        saves = plan.pieces[0].saves
        inner, final = saves.inner_chunk.shape[0], saves.final_b.shape[0]
        if inner > MAX_INNER_SAVES or final > 1 or (inner, final) == (0, 0):
            return "none"
        return inner, final

    def can_run(self, batch: ForwardBatch) -> bool:
        return (
            batch.mode is ForwardMode.EXTEND
            and not batch.has_image_rows
            and batch.batch_size == 1
            and 0 < batch.num_tokens <= self.sizes[-1]
            and batch.host_q_lens is not None
            and batch.keep_all_hidden == self.keep_all_hidden
            and batch.b_logits_index.shape[0] <= 1
            and batch.b_accept_len is None
            and batch.b_state_write is None
            and (self.size_of(batch.num_tokens), self.layout_of(batch)) in self.graphs
        )

    def size_of(self, rows: int) -> int:
        return next(s for s in self.sizes if s >= rows)

    def run(self, batch: ForwardBatch, *hidden: torch.Tensor) -> ModelOutput:
        assert not hidden, "the prefill graphs take the model's own inputs only"
        n = batch.num_tokens
        size, layout = self.size_of(n), self.layout_of(batch)
        self.input_ids[:n].copy_(batch.input_ids)
        self.positions[:n].copy_(batch.positions)
        self.mem_index[:n].copy_(batch.mem_index)
        self.mem_index[n:size].fill_(self.caches.kv_pool.hold_slot)
        self.b_req_idx.copy_(batch.b_req_idx)
        self.b_seq_len.copy_(batch.b_seq_len)
        self.b1_cu_q_len.copy_(batch.b1_cu_q_len)
        self.cu_seqlens.copy_(batch.b1_cu_q_len)
        self.has_state.copy_(batch.b_has_initial_state)
        logits_rows = batch.b_logits_index.shape[0]
        if logits_rows:
            self.logits_index.copy_(batch.b_logits_index)
        else:  # a chunk that does not end its prompt: a row of this bucket, its logits unused
            self.logits_index.fill_(n - 1)
        if layout is not None:
            plan = batch.snapshot_plan
            saves = plan.pieces[0].saves
            inner, final = layout
            self.inner_chunk[:inner].copy_(saves.inner_chunk)
            self.inner_dest[:inner].copy_(saves.inner_dest)
            self.final_dest[:final].copy_(saves.final_dest)
            # conv windows: rows >= n of the eager plan index the request's conv history, which follows the N rows
            index = plan.conv_index
            self.conv_index[: inner + final].copy_(torch.where(index >= n, index + (size - n), index))
            self.conv_slots[: inner + final].copy_(plan.conv_slots)
        graph, out = self.graphs[(size, layout)]
        if graph is None:
            out = self.fn(self._eager_batch(batch, size, layout))
        else:
            graph.replay()
        hidden = out.hidden[:n] if self.keep_all_hidden else out.hidden[:logits_rows]
        if graph is None:
            return ModelOutput(logits=out.logits[:logits_rows], hidden=hidden)
        # copies: the static outputs sit in the graph pool shared with the decode / verify / draft graphs captured
        # before, whose replays (the step's verify, a draft module's window) may use that memory as scratch while
        # the builder and the proposers still read these rows
        return ModelOutput(logits=out.logits[:logits_rows].clone(), hidden=hidden.clone())


def bucket_sizes(max_chunk_rows: int, max_model_len: int) -> tuple[int, ...]:
    """The buckets worth capturing: none longer than a request (a bucket's warm-up reads its whole page-table row),
    and none past the first that holds the longest prompt chunk."""
    sizes = []
    for size in PREFILL_GRAPH_SIZES:
        if size > max_model_len:
            break
        sizes.append(size)
        if size >= max_chunk_rows:
            break
    return tuple(sizes)


def prefill_graph_set(fn, caches: ModelCaches, keep_all_hidden: bool, pool, max_chunk_rows: int,
                      max_model_len: int) -> PrefillGraphSet | None:  # fmt: skip
    """The prefill graphs of a forward (with the prefix cache's snapshot pool in caches), or None when no bucket fits
    (max_model_len below the smallest) or fla's step-by-step forward is missing (the reference GDN prefill reads the
    device, which a capture refuses)."""
    sizes = bucket_sizes(max_chunk_rows, max_model_len)
    device = caches.req_manager.req_to_token.device
    if not sizes or state_save_alignment(device) != FLA_CHUNK_SIZE:
        return None
    start = time.perf_counter()
    try:
        graphs = PrefillGraphSet(fn, caches, keep_all_hidden, pool, sizes)
    except Exception as e:  # a failed capture can leave the CUDA context unusable: stop here, loudly
        raise RuntimeError("capturing the prefill CUDA graphs failed; start with --disable_prefill_cudagraph "
                           "(LLM(prefill_cuda_graphs=False)) to run prompt chunks eagerly") from e
    logger.info("prefill CUDA graphs: %d captured in %.1f s", len(graphs.graphs), time.perf_counter() - start)
    return graphs
