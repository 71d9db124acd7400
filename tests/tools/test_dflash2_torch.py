"""The PyTorch DFlash 2 reference: the convolution formula, the v1 equivalence of identity convs,
the selector's walk, the config reading and the strict loader."""

import json

import pytest
import torch
from safetensors.torch import save_file

from gguf2ov.tools.dflash2_torch import (CandidateSelector, DFlash2DraftModel, DFlash2ForCausalLM,
                                         GroupedDynamicCausalConv, dflash_value, load_dflash2)

DFLASH2 = {"conv_kernel_size": 2, "conv_group_size": 16, "selector_rank": 8, "selector_top_k": 4}


def _conv_by_loop(x, x_in, base, proj, side, group_size, block_rows=None):
    """The formula written out element by element, reading the projection rows as
    side*ks*G + tap*G + g and the base as [side, tap, channel]."""
    batch, rows, hidden = x.shape
    ks = base.shape[1]
    groups = hidden // group_size
    d = x_in @ proj.T  # [batch, rows, 2*ks*G]
    y = torch.zeros_like(x)
    for b in range(batch):
        for i in range(rows):
            start = i - i % block_rows if block_rows else 0
            for c in range(hidden):
                g = c // group_size
                for t in range(ks):
                    if i - t < start:
                        continue  # before the block start: zero padding
                    k = base[side, t, c] + d[b, i, side * ks * groups + t * groups + g]
                    y[b, i, c] += k * x[b, i - t, c]
    return y


@pytest.mark.parametrize("ks", [2, 3])
def test_conv_equals_the_formula(ks):
    torch.manual_seed(0)
    hidden, gs = 32, 8
    conv = GroupedDynamicCausalConv(hidden, ks, gs).double()
    with torch.no_grad():
        conv.base_kernel.normal_()
        conv.kernel_projection.weight.normal_()
    x_in = torch.randn(2, 5, hidden, dtype=torch.float64)
    x = torch.randn(2, 5, hidden, dtype=torch.float64)
    dyn = conv.dynamic(x_in)
    assert dyn.shape == (2, 5, 2, ks, hidden // gs)
    for side in (0, 1):
        want = _conv_by_loop(x, x_in, conv.base_kernel.detach(), conv.kernel_projection.weight.detach(), side, gs)
        got = conv.conv(x, dyn, side)
        torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)
        # row 0 (the anchor) reads only itself: every other tap sees zero
        row0 = (conv.base_kernel[side, 0] + dyn[:, 0, side, 0].repeat_interleave(gs, -1)) * x[:, 0]
        torch.testing.assert_close(got[:, 0], row0, rtol=1e-12, atol=1e-12)


def test_packed_blocks_restart_the_padding():
    torch.manual_seed(1)
    conv = GroupedDynamicCausalConv(32, 2, 8).double()
    with torch.no_grad():
        conv.base_kernel.normal_()
        conv.kernel_projection.weight.normal_()
    x, x_in = torch.randn(2, 1, 12, 32, dtype=torch.float64).unbind(0)
    conv.block_rows = 4
    packed = conv.conv(x, conv.dynamic(x_in), 1)
    want = _conv_by_loop(x, x_in, conv.base_kernel.detach(), conv.kernel_projection.weight.detach(), 1, 8, 4)
    torch.testing.assert_close(packed, want, rtol=1e-12, atol=1e-12)
    conv.block_rows = None
    for k in range(3):  # each block alone gives the same rows
        rows = slice(4 * k, 4 * k + 4)
        torch.testing.assert_close(conv.conv(x[:, rows], conv.dynamic(x_in[:, rows]), 1), packed[:, rows])


def test_projection_layout_group_is_fastest():
    hidden, gs, ks = 32, 8, 2
    conv = GroupedDynamicCausalConv(hidden, ks, gs)
    side, tap, g = 1, 1, 2
    with torch.no_grad():
        conv.kernel_projection.weight[side * ks * 4 + tap * 4 + g, 0] = 1.0  # reads channel 0 of x_in
    x_in = torch.zeros(1, 3, hidden)
    x_in[0, :, 0] = torch.tensor([1.0, 2.0, 3.0])
    dyn = conv.dynamic(x_in)
    assert torch.nonzero(dyn).tolist() == [[0, i, side, tap, g] for i in range(3)]
    # only the channels of group 2 of side 1 pick up the correction, and only through tap 1
    x = torch.ones(1, 3, hidden)
    y = conv.conv(x, dyn, 1)
    changed = torch.nonzero((y - x)[0, 2]).flatten().tolist()
    assert changed == list(range(g * gs, (g + 1) * gs))
    assert torch.equal(y[0, 0], x[0, 0])  # row 0's tap 1 reads zero
    assert torch.equal(conv.conv(x, dyn, 0), x)  # side 0 untouched


