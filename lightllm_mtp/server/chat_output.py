"""What a chat answer becomes: reasoning_content, content and tool_calls, the same code for whole answers and for
streams (reasoning.py, then tool_calls.py on the content), so streamed deltas reassemble to the non-streaming
message whatever the deltas' sizes (MTP steps of 1..k+1 tokens).

`plan_chat` decides per request, against the server's --reasoning_parser / --tool_call_parser /
--enable_auto_tool_choice: whether the answer starts inside reasoning (the prompt opened a think block), whether
tool calls are parsed, and the grammar the engine enforces (the request's structured output, or the tool_choice
grammar for "required" and a named function), applied only after the reasoning ends.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from lightllm_mtp.sampling.grammar import GATED_LEADING_WHITESPACE
from lightllm_mtp.sampling_params import StructuredOutput
from lightllm_mtp.server.chat_protocol import ChatCompletionRequest
from lightllm_mtp.server.protocol import ApiError
from lightllm_mtp.server.reasoning import THINK_END, ReasoningSplitter, opens_reasoning
from lightllm_mtp.server.tool_calls import ToolCallStream, tool_choice_grammar


@dataclass(frozen=True)
class ChatOptions:
    reasoning_parser: str | None = None
    tool_call_parser: str | None = None
    enable_auto_tool_choice: bool = False


@dataclass(frozen=True)
class ChatPlan:
    in_reasoning: bool | None  # None: no reasoning parser (everything is content)
    parse_tools: bool
    structured: StructuredOutput | None

    @property
    def tool_call_ends_reasoning(self) -> bool:
        """Whether a tool call opened before `</think>` ends the reasoning (server/reasoning.py): not when the answer
        is a grammar's that applies from `</think>` only (a call before it is unconstrained reasoning text)."""
        return self.structured is None or not self.structured.starts_after

    @property
    def content_lead(self) -> str:
        """What is dropped before the content: the newlines Qwen writes after `</think>`; under a grammar gated on
        `</think>` every whitespace character its leading part allows (sampling/grammar.py), so that the content is
        exactly the grammar's text (a regex or choice answer matches whole)."""
        return GATED_LEADING_WHITESPACE if self.structured is not None and self.structured.starts_after else "\n"


def plan_chat(req: ChatCompletionRequest, opts: ChatOptions, prompt_text: str) -> ChatPlan:
    mode = req.tool_choice_mode
    if mode == "auto" and not (opts.enable_auto_tool_choice and opts.tool_call_parser):
        raise ApiError(400, "tool_choice auto (the default with tools) needs the server's --enable_auto_tool_choice and "
                       "--tool_call_parser; send tool_choice none to render the tools only", param="tool_choice")
    if mode in ("required", "named") and not opts.tool_call_parser:
        raise ApiError(400, f"tool_choice {mode} needs the server's --tool_call_parser", param="tool_choice")
    structured = req.structured
    if mode in ("required", "named"):
        if structured is not None:
            raise ApiError(400, "tool_choice required / a named function and a structured output both constrain "
                           "the answer: give one", param="tool_choice")  # fmt: skip
        grammar = tool_choice_grammar(req.tools, req.named_tool, req.parallel_tool_calls)
        structured = StructuredOutput("grammar", grammar)
    in_reasoning = opens_reasoning(prompt_text) if opts.reasoning_parser else None
    if structured is not None and in_reasoning:
        structured = dataclasses.replace(structured, starts_after=THINK_END)
    return ChatPlan(in_reasoning, mode != "none" and opts.tool_call_parser is not None, structured)


class ChatAssembler:
    """One choice's answer, delta by delta."""

    def __init__(self, plan: ChatPlan, req: ChatCompletionRequest):
        self.reasoning = None
        if plan.in_reasoning is not None:
            self.reasoning = ReasoningSplitter(plan.in_reasoning, plan.tool_call_ends_reasoning, plan.content_lead)
        self.tools = ToolCallStream(req.tools, req.parallel_tool_calls) if plan.parse_tools else None
        self.num_calls = 0

    def push(self, text: str, final: bool) -> tuple[str, str, list[dict]]:
        """(reasoning delta, content delta, tool calls completed)."""
        reasoning, pieces = self.push_pieces(text, final)
        return reasoning, "".join(p for p in pieces if isinstance(p, str)), [p for p in pieces if isinstance(p, dict)]

    def push_pieces(self, text: str, final: bool) -> tuple[str, list[str | dict]]:
        """(reasoning delta, what follows it in answer order: content text (str) and completed tool calls (dict))."""
        reasoning, content = self.reasoning.push(text, final) if self.reasoning is not None else ("", text)
        if self.tools is None:
            return reasoning, [content] if content else []
        pieces = self.tools.push_pieces(content, final)
        self.num_calls += sum(isinstance(p, dict) for p in pieces)
        return reasoning, pieces

    def finish_reason(self, reason: str | None) -> str | None:
        return "tool_calls" if reason == "stop" and self.num_calls else reason


def chat_message(plan: ChatPlan, req: ChatCompletionRequest, text: str) -> tuple[dict, ChatAssembler]:
    """The non-streaming message of a whole answer."""
    asm = ChatAssembler(plan, req)
    reasoning, content, calls = asm.push(text, final=True)
    message = {"role": "assistant", "content": content if content or not (calls or reasoning) else None}
    if plan.in_reasoning is not None:
        message["reasoning_content"] = reasoning if plan.in_reasoning or reasoning else None
    if calls:
        message["tool_calls"] = calls
    return message, asm


def delta_of(reasoning: str, content: str, calls: list[dict]) -> dict:
    delta = {}
    if reasoning:
        delta["reasoning_content"] = reasoning
    if content:
        delta["content"] = content
    if calls:
        delta["tool_calls"] = calls
    return delta
