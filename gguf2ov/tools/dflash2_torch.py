"""A PyTorch reference of the DFlash 2 draft, built on optimum-intel's DFlash (v1) classes.

DFlash 2 keeps the v1 block layout ([anchor, mask x (B-1)] rows attending to the context K/V made
from the target's hidden states) and adds, per decoder layer, two grouped dynamic causal
convolutions over the block rows (one around attention, one around the MLP), plus a candidate
selector that re-ranks the top-K draft tokens of each row given the token chosen before it.

The modules hold the Hugging Face checkpoint names exactly (`layers.N.attention_conv.*`,
`layers.N.mlp_conv.*`, `candidate_selector.*`), so a published checkpoint loads strictly. Two model
forms, as in optimum: `DFlash2DraftModel` (training form, takes `noise_embedding`, returns every
row) and `DFlash2ForCausalLM` (export form, takes `inputs_embeds`, drops the seed row; optimum's
OpenVINO export needs these input names).

Tests and fixtures only: it needs PyTorch and optimum-intel (`pip install 'gguf2ov[reference]'`).
"""

import json
from pathlib import Path

from ..errors import reference_imports
from ..names import IR_XML

with reference_imports("the DFlash 2 PyTorch reference"):
    import torch
    import torch.nn.functional as F
    from optimum.exporters.openvino.model_patcher import (Qwen3DFlashDecoderLayer, Qwen3DFlashDraftModel,
                                                          Qwen3DFlashForCausalLM)
    from torch import nn

ARCHITECTURE = "DFlash2DraftModel"
DFLASH2_KEYS = ("conv_kernel_size", "conv_group_size", "selector_rank", "selector_top_k")


def dflash_value(config, name: str, default=None):
    """A DFlash setting: `dflash_config[name]` first, then the top level (z-lab's reader does the same).

    Published DFlash 2 configs keep every DFlash key under `dflash_config`; a reader that only looks
    at the top level silently falls back to defaults (block size 16 instead of 8).
    """
    get = (lambda k, d=None: config.get(k, d)) if isinstance(config, dict) else (lambda k, d=None: getattr(config, k, d))
    nested = get("dflash_config") or {}
    if name in nested:
        return nested[name]
    return get(name, default)




# --- the convolution ------------------------------------------------------------------------------


class GroupedDynamicCausalConv(nn.Module):
    """y[i, c] = sum_t (base[side, t, c] + dyn[i, side, t, c // group_size]) * x[i - t, c], x[j < 0] = 0.

    Rows are dim -2 of [..., rows, H]: the rows of one draft block, never the context. Row 0 (the
    anchor) reads zero padding. `block_rows` restarts the padding every `block_rows` rows, for
    training batches that pack several blocks along the row axis; None (the export form) treats the
    whole row axis as one block, which is what a GenAI draft call feeds.
    """

    def __init__(self, hidden_size: int, kernel_size: int, group_size: int):
        super().__init__()
        if hidden_size % group_size:
            raise ValueError(f"hidden size {hidden_size} is not a multiple of conv_group_size {group_size}")
        self.kernel_size, self.group_size, self.groups = kernel_size, group_size, hidden_size // group_size
        # [side (0: before the sublayer, 1: after it), tap, channel]; channel fastest, as in the checkpoint.
        self.base_kernel = nn.Parameter(torch.zeros(2, kernel_size, hidden_size))
        # Output index side*ks*G + tap*G + g: the group is fastest.
        self.kernel_projection = nn.Linear(hidden_size, 2 * kernel_size * self.groups, bias=False)
        self.block_rows: int | None = None
        self.reset_to_identity()

    @torch.no_grad()
    def reset_to_identity(self) -> None:
        """Tap 0 = 1, everything else 0: both sides pass their input through unchanged."""
        self.base_kernel.zero_()
        self.base_kernel[:, 0] = 1.0
        self.kernel_projection.weight.zero_()

    def dynamic(self, x_in: torch.Tensor) -> torch.Tensor:
        """Per-row corrections [..., 2, ks, G] of both sides, from the normed sublayer input.

        The side-1 conv (after the sublayer) reuses them: they are not recomputed from its output.
        """
        return self.kernel_projection(x_in).unflatten(-1, (2, self.kernel_size, self.groups))

    def conv(self, x: torch.Tensor, dyn: torch.Tensor, side: int) -> torch.Tensor:
        rows = x.shape[-2]
        xg = x.unflatten(-1, (self.groups, self.group_size))  # [..., rows, G, gs]
        y = None
        for t in range(self.kernel_size):
            xt = xg
            if t:
                # Row i reads row i - t; rows before the block start read zero (pad, then keep `rows`).
                xt = F.pad(xg, (0, 0, 0, 0, t, 0))[..., :rows, :, :]
                if self.block_rows is not None:
                    pos = torch.arange(rows, device=x.device) % self.block_rows
                    xt = xt * (pos >= t).to(x.dtype)[:, None, None]
            k = self.base_kernel[side, t].view(self.groups, self.group_size) + dyn[..., side, t, :, None]
            y = k * xt if y is None else y + k * xt
        return y.flatten(-2)


