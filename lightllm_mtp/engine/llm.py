"""Offline API: `LLM(model_dir, ...).generate(prompts, SamplingParams(...))` and `LLM.chat(messages, ...)`, images
included (vLLM's multi_modal_data, chat image_url parts)."""

from __future__ import annotations

import difflib
import inspect
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

from tqdm import tqdm

from lightllm_mtp.chat_templates import chat_template_text
from lightllm_mtp.config.engine_args import EngineArgs
from lightllm_mtp.config.options import options_of
from lightllm_mtp.engine.detokenizer import IncrementalDetokenizer
from lightllm_mtp.engine.llm_engine import LLMEngine
from lightllm_mtp.engine.prompt_inputs import PromptInput, as_prompt_list, chat_messages, describe, from_dict
from lightllm_mtp.engine.request import Request
from lightllm_mtp.env import ENV
from lightllm_mtp.multimodal.content_parts import ImagePart
from lightllm_mtp.multimodal.image_input import ImageInput
from lightllm_mtp.multimodal.image_intake import ImageIntake
from lightllm_mtp.sampling_params import SamplingParams
from lightllm_mtp.spec_decode.stats import SpecStats


@dataclass(frozen=True)
class RequestOutput:
    prompt_token_ids: list[int]
    token_ids: list[int]  # generated tokens, a final stop/eos token included
    text: str  # detokenized generated tokens (special tokens skipped)
    finish_reason: str  # "stop" | "length" | "error" (see error)
    spec: SpecStats  # MTP acceptance (all zero without MTP)
    num_cached_tokens: int = 0  # prompt tokens served from the prefix cache
    # SamplingParams.logprobs: per token (its logprob, ((id, logprob) of the top alternatives)); None: not asked
    logprobs: list | None = None
    error: str | None = None  # finish_reason "error": why (a structured output whose grammar did not compile)


