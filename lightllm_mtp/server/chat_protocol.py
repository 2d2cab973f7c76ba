"""The chat completions request (/v1/chat/completions): messages (text and image content parts, tool calls and tool
turns), tools and tool_choice, chat_template_kwargs; the sampling fields are protocol.py's SamplingRequest."""

from __future__ import annotations

import json
from typing import Annotated, Literal

from pydantic import BaseModel, Field, field_validator, model_validator

from lightllm_mtp.multimodal.content_parts import ImagePart, content_part
from lightllm_mtp.sampling_params import MAX_TOP_LOGPROBS
from lightllm_mtp.server.protocol import FIRST_ERROR, STRICT, Objects, SamplingRequest
from lightllm_mtp.server.request_fields import CHAT, UnsupportedField


class ContentPart(BaseModel):
    """text, image_url ({"url", "detail"} or a URL string) or image (a URL string; vLLM / SGLang); other types are
    refused by name (multimodal/content_parts.py)."""

    model_config = STRICT
    type: str
    text: str | None = None
    image_url: dict | str | None = None
    image: str | None = None

    def part(self) -> str | ImagePart:
        return content_part(self.model_dump(exclude_none=True))


class ChatMessage(BaseModel):
    model_config = STRICT
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | Annotated[list[ContentPart], FIRST_ERROR] | None = None
    tool_calls: Objects | None = None  # an assistant turn's calls (rendered by the chat template)
    tool_call_id: str | None = None  # a tool turn's answer to that call
    name: str | None = None
    reasoning_content: str | None = None  # an assistant turn's reasoning (vLLM; `reasoning` too)
    reasoning: str | None = None

    @field_validator("content", mode="before")
    @classmethod
    def _content_parts(cls, v):
        """Each part checked as it is (one error naming it, not one per member of the content union)."""
        if isinstance(v, list):
            for i, part in enumerate(v):
                try:
                    content_part(part)
                except ValueError as e:
                    raise ValueError(f"content part {i}: {e}") from None
        return v

    def template_fields(self, content: str | list[dict]) -> dict:
        """The message as the chat template reads it: tool-call arguments as objects (sent as JSON text)."""
        out = {"role": self.role, "content": content}
        if self.tool_calls:
            out["tool_calls"] = [_call_for_template(c) for c in self.tool_calls]
        for key in ("tool_call_id", "name"):
            if getattr(self, key) is not None:
                out[key] = getattr(self, key)
        if self.reasoning_content or self.reasoning:
            out["reasoning_content"] = self.reasoning_content or self.reasoning
        return out

    def parts(self) -> list[str | ImagePart]:
        """The content's texts and images, in order."""
        if self.content is None or isinstance(self.content, str):
            return [self.content or ""]
        return [p.part() for p in self.content]


def _call_for_template(call: dict) -> dict:
    fn = dict(call.get("function") or {})
    if isinstance(fn.get("arguments"), str):
        try:
            fn["arguments"] = json.loads(fn["arguments"])
        except json.JSONDecodeError:
            raise ValueError(f"tool call {fn.get('name')!r}: arguments are not JSON") from None
    return {**call, "function": fn}


class ChatCompletionRequest(SamplingRequest):
    ENDPOINT = CHAT
    messages: list[ChatMessage] = Field(min_length=1, fail_fast=True)
    max_completion_tokens: int | None = None
    logprobs: bool = False
    top_logprobs: int | None = None  # with logprobs: alternatives per token
    tools: Objects | None = None  # [{"type": "function", "function": {"name", "description", "parameters"}}]
    tool_choice: str | dict | None = None  # none / auto (default with tools) / required / {"type": "function", ..}
    parallel_tool_calls: bool = True  # false: at most one call
    chat_template_kwargs: dict | None = None  # e.g. {"enable_thinking": false}

    def image_parts(self) -> list[ImagePart]:
        """Every image of the conversation, in message order (the order the chat template renders them)."""
        return [p for m in self.messages for p in m.parts() if isinstance(p, ImagePart)]

    @field_validator("tools")
    @classmethod
    def _tools(cls, v):
        for t in v or []:
            fn = t.get("function") if t.get("type") == "function" else None
            if not isinstance(fn, dict) or not isinstance(fn.get("name"), str) or not fn["name"]:
                raise ValueError("each tool must be {\"type\": \"function\", \"function\": {\"name\": ...}}")
            if not isinstance(fn.get("parameters", {}), dict):
                raise ValueError(f"tool {fn['name']}: parameters must be a JSON schema object")
        return v

    @field_validator("chat_template_kwargs")
    @classmethod
    def _template_kwargs(cls, v):
        reserved = {"messages", "tools", "add_generation_prompt", "tokenize", "chat_template"} & set(v or {})
        if reserved:
            raise ValueError(f"{sorted(reserved)} are set by the server, not by chat_template_kwargs")
        return v

    @model_validator(mode="after")
    def _tool_choice(self):
        choice, names = self.tool_choice, [t["function"]["name"] for t in self.tools or []]
        if isinstance(choice, dict):
            name = (choice.get("function") or {}).get("name") if choice.get("type") == "function" else None
            if name not in names:
                raise UnsupportedField("tool_choice", None, f"tool_choice names {name!r}, not one of the tools")
        elif choice not in (None, "none", "auto", "required"):
            raise UnsupportedField("tool_choice", None, "tool_choice must be none, auto, required or a function")
        elif choice == "required" and not names:
            raise UnsupportedField("tool_choice", None, "tool_choice required needs tools")
        return self

    @property
    def tool_choice_mode(self) -> str:
        """none / auto / required / named (a dict tool_choice)."""
        if isinstance(self.tool_choice, dict):
            return "named"
        return self.tool_choice or ("auto" if self.tools else "none")

    @property
    def named_tool(self) -> str | None:
        return self.tool_choice["function"]["name"] if isinstance(self.tool_choice, dict) else None

    @field_validator("top_logprobs")
    @classmethod
    def _top_logprobs(cls, v):
        if v is not None and not 0 <= v <= MAX_TOP_LOGPROBS:
            raise ValueError(f"must be in [0, {MAX_TOP_LOGPROBS}], got {v}")
        return v

    @model_validator(mode="after")
    def _top_logprobs_need_logprobs(self):
        if self.top_logprobs and not self.logprobs:
            raise UnsupportedField("top_logprobs", None, "top_logprobs needs logprobs: true")
        return self

    @property
    def num_logprobs(self) -> int | None:
        return (self.top_logprobs or 0) if self.logprobs else None

    @field_validator("max_completion_tokens")
    @classmethod
    def _max_completion_tokens(cls, v):
        return cls._max_tokens(v)

    @property
    def max_new_tokens(self) -> int | None:
        return self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens
