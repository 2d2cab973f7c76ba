"""One workload for every layout: mixed prompt lengths (one longer than the prefill chunk), more requests than
request slots, a stop token, an abort mid-generation; greedy. Deterministic scheduling, so any two layouts run
the same steps."""

from lightllm_mtp.config.engine_args import EngineArgs
from lightllm_mtp.engine.llm_engine import LLMEngine
from lightllm_mtp.sampling_params import SamplingParams

from unit_tests.trained_fixtures import DENSE, MOE
from unit_tests.trained_fixtures import MTP3_PTD as MTP3

PROMPTS = [
    [785, 1156, 315, 264, 1140, 374, 25, 198, 262, 707],
    list(range(300, 370)),  # longer than chunked_prefill_size: chunked prefill
    [2, 3],
    [1024, 17, 9, 310, 311, 258],
    [498, 2838, 822, 25, 220, 316, 537, 306, 745, 678, 198, 745, 678],
]
PARAMS = [
    SamplingParams(temperature=0, max_new_tokens=30),  # aborted after a few steps
    SamplingParams(temperature=0, max_new_tokens=10),
    SamplingParams(temperature=0, max_new_tokens=16, stop_token_ids=[198]),  # "\n": these fixtures emit it often
    SamplingParams(temperature=0, max_new_tokens=14),
    SamplingParams(temperature=0, max_new_tokens=12, stop_token_ids=[198, 25]),
]
ABORT_AT_STEP, ABORTED = 5, 0


def engine(model_dir, mtp: dict, **kwargs) -> LLMEngine:
    kwargs.setdefault("dist_timeout_s", 30)
    kwargs.setdefault("prefix_cache", False)  # on in test_prefix_cache_parallel.py
    kwargs.setdefault("chunked_prefill_size", 32)
    return LLMEngine(EngineArgs(model_dir=str(model_dir), max_model_len=128, max_batch_size=3, **mtp, **kwargs))


def run(eng: LLMEngine, stop_after: int | None = None) -> list[tuple[list[int], str | None]]:
    """(tokens, finish reason) per request; stop_after: leave the loop after that many steps (state tests)."""
    reqs = [eng.add_request(p, sp) for p, sp in zip(PROMPTS, PARAMS)]
    steps = 0
    while eng.has_unfinished() and (stop_after is None or steps < stop_after):
        eng.step_outputs()
        steps += 1
        if steps == ABORT_AT_STEP:
            eng.abort(reqs[ABORTED])
    return [(list(r.output_ids), r.finish_reason.value if r.finish_reason else None) for r in reqs]


def count_launch_ahead(eng: LLMEngine) -> list[int]:
    """[launches queued before the previous step was read], counted as the engine runs."""
    calls = [0]
    inner = eng.runner.launch

    def counted(scheduled, after=None):
        calls[0] += after is not None
        return inner(scheduled, after)

    eng.runner.launch = counted
    return calls
