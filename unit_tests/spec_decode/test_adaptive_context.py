"""Adaptive k at long context: the step-cost table's per-context-token term (timed from the graphs on the GPU, rows x
a row's attention share on the CPU), the controller's k falling as context grows when the cost says so (and not when
it does not), and the engine passing each launch's context to the controller."""

import pytest

from benchmark.model_shapes import MODEL_SHAPES
from lightllm_mtp import LLM
from lightllm_mtp.config.model_config import ModelConfig
from lightllm_mtp.spec_decode.adaptive import AcceptanceEstimate, SpecLengthController, StepCostTable
from lightllm_mtp.spec_decode.step_cost import context_cost_per_row, measured_step_costs, row_count_step_costs
from unit_tests.spec_decode.test_adaptive import H100_LIKE, K
from unit_tests.spec_decode.test_greedy_equivalence import MAX_NEW, PROMPTS, greedy

DECODE_MS_PER_TOKEN = 16 * 2 * 4 * 256 * 2 / 4.8e12 * 1e3  # 27B: 64 KB of bf16 KV per token at ~4.8 TB/s, in ms
DRAFT_MS_PER_TOKEN = DECODE_MS_PER_TOKEN / 16  # the MTP layer's own KV: one layer of sixteen


def with_slopes(table: StepCostTable, per_k) -> StepCostTable:
    return StepCostTable(table.batch_sizes, table.cost_ms, tuple(tuple(per_k(k) for k in range(K + 1))
                                                                 for _ in table.batch_sizes))  # fmt: skip


# a verify kernel that reads the KV once per row (others' stacks): each of the k + 1 rows pays the whole context
PER_ROW_READS = with_slopes(H100_LIKE, lambda k: (k + 1) * DECODE_MS_PER_TOKEN + max(k, 1) * DRAFT_MS_PER_TOKEN)
# ours: the verify block reads each KV page once for its k + 1 rows; the drafts' passes read the MTP layer's KV
PAGE_ONCE = with_slopes(H100_LIKE, lambda k: DECODE_MS_PER_TOKEN + max(k, 1) * DRAFT_MS_PER_TOKEN)


def steady_choice(costs: StepCostTable, rates: list[float], context: int) -> int:
    """The controller's pick for one request whose estimate has settled on `rates`."""
    req = AcceptanceEstimate(reached=[10.0] * K, accepted=[10.0 * a for a in rates])
    return SpecLengthController(costs).best([req], context_tokens=context)


def test_table_row_adds_the_context_cost_and_is_validated():
    assert PER_ROW_READS.row(1, 0) == H100_LIKE.row(1)
    row = PER_ROW_READS.row(1, 1000)
    assert row[2] == pytest.approx(H100_LIKE.row(1)[2] + 1000 * (3 * DECODE_MS_PER_TOKEN + 2 * DRAFT_MS_PER_TOKEN))
    with pytest.raises(ValueError, match="ms_per_context_token"):
        StepCostTable((1,), ((1.0, 2.0),), ((0.1,),))
    with pytest.raises(ValueError, match="ms_per_context_token"):
        StepCostTable((1,), ((1.0, 2.0),), ((0.1, -0.1),))


@pytest.mark.parametrize("rates", [[0.8] * K, [0.9, 0.8, 0.7, 0.6, 0.5]], ids=["a80", "decaying"])
def test_k_drops_as_context_grows_when_each_row_reads_the_kv(rates):
    chosen = [steady_choice(PER_ROW_READS, rates, c) for c in (0, 32768, 262144, 1 << 20)]
    assert chosen[0] >= 4 and chosen == sorted(chosen, reverse=True), chosen
    assert chosen[2] < chosen[0] and chosen[-1] <= chosen[0] - 2, chosen


def test_k_holds_when_the_verify_reads_each_page_once():
    rates = [0.8] * K
    short, long = steady_choice(PAGE_ONCE, rates, 0), steady_choice(PAGE_ONCE, rates, 1 << 20)
    assert long >= short >= 3  # the drafts' fixed cost weighs less next to a long context's KV read


class FakeGraphs:
    """A graph set whose replay takes base + per_row x rows + slope x (size x context) ms."""

    def __init__(self, q: int, base: float, slope: float, sizes=(1, 4)):
        self.q, self.base, self.slope, self.sizes = q, base, slope, list(sizes)

    def replay_ms(self, size: int, iters: int = 10, context: int = 0) -> float:
        return self.base + 0.01 * size * self.q + self.slope * size * context


def test_measured_costs_recover_the_per_context_token_slope():
    verify = {q: FakeGraphs(q, 10.0, 1e-4 * q) for q in range(1, 4)}
    window, chain = FakeGraphs(4, 1.0, 1e-5), FakeGraphs(1, 0.5, 1e-5)
    table = measured_step_costs(verify, [window], chain, 2, kv_only_window=None, context=8192)
    for b, slopes in zip(table.batch_sizes, table.ms_per_context_token):
        assert slopes == pytest.approx((1e-4 + 1e-5, 2e-4 + 1e-5, 3e-4 + 2e-5))
    assert measured_step_costs(verify, [window], chain, 2).ms_per_context_token is None


def test_row_count_model_scales_rows_by_the_attention_share(tiny_dense_dir):
    cfg = ModelConfig.from_model_dir(tiny_dense_dir)
    share = context_cost_per_row(cfg)
    table = row_count_step_costs([1, 4], 3, window_rows=4, num_modules=1, eagle_chain=True, context_cost=share)
    for b, costs, slopes in zip(table.batch_sizes, table.cost_ms, table.ms_per_context_token):
        assert slopes == pytest.approx(tuple(c / b * share for c in costs))  # rows per request x the share
    published = ModelConfig.from_hf(MODEL_SHAPES["qwen3.5-27b"])
    assert 2e-6 < context_cost_per_row(published) < 2e-5  # 27B: at 1M tokens a row's attention ~ 7 rows' work


def test_engine_passes_each_launch_context_to_the_controller(tiny_dense_mtp3_dir):
    llm = LLM(tiny_dense_mtp3_dir, max_model_len=64, mtp_mode="eagle_with_att", mtp_step=3, mtp_adaptive=True)
    controller = llm.engine.spec_controller
    assert controller.costs.ms_per_context_token is not None
    seen = []
    choose = controller.choose
    controller.choose = lambda reqs, context_tokens=0: seen.append((len(reqs), context_tokens)) or choose(
        reqs, context_tokens)  # fmt: skip
    outs = llm.generate(PROMPTS, [greedy(n) for n in MAX_NEW])
    assert [o.token_ids for o in outs] == [o.token_ids for o in LLM(tiny_dense_mtp3_dir, max_model_len=64).generate(
        PROMPTS, [greedy(n) for n in MAX_NEW])]  # fmt: skip
    total = sum(len(p) for p in PROMPTS)
    assert seen[0] == (3, total)  # the first launch: the three prompts
    assert max(c for _, c in seen) > total and all(c >= b for b, c in seen)
