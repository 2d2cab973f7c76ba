"""CudaGraphSet.can_run, the host-side dispatch of a batch to a captured graph set, checked without a GPU: a set
captured without logits (the window pass kept for its KV under adaptive k) serves exactly the batches that ask for
no logits, and a set with logits only those that ask for every row's."""

import torch

from lightllm_mtp.common.basemodel.cuda_graph import CudaGraphSet, graph_batch_sizes
from lightllm_mtp.common.basemodel.forward_batch import ForwardBatch, ForwardMode


def graph_set(logits: bool, q: int = 2, max_batch_size: int = 8) -> CudaGraphSet:
    g = object.__new__(CudaGraphSet)  # the dispatch fields only: capturing needs CUDA
    g.mode, g.q, g.logits, g.b_state_write = ForwardMode.EXTEND, q, logits, None
    g.sizes = graph_batch_sizes(max_batch_size)
    return g


def batch(size: int, q: int, logits_rows: int) -> ForwardBatch:
    rows = size * q
    return ForwardBatch(
        mode=ForwardMode.EXTEND, input_ids=torch.zeros(rows, dtype=torch.int64), positions=torch.zeros(rows),
        mem_index=torch.zeros(rows, dtype=torch.int32), b_req_idx=torch.zeros(size, dtype=torch.int32),
        b_seq_len=torch.full((size,), q, dtype=torch.int32), b1_cu_q_len=torch.arange(size + 1, dtype=torch.int32) * q,
        b_has_initial_state=torch.ones(size, dtype=torch.bool), b_logits_index=torch.arange(logits_rows),
        max_q_len=q, keep_all_hidden=True,
    )  # fmt: skip


def test_kv_only_set_serves_batches_without_logits():
    kv_only, with_logits = graph_set(logits=False), graph_set(logits=True)
    no_logits = batch(3, 2, logits_rows=0)
    all_logits = batch(3, 2, logits_rows=6)
    assert kv_only.can_run(no_logits) and not with_logits.can_run(no_logits)
    assert with_logits.can_run(all_logits) and not kv_only.can_run(all_logits)
    assert not with_logits.can_run(batch(3, 2, logits_rows=3))  # some rows only: eager
    assert not kv_only.can_run(batch(9, 2, logits_rows=0))  # above the largest bucket
    assert not kv_only.can_run(batch(3, 3, logits_rows=0))  # another layout
