"""Pipeline stages behind graphs, without a GPU: the stage split (stage_forward) and StageGraphedForward's buffer
routing (receive into the graph set's static inputs, replay, send its static output) give one process's logits
bit for bit; a graph set stand-in replays the stage eagerly from its static buffers. And the host-staged
collectives (gloo on CUDA, parallel_state) give the same results as gloo's own, in two gloo processes."""

import multiprocessing
import socket
import traceback

import pytest
import torch

from lightllm_mtp.common import parallel_state
from lightllm_mtp.common.basemodel import basemodel, stage_graphs
from lightllm_mtp.common.basemodel.forward_batch import ForwardBatch, ForwardMode
from lightllm_mtp.config.model_config import ModelConfig
from lightllm_mtp.config.parallel_config import ParallelConfig, RankInfo
from lightllm_mtp.config.runtime import RuntimeShape
from lightllm_mtp.models.registry import create_model
from unit_tests.parallel.workload import DENSE, MOE


class EagerGraphSet:
    """CudaGraphSet's interface over the stage's forward, replayed eagerly from static input buffers."""

    def __init__(self, model, mode: ForwardMode, max_rows: int = 16):
        self.model, self.mode, self.replays = model, mode, 0
        h = model.cfg.hidden_size
        self.hiddens = [torch.full((max_rows, h), float("nan")) for _ in range(model.num_stage_inputs)]

    def can_run(self, batch):
        return batch.mode is self.mode

    def hidden_inputs(self, rows):
        return [h[:rows] for h in self.hiddens]

    def run(self, batch, *hidden):
        assert not hidden, "a pipeline stage's inputs are received in place"
        self.replays += 1
        return self.model.stage_forward(batch, *self.hidden_inputs(batch.num_tokens))


def _batch(mode, tokens, positions, slots, seq_len) -> ForwardBatch:
    n = len(tokens)
    return ForwardBatch(
        mode=mode, input_ids=torch.tensor(tokens), positions=torch.tensor(positions), mem_index=slots,
        b_req_idx=torch.tensor([0], dtype=torch.int32), b_seq_len=torch.tensor([seq_len], dtype=torch.int32),
        b1_cu_q_len=torch.tensor([0, n], dtype=torch.int32), b_has_initial_state=torch.tensor([positions[0] > 0]),
        b_logits_index=torch.tensor([n - 1]), max_q_len=n,
    )  # fmt: skip


