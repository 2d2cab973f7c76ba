"""A Responses API answer as output items, with the stream events that build them: a `reasoning` item (its text
as a reasoning_text part; --reasoning_parser), `message` items (output_text) and one `function_call` item per tool
call (--tool_call_parser), in the order the answer holds them.

`ResponseOutput` is fed the answer's text as it comes (chat_output.py's ChatAssembler splits it) and returns the
events of each push; a whole answer is one push. Items are added and done one after the other (a new kind of text or
a call closes the open item), so the events of any split of the answer into deltas build the same items as the whole
answer. A function call comes whole (the parser releases it at its closing tag): its arguments are one delta.
"""

from __future__ import annotations

import uuid

from lightllm_mtp.server.chat_output import ChatAssembler, ChatPlan
from lightllm_mtp.server.chat_protocol import ChatCompletionRequest
from lightllm_mtp.server.reasoning import reasoning_end

_TEXT = {  # item type -> (its id prefix, its text part's type, its text events' prefix)
    "reasoning": ("rs", "reasoning_text", "response.reasoning_text"),
    "message": ("msg", "output_text", "response.output_text"),
}


def _part(kind: str, text: str) -> dict:
    part = {"type": _TEXT[kind][1], "text": text}
    return part | {"annotations": []} if kind == "message" else part


def _item(kind: str, item_id: str, status: str, parts: list[dict]) -> dict:
    if kind == "reasoning":
        return {"type": "reasoning", "id": item_id, "summary": [], "content": parts, "status": status}
    return {"type": "message", "id": item_id, "status": status, "role": "assistant", "content": parts}


class ResponseOutput:
    def __init__(self, plan: ChatPlan, chat: ChatCompletionRequest):
        self.assembler = ChatAssembler(plan, chat)
        self.items: list[dict] = []  # the output so far (the open item's text is in self.text until it is done)
        self.open: str | None = None  # kind of the item receiving text: "reasoning" or "message"
        self.text = ""

    def push(self, text: str, final: bool) -> list[dict]:
        """The events (without sequence numbers) of the answer's next text."""
        reasoning, pieces = self.assembler.push_pieces(text, final)
        events = self._text("reasoning", reasoning) if reasoning else []
        for piece in pieces:
            events += self._text("message", piece) if isinstance(piece, str) else self._call(piece)
        return events

    def finish(self, incomplete: bool) -> list[dict]:
        """The events that close the answer (after its last push); an answer with no items gets an empty message."""
        status = "incomplete" if incomplete else "completed"
        events = self._close(status)
        if not self.items:
            events = self._open("message") + self._close(status)
        return events

    @property
    def num_calls(self) -> int:
        return self.assembler.num_calls

    def _where(self) -> dict:
        return {"item_id": self.items[-1]["id"], "output_index": len(self.items) - 1}

    def _open(self, kind: str) -> list[dict]:
        self.items.append(_item(kind, f"{_TEXT[kind][0]}_{uuid.uuid4().hex}", "in_progress", []))
        self.open, self.text = kind, ""
        where = self._where()
        return [{"type": "response.output_item.added", "output_index": where["output_index"], "item": self.items[-1]},
                {"type": "response.content_part.added", **where, "content_index": 0, "part": _part(kind, "")}]

    def _text(self, kind: str, text: str) -> list[dict]:
        events = [] if self.open == kind else self._close("completed") + self._open(kind)
        self.text += text
        delta = {"type": f"{_TEXT[kind][2]}.delta", **self._where(), "content_index": 0, "delta": text}
        return events + [delta | {"logprobs": []} if kind == "message" else delta]

    def _close(self, status: str) -> list[dict]:
        if self.open is None:
            return []
        kind, where = self.open, {**self._where(), "content_index": 0}
        done = {"type": f"{_TEXT[kind][2]}.done", **where, "text": self.text}
        self.items[-1] = item = _item(kind, self.items[-1]["id"], status, [_part(kind, self.text)])
        self.open = None
        return [done | {"logprobs": []} if kind == "message" else done,
                {"type": "response.content_part.done", **where, "part": _part(kind, self.text)},
                {"type": "response.output_item.done", "output_index": len(self.items) - 1, "item": item}]

    def _call(self, call: dict) -> list[dict]:
        """A tool call (tool_calls.py's OpenAI dict) as a function_call item."""
        events = self._close("completed")
        item = {"type": "function_call", "id": f"fc_{uuid.uuid4().hex}", "call_id": call["id"],
                "name": call["function"]["name"], "arguments": call["function"]["arguments"], "status": "completed"}
        self.items.append(item)
        where = self._where()
        return events + [
            {"type": "response.output_item.added", "output_index": where["output_index"],
             "item": item | {"arguments": "", "status": "in_progress"}},
            {"type": "response.function_call_arguments.delta", **where, "delta": item["arguments"]},
            {"type": "response.function_call_arguments.done", **where, "arguments": item["arguments"]},
            {"type": "response.output_item.done", "output_index": where["output_index"], "item": item},
        ]  # fmt: skip


def reasoning_tokens(tokenizer, ids: list[int], in_reasoning: bool | None, tool_call_ends: bool = True) -> int:
    """Output tokens of the reasoning (reasoning.py's end: its closing `</think>` included, a tool call that ends it
    not; all of them when it never ends): the tokens up to the content's start in the text, found by decoding
    prefixes (a binary search: a marker may span several tokens). tool_call_ends: ChatPlan.tool_call_ends_reasoning."""
    if not in_reasoning or not ids:
        return 0
    content_start = reasoning_end(tokenizer.decode(ids, skip_special_tokens=True), True, tool_call_ends)[1]
    if content_start < 0:
        return len(ids)
    lo, hi = 0, len(ids)
    while lo < hi:
        mid = (lo + hi) // 2
        if len(tokenizer.decode(ids[:mid], skip_special_tokens=True)) >= content_start:
            hi = mid
        else:
            lo = mid + 1
    return lo
