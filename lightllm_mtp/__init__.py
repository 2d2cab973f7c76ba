"""lightllm_mtp: a LightLLM-style inference engine for Qwen3.5 (dense and MoE) with MTP speculative decoding."""

from lightllm_mtp.engine.llm import LLM, RequestOutput
from lightllm_mtp.sampling_params import SamplingParams

__all__ = ["LLM", "RequestOutput", "SamplingParams"]
__version__ = "0.1.0"