class LLM:
    """The offline engine. Keywords: every option of `EngineArgs` (docs/flags.md lists them), `model` as another
    name of `model_dir`. tp / pp > 1: this process drives tp x pp - 1 follower processes (engine/parallel/);
    `shutdown()` ends them (they also end with this process)."""

    def __init__(self, model_dir: str | Path | None = None, **options: Any):
        self.engine = LLMEngine(engine_args_from_keywords(model_dir, options))
        self.tokenizer = _load_tokenizer(self.engine.args.model_dir)
        self._image_intake: ImageIntake | None = None

    def shutdown(self) -> None:
        """Ends the follower ranks of a tp / pp LLM (they also end with this process)."""
        self.engine.shutdown()

    def __enter__(self) -> "LLM":
        return self

    def __exit__(self, *exc) -> None:
        self.shutdown()

    def generate(
        self,
        prompts: PromptInput | Sequence[PromptInput],
        sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
        use_tqdm: bool = False,
    ) -> list[RequestOutput]:
        """Prompts are strings, token-id lists or vLLM's dicts ({"prompt": str} / {"prompt_token_ids": [...]}, with
        "multi_modal_data": {"image": an image or a list}: PIL images, encoded bytes, data: URIs or local paths, the
        prompt holding one <|vision_start|><|image_pad|><|vision_end|> per image), one or a list of them; outputs
        come back in prompt order. Stop strings (SamplingParams.stop) end a text as the server's do: just before the
        stop string, which is not returned."""
        return self._generate([self._prepare(p) for p in as_prompt_list(prompts)], sampling_params, use_tqdm)

    def _generate(self, prompts: list[tuple[list[int], list[ImageInput]]],
                  sampling_params: SamplingParams | Sequence[SamplingParams] | None, use_tqdm: bool,
                  ) -> list[RequestOutput]:  # fmt: skip
        if sampling_params is None:
            sampling_params = SamplingParams()
        params = [sampling_params] * len(prompts) if isinstance(sampling_params, SamplingParams) else list(
            sampling_params
        )
        if len(params) != len(prompts):
            raise ValueError(f"{len(params)} SamplingParams for {len(prompts)} prompts")
        for (ids, images), p in zip(prompts, params):  # reject bad input before any request is queued
            if not isinstance(p, SamplingParams):
                raise TypeError(f"sampling_params must be SamplingParams, got {type(p).__name__}")
            if p.stop and self.tokenizer is None:
                raise ValueError("stop strings need a tokenizer: this model directory has none")
            self.engine.validate_request(ids, p, images)
        reqs = [self.engine.add_request(ids, p, images=images) for (ids, images), p in zip(prompts, params)]
        stops = {id(r): _StopStrings(self.tokenizer, r) for r in reqs if r.params.stop}
        with tqdm(total=len(reqs), desc="generate", disable=not use_tqdm or ENV.disable_progress_bars) as bar:
            while self.engine.has_unfinished():
                for out in self.engine.step_outputs():
                    stop = stops.get(id(out.request))
                    if stop is not None and not out.finished and stop.push(out.new_token_ids, final=False):
                        self.engine.abort(out.request)  # as the server tells its worker to
                        bar.update(1)
                    elif out.finished:
                        if stop is not None:
                            stop.push(out.new_token_ids, final=True)
                        bar.update(1)
        return [self._output(r, stops.get(id(r))) for r in reqs]

    def chat(
        self,
        messages: list[dict] | Sequence[list[dict]],
        sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
        tools: list[dict] | None = None,
        chat_template: str | None = None,
        chat_template_kwargs: dict | None = None,
        use_tqdm: bool = False,
    ) -> list[RequestOutput]:
        """One conversation (a list of OpenAI-style message dicts) or a list of them, through the chat template (the
        tokenizer's, or `chat_template`: a shipped template's name such as "qwen3_5", or a Jinja file) with `tools`
        and `chat_template_kwargs` (e.g. {"enable_thinking": False}); then `generate`. Content may be a list of parts:
        text, image_url ({"url": data: URI or file:// URL under allowed_local_media_path}) or vLLM's image_pil.
        The text is the raw answer: the server's --reasoning_parser / --tool_call_parser split it."""
        if self.tokenizer is None:
            raise ValueError("chat needs a tokenizer: this model directory has none")
        conversations = [messages] if messages and isinstance(messages[0], dict) else list(messages)
        template = chat_template_text(chat_template) if chat_template is not None else None
        prompts = []
        for conversation in conversations:
            conversation, parts = chat_messages(conversation)
            text = self.tokenizer.apply_chat_template(conversation, tools=tools, chat_template=template,
                                                      tokenize=False, add_generation_prompt=True,
                                                      **(chat_template_kwargs or {}))  # fmt: skip
            prompts.append(self._with_images(self.tokenizer.encode(text, add_special_tokens=False), parts))
        return self._generate(prompts, sampling_params, use_tqdm)

    @property
    def image_intake(self) -> ImageIntake:
        """How images are taken (built on first use: the checkpoint's image processor)."""
        if self._image_intake is None:
            self._image_intake = ImageIntake.for_engine(self.engine.args)
        return self._image_intake

    def _prepare(self, prompt: PromptInput) -> tuple[list[int], list[ImageInput]]:
        parts: list[ImagePart] = []
        if isinstance(prompt, dict):
            prompt, parts = from_dict(prompt)
        return self._with_images(self._encode(prompt), parts, bare_paths=True)

    def _with_images(self, ids: list[int], parts: list[ImagePart], bare_paths: bool = False,
                     ) -> tuple[list[int], list[ImageInput]]:  # fmt: skip
        """The prompt with its images loaded and their placeholders expanded (ImageInputError: a ValueError)."""
        if not parts:
            return ids, []
        images = self.image_intake.load(parts, bare_paths=bare_paths)
        return self.image_intake.expand(ids, images), images

    def _output(self, req: Request, stop: "_StopStrings | None") -> RequestOutput:
        token_ids, text = list(req.output_ids), None
        reason = req.finish_reason.value if req.finish_reason else "abort"
        if stop is not None:
            token_ids, text = token_ids[: stop.kept], stop.detok.text
            if stop.detok.stopped:
                reason = "stop"
        return RequestOutput(
            prompt_token_ids=req.prompt_ids,
            token_ids=token_ids,
            text=self._decode(token_ids) if text is None else text,
            finish_reason=reason,
            spec=req.spec_stats,
            num_cached_tokens=req.num_cached_tokens,
            logprobs=req.output_logprobs[: len(token_ids)] if req.params.logprobs is not None else None,
            error=req.error,
        )

    def _encode(self, prompt: str | list[int]) -> list[int]:
        if isinstance(prompt, str):
            if self.tokenizer is None:
                raise ValueError("this model directory has no tokenizer: pass token-id lists")
            return self.tokenizer.encode(prompt, add_special_tokens=False)
        if isinstance(prompt, (list, tuple)) and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
            return list(prompt)
        raise TypeError(f"a prompt must be a str, a list of token ids or a dict with 'prompt' / 'prompt_token_ids', "
                        f"got {describe(prompt)}")

    def _decode(self, token_ids: list[int]) -> str:
        if self.tokenizer is None:
            return ""
        return self.tokenizer.decode(token_ids, skip_special_tokens=True)