def _config(v1_cfg: dict, **dflash2):
    from transformers import Qwen3Config

    cfg = dict(v1_cfg, architectures=["DFlash2DraftModel"], is_causal=False)
    cfg["dflash_config"] = dict(cfg["dflash_config"], **(dflash2 or DFLASH2))
    return Qwen3Config(**{k: v for k, v in cfg.items() if k != "dtype"}), cfg


def _v1(fixtures_dir):
    from optimum.exporters.openvino.model_patcher import Qwen3DFlashForCausalLM
    from safetensors.torch import load_file
    from transformers import Qwen3Config

    raw = json.loads((fixtures_dir / "draft-ref/config.json").read_text())
    v1 = Qwen3DFlashForCausalLM(Qwen3Config(**{k: v for k, v in raw.items() if k != "dtype"}))
    sd = {k: v.float() for k, v in load_file(str(fixtures_dir / "draft-ref/model.safetensors")).items()}
    v1.load_state_dict(sd, strict=True)
    return raw, v1.eval(), sd


def _inputs(ctx=11, rows=8, hidden=256, taps=2, seed=0):
    g = torch.Generator().manual_seed(seed)
    return dict(
        inputs_embeds=torch.randn(1, rows, hidden, generator=g) * 0.05,
        hidden_states=torch.randn(1, ctx, taps * hidden, generator=g),
        position_ids=torch.arange(ctx + rows)[None],
        attention_mask=torch.ones(1, ctx + rows),
    )


def test_identity_convs_reproduce_the_v1_draft_exactly(fixtures_dir):
    raw, v1, sd = _v1(fixtures_dir)
    cfg, _ = _config(raw)
    draft = DFlash2ForCausalLM(cfg).eval()
    missing, unexpected = draft.load_state_dict(sd, strict=False)
    assert not unexpected and all(".attention_conv." in k or ".mlp_conv." in k or "candidate_selector." in k
                                  for k in missing)
    # a fresh model's convs are the identity: base tap 0 = 1, tap 1 = 0, projection 0
    with torch.no_grad():
        for step in range(3):  # three calls with a carried context cache, as GenAI makes them
            x = _inputs(ctx=(11, 4, 6)[step], seed=step)
            if step == 0:
                cache_v1 = cache_v2 = None
            else:
                past = sum((11, 4, 6)[:step])  # only context rows are cached
                x["position_ids"] = x["position_ids"] + past
                x["attention_mask"] = torch.ones(1, past + x["attention_mask"].shape[1])
            out_v1 = v1(**x, past_key_values=cache_v1, use_cache=True)
            out_v2 = draft(**x, past_key_values=cache_v2, use_cache=True)
            cache_v1, cache_v2 = out_v1.past_key_values, out_v2.past_key_values
            assert out_v2.last_hidden_state.shape == (1, 7, 256)
            assert torch.equal(out_v1.last_hidden_state, out_v2.last_hidden_state), step
        # the convs are live: a tap-1 base weight changes the output
        draft.layers[0].attention_conv.base_kernel[0, 1] = 0.5
        moved = draft(**_inputs()).last_hidden_state
        plain = v1(**_inputs()).last_hidden_state
        assert (moved - plain).abs().max() > 1e-2


def test_training_form_packs_blocks_like_separate_calls(fixtures_dir):
    """Two blocks packed along the row axis (block_rows set, a mask keeping them apart) give the
    rows that separate export-form calls give."""
    raw, _, sd = _v1(fixtures_dir)
    cfg, _ = _config(raw)
    torch.manual_seed(0)
    train = DFlash2DraftModel(cfg, block_rows=8).eval()
    train.load_state_dict(sd, strict=False)
    with torch.no_grad():
        for conv in train.convs():
            conv.base_kernel.add_(torch.randn_like(conv.base_kernel) * 0.2)
            conv.kernel_projection.weight.normal_(std=0.05)
    export = DFlash2ForCausalLM(cfg).eval()
    export.load_state_dict(train.state_dict(), strict=True)
    ctx, anchors = 20, (9, 15)
    x = _inputs(ctx=ctx, rows=16, seed=3)
    pos = torch.cat([torch.arange(ctx), torch.arange(9, 17), torch.arange(15, 23)])[None]
    allowed = torch.zeros(16, ctx + 16, dtype=torch.bool)
    for k, p in enumerate(anchors):
        allowed[8 * k: 8 * k + 8, :p] = True
        allowed[8 * k: 8 * k + 8, ctx + 8 * k: ctx + 8 * k + 8] = True
    mask = torch.zeros(allowed.shape).masked_fill(~allowed, torch.finfo(torch.float32).min)[None, None]
    with torch.no_grad():
        packed = train(position_ids=pos, attention_mask=mask, noise_embedding=x["inputs_embeds"],
                       hidden_states=x["hidden_states"], use_cache=False).last_hidden_state
        for k, p in enumerate(anchors):
            alone = export(inputs_embeds=x["inputs_embeds"][:, 8 * k: 8 * k + 8],
                           hidden_states=x["hidden_states"][:, :p], position_ids=torch.arange(p + 8)[None],
                           attention_mask=torch.ones(1, p + 8), use_cache=False).last_hidden_state
            torch.testing.assert_close(packed[:, 8 * k + 1: 8 * k + 8], alone, rtol=1e-5, atol=1e-5)
        # without block_rows the second block's anchor would read the first block's last row
        train.set_block_rows(None)
        leaky = train(position_ids=pos, attention_mask=mask, noise_embedding=x["inputs_embeds"],
                      hidden_states=x["hidden_states"], use_cache=False).last_hidden_state
        assert (leaky[:, 8] - packed[:, 8]).abs().max() > 1e-3


