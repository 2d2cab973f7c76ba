"""LightLLM's /generate and /generate_stream request: {"inputs": str, "parameters": {...}}, strictly typed like the
OpenAI schemas in protocol.py (same error bodies through `parse_body`)."""

from __future__ import annotations

import math

from pydantic import BaseModel, Field, field_validator

from lightllm_mtp.sampling_params import SamplingParams
from lightllm_mtp.server.protocol import STRICT, Strings, check_cache_salt, check_seed, check_stop


class GenerateParameters(BaseModel):
    """LightLLM's /generate "parameters" (do_sample false: greedy)."""

    model_config = STRICT
    do_sample: bool = False
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    max_new_tokens: int = 16
    stop_sequences: str | Strings | None = None
    ignore_eos: bool = False
    seed: int | None = None
    cache_salt: str | None = None  # the prefix cache is shared only between requests of the same salt

    @field_validator("stop_sequences")
    @classmethod
    def _stop(cls, v):
        return check_stop(v)

    @field_validator("temperature")
    @classmethod
    def _temperature(cls, v):  # checked even with do_sample false, which ignores it
        if not math.isfinite(v) or v < 0:
            raise ValueError(f"must be a finite number >= 0, got {v}")
        return v

    @field_validator("seed")
    @classmethod
    def _seed(cls, v):
        return check_seed(v)

    @field_validator("cache_salt")
    @classmethod
    def _cache_salt(cls, v):
        return check_cache_salt(v)

    def sampling_params(self, max_new_tokens: int | None = None) -> SamplingParams:
        """max_new_tokens: the budget granted (default: the one asked)."""
        return SamplingParams(
            temperature=self.temperature if self.do_sample else 0.0,
            top_p=self.top_p,
            top_k=self.top_k,
            max_new_tokens=self.max_new_tokens if max_new_tokens is None else max_new_tokens,
            seed=self.seed,
            ignore_eos=self.ignore_eos,
            cache_salt=self.cache_salt,
        )

    @property
    def asked_max_new_tokens(self) -> int | None:
        """max_new_tokens when the request set it (an explicit budget that does not fit is an error)."""
        return self.max_new_tokens if "max_new_tokens" in self.model_fields_set else None

    @property
    def stop_strings(self) -> tuple[str, ...]:
        return (self.stop_sequences,) if isinstance(self.stop_sequences, str) else tuple(self.stop_sequences or ())


class GenerateRequest(BaseModel):
    model_config = STRICT
    inputs: str = Field(min_length=1)
    parameters: GenerateParameters = Field(default_factory=GenerateParameters)
    multimodal_params: dict | None = None  # LightLLM's images: refused (this server takes them in chat messages)

    @field_validator("multimodal_params")
    @classmethod
    def _multimodal_params(cls, v):
        if v and any(v.values()):
            raise ValueError("images are not taken by /generate: send them as image_url parts to "
                             "/v1/chat/completions")  # fmt: skip
        return v
