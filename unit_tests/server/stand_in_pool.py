"""A WorkerPool stand-in for the front's tests: two replicas that reported ready, recording what the front does."""

from types import SimpleNamespace

from lightllm_mtp.server.messages import WorkerReady, WorkerStats

STALL_S, WATCHDOG_S = 1.0, 5.0


def stats(rank):
    return WorkerStats(rank, 0, 1000, 0, 0, 8, 0, 0, 0, 0)


class StandInPool:
    def __init__(self, dp=2):
        self.ready = [WorkerReady(r, "cpu", 128, 1000, (0,), 0, 1, stats(r), follower_pids=(900 + r,))
                      for r in range(dp)]  # fmt: skip
        self.args = SimpleNamespace(worker_restart_attempts=3, worker_stall_s=STALL_S, worker_watchdog_s=WATCHDOG_S)
        self.generations = [0] * dp
        self.sent, self.killed, self.restarted, self.gone = [], [], [], []

    def send(self, rank, msg):
        self.sent.append((rank, msg))

    def dead_workers(self):
        return list(self.gone)

    def kill(self, rank, follower_pids):
        self.killed.append((rank, follower_pids))

    def restart(self, rank):
        self.restarted.append(rank)
        self.generations[rank] += 1
