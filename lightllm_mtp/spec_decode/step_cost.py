"""The step-cost table of adaptive speculation: milliseconds of a speculative step per (batch-size bucket, drafts k),
measured at start-up by replaying the captured CUDA graphs (all rows padding), or, without graphs (CPU), counted in
rows through the forwards (the tiny CPU models are compute-bound, so rows stand in for time).

A step with blocks of k drafts costs the target's verify forward over k + 1 rows per request, the proposer's draft
pass (one window forward per MTP module) and, for eagle, k - 1 chain steps of one row per request. Each of these
attends over the requests' context, so the table also holds what one token of context adds: on the GPU timed by
replaying the graphs with the padding requests holding a long context (they share the reserved request's page-table
row, so at B > 1 they read the same KV: its reuse in the L2 cache can make the term smaller than real; at B = 1, the
long-context case, it is the real read), on the CPU the attention work of a row per context token (in rows) times
the step's rows per request."""

from __future__ import annotations

from lightllm_mtp.common.basemodel.cuda_graph import CudaGraphSet
from lightllm_mtp.config.model_config import LayerType, ModelConfig
from lightllm_mtp.spec_decode.adaptive import StepCostTable

CONTEXT_PROBE_TOKENS = 32768  # the padding requests' context when the per-context-token cost is timed


def measured_step_costs(
    verify: dict[int, CudaGraphSet], windows: list[CudaGraphSet], chain: CudaGraphSet | None, max_drafts: int,
    kv_only_window: CudaGraphSet | None = None, context: int = 0,
) -> StepCostTable:
    """verify[q]: the target's (VERIFY, q) graphs for q = 1..max_drafts+1; windows: each draft module's window-pass
    graphs; chain: the eagle chain step's (DECODE, 1) graphs, or None; kv_only_window: the window pass without logits
    that k = 0 steps run (one-module proposers), or None. context > 0: the steps are timed again with every padding
    request holding that many tokens, the difference per context token of the batch is ms_per_context_token."""
    sizes = verify[max_drafts + 1].sizes

    def costs(size: int, ctx: int) -> tuple[float, ...]:
        draft = sum(w.replay_ms(size, context=ctx) for w in windows)
        step = chain.replay_ms(size, context=ctx) if chain is not None else 0.0
        drafts = [kv_only_window.replay_ms(size, context=ctx) if kv_only_window is not None else draft]
        drafts += [draft + (k - 1) * step for k in range(1, max_drafts + 1)]
        return tuple(verify[k + 1].replay_ms(size, context=ctx) + drafts[k] for k in range(max_drafts + 1))

    rows = [costs(size, 0) for size in sizes]
    slopes = None
    if context > 0:
        slopes = tuple(
            tuple(max(0.0, (long - short) / (size * context)) for short, long in zip(row, costs(size, context)))
            for size, row in zip(sizes, rows)
        )
    return StepCostTable(tuple(sizes), tuple(rows), slopes)


def row_count_step_costs(
    batch_sizes: list[int], max_drafts: int, window_rows: int, num_modules: int, eagle_chain: bool,
    context_cost: float = 0.0,
) -> StepCostTable:
    """Rows through the forwards per step (no graphs to time); context_cost: a row's attention work per token of
    context, in rows (context_cost_per_row), so that each context token of the batch adds the step's rows per request
    times it."""
    costs, slopes = [], []
    for b in batch_sizes:
        per_request = [k + 1 + window_rows * num_modules + (max(k - 1, 0) if eagle_chain else 0)
                       for k in range(max_drafts + 1)]  # fmt: skip  (a k = 0 pass without logits: same rows)
        costs.append(tuple(float(b * rows) for rows in per_request))
        slopes.append(tuple(rows * context_cost for rows in per_request))
    return StepCostTable(tuple(batch_sizes), tuple(costs), tuple(slopes) if context_cost > 0 else None)


def context_cost_per_row(cfg: ModelConfig) -> float:
    """Attention multiply-adds of one row per token of context (q.k and p.v in every full-attention layer) over the
    multiply-adds of the row through the model (projections, GDN state update, feed-forward of the experts it uses,
    lm_head): what one context token adds to a row, in rows."""
    h, hq, hkv, d = cfg.hidden_size, cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
    full = sum(1 for t in cfg.layer_types if t is LayerType.FULL_ATTENTION)
    linear = len(cfg.layer_types) - full
    attention = h * (2 * hq * d + 2 * hkv * d) + hq * d * h
    gdn = (h * (cfg.linear_conv_dim + cfg.linear_value_dim + 2 * cfg.linear_num_value_heads) + cfg.linear_value_dim * h
           + 3 * cfg.linear_num_value_heads * cfg.linear_key_head_dim * cfg.linear_value_head_dim)  # fmt: skip
    if cfg.moe is not None:
        m = cfg.moe
        ffn = 3 * h * (m.num_experts_per_tok * m.moe_intermediate_size + m.shared_expert_intermediate_size)
        ffn += h * m.num_experts
    else:
        ffn = 3 * h * cfg.intermediate_size
    per_row = full * attention + linear * gdn + len(cfg.layer_types) * ffn + h * cfg.vocab_size
    return 2 * full * hq * d / per_row