def _selector():
    """V=6, R=2, K=2 with H = identity: the gate is the hidden row itself."""
    sel = CandidateSelector(hidden_size=2, rank=2, vocab_size=6, top_k=2)
    with torch.no_grad():
        sel.hidden_projection.weight.copy_(torch.eye(2))
        sel.predecessor_codebook.zero_()
        sel.successor_codebook.zero_()
        sel.predecessor_codebook[0] = torch.tensor([1.0, 0.0])  # anchor 0 favours successors along r=0
        sel.predecessor_codebook[2] = torch.tensor([0.0, 1.0])  # token 2 favours successors along r=1
        sel.successor_codebook[2] = torch.tensor([1.0, 0.0])
        sel.successor_codebook[4] = torch.tensor([0.0, 0.5])
    logits = torch.full((3, 6), -5.0)
    logits[0, 1], logits[0, 2] = 2.0, 1.5   # top-1: 1; after anchor 0: 1.5 + 1 beats 2.0 -> 2
    logits[1, 3], logits[1, 4] = 1.0, 0.8   # top-1: 3; after 2: 0.8 + 0.5 beats 1.0 -> 4
    logits[2, 5], logits[2, 0] = 3.0, 1.0   # 4 has a zero predecessor row: the logits decide -> 5
    return sel, logits, torch.ones(3, 2)


def test_selector_walk_hand_made():
    sel, logits, hidden = _selector()
    assert sel.select(logits, hidden, 0).tolist() == [2, 4, 5]
    assert logits.argmax(-1).tolist() == [1, 3, 5]
    # anchor 1 has a zero predecessor row: the first step keeps the top-1, and so do the next ones
    assert sel.select(logits, hidden, 1).tolist() == [1, 3, 5]
    # batched over blocks, each with its own anchor
    both = sel.select(torch.stack([logits, logits]), torch.stack([hidden, hidden]), torch.tensor([0, 1]))
    assert both.tolist() == [[2, 4, 5], [1, 3, 5]]
    # the scores are U + <A[a] * H(h), B[b]>
    s = sel.scores(hidden[0], torch.tensor(0), torch.tensor([1, 2]), torch.tensor([2.0, 1.5]))
    torch.testing.assert_close(s, torch.tensor([2.0, 2.5]))


def test_dflash_keys_read_nested_first():
    assert dflash_value({"block_size": 16, "dflash_config": {"block_size": 8}}, "block_size") == 8
    assert dflash_value({"block_size": 16, "dflash_config": {}}, "block_size") == 16
    assert dflash_value({"dflash_config": None}, "selector_rank", 3) == 3
    from transformers import Qwen3Config

    assert dflash_value(Qwen3Config(conv_group_size=4, dflash_config={"conv_group_size": 16}), "conv_group_size") == 16


def test_a_v1_config_is_refused():
    from transformers import Qwen3Config

    with pytest.raises(ValueError, match="not a DFlash 2 config"):
        DFlash2DraftModel(Qwen3Config(hidden_size=32, dflash_config={"target_layer_ids": [0]}))


def test_loader_is_strict(tmp_path, fixtures_dir):
    raw, _, _ = _v1(fixtures_dir)
    cfg, cfg_dict = _config(raw)
    torch.manual_seed(0)
    model = DFlash2ForCausalLM(cfg)
    sd = {k: v.contiguous() for k, v in model.state_dict().items()}
    (tmp_path / "config.json").write_text(json.dumps(cfg_dict))
    save_file(sd, str(tmp_path / "model.safetensors"))
    back = load_dflash2(tmp_path)
    assert all(torch.equal(back.state_dict()[k], v) for k, v in sd.items())
    assert back.candidate_selector.top_k == DFLASH2["selector_top_k"]

    save_file({**sd, "model.norm.weight": sd["norm.weight"].clone()}, str(tmp_path / "model.safetensors"))
    with pytest.raises(ValueError, match=r"unexpected \['model.norm.weight'\]"):
        load_dflash2(tmp_path)
    save_file({k: v for k, v in sd.items() if "mlp_conv" not in k}, str(tmp_path / "model.safetensors"))
    with pytest.raises(ValueError, match="missing .*layers.0.mlp_conv.base_kernel"):
        load_dflash2(tmp_path)
