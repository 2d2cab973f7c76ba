"""A copy of one rank's cached state, keyed by global decoder layer: what tests compare across layouts (a pp
stage's KV, conv windows and SSM rows against the same layers of a single-process run), and a debugging aid."""

from __future__ import annotations

import torch

from lightllm_mtp.common.basemodel.basemodel import TpPartBaseModel
from lightllm_mtp.common.layers.gated_attention import GatedAttention
from lightllm_mtp.engine.prefix_cache import PrefixCache
from lightllm_mtp.engine.spec_runner import SpecRunner
from lightllm_mtp.engine.step import StepRunner


def stage_state(model: TpPartBaseModel, runner: StepRunner,
                cache: PrefixCache | None = None) -> dict[str, torch.Tensor]:  # fmt: skip
    """{"layer.{i}.k" / ".v" (KV pool buffers of attention layer i), "layer.{i}.conv" / ".ssm" (GDN layer i, every
    request slot), "req_to_token", "draft_table" (DraftState, under MTP), "prefix_cache" (its digest, after the
    tree's consistency check), "snapshot.{i}.conv" / ".ssm" (GDN layer i's snapshot slots)} on the host."""
    caches = model.caches
    out = {"req_to_token": caches.req_manager.req_to_token.cpu().clone()}
    for i, layer in zip(model.layer_ids, model.layers):
        if isinstance(layer.mixer, GatedAttention):
            k, v = caches.kv_pool.layer(layer.mixer.kv_layer)
            out[f"layer.{i}.k"], out[f"layer.{i}.v"] = k.cpu().clone(), v.cpu().clone()
        else:
            conv, ssm = caches.req_manager.linear_state.layer(layer.mixer.state_layer)
            out[f"layer.{i}.conv"], out[f"layer.{i}.ssm"] = conv.cpu().clone(), ssm.cpu().clone()
    if isinstance(runner, SpecRunner):
        out["draft_table"] = runner.state.table.cpu().clone()
    if cache is not None:
        cache.tree.check()
        out["prefix_cache"] = torch.tensor(cache.digest())
        for i, layer in zip(model.layer_ids, model.layers):
            if not isinstance(layer.mixer, GatedAttention):
                j = layer.mixer.state_layer
                out[f"snapshot.{i}.conv"] = cache.snapshots.conv[j].cpu().clone()
                out[f"snapshot.{i}.ssm"] = cache.snapshots.ssm[j].cpu().clone()
    return out
