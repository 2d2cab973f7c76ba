"""Joining and leaving the tp x pp process group (driver and followers alike)."""

from __future__ import annotations

import multiprocessing
import multiprocessing.connection
import os
import threading
import traceback
from datetime import timedelta

import torch
import torch.distributed as dist

from lightllm_mtp.common.parallel_state import init_parallel_state, reset_parallel_state
from lightllm_mtp.config.engine_args import EngineArgs
from lightllm_mtp.config.parallel_config import RankInfo
from lightllm_mtp.engine.parallel.step_ops import decode_ops, encode_ops

_IDLE_TIMEOUT = timedelta(days=365)  # the control group: followers wait for the next step for as long as it takes


def join_group(args: EngineArgs, rank: int, port: int, backend: str, host_staged: bool) -> object:
    """Joins the process group as `rank` and creates every group; returns the control group. backend, host_staged:
    the forwards' collectives (parallel_state.compute_backend, decided once by the driver)."""
    if args.device.type == "cuda":
        torch.cuda.set_device(args.device.index or 0)  # "cuda" without an index: the first GPU
    dist.init_process_group(
        backend, init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=args.parallel.world_size,
        timeout=timedelta(seconds=args.dist_timeout_s),
    )  # fmt: skip
    control = dist.new_group(backend="gloo", timeout=_IDLE_TIMEOUT)
    # the forward's collectives wait at most dist_timeout_s for a peer (a hung rank ends the group, group.py)
    init_parallel_state(RankInfo(args.parallel, rank), host_staged=host_staged, timeout_s=args.dist_timeout_s)
    return control


_STATUS_BYTES = 2048


def exchange_status(control, status: str, timeout_s: float | None = None) -> list[str]:
    """Every rank's start status ("ok" or its error, cut to 2 KB), so that a rank failing to load ends the start
    everywhere. timeout_s: how long to wait for the slowest rank (None: as long as the control group allows)."""
    raw = status.encode()[: _STATUS_BYTES - 8]
    mine = torch.zeros(_STATUS_BYTES, dtype=torch.uint8)
    mine[:8] = torch.tensor([len(raw)], dtype=torch.int64).view(torch.uint8)
    if raw:
        mine[8 : 8 + len(raw)] = torch.frombuffer(bytearray(raw), dtype=torch.uint8)
    parts = [torch.empty_like(mine) for _ in range(dist.get_world_size())]
    work = dist.all_gather(parts, mine, group=control, async_op=True)
    if timeout_s is None:
        work.wait()
    else:
        work.wait(timeout=timedelta(seconds=timeout_s))
    out = []
    for p in parts:
        n = int(p[:8].view(torch.int64).item())
        out.append(bytes(p[8 : 8 + n].tolist()).decode(errors="replace"))
    return out


def leave_group() -> None:
    reset_parallel_state()
    if dist.is_initialized():
        dist.destroy_process_group()


def watch_parent() -> None:
    """A follower ends itself when its driver process is gone (it may be waiting on the control group)."""
    parent = multiprocessing.parent_process()
    if parent is None:
        return

    def wait() -> None:
        multiprocessing.connection.wait([parent.sentinel])
        os._exit(1)

    threading.Thread(target=wait, name="watch-driver", daemon=True).start()


def describe(e: BaseException) -> str:
    """A start failure in one line for the other ranks; the traceback goes to this rank's stderr."""
    traceback.print_exc()
    return f"{type(e).__name__}: {e}"


def send_ops(ops: list, control, timeout_s: float) -> None:
    """The driver's step ops to every follower: a length, then their JSON bytes. Waits at most timeout_s (the
    control group's own timeout is the idle one)."""
    payload = torch.frombuffer(bytearray(encode_ops(ops)), dtype=torch.uint8)
    for tensor in (torch.tensor([payload.numel()], dtype=torch.int64), payload):
        dist.broadcast(tensor, 0, group=control, async_op=True).wait(timeout=timedelta(seconds=timeout_s))


def recv_ops(control) -> list:
    """A follower's next step ops (waits as long as the driver is idle)."""
    size = torch.zeros(1, dtype=torch.int64)
    dist.broadcast(size, 0, group=control)
    payload = torch.empty(int(size.item()), dtype=torch.uint8)
    dist.broadcast(payload, 0, group=control)
    return decode_ops(payload.numpy().tobytes())