# --- decoder layer and models ---------------------------------------------------------------------


class DFlash2DecoderLayer(Qwen3DFlashDecoderLayer):
    """optimum's DFlash layer with a prepare conv before and a finish conv after each sublayer.

    Attention gets the prepared block rows as `hidden_states`, so queries and the block's own keys
    and values come from the conv output; the context K/V (from `target_hidden`) pass no conv.
    """

    def __init__(self, config, layer_idx: int):
        super().__init__(config, layer_idx)
        ks, gs = dflash_value(config, "conv_kernel_size"), dflash_value(config, "conv_group_size")
        self.attention_conv = GroupedDynamicCausalConv(config.hidden_size, ks, gs)
        self.mlp_conv = GroupedDynamicCausalConv(config.hidden_size, ks, gs)

    def forward(self, target_hidden, hidden_states, attention_mask=None, position_ids=None, past_key_value=None,
                output_attentions=False, use_cache=False, cache_position=None, position_embeddings=None, **kwargs):
        n = self.input_layernorm(hidden_states)
        dyn = self.attention_conv.dynamic(n)
        attn = self.self_attn(
            hidden_states=self.attention_conv.conv(n, dyn, 0),
            target_hidden=target_hidden,
            attention_mask=attention_mask,
            position_ids=position_ids,
            past_key_values=past_key_value,
            output_attentions=output_attentions,
            use_cache=use_cache,
            cache_position=cache_position,
            position_embeddings=position_embeddings,
            **kwargs,
        )[0]
        h = hidden_states + self.attention_conv.conv(attn, dyn, 1)
        n = self.post_attention_layernorm(h)
        dyn = self.mlp_conv.dynamic(n)
        return h + self.mlp_conv.conv(self.mlp(self.mlp_conv.conv(n, dyn, 0)), dyn, 1)


class CandidateSelector(nn.Module):
    """S_t(a, b) = U_t(b) + <A[a] * H(h_t), B[b]> over the top-K draft candidates b of row t.

    a is the token chosen for the row before (the anchor for the first proposal), U_t the draft
    logits, h_t the final-normed draft hidden state. The codebooks are bare Parameters [V, R], as
    the checkpoint names them (no `.weight`).
    """

    def __init__(self, hidden_size: int, rank: int, vocab_size: int, top_k: int):
        super().__init__()
        self.top_k = top_k
        self.hidden_projection = nn.Linear(hidden_size, rank, bias=False)
        self.predecessor_codebook = nn.Parameter(torch.zeros(vocab_size, rank))
        self.successor_codebook = nn.Parameter(torch.zeros(vocab_size, rank))

    def scores(self, hidden, predecessor, candidates, candidate_logits):
        """S_t over the candidates: hidden [..., H], predecessor [...], candidates/logits [..., K] -> [..., K]."""
        gated = self.predecessor_codebook[predecessor] * self.hidden_projection(hidden)  # [..., R]
        return candidate_logits + (self.successor_codebook[candidates] @ gated.unsqueeze(-1)).squeeze(-1)

    @torch.no_grad()
    def select(self, logits, hidden, anchor):
        """Greedy walk over the block: logits [..., T, V] and hidden [..., T, H] of rows 1..B-1,
        anchor [...] (the last committed token) -> proposed tokens [..., T]."""
        values, candidates = torch.topk(logits, self.top_k, dim=-1)
        pred = torch.as_tensor(anchor, device=logits.device)
        out = []
        for t in range(logits.shape[-2]):
            s = self.scores(hidden[..., t, :], pred, candidates[..., t, :], values[..., t, :])
            pred = candidates[..., t, :].gather(-1, s.argmax(-1, keepdim=True)).squeeze(-1)
            out.append(pred)
        return torch.stack(out, dim=-1)


