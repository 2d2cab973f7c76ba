"""The `qwen3` reasoning parser (`--reasoning_parser qwen3`): a chat answer's text split into `reasoning_content`
and `content` at the end of its think block.

Qwen3.5's chat template opens the think block in the prompt (`<think>\\n`; with enable_thinking=false it pre-fills an
empty one), so an answer starts inside its reasoning when its prompt ends in an open think block, and the reasoning
ends at the first `</think>` of the output; an answer that never closes it is all reasoning. A `<think>` the model
writes itself at the start is dropped. As vLLM's qwen3 parser, a tool call the model opens before closing its
thinking also ends it: the first `<tool_call>` followed (after whitespace) by `<function=` (or `<function `) ends the
reasoning there and is the content's start, so the tool-call parser gets it; a `<tool_call>` mentioned otherwise
stays reasoning. Not under a structured output gated after `</think>` (tool_choice required / named, response_format
with thinking): its grammar applies from `</think>` only, so a call written before it is unconstrained reasoning text
and the answer is what the grammar wrote (`tool_call_ends=False`). The split works on text, the same code for whole
answers and for streams: text that may be the beginning of a marker (or a `<tool_call>` whose next text has not
decided yet) is held back until a later delta decides, so a marker split over tokens, over deltas or inside an
accepted MTP block splits exactly where it ends, and streamed deltas reassemble to the whole answer's split.
"""

from __future__ import annotations

THINK_START, THINK_END = "<think>", "</think>"
TOOL_CALL_START, FUNCTION_OPEN = "<tool_call>", "<function"
PARSERS = ("qwen3",)


def opens_reasoning(prompt_text: str) -> bool:
    """Whether the prompt leaves the answer inside a think block (the template's generation prompt opened it)."""
    start, end = prompt_text.rfind(THINK_START), prompt_text.rfind(THINK_END)
    return start > end


def _opens_call(after: str, final: bool) -> bool | None:
    """Whether the text after a `<tool_call>` makes it a call's start: `<function` then `=` or whitespace, after
    optional whitespace; None: not decided yet (the text so far may still become one)."""
    head, n = after.lstrip(), len(FUNCTION_OPEN)
    if len(head) > n:
        return head.startswith(FUNCTION_OPEN) and (head[n] == "=" or head[n].isspace())
    return None if FUNCTION_OPEN.startswith(head) and not final else False


def reasoning_end(text: str, final: bool, tool_call_ends: bool = True) -> tuple[int, int]:
    """Where the reasoning in `text` ends: (its end, the content's start); content start -1 when it has not ended,
    and then the end is where text that may still end it (held back) begins. final: no more text comes.
    tool_call_ends: whether a tool call opened before `</think>` ends it too."""
    close = text.find(THINK_END)
    limit = close if close >= 0 else len(text)
    at = text.find(TOOL_CALL_START, 0, limit) if tool_call_ends else -1
    while at >= 0:
        opens = _opens_call(text[at + len(TOOL_CALL_START) :], final)
        if opens:
            return at, at
        if opens is None:
            return at, -1
        at = text.find(TOOL_CALL_START, at + 1, limit)
    if close >= 0:
        return close, close + len(THINK_END)
    call_prefix = _partial_suffix(text, TOOL_CALL_START) if tool_call_ends else 0
    keep = 0 if final else max(_partial_suffix(text, THINK_END), call_prefix)
    return len(text) - keep, -1


class ReasoningSplitter:
    def __init__(self, in_reasoning: bool, tool_call_ends: bool = True, content_lead: str = "\n"):
        self.in_reasoning = in_reasoning
        self.tool_call_ends = tool_call_ends  # reasoning_end's
        self.content_lead = content_lead  # characters dropped between the reasoning's end and the content
        self.pending = ""  # held back: may be the start of a marker
        self.at_start = True  # nothing released yet (a leading <think> is dropped, and the newline after it)
        self.content_started = False  # the content_lead characters between </think> and the content are dropped
        self.reasoning_started = True  # False: the newlines after a <think> the model wrote are dropped

    def push(self, text: str, final: bool = False) -> tuple[str, str]:
        """(reasoning delta, content delta) released by `text`; final: the answer is complete."""
        self.pending += text
        reasoning = content = ""
        if self.in_reasoning:
            if self.at_start:
                stripped = self.pending.lstrip("\n")
                if THINK_START.startswith(stripped) and not final:
                    return "", ""
                if stripped.startswith(THINK_START):
                    self.pending = stripped[len(THINK_START) :]
                    self.reasoning_started = False
                self.at_start = False
            if not self.reasoning_started:
                self.pending = self.pending.lstrip("\n")
                self.reasoning_started = bool(self.pending)
            end, content_start = reasoning_end(self.pending, final, self.tool_call_ends)
            reasoning = self.pending[:end]
            if content_start < 0:
                self.pending = self.pending[end:]
                return reasoning, ""
            self.pending = self.pending[content_start:]
            self.in_reasoning = False
        if not self.content_started:
            self.pending = self.pending.lstrip(self.content_lead)
            self.content_started = bool(self.pending)
        content, self.pending = self.pending, ""
        return reasoning, content


def _partial_suffix(text: str, marker: str) -> int:
    """Length of the longest suffix of `text` that is a proper prefix of `marker`."""
    for n in range(min(len(marker) - 1, len(text)), 0, -1):
        if marker.startswith(text[-n:]):
            return n
    return 0


def split_reasoning(text: str, in_reasoning: bool, tool_call_ends: bool = True) -> tuple[str | None, str]:
    """A whole answer: (reasoning_content or None, content)."""
    splitter = ReasoningSplitter(in_reasoning, tool_call_ends)
    reasoning, content = splitter.push(text, final=True)
    return (reasoning if in_reasoning or reasoning else None), content
