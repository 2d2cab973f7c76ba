"""Offline API: `LLM(model_dir, ...).generate(prompts, SamplingParams(...))`."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import torch
from tqdm import tqdm

from lightllm_mtp.config.engine_args import EngineArgs
from lightllm_mtp.engine.llm_engine import LLMEngine
from lightllm_mtp.env import ENV
from lightllm_mtp.sampling_params import SamplingParams
from lightllm_mtp.spec_decode.stats import SpecStats

Prompt = str | list[int]


@dataclass(frozen=True)
class RequestOutput:
    prompt_token_ids: list[int]
    token_ids: list[int]  # generated tokens, a final stop/eos token included
    text: str  # detokenized generated tokens (special tokens skipped)
    finish_reason: str  # "stop" | "length"
    spec: SpecStats  # MTP acceptance (all zero without MTP)
    num_cached_tokens: int = 0  # prompt tokens served from the prefix cache


class LLM:
    def __init__(
        self,
        model_dir: str | Path,
        device: str | torch.device = "cpu",
        dtype: str | torch.dtype = "auto",
        max_model_len: int | None = None,
        max_batch_size: int = 8,
        max_total_token_num: int | None = None,
        chunked_prefill_size: int = 4096,
        graph_max_batch_size: int = 64,
        mtp_mode: str | None = None,
        mtp_step: int = 0,
        mtp_draft_model_dir: str | Path | None = None,
        parallel_drafting: bool = False,
        mtp_draft_vocab_file: str | Path | None = None,
        mtp_draft_vocab_size: int | None = None,
        mtp_adaptive: bool = False,
        mtp_mask_token_id: int | None = None,
        mtp_force_acceptance: str | None = None,
        disable_overlap: bool = False,
        prefill_cuda_graphs: bool = True,
        tp: int = 1,
        pp: int = 1,
        dist_timeout_s: float = 120.0,
        prefix_cache: bool = True,
        prefix_cache_interval: int = 256,
        prefix_cache_state_share: float | None = None,
        prefix_cache_host_gb: float = 0.0,
    ):
        """tp / pp > 1: this process drives tp x pp - 1 follower processes (engine/parallel/); `shutdown()` ends
        them (they also end with this process)."""
        args = EngineArgs(
            model_dir=str(model_dir),
            device=device,
            dtype=dtype,
            max_model_len=max_model_len,
            max_batch_size=max_batch_size,
            max_total_token_num=max_total_token_num,
            chunked_prefill_size=chunked_prefill_size,
            graph_max_batch_size=graph_max_batch_size,
            mtp_mode=mtp_mode,
            mtp_step=mtp_step,
            mtp_draft_model_dir=None if mtp_draft_model_dir is None else str(mtp_draft_model_dir),
            parallel_drafting=parallel_drafting,
            mtp_draft_vocab_file=None if mtp_draft_vocab_file is None else str(mtp_draft_vocab_file),
            mtp_draft_vocab_size=mtp_draft_vocab_size,
            prefill_cuda_graphs=prefill_cuda_graphs,
            mtp_adaptive=mtp_adaptive,
            mtp_mask_token_id=mtp_mask_token_id,
            mtp_force_acceptance=mtp_force_acceptance,
            disable_overlap=disable_overlap,
            tp=tp,
            pp=pp,
            dist_timeout_s=dist_timeout_s,
            prefix_cache=prefix_cache,
            prefix_cache_interval=prefix_cache_interval,
            prefix_cache_state_share=prefix_cache_state_share,
            prefix_cache_host_gb=prefix_cache_host_gb,
        )
        self.engine = LLMEngine(args)
        self.tokenizer = _load_tokenizer(model_dir)

    def shutdown(self) -> None:
        """Ends the follower ranks of a tp / pp LLM (they also end with this process)."""
        self.engine.shutdown()

    def __enter__(self) -> "LLM":
        return self

    def __exit__(self, *exc) -> None:
        self.shutdown()

    def generate(
        self,
        prompts: Prompt | Sequence[Prompt],
        sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
        use_tqdm: bool = False,
    ) -> list[RequestOutput]:
        """Prompts are strings or token-id lists; outputs come back in prompt order."""
        if isinstance(prompts, str) or (isinstance(prompts, list) and prompts and isinstance(prompts[0], int)):
            prompts = [prompts]  # one prompt
        prompt_ids = [self._encode(p) for p in prompts]
        if sampling_params is None:
            sampling_params = SamplingParams()
        params = [sampling_params] * len(prompt_ids) if isinstance(sampling_params, SamplingParams) else list(
            sampling_params
        )
        if len(params) != len(prompt_ids):
            raise ValueError(f"{len(params)} SamplingParams for {len(prompt_ids)} prompts")
        for ids, p in zip(prompt_ids, params):  # reject bad input before any request is queued
            if not isinstance(p, SamplingParams):
                raise ValueError(f"sampling_params must be SamplingParams, got {type(p).__name__}")
            self.engine.validate_request(ids, p)
        reqs = [self.engine.add_request(ids, p) for ids, p in zip(prompt_ids, params)]
        with tqdm(total=len(reqs), desc="generate", disable=not use_tqdm or ENV.disable_progress_bars) as bar:
            while self.engine.has_unfinished():
                bar.update(len(self.engine.step()))
        return [
            RequestOutput(
                prompt_token_ids=r.prompt_ids,
                token_ids=list(r.output_ids),
                text=self._decode(r.output_ids),
                finish_reason=r.finish_reason.value if r.finish_reason else "abort",
                spec=r.spec_stats,
                num_cached_tokens=r.num_cached_tokens,
            )
            for r in reqs
        ]

    def _encode(self, prompt: Prompt) -> list[int]:
        if isinstance(prompt, str):
            if self.tokenizer is None:
                raise ValueError("this model directory has no tokenizer: pass token-id lists")
            return self.tokenizer.encode(prompt, add_special_tokens=False)
        if not isinstance(prompt, (list, tuple)) or not all(isinstance(t, int) for t in prompt):
            raise ValueError(f"a prompt must be a string or a list of token ids, got {type(prompt).__name__}")
        return list(prompt)

    def _decode(self, token_ids: list[int]) -> str:
        if self.tokenizer is None:
            return ""
        return self.tokenizer.decode(token_ids, skip_special_tokens=True)


def _load_tokenizer(model_dir: str | Path):
    if not (Path(model_dir) / "tokenizer.json").is_file() and not (Path(model_dir) / "tokenizer_config.json").is_file():
        return None
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(model_dir))