class DFlash2DraftModel(Qwen3DFlashDraftModel):
    """Training form: `forward(position_ids, attention_mask, noise_embedding, hidden_states, ...)`,
    every block row out (final-normed). The selector is not part of the forward: it runs on the
    output, after the target's lm_head."""

    def __init__(self, config, block_rows: int | None = None):
        missing = [k for k in DFLASH2_KEYS if dflash_value(config, k) is None]
        if missing:
            raise ValueError(f"not a DFlash 2 config: no {', '.join(missing)} under dflash_config or at the top level")
        super().__init__(config)
        # optimum builds v1 layers; the DFlash 2 layers replace them (same parameter names, plus convs).
        self.layers = nn.ModuleList(DFlash2DecoderLayer(config, i) for i in range(config.num_hidden_layers))
        self.candidate_selector = CandidateSelector(config.hidden_size, dflash_value(config, "selector_rank"),
                                                    config.vocab_size, dflash_value(config, "selector_top_k"))
        self.layers.apply(self._init_weights)  # HF init of the new Linear/norm weights, then ours
        std = getattr(config, "initializer_range", 0.02)
        self.candidate_selector.apply(self._init_weights)
        nn.init.normal_(self.candidate_selector.predecessor_codebook, std=std)
        nn.init.normal_(self.candidate_selector.successor_codebook, std=std)
        for conv in self.convs():
            conv.reset_to_identity()  # a fresh model computes the v1 function
        self.set_block_rows(block_rows)

    def convs(self):
        return [m for m in self.modules() if isinstance(m, GroupedDynamicCausalConv)]

    def set_block_rows(self, block_rows: int | None) -> None:
        """Rows per block along the row axis (training packs several blocks); None: one block."""
        for conv in self.convs():
            conv.block_rows = block_rows


class DFlash2ForCausalLM(DFlash2DraftModel, Qwen3DFlashForCausalLM):
    """Export form: optimum's `Qwen3DFlashForCausalLM.forward` (inputs_embeds in, seed row dropped)
    on the DFlash 2 layers."""


# --- loading ---------------------------------------------------------------------------------------


def dflash2_config(folder):
    """The Qwen3Config of a DFlash 2 checkpoint folder (extra keys such as dflash_config kept)."""
    from transformers import Qwen3Config

    raw = json.loads((Path(folder) / "config.json").read_text())
    if raw.get("model_type") != "qwen3":
        raise ValueError(f"{folder}: model_type {raw.get('model_type')!r}, expected qwen3")
    return Qwen3Config(**{k: v for k, v in raw.items() if k not in ("dtype", "torch_dtype", "transformers_version")})


def load_dflash2(folder, cls=DFlash2ForCausalLM, dtype=torch.float32):
    """Load config.json + safetensors of `folder` into `cls`, every key and shape checked first.

    load_state_dict(strict=False) would silently keep random weights for misnamed keys; strict=True
    alone reports names but not the reason, so the differences are listed here.
    """
    from safetensors.torch import load_file

    from ..hf.checkpoint import safetensors_files

    config = dflash2_config(folder)
    model = cls(config)
    state = {}
    for f in safetensors_files(folder):
        state.update(load_file(str(f)))
    expected = model.state_dict()
    missing = sorted(set(expected) - set(state))
    unexpected = sorted(set(state) - set(expected))
    shapes = sorted(f"{k} {list(state[k].shape)} != {list(expected[k].shape)}"
                    for k in set(state) & set(expected) if state[k].shape != expected[k].shape)
    if missing or unexpected or shapes:
        raise ValueError(f"{folder} does not fit {cls.__name__}: missing {missing[:8]}, "
                         f"unexpected {unexpected[:8]}, shapes {shapes[:8]}")
    model.load_state_dict({k: v.to(dtype) for k, v in state.items()}, strict=True)
    return model.to(dtype).eval()


def export_with_optimum(model, out_dir) -> Path:
    """The export form traced by optimum-intel's stateful DFlash export, as the fixture build
    exports its v1 reference draft; returns the .xml path.

    optimum recognises a DFlash draft by the v1 architecture name (and then writes the dflash
    rt_info), so the export config says DFlashDraftModel; the graph traced is this model's,
    convolutions included. The selector is not in the graph: GenAI proposes the top-1 tokens.
    """
    import copy

    from optimum.exporters.openvino.convert import export
    from optimum.exporters.openvino.model_configs import Qwen3OpenVINOConfig

    config = copy.deepcopy(model.config)
    config.architectures = ["DFlashDraftModel"]
    xml = Path(out_dir) / IR_XML
    export(model=model.eval(), output=xml, stateful=True, library_name="transformers",
           config=Qwen3OpenVINOConfig(config, task="text-generation", use_past=True, use_past_in_inputs=True))
    return xml
