"""Qwen3.5 Gated DeltaNet (linear attention): causal depthwise conv + SiLU, gated delta rule with fp32
per-request state, gated RMSNorm, out_proj."""

from __future__ import annotations

import torch

from lightllm_mtp.common.basemodel.forward_batch import ForwardBatch, ForwardMode
from lightllm_mtp.common.layers.base import Layer, ModelCaches, Weights
from lightllm_mtp.common.quantization.linear import Linear, same_format
from lightllm_mtp.common.tensor_spec import TensorSpec, TpShard
from lightllm_mtp.config.model_config import ModelConfig
from lightllm_mtp.kernels.gdn.causal_conv1d import causal_conv1d_prefill_qkv
from lightllm_mtp.kernels.gdn.causal_conv1d_verify import causal_conv1d_verify
from lightllm_mtp.kernels.gdn.fla_prefill import prefill_chunks
from lightllm_mtp.kernels.gdn.gated_delta_rule import gated_delta_rule_decode_fused, gated_delta_rule_prefill
from lightllm_mtp.kernels.gdn.gated_delta_rule_states import gated_delta_rule_prefill_states
from lightllm_mtp.kernels.gdn.gated_delta_rule_verify import gated_delta_rule_verify_fused_gates
from lightllm_mtp.kernels.gdn.gdn_gating import gdn_gating
from lightllm_mtp.kernels.gdn.snapshot_conv import snapshot_conv_windows
from lightllm_mtp.kernels.norm.gated_rmsnorm import gated_rmsnorm


