"""Oracle MTP proposals for tests: the known greedy continuation, so verify sees long accepted blocks."""

from lightllm_mtp.spec_decode.spec_runner import SpecRunner


def oracle_drafts(monkeypatch, reference, corrupt_every: int):
    """Replaces the MTP proposals with the known greedy continuation (one wrong draft every `corrupt_every`
    positions), so that verify accepts long blocks, partial blocks and rejects: the accept path is exercised
    at high acceptance even with random-weight MTP heads."""
    draft = SpecRunner._draft

    def patched(self, *args, **kwargs):
        draft(self, *args, **kwargs)
        groups = args[4]
        for g in groups:
            r = g.req
            if r.draft is None:
                continue
            ref = reference[r.request_id]
            for j in range(len(r.draft.tokens)):
                out_idx = r.draft.start + 1 + j - len(r.prompt_ids)
                good = ref[out_idx] if out_idx < len(ref) else 0
                r.draft.tokens[j] = good if (r.draft.start + j) % corrupt_every else (good + 1) % 1000

    monkeypatch.setattr(SpecRunner, "_draft", patched)
    # the host must see (and replace) every proposal: no verify step built on the device ahead of it
    monkeypatch.setattr(SpecRunner, "launch_after", lambda self, prev, reqs: None)