@pytest.mark.parametrize("model_dir", [DENSE, MOE], ids=["dense", "moe"])
def test_stage_graphs_route_the_residual_stream_like_one_process(model_dir, monkeypatch):
    cfg = ModelConfig.from_model_dir(model_dir)

    def build(rank: RankInfo):
        rt = RuntimeShape(dtype=torch.float32, device=torch.device("cpu"), max_reqs=1, max_model_len=64,
                          kv_pool_size=64, rank=rank)  # fmt: skip
        model = create_model(model_dir, cfg, rt)
        assert model.caches.req_manager.alloc() == 0
        return model

    whole = build(RankInfo(ParallelConfig()))
    stages = [build(RankInfo(ParallelConfig(pp=2), r)) for r in range(2)]
    graph_sets = [EagerGraphSet(m, ForwardMode.DECODE) for m in stages]
    pipeline = [stage_graphs.graphed_model_forward(m, [g]) for m, g in zip(stages, graph_sets)]
    assert all(isinstance(p, stage_graphs.StageGraphedForward) for p in pipeline)
    wire: list[torch.Tensor] = []  # stage 0 -> stage 1, in order

    def send(tensors):
        wire.extend(t.clone() for t in tensors)

    def recv_into(tensors):
        for t in tensors:
            t.copy_(wire.pop(0))

    for module in (basemodel, stage_graphs):
        monkeypatch.setattr(module, "pp_send_next", send)
    monkeypatch.setattr(stage_graphs, "pp_recv_into", recv_into)
    monkeypatch.setattr(basemodel, "pp_recv_prev", lambda shapes, dtype, device: [wire.pop(0) for _ in shapes])

    tokens = [785, 1156, 315, 264, 1140, 374, 25]
    slots = torch.arange(len(tokens) + 4, dtype=torch.int32)
    for m in [whole] + stages:
        m.caches.req_manager.req_to_token[0, : len(slots)] = slots
    for step in range(4):  # a prompt (eager, EXTEND), then decode rows (the stand-in graphs)
        if step == 0:
            batch = _batch(ForwardMode.EXTEND, tokens, list(range(len(tokens))), slots[: len(tokens)], len(tokens))
        else:
            n = len(tokens) - 1
            batch = _batch(ForwardMode.DECODE, tokens[-1:], [n], slots[n : n + 1], n + 1)
        want = whole.forward(batch).logits
        assert pipeline[0].forward(batch).logits is None and len(wire) == 2  # delta and residual
        got = pipeline[1].forward(batch).logits
        assert not wire
        assert torch.equal(got, want), f"step {step}"
        tokens.append(int(want[-1].argmax()))
    assert [g.replays for g in graph_sets] == [3, 3]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _staged_collectives(rank: int, port: int, results) -> None:
    import torch.distributed as dist

    try:
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
        x = torch.arange(6, dtype=torch.float32).view(2, 3) + 10 * rank
        parallel_state.init_parallel_state(RankInfo(ParallelConfig(tp=2), rank), host_staged=True)
        summed = parallel_state.tp_all_reduce(x.clone())
        assert torch.equal(summed, 2 * torch.arange(6.0).view(2, 3) + 10), summed
        assert torch.equal(parallel_state.tp_all_gather_last(x), torch.cat([x - 10 * rank, x - 10 * rank + 10], 1))
        assert torch.equal(parallel_state.tp_all_gather_rows(x), torch.cat([x - 10 * rank, x - 10 * rank + 10], 0))
        parallel_state.init_parallel_state(RankInfo(ParallelConfig(pp=2), rank), host_staged=True)
        if rank == 0:
            parallel_state.pp_send_next([x, x[:, 1:]])  # a non-contiguous view travels too
        else:
            buffer = torch.zeros(4, 3)
            parallel_state.pp_recv_into([buffer[:2]])  # a static buffer's first rows, filled in place
            (tail,) = parallel_state.pp_recv_prev([(2, 2)], torch.float32, torch.device("cpu"))
            assert torch.equal(buffer[:2], x - 10) and not buffer[2:].any() and torch.equal(tail, (x - 10)[:, 1:])
        tokens = torch.tensor([7, 8, 9]) * (rank + 1)
        assert parallel_state.pp_broadcast_from_last(tokens) is tokens  # in place, as the runners use it
        assert torch.equal(tokens, torch.tensor([14, 16, 18]))
        results.put((rank, "ok"))
    except BaseException:
        results.put((rank, traceback.format_exc()))
    finally:
        parallel_state.reset_parallel_state()
        if dist.is_initialized():
            dist.destroy_process_group()


def test_host_staged_collectives_match_gloo():
    ctx = multiprocessing.get_context("spawn")
    results, port = ctx.Queue(), _free_port()
    procs = [ctx.Process(target=_staged_collectives, args=(r, port, results)) for r in range(2)]
    for p in procs:
        p.start()
    got = dict(results.get(timeout=120) for _ in procs)
    for p in procs:
        p.join(timeout=30)
    assert got == {0: "ok", 1: "ok"}, got


def test_backend_choice(monkeypatch):
    from lightllm_mtp import env

    monkeypatch.setenv("LIGHTLLM_MTP_DIST_BACKEND", "GLOO")
    assert env._read_env().dist_backend == "gloo"
    monkeypatch.setenv("LIGHTLLM_MTP_DIST_BACKEND", "mpi")
    with pytest.raises(ValueError, match="LIGHTLLM_MTP_DIST_BACKEND must be one of"):
        env._read_env()
    cpu, cuda = torch.device("cpu"), torch.device("cuda", 0)
    assert parallel_state.compute_backend(cpu) == ("gloo", False)
    assert parallel_state.compute_backend(cuda) == ("nccl", False)
    assert parallel_state.compute_backend(cuda, "gloo") == ("gloo", True)  # one GPU: staged through host memory
    with pytest.raises(ValueError, match="needs a CUDA device"):
        parallel_state.compute_backend(cpu, "nccl")
