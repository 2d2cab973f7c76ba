"""The Responses API request (/v1/responses) and the chat conversation it becomes.

`input` is a string or a list of items: messages (text parts), `function_call` items (an earlier answer's calls),
`function_call_output` items (their results, rendered as tool turns) and `reasoning` items (an earlier answer's
reasoning, rendered as the reasoning of the assistant turn after it). Function `tools`, `tool_choice` and
`parallel_tool_calls` become the chat request's, so the chat template, the tool_choice grammar and the parsers are
the chat endpoint's. Other item and tool types are a 400 naming them.
"""

from __future__ import annotations

from typing import Annotated, Literal, Union

from pydantic import (
    BaseModel,
    Discriminator,
    Field,
    PrivateAttr,
    Tag,
    ValidationError,
    field_validator,
    model_validator,
)

from lightllm_mtp.server.chat_protocol import ChatCompletionRequest
from lightllm_mtp.server.protocol import FIRST_ERROR, STRICT, Objects, SamplingRequest
from lightllm_mtp.server.request_fields import RESPONSES, UnsupportedField

INPUT_ITEMS = ("message", "function_call", "function_call_output", "reasoning")


class InputPart(BaseModel):
    """Text, or an image: {"type": "input_image", "image_url": "data:image/...;base64,...", "detail": "auto"}."""

    model_config = STRICT
    type: Literal["input_text", "output_text", "text", "input_image"]
    text: str | None = None
    image_url: str | None = None
    detail: Literal["auto", "low", "high"] = "auto"
    file_id: str | None = None

    @model_validator(mode="after")
    def _complete(self):
        if self.type == "input_image":
            if self.file_id is not None:
                raise ValueError("input_image file_id is not supported (nothing is stored): send image_url as a "
                                 "data: URI")  # fmt: skip
            if self.image_url is None:
                raise ValueError("an input_image part needs image_url (a data: URI)")
        elif self.text is None:
            raise ValueError(f"a {self.type} part needs text")
        return self

    def as_chat_part(self) -> dict:
        if self.type == "input_image":
            return {"type": "image_url", "image_url": {"url": self.image_url, "detail": self.detail}}
        return {"type": "text", "text": self.text}


Parts = Annotated[list[InputPart], FIRST_ERROR]


def _text(content: str | list[InputPart]) -> str:
    """Text-only content (assistant turns, tool outputs): an image there is refused."""
    if isinstance(content, str):
        return content
    if any(p.type == "input_image" for p in content):
        raise ValueError("input_image parts are taken in user / system messages only")
    return "".join(p.text for p in content)


def _content(content: str | list[InputPart]) -> str | list[dict]:
    """A user / system message's content: its text, or chat content parts when it holds an image."""
    if isinstance(content, str) or all(p.type != "input_image" for p in content):
        return _text(content)
    return [p.as_chat_part() for p in content]


class MessageItem(BaseModel):
    model_config = STRICT
    type: Literal["message"] = "message"
    role: Literal["system", "developer", "user", "assistant"]
    content: str | Parts


class FunctionCallItem(BaseModel):
    model_config = STRICT
    type: Literal["function_call"]
    call_id: str
    name: str
    arguments: str  # JSON text


class FunctionCallOutputItem(BaseModel):
    model_config = STRICT
    type: Literal["function_call_output"]
    call_id: str
    output: str | Parts


class ReasoningPart(BaseModel):
    model_config = STRICT
    type: Literal["reasoning_text", "summary_text"]
    text: str


class ReasoningItem(BaseModel):
    model_config = STRICT
    type: Literal["reasoning"]
    content: Annotated[list[ReasoningPart], FIRST_ERROR] | None = None
    summary: Annotated[list[ReasoningPart], FIRST_ERROR] = []
    encrypted_content: None = None  # this server returns its reasoning as text, never encrypted

    def text(self) -> str:
        return "".join(p.text for p in (self.content if self.content else self.summary))


InputItem = Annotated[
    Union[Annotated[MessageItem, Tag("message")], Annotated[FunctionCallItem, Tag("function_call")],
          Annotated[FunctionCallOutputItem, Tag("function_call_output")], Annotated[ReasoningItem, Tag("reasoning")]],
    Discriminator(lambda v: v.get("type", "message") if isinstance(v, dict) else getattr(v, "type", None)),
]  # fmt: skip


