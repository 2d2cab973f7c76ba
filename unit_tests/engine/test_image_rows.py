"""ImageRows: a prompt batch's vision-embedding rows (the target's, and each MTP distance's: row p reads the token
at p + d) and M-RoPE rows, for chunks that split images, against a per-position recompute from the spans."""

import torch

from lightllm_mtp.engine.image_rows import ImageRows
from lightllm_mtp.engine.request import Request
from lightllm_mtp.multimodal.image_input import ImageInput, expand_image_tokens
from lightllm_mtp.multimodal.prompt_images import PromptImages
from lightllm_mtp.sampling_params import SamplingParams

IMAGE, H = 9, 4


def image(h, w, seed):
    return ImageInput.of(torch.randn(h * w, 6, generator=torch.Generator().manual_seed(seed)), (1, h, w), 2)


def tower(images):
    """Embedding j of an image: [content id, j, j, j] (content id from its hash), so rows can be traced back."""
    return [torch.tensor([[int(im.content_hash[:6], 16), j, j, j] for j in range(im.num_tokens)], dtype=torch.float)
            for im in images]  # fmt: skip


def request(rid, ids, images):
    req = Request(rid, ids, SamplingParams())
    req.images = PromptImages.of(ids, images, IMAGE) if images else None
    return req


def test_rows_and_positions_of_split_chunks():
    images = [image(4, 4, 1), image(2, 6, 2)]
    ids = expand_image_tokens([1, 2, IMAGE, 3, 4, IMAGE, 5], images, IMAGE)  # 4 + 3 image tokens
    text_req = request(1, [7, 8, 9, 10], [])
    req = request(0, ids, images)
    rows = ImageRows(tower, torch.zeros(4, dtype=torch.int64), torch.device("cpu"), lookahead=2)
    calls = []
    rows.tower = lambda ims: calls.append(len(ims)) or tower(ims)
    spans = req.images.spans
    for start, n in [(0, 3), (3, 2), (5, 4), (9, 2)]:  # chunks cutting both images
        chunks = [(text_req, 0, 4), (req, start, n)]  # a text request's rows first
        fields = rows.batch_fields(chunks)
        for d in range(3):
            got = fields["input_embeds"] if d == 0 else fields["ahead_embeds"][d - 1]
            want = {}
            for p in range(start, start + n):
                for i, span in enumerate(spans):
                    if span.start <= p + d < span.end:
                        want[4 + p - start] = tower([span.image])[0][p + d - span.start]
            if not want:
                assert got is None
                continue
            assert sorted(got[0].tolist()) == sorted(want)
            for r, v in zip(got[0].tolist(), got[1]):
                assert torch.equal(v, want[r])
        pos = fields["mrope_positions"]
        assert torch.equal(pos[:, :4], torch.arange(4).expand(3, -1))
        assert torch.equal(pos[:, 4:], req.images.positions[:, start : start + n])
        req.num_computed = start + n
        req.images.drop_embeds_before(req.num_computed)
    assert calls == [1, 1]  # each image through the tower once, when a chunk (or its lookahead) first reaches it
    assert rows.batch_fields([(text_req, 0, 4), (req, len(ids), 1)]) == {}  # past the images: the delta does it


def test_admit_resets_the_slot_delta():
    delta = torch.full((4,), 99, dtype=torch.int64)
    rows = ImageRows(tower, delta, torch.device("cpu"))
    images = [image(4, 4, 3)]  # 2 x 2 tokens over 2 rope positions: what follows sits 2 positions lower
    req = request(0, expand_image_tokens([1, IMAGE, 2], images, IMAGE), images)
    req.req_idx = 2
    rows.admit(req)
    assert req.images.delta == -2
    assert int(delta[2]) == -2
    text = request(1, [1, 2], [])
    text.req_idx = 2
    rows.admit(text)
    assert int(delta[2]) == 0
