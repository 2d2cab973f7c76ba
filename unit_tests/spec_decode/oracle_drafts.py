"""Oracle MTP proposals for tests: the known greedy continuation, so verify sees long accepted blocks."""

import torch

from lightllm_mtp.engine.spec_runner import SpecRunner


class OracleProposer:
    """Runs the real proposer (so the MTP KV is written as usual), then replaces its drafts with the reference
    continuation of each request, one wrong draft every `corrupt_every` positions."""

    def __init__(self, inner, runner: SpecRunner, reference, corrupt_every: int):
        self.inner, self.runner, self.reference, self.corrupt_every = inner, runner, reference, corrupt_every
        self.num_draft_tokens, self.lookahead, self.modules = inner.num_draft_tokens, inner.lookahead, inner.modules
        self.requests = []  # the requests of the step being launched (their slots are taken during the launch)

    def propose(self, inp):
        drafts = self.inner.propose(inp)
        by_slot = {r.req_idx: r for r in self.requests}
        starts = self.runner.state.start[inp.b_req_idx.long()].tolist()
        rows = []
        for req_idx, start in zip(inp.b_req_idx.tolist(), starts):
            r = by_slot[req_idx]
            ref = self.reference[r.request_id]
            row = []
            for j in range(drafts.shape[1]):
                out_idx = start + 1 + j - len(r.prompt_ids)
                good = ref[out_idx] if out_idx < len(ref) else 0
                row.append(good if (start + j) % self.corrupt_every else (good + 1) % 1000)
            rows.append(row)
        return torch.tensor(rows, dtype=torch.int64, device=drafts.device).view_as(drafts)


def oracle_drafts(monkeypatch, reference, corrupt_every: int):
    """Every SpecRunner made from now on drafts the known greedy continuation: the accept path is exercised at high
    acceptance even with random-weight MTP heads, overlap scheduling included."""
    init, verify, chunks = SpecRunner.__init__, SpecRunner._launch_verify, SpecRunner._launch_prompt_chunks

    def patched_init(self, runner, proposer, builder, *args):
        init(self, runner, proposer, builder, *args)
        self.proposer = OracleProposer(proposer, self, reference, corrupt_every)

    def patched_verify(self, reqs, *args):
        self.proposer.requests = list(reqs)
        return verify(self, reqs, *args)

    def patched_chunks(self, scheduled, *args):
        self.proposer.requests = [s.request for s in scheduled]
        return chunks(self, scheduled, *args)

    monkeypatch.setattr(SpecRunner, "__init__", patched_init)
    monkeypatch.setattr(SpecRunner, "_launch_verify", patched_verify)
    monkeypatch.setattr(SpecRunner, "_launch_prompt_chunks", patched_chunks)