class ResponsesRequest(SamplingRequest):
    ENDPOINT = RESPONSES
    input: str | Annotated[list[InputItem], FIRST_ERROR] = Field(min_length=1)
    instructions: str | None = None
    max_output_tokens: int | None = None
    text: dict | None = None  # {"format": {"type": "text" | "json_object" | "json_schema", ...}}
    tools: Objects | None = None  # [{"type": "function", "name", "description", "parameters"}]
    tool_choice: str | dict | None = None  # none / auto / required / {"type": "function", "name": ...}
    parallel_tool_calls: bool = True
    reasoning: dict | None = None  # {"effort": "none"}: thinking off
    chat_template_kwargs: dict | None = None  # extension (vLLM's chat field), e.g. {"enable_thinking": false}
    _chat: ChatCompletionRequest | None = PrivateAttr(None)

    @field_validator("input", mode="before")
    @classmethod
    def _item_types(cls, v):
        for item in v if isinstance(v, list) else []:
            kind = item.get("type", "message") if isinstance(item, dict) else None
            if kind not in INPUT_ITEMS:
                raise ValueError(f"input items of type {kind!r} are not supported (only {', '.join(INPUT_ITEMS)})")
        return v

    @field_validator("max_output_tokens")
    @classmethod
    def _max_output_tokens(cls, v):
        return cls._max_tokens(v)

    @field_validator("text")
    @classmethod
    def _text_keys(cls, v):
        if v and v.get("verbosity") is not None:
            raise UnsupportedField("text", None, "text.verbosity is not supported by this server")
        return v

    @model_validator(mode="after")
    def _as_chat(self):
        data = {"messages": self.chat_messages(), "parallel_tool_calls": self.parallel_tool_calls}
        if self.tools:
            data["tools"] = [_chat_tool(t) for t in self.tools]
        if self.tool_choice is not None:
            data["tool_choice"] = _chat_tool_choice(self.tool_choice)
        kwargs = dict(self.chat_template_kwargs or {})
        if self.reasoning is not None:
            kwargs = _reasoning_kwargs(self.reasoning, kwargs)
        if kwargs:
            data["chat_template_kwargs"] = kwargs
        try:
            self._chat = ChatCompletionRequest.model_validate(data)
        except ValidationError as e:
            err = e.errors()[0]
            key = {"messages": "input"}.get(str(err["loc"][0]) if err["loc"] else "", "input")
            raise UnsupportedField(key, None, f"{key}: {err['msg'].removeprefix('Value error, ')}") from None
        self._chat._structured = self._structured  # `text.format` (the chat request has no structured field set)
        return self

    @property
    def chat(self) -> ChatCompletionRequest:
        """The conversation as a chat request (messages, tools, tool_choice, template kwargs, structured output)."""
        return self._chat

    def chat_messages(self) -> list[dict]:
        messages = [{"role": "system", "content": self.instructions}] if self.instructions else []
        if isinstance(self.input, str):
            return messages + [{"role": "user", "content": self.input}]
        reasoning = None  # a reasoning item's text, for the assistant turn after it

        def assistant_turn() -> dict:
            nonlocal reasoning
            turn = {"role": "assistant", "content": None}
            if reasoning is not None:
                turn["reasoning_content"], reasoning = reasoning, None
            messages.append(turn)
            return turn

        for item in self.input:
            if isinstance(item, MessageItem) and item.role == "assistant":
                assistant_turn()["content"] = _text(item.content)
            elif isinstance(item, MessageItem):  # the chat templates read developer as system
                role = {"developer": "system"}.get(item.role, item.role)
                messages.append({"role": role, "content": _content(item.content)})
            elif isinstance(item, FunctionCallItem):  # one assistant turn holds its text and the calls after it
                last = messages[-1] if messages else {}
                turn = last if last.get("role") == "assistant" and reasoning is None else assistant_turn()
                function = {"name": item.name, "arguments": item.arguments}
                turn.setdefault("tool_calls", []).append({"id": item.call_id, "type": "function", "function": function})
            elif isinstance(item, FunctionCallOutputItem):
                messages.append({"role": "tool", "tool_call_id": item.call_id, "content": _text(item.output)})
            else:
                reasoning = (reasoning or "") + item.text()
        if reasoning is not None:  # the last answer was reasoning only
            assistant_turn()
        return messages


def _chat_tool(tool: dict) -> dict:
    if tool.get("type") != "function":
        raise UnsupportedField("tools", None, f"tools: only function tools are supported, not {tool.get('type')!r}")
    fn = {k: tool[k] for k in ("name", "description", "parameters") if tool.get(k) is not None}
    return {"type": "function", "function": fn}


def _chat_tool_choice(choice: str | dict) -> str | dict:
    if isinstance(choice, dict):
        if choice.get("type") != "function":
            raise UnsupportedField("tool_choice", None, f"tool_choice of type {choice.get('type')!r} is not supported "
                                   "(none, auto, required or {\"type\": \"function\", \"name\": ...})")  # fmt: skip
        return {"type": "function", "function": {"name": choice.get("name")}}
    return choice


def _reasoning_kwargs(reasoning: dict, kwargs: dict) -> dict:
    """`reasoning`: effort "none" turns thinking off (Qwen3.5 has no effort levels); anything else is a 400."""
    extra = sorted(k for k, v in reasoning.items() if k != "effort" and v is not None)
    if extra:
        raise UnsupportedField("reasoning", None, f"reasoning.{extra[0]} is not supported by this server")
    effort = reasoning.get("effort")
    if effort is None:
        return kwargs
    if effort != "none":
        raise UnsupportedField("reasoning", None, f"reasoning.effort {effort!r}: this model has no effort levels; "
                               "give none (thinking off) or leave it out (the chat template's default)")  # fmt: skip
    if kwargs.get("enable_thinking", False) is not False:
        raise UnsupportedField("reasoning", None, "reasoning.effort none and chat_template_kwargs enable_thinking "
                               "true contradict each other")  # fmt: skip
    return {**kwargs, "enable_thinking": False}
