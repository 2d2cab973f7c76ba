"""The step-cost table of adaptive speculation: milliseconds of a speculative step per (batch-size bucket, drafts k),
measured at start-up by replaying the captured CUDA graphs (all rows padding), or, without graphs (CPU), counted in
rows through the forwards (the tiny CPU models are compute-bound, so rows stand in for time).

A step with blocks of k drafts costs the target's verify forward over k + 1 rows per request, the proposer's draft
pass (one window forward per MTP module) and, for eagle, k - 1 chain steps of one row per request."""

from __future__ import annotations

from lightllm_mtp.common.basemodel.cuda_graph import CudaGraphSet
from lightllm_mtp.spec_decode.adaptive import StepCostTable


def measured_step_costs(
    verify: dict[int, CudaGraphSet], windows: list[CudaGraphSet], chain: CudaGraphSet | None, max_drafts: int,
    kv_only_window: CudaGraphSet | None = None,
) -> StepCostTable:
    """verify[q]: the target's (VERIFY, q) graphs for q = 1..max_drafts+1; windows: each draft module's window-pass
    graphs; chain: the eagle chain step's (DECODE, 1) graphs, or None; kv_only_window: the window pass without logits
    that k = 0 steps run (one-module proposers), or None."""
    sizes = verify[max_drafts + 1].sizes
    rows = []
    for size in sizes:
        draft = sum(w.replay_ms(size) for w in windows)
        step = chain.replay_ms(size) if chain is not None else 0.0
        drafts = [kv_only_window.replay_ms(size) if kv_only_window is not None else draft]
        drafts += [draft + (k - 1) * step for k in range(1, max_drafts + 1)]
        rows.append(tuple(verify[k + 1].replay_ms(size) + drafts[k] for k in range(max_drafts + 1)))
    return StepCostTable(tuple(sizes), tuple(rows))


def row_count_step_costs(
    batch_sizes: list[int], max_drafts: int, window_rows: int, num_modules: int, eagle_chain: bool
) -> StepCostTable:
    """Rows through the forwards per step (no graphs to time)."""
    costs = []
    for b in batch_sizes:
        draft = b * window_rows * num_modules
        costs.append(tuple(float(b * (k + 1) + draft + (max(k - 1, 0) * b if eagle_chain else 0))
                           for k in range(max_drafts + 1)))  # fmt: skip  (a k = 0 pass without logits: same rows)
    return StepCostTable(tuple(batch_sizes), tuple(costs))
