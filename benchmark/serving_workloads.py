"""Prefix-cache workloads of benchmark/serving.py: shared prefixes (a few long "system prompts", each followed by
distinct questions) and multi-turn chats (each turn resends the conversation so far: the previous prompt, the
answer the server gave, re-tokenized or as the server's token ids, and a new user message)."""

from __future__ import annotations

import asyncio
import random
import time
from typing import Awaitable, Callable


def shared_prefix_prompts(prefixes: list[list[int]], questions: list[list[int]], rng: random.Random) -> list[list[int]]:
    """One prompt per question: prefix i % len(prefixes) (a few long "system prompts") + the question, in an order
    that interleaves the groups."""
    order = list(range(len(questions)))
    rng.shuffle(order)  # groups interleave
    return [prefixes[i % len(prefixes)] + questions[i] for i in order]


async def multi_turn(send: Callable[[list[int]], Awaitable], answer_ids: Callable[[object], list[int]],
                     first: list[list[int]], user_turns: list[list[list[int]]], concurrency: int,
                     on_done: Callable[[], None]) -> tuple[list, float]:  # fmt: skip
    """Conversations (first prompt, then the user messages of later turns), at most `concurrency` at once, each
    turn after the previous one's answer: prompt = previous prompt + answer_ids(record) + user message (the answer's
    text re-encoded, as a chat client does, or the server's token ids). send(prompt) -> a record. Returns the
    records of every turn and the wall time."""
    sem = asyncio.Semaphore(concurrency)
    records = []

    async def conversation(i: int) -> None:
        async with sem:
            prompt = first[i]
            for turn in range(len(user_turns[i]) + 1):
                rec = await send(prompt)
                records.append(rec)
                on_done()
                if rec.error is not None or turn == len(user_turns[i]):
                    return
                prompt = prompt + answer_ids(rec) + user_turns[i][turn]

    start = time.perf_counter()
    await asyncio.gather(*(conversation(i) for i in range(len(first))))
    return records, time.perf_counter() - start
