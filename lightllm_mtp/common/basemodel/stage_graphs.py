"""CUDA graphs of one pipeline stage: each stage captures its own layers (TpPartBaseModel.stage_forward) for the
decode / verify layouts, in the same batch-size buckets as a single process; the stage-to-stage send / recv stay
outside the graphs. A stage after the first receives the previous stage's (delta, residual) straight into its
graph's static input buffers, then replays; a stage before the last replays, then sends its graph's static output
(the residual stream). The last stage's graph holds what one process's does: its layers, the final norm and the
logits (verify, sampling and the MTP drafts run after it as they do without pp).

Without pp (one stage) this is the model's forward behind GraphedForward, unchanged."""

from __future__ import annotations

from lightllm_mtp.common.basemodel.basemodel import TpPartBaseModel
from lightllm_mtp.common.basemodel.cuda_graph import CudaGraphSet, GraphedForward
from lightllm_mtp.common.basemodel.forward_batch import ForwardBatch, ForwardMode, ModelOutput
from lightllm_mtp.common.parallel_state import pp_recv_into, pp_send_next


def _single_stage(model: TpPartBaseModel) -> bool:
    return model.is_first_stage and model.is_last_stage


def model_graph_set(
    model: TpPartBaseModel, mode: ForwardMode, rows_per_req: int, max_batch_size: int, pool
) -> CudaGraphSet:
    """The graphs of the model's forward (one process) or of this stage's layers (pp) for one layout."""
    if _single_stage(model):
        return CudaGraphSet(model.forward, model.caches, mode, rows_per_req, max_batch_size, pool)
    inputs = model.num_stage_inputs
    return CudaGraphSet(
        model.stage_forward, model.caches, mode, rows_per_req, max_batch_size, pool,
        hidden_size=model.cfg.hidden_size if inputs else None, hidden_dtype=model.rt.dtype,
        num_hidden_inputs=max(inputs, 1),
    )  # fmt: skip


def graphed_model_forward(model: TpPartBaseModel, graph_sets: list[CudaGraphSet]):
    """`forward(batch)` of the model with its graph sets (model_graph_set): GraphedForward for one process, else
    StageGraphedForward."""
    if _single_stage(model):
        return GraphedForward(model.forward, graph_sets)
    return StageGraphedForward(model, graph_sets)


class StageGraphedForward:
    """A pipeline stage's forward: recv -> graph replay -> send when a graph set fits the batch, else the model's
    eager forward (which does its own recv / send)."""

    def __init__(self, model: TpPartBaseModel, graph_sets: list[CudaGraphSet]):
        self.model = model
        self.graph_sets = graph_sets

    def forward(self, batch: ForwardBatch) -> ModelOutput:
        graphs = next((g for g in self.graph_sets if g.can_run(batch)), None)
        if graphs is None:
            return self.model.forward(batch)
        if not self.model.is_first_stage:
            pp_recv_into(graphs.hidden_inputs(batch.num_tokens))  # straight into the static input buffers
        out = graphs.run(batch)
        if self.model.is_last_stage:
            return out
        pp_send_next(list(out.to_next_stage))
        return ModelOutput(logits=None, hidden=None)