class _StopStrings:
    """One request's stop strings, matched on its text as the server matches them (engine/detokenizer.py)."""

    def __init__(self, tokenizer, req: Request):
        p = req.params
        self.detok = IncrementalDetokenizer(tokenizer, req.prompt_ids, p.stop, p.include_stop_str_in_output, p.min_tokens)
        self.kept = 0  # output tokens up to the one completing a stop string

    def push(self, tokens: list[int], final: bool) -> bool:
        """Adds a step's tokens; True when a stop string ended the text."""
        was_stopped = self.detok.stopped
        self.detok.push(tokens, final)
        if not was_stopped:
            self.kept += self.detok.used
        return self.detok.stopped


def _load_tokenizer(model_dir: str | Path):
    if not (Path(model_dir) / "tokenizer.json").is_file() and not (Path(model_dir) / "tokenizer_config.json").is_file():
        return None
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(model_dir))


def engine_args_from_keywords(model_dir: str | Path | None, options: dict[str, Any]) -> EngineArgs:
    """`LLM(...)`'s keywords -> EngineArgs: `model=` is `model_dir=`; a keyword that is no option is a TypeError
    naming the closest option."""
    names = [opt.name for opt in options_of(EngineArgs)]
    options = dict(options)
    if "model" in options:
        if model_dir is not None or "model_dir" in options:
            raise TypeError("LLM() got both model and model_dir: give one")
        model_dir = options.pop("model")
    if "model_dir" in options:
        if model_dir is not None:
            raise TypeError("LLM() got model_dir twice")
        model_dir = options.pop("model_dir")
    if model_dir is None:
        raise TypeError("LLM() needs a model directory: LLM(model_dir) or LLM(model=...)")
    unknown = [k for k in options if k not in names]
    if unknown:
        close = difflib.get_close_matches(unknown[0], names, n=1)
        hint = f"; did you mean {close[0]!r}?" if close else " (the options are listed in docs/flags.md)"
        raise TypeError(f"LLM() got an unexpected keyword argument {unknown[0]!r}{hint}")
    return EngineArgs(model_dir=str(model_dir), **options)


def _signature() -> inspect.Signature:
    """LLM.__init__'s signature as help() and editors show it: the EngineArgs options with their defaults."""
    params = [inspect.Parameter("self", inspect.Parameter.POSITIONAL_OR_KEYWORD)]
    for opt in options_of(EngineArgs):
        default = None if opt.required else opt.default
        kind = inspect.Parameter.POSITIONAL_OR_KEYWORD if opt.name == "model_dir" else inspect.Parameter.KEYWORD_ONLY
        params.append(inspect.Parameter(opt.name, kind, default=default))
    params.insert(2, inspect.Parameter("model", inspect.Parameter.KEYWORD_ONLY, default=None))
    return inspect.Signature(params)


LLM.__init__.__signature__ = _signature()
