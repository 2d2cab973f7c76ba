"""The `qwen3` reasoning parser (`--reasoning_parser qwen3`): a chat answer's text split into `reasoning_content`
and `content` at the end of its think block.

Qwen3.5's chat template opens the think block in the prompt (`<think>\\n`; with enable_thinking=false it pre-fills an
empty one), so an answer starts inside its reasoning when its prompt ends in an open think block, and the reasoning
ends at the first `</think>` of the output; an answer that never closes it is all reasoning. A `<think>` the model
writes itself at the start is dropped. The split works on text, the same code for whole answers and for streams:
text that may be the beginning of `</think>` is held back until the next delta decides, so a marker split over
tokens, over deltas or inside an accepted MTP block splits exactly where it ends, and streamed deltas reassemble to
the whole answer's split.
"""

from __future__ import annotations

THINK_START, THINK_END = "<think>", "</think>"
PARSERS = ("qwen3",)


def opens_reasoning(prompt_text: str) -> bool:
    """Whether the prompt leaves the answer inside a think block (the template's generation prompt opened it)."""
    start, end = prompt_text.rfind(THINK_START), prompt_text.rfind(THINK_END)
    return start > end


class ReasoningSplitter:
    def __init__(self, in_reasoning: bool):
        self.in_reasoning = in_reasoning
        self.pending = ""  # held back: may be the start of a marker
        self.at_start = True  # nothing released yet (a leading <think> is dropped, and the newline after it)
        self.content_started = False  # the newlines between </think> and the content are dropped
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
            end = self.pending.find(THINK_END)
            if end < 0:
                keep = 0 if final else _partial_suffix(self.pending, THINK_END)
                reasoning, self.pending = self.pending[: len(self.pending) - keep], self.pending[len(self.pending) - keep :]
                return reasoning, ""
            reasoning, self.pending = self.pending[:end], self.pending[end + len(THINK_END) :]
            self.in_reasoning = False
        if not self.content_started:
            self.pending = self.pending.lstrip("\n")
            self.content_started = bool(self.pending)
        content, self.pending = self.pending, ""
        return reasoning, content


def _partial_suffix(text: str, marker: str) -> int:
    """Length of the longest suffix of `text` that is a proper prefix of `marker`."""
    for n in range(min(len(marker) - 1, len(text)), 0, -1):
        if marker.startswith(text[-n:]):
            return n
    return 0


def split_reasoning(text: str, in_reasoning: bool) -> tuple[str | None, str]:
    """A whole answer: (reasoning_content or None, content)."""
    splitter = ReasoningSplitter(in_reasoning)
    reasoning, content = splitter.push(text, final=True)
    return (reasoning if in_reasoning or reasoning else None), content