class GatedDeltaNet(Layer):
    def __init__(self, cfg: ModelConfig, prefix: str, weights: Weights, state_layer: int):
        self.state_layer = state_layer
        # this tp rank's heads: q/k/v/z/a/b, conv channels, A_log, dt_bias split by head; out_proj row-parallel
        self.dk, self.dv = cfg.linear_key_head_dim, cfg.linear_value_head_dim
        self.nv = weights[f"{prefix}A_log"].shape[0]
        conv_rows = weights[f"{prefix}in_proj_qkv.weight"].shape[0]
        self.nk = (conv_rows - self.nv * self.dv) // (2 * self.dk)  # key heads are replicated when tp > their count
        self.key_dim, self.value_dim = self.nk * self.dk, self.nv * self.dv
        self.eps = cfg.rms_norm_eps
        names = [f"{prefix}{n}.weight" for n in ("in_proj_qkv", "in_proj_z", "in_proj_b", "in_proj_a")]
        # one GEMM for all four input projections: rows [qkv | z | b | a]; two where the checkpoint stores them in
        # different formats (the -FP8 checkpoints: qkv and z FP8, the small b and a 16-bit)
        groups = [names] if same_format(weights, names) else [names[:2], names[2:]]
        self.in_projs = [Linear.fused(weights, g) for g in groups]
        self.conv_weight = weights[f"{prefix}conv1d.weight"].squeeze(1)  # [conv_dim, K]
        self.A_log = weights[f"{prefix}A_log"]
        self.dt_bias = weights[f"{prefix}dt_bias"]
        self.norm_weight = weights[f"{prefix}norm.weight"]
        self.out_proj = Linear(weights[f"{prefix}out_proj.weight"], [f"{prefix}out_proj.weight"])

    @classmethod
    def specs(cls, cfg: ModelConfig, prefix: str) -> list[TensorSpec]:
        h, nv = cfg.hidden_size, cfg.linear_num_value_heads
        nk = cfg.linear_num_key_heads
        qkv = TpShard(0, sections=(cfg.linear_key_dim, cfg.linear_key_dim, cfg.linear_value_dim), heads=(nk, nk, nv))
        return [
            TensorSpec(f"{prefix}in_proj_qkv.weight", (cfg.linear_conv_dim, h), tp=qkv, quantizable=True),
            TensorSpec(f"{prefix}in_proj_z.weight", (cfg.linear_value_dim, h), tp=TpShard(0), quantizable=True),
            TensorSpec(f"{prefix}in_proj_b.weight", (nv, h), tp=TpShard(0)),
            TensorSpec(f"{prefix}in_proj_a.weight", (nv, h), tp=TpShard(0)),
            TensorSpec(f"{prefix}conv1d.weight", (cfg.linear_conv_dim, 1, cfg.linear_conv_kernel_dim), tp=qkv),
            TensorSpec(f"{prefix}A_log", (nv,), keep_fp32=True, tp=TpShard(0)),
            TensorSpec(f"{prefix}dt_bias", (nv,), keep_fp32=True, tp=TpShard(0)),
            TensorSpec(f"{prefix}norm.weight", (cfg.linear_value_head_dim,)),
            TensorSpec(f"{prefix}out_proj.weight", (h, cfg.linear_value_dim), tp=TpShard(1), quantizable=True),
        ]

    def forward(self, x: torch.Tensor, batch: ForwardBatch, caches: ModelCaches) -> torch.Tensor:
        t = x.shape[0]
        conv_dim = 2 * self.key_dim + self.value_dim
        qkv, z, b, a = self._in_proj(x, [conv_dim, self.value_dim, self.nv, self.nv])
        linear_state = caches.req_manager.linear_state
        assert linear_state is not None
        conv_state, ssm_state = linear_state.layer(self.state_layer)
        # SSM rows: request r owns rows [r * rows_per_req, (r + 1) * rows_per_req); row 0 outside verify.
        rows = linear_state.rows_per_req
        b_ssm_row = batch.b_req_idx if rows == 1 else batch.derived("b_ssm_row", lambda: batch.b_req_idx * rows)
        mode = batch.mode
        if mode is ForwardMode.DECODE:  # one fused step: conv update, gates, l2norm, delta rule
            o = gated_delta_rule_decode_fused(
                qkv, self.conv_weight, conv_state, a, b, ssm_state, A_log=self.A_log, dt_bias=self.dt_bias,
                b_conv_idx=batch.b_req_idx, b_ssm_idx=b_ssm_row, nk=self.nk, dk=self.dk, dv=self.dv,
            )
            o = gated_rmsnorm(o, z.reshape(t, self.nv, self.dv), self.norm_weight, self.eps)
            return self.out_proj(o.reshape(t, self.value_dim))
        if mode is ForwardMode.VERIFY:
            assert batch.b_accept_len is not None, "a VERIFY batch carries b_accept_len"
            qkv = causal_conv1d_verify(
                qkv, self.conv_weight, conv_state, b_state_idx=batch.b_req_idx, b1_cu_q_len=batch.b1_cu_q_len,
                b_accept_len=batch.b_accept_len, max_q_len=batch.max_q_len, b_write_col=batch.b_state_write,
            )
            q, k, v = qkv.split([self.key_dim, self.key_dim, self.value_dim], dim=-1)
        else:  # EXTEND: contiguous q | k | v planes, q and k L2-normalised (one pass, what the chunk kernel wants)
            if batch.snapshot_plan is not None:
                self._snapshot_conv(qkv, conv_state, batch, caches)
            q, k, v = causal_conv1d_prefill_qkv(
                qkv, self.conv_weight, conv_state, b_state_idx=batch.b_req_idx, b1_cu_q_len=batch.b1_cu_q_len,
                b_has_initial_state=batch.b_has_initial_state, key_dim=self.key_dim, head_dim=self.dk,
            )
        q = q.reshape(t, self.nk, self.dk)
        k = k.reshape(t, self.nk, self.dk)
        v = v.reshape(t, self.nv, self.dv)
        if mode is ForwardMode.VERIFY:  # gates computed inside the kernel from a, b
            base, accept = b_ssm_row, batch.b_accept_len
            if batch.b_state_write is not None:  # rows from base + write; the read row stays base + accept - 1
                base = batch.derived("b_ssm_write_row", lambda: b_ssm_row + batch.b_state_write)
                accept = batch.derived("b_ssm_read_rel", lambda: batch.b_accept_len - batch.b_state_write)
            o = gated_delta_rule_verify_fused_gates(
                q, k, v, a, b, ssm_state, A_log=self.A_log, dt_bias=self.dt_bias, b_state_base=base,
                b1_cu_q_len=batch.b1_cu_q_len, b_accept_len=accept, max_q_len=batch.max_q_len,
            )
        else:
            g, beta = gdn_gating(a, b, self.A_log, self.dt_bias)
            if batch.snapshot_plan is None:
                chunks = batch.derived(
                    "gdn_prefill_chunks", lambda: prefill_chunks(batch.b1_cu_q_len, batch.host_q_lens)
                )
                o = gated_delta_rule_prefill(
                    q, k, v, g, beta, ssm_state, b_state_idx=b_ssm_row, b1_cu_q_len=batch.b1_cu_q_len,
                    b_has_initial_state=batch.b_has_initial_state, qk_normalized=True, chunks=chunks,
                )
            else:
                o = self._prefill_with_snapshots(q, k, v, g, beta, ssm_state, b_ssm_row, batch, caches)
        o = gated_rmsnorm(o, z.reshape(t, self.nv, self.dv), self.norm_weight, self.eps)
        return self.out_proj(o.reshape(t, self.value_dim))

    def _in_proj(self, x: torch.Tensor, sizes: list[int]) -> list[torch.Tensor]:
        """[qkv, z, b, a] (views of one or two projections' outputs)."""
        if len(self.in_projs) == 1:
            return list(self.in_projs[0](x).split(sizes, dim=-1))
        return [*self.in_projs[0](x).split(sizes[:2], dim=-1), *self.in_projs[1](x).split(sizes[2:], dim=-1)]

    # ---- prefix cache: GDN state snapshots at token boundaries inside prompt chunks (common/state_snapshots.py) ----
    def _snapshot_conv(self, x: torch.Tensor, conv_state: torch.Tensor, batch: ForwardBatch, caches: ModelCaches) -> None:
        """Each snapshot's conv window: the K-1 pre-conv inputs before its boundary, from the chunk's rows or the
        request's conv history (read before the conv kernel updates it)."""
        plan, snaps = batch.snapshot_plan, caches.snapshots
        snapshot_conv_windows(
            x, conv_state, snaps.conv[self.state_layer], conv_index=plan.conv_index, conv_slots=plan.conv_slots,
            b_state_idx=batch.b_req_idx, b_has_initial_state=batch.b_has_initial_state,
        )

    def _prefill_with_snapshots(self, q, k, v, g, beta, ssm_state, b_ssm_row, batch, caches) -> torch.Tensor:
        """The chunk's recurrence in the plan's pieces (one unless a boundary is off the kernel's alignment), each
        call writing the states at its boundaries into their snapshot slots."""
        snaps = caches.snapshots.ssm[self.state_layer]
        pieces = batch.snapshot_plan.pieces
        if pieces[0].rows is None:
            return gated_delta_rule_prefill_states(
                q, k, v, g, beta, ssm_state, snaps, b_state_idx=b_ssm_row, b1_cu_q_len=batch.b1_cu_q_len,
                b_has_initial_state=batch.b_has_initial_state, saves=pieces[0].saves, qk_normalized=True,
            )
        out = torch.empty_like(v)
        for piece in pieces:
            r = piece.rows
            out[r] = gated_delta_rule_prefill_states(
                q[r], k[r], v[r], g[r], beta[r], ssm_state, snaps, b_state_idx=b_ssm_row[piece.b_index],
                b1_cu_q_len=piece.saves.cu_seqlens, b_has_initial_state=piece.b_has_initial_state, saves=piece.saves,
                qk_normalized=True,
            )
        return out
