"""Tiny DFlash drafts and targets for the export and verify tests, built once per test session.

The committed fixtures (fixtures/tiny-dflash: a trained pair) are used when present; otherwise a
tiny random draft and target are built in a temporary folder. The broken drafts reproduce the
silent failures measured with GenAI by exporting the way a naive script would.
"""

import json
import shutil
import xml.etree.ElementTree as ET
from pathlib import Path

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "tiny-dflash"

DRAFT_CONFIG = {
    "architectures": ["DFlashDraftModel"],
    "model_type": "qwen3",
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 1,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "vocab_size": 320,
    "rms_norm_eps": 1e-6,
    "rope_theta": 10000.0,
    "max_position_embeddings": 512,
    "initializer_range": 0.02,
    "tie_word_embeddings": False,
    "dflash_config": {"target_layer_ids": [0, 2], "mask_token_id": 1, "block_size": 4},
}
TARGET_LAYERS = 4

_BUILT: dict[str, Path] = {}
_MADE: dict[str, object] = {}


def once(name: str, factory, build) -> Path:
    """Build `name` into a fresh session folder the first time it is asked for."""
    if name not in _BUILT:
        path = factory.mktemp(name)
        _MADE[name] = build(path)
        _BUILT[name] = path
    return _BUILT[name]


def made(name: str):
    """What the build of `name` returned (a stage's result), once `once` has built it."""
    return _MADE[name]


def write_checkpoint(path: Path, config: dict | None = None, prefix: str = "", extra: dict | None = None,
                     seed: int = 1) -> Path:
    """A draft checkpoint whose weights look trained (norms off 1.0, projections off the init std)."""
    import torch
    from optimum.exporters.openvino.model_patcher import Qwen3DFlashForCausalLM
    from safetensors.torch import save_file
    from transformers import Qwen3Config

    config = config or DRAFT_CONFIG
    torch.manual_seed(seed)
    model = Qwen3DFlashForCausalLM(Qwen3Config.from_dict(config))
    state = {}
    for name, value in model.state_dict().items():
        value = 1 + 0.2 * torch.randn_like(value) if name.endswith("norm.weight") else 2.5 * value
        state[prefix + name] = value.contiguous()
    state.update(extra or {})
    path.mkdir(parents=True, exist_ok=True)
    save_file(state, str(path / "model.safetensors"))
    (path / "config.json").write_text(json.dumps(config, indent=2))
    return path


def draft_model(config: dict):
    """optimum's v1 DFlash draft class built from a draft's config.json dict (freshly initialised)."""
    from optimum.exporters.openvino.model_patcher import Qwen3DFlashForCausalLM
    from transformers import Qwen3Config

    return Qwen3DFlashForCausalLM(Qwen3Config(**{k: v for k, v in config.items() if k not in ("dtype", "torch_dtype")}))


def random_checkpoint(config: dict, out_dir: Path, seed: int = 0) -> Path:
    """A v1 draft with `config` and the seeded random initialisation of optimum's class: attaches,
    runs, and is never accepted."""
    import torch
    from safetensors.torch import save_file

    torch.manual_seed(seed)
    model = draft_model(config)
    out_dir.mkdir(parents=True)
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(out_dir / "model.safetensors"),
              metadata={"format": "pt"})
    (out_dir / "config.json").write_text(json.dumps(config, indent=2))
    return out_dir


def dflash2_config(kernel: int = 2, group: int = 16, rank: int = 8, **extra) -> dict:
    config = json.loads(json.dumps(DRAFT_CONFIG))
    config.update(architectures=["DFlash2DraftModel"], is_causal=False, **extra)
    config["dflash_config"].update(conv_kernel_size=kernel, conv_group_size=group, selector_rank=rank,
                                   selector_top_k=4)
    return config


def dflash2_tensors(config: dict, identity: bool = False, seed: int = 2) -> dict:
    """A DFlash 2 draft's convolutions and selector; `identity` makes every convolution pass its input through."""
    import torch

    g = torch.Generator().manual_seed(seed)
    h, layers = config["hidden_size"], config["num_hidden_layers"]
    d = config["dflash_config"]
    ks, groups, rank, vocab = d["conv_kernel_size"], h // d["conv_group_size"], d["selector_rank"], config["vocab_size"]
    out = {}
    for i in range(layers):
        for conv in ("attention_conv", "mlp_conv"):
            base = torch.zeros(2, ks, h)
            base[:, 0] = 1.0
            projection = torch.zeros(2 * ks * groups, h)
            if not identity:
                base = base + 0.3 * torch.randn(2, ks, h, generator=g)
                projection = 0.1 * torch.randn(2 * ks * groups, h, generator=g)
            out[f"layers.{i}.{conv}.base_kernel"] = base
            out[f"layers.{i}.{conv}.kernel_projection.weight"] = projection
    out["candidate_selector.hidden_projection.weight"] = 0.1 * torch.randn(rank, h, generator=g)
    out["candidate_selector.predecessor_codebook"] = torch.randn(vocab, rank, generator=g)
    out["candidate_selector.successor_codebook"] = torch.randn(vocab, rank, generator=g)
    return out


def write_dflash2_checkpoint(path: Path, identity: bool = False, seed: int = 1, **config_args) -> Path:
    """A DFlash 2 draft: the v1 weights of `write_checkpoint` plus live (or identity) convolutions."""
    config = dflash2_config(**config_args)
    return write_checkpoint(path, config=config, extra=dflash2_tensors(config, identity, seed + 1), seed=seed)


def edit_convolutions(src: Path, dst: Path, mode: str) -> Path:
    """A copy of a DFlash 2 checkpoint with its convolutions changed: "identity" passes every input
    through (base tap 0 = 1, everything else 0); "no-shift" drops tap 1 and beyond (the rows before),
    leaving each row's own term: what a shift that silently read zeros would compute."""
    from safetensors.torch import load_file, save_file

    config = json.loads((src / "config.json").read_text())
    groups = config["hidden_size"] // config["dflash_config"]["conv_group_size"]
    state = load_file(str(src / "model.safetensors"))
    for name, value in state.items():
        if name.endswith("_conv.base_kernel"):
            value = value.clone()
            if mode == "identity":
                value[:, 0] = 1
            value[:, 1:] = 0
        elif name.endswith("_conv.kernel_projection.weight"):
            value = value.clone()
            rows = value.view(2, -1, groups, value.shape[-1])  # [side, tap, group, in]
            if mode == "identity":
                rows[:, 0] = 0
            rows[:, 1:] = 0
        state[name] = value.contiguous()
    dst.mkdir(parents=True, exist_ok=True)
    save_file(state, str(dst / "model.safetensors"), metadata={"format": "pt"})
    (dst / "config.json").write_text(json.dumps(config, indent=2))
    return dst


def no_slice_class():
    """The Qwen3DFlashDraftModel behaviour (every row, seed included) behind the causal-LM signature."""
    from optimum.exporters.openvino.model_patcher import Qwen3DFlashDraftModel, Qwen3DFlashForCausalLM

    class NoSliceDraft(Qwen3DFlashForCausalLM):
        def forward(self, inputs_embeds, hidden_states, position_ids, attention_mask=None, past_key_values=None,
                    use_cache=None, logits_to_keep=None, **kwargs):
            return Qwen3DFlashDraftModel.forward(
                self, hidden_states=hidden_states, noise_embedding=inputs_embeds, position_ids=position_ids,
                attention_mask=attention_mask, past_key_values=past_key_values, use_cache=use_cache, **kwargs)

    return NoSliceDraft


def naive_export(checkpoint: Path, out: Path, model_class=None, stateful: bool = True) -> Path:
    """Export like a naive conversion script: strict=False loading, no key check, optimum's rt_info only."""
    from optimum.exporters.openvino.convert import export
    from optimum.exporters.openvino.model_configs import Qwen3OpenVINOConfig
    from optimum.exporters.openvino.model_patcher import Qwen3DFlashForCausalLM
    from safetensors.torch import load_file
    from transformers import Qwen3Config

    config = Qwen3Config.from_dict(json.loads((checkpoint / "config.json").read_text()))
    model = (model_class or Qwen3DFlashForCausalLM)(config)
    model.load_state_dict(load_file(str(checkpoint / "model.safetensors")), strict=False)
    export(model=model.eval(),
           config=Qwen3OpenVINOConfig(config, task="text-generation", use_past=True, use_past_in_inputs=stateful),
           output=out / "openvino_model.xml", stateful=stateful, library_name="transformers")
    shutil.copy(checkpoint / "config.json", out / "config.json")  # export puts it next to the IR too
    return out


def prefixed_checkpoint(checkpoint: Path, out: Path) -> Path:
    """The same weights under a `model.` prefix (what strict=False silently ignores)."""
    from safetensors.torch import load_file, save_file

    state = load_file(str(checkpoint / "model.safetensors"))
    out.mkdir(parents=True, exist_ok=True)
    save_file({f"model.{k}": v for k, v in state.items()}, str(out / "model.safetensors"))
    shutil.copy(checkpoint / "config.json", out / "config.json")
    return out


def edit_ir(src: Path, out: Path, drop_rt_info=(), set_rt_info: dict | None = None) -> Path:
    """Copy an IR, removing or changing top-level rt_info entries in its XML."""
    shutil.copytree(src, out, dirs_exist_ok=True)
    tree = ET.parse(src / "openvino_model.xml")
    rt = tree.getroot().find("rt_info")
    for name in drop_rt_info:
        for el in rt.findall(name):
            rt.remove(el)
    for path, value in (set_rt_info or {}).items():
        el = rt
        for part in path.split("/"):
            el = el.find(part)
        el.set("value", value)
    tree.write(out / "openvino_model.xml")
    return out


DFLASH_RT_INFO = {"dflash_mode": "True", "dflash/mask_token_id": "1", "dflash/target_layer_ids": "1,2"}


def rt_info_ir(out: Path, rt_info: dict | None = None) -> Path:
    """An IR of one op carrying `rt_info` (default: a DFlash draft's three keys), for commands that read
    a draft folder's rt_info and nothing else."""
    import openvino as ov
    import openvino.opset13 as ops

    x = ops.parameter([1, 4], ov.Type.f32, name="x")
    model = ov.Model([ops.relu(x)], [x], "draft")
    for key, value in (DFLASH_RT_INFO if rt_info is None else rt_info).items():
        model.set_rt_info(value, key.split("/"))
    ov.save_model(model, str(out / "openvino_model.xml"))
    return out


def _tokenizer(words: str, vocab_size: int):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=["<|endoftext|>", "<|mask|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator([words] * 10, trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|endoftext|>", pad_token="<|endoftext|>")


def build_target(out: Path) -> None:
    """A random tiny Qwen3 target exported with optimum (hidden-state locators) plus its tokenizer."""
    import openvino as ov
    import torch
    from openvino_tokenizers import convert_tokenizer
    from optimum.exporters.openvino import main_export
    from transformers import Qwen3Config, Qwen3ForCausalLM

    hf = out / "hf"
    tokenizer = _tokenizer("the quick brown fox jumps over the lazy dog, hello world", 300)
    config = Qwen3Config(hidden_size=DRAFT_CONFIG["hidden_size"], intermediate_size=128, num_hidden_layers=TARGET_LAYERS,
                         num_attention_heads=4, num_key_value_heads=2, head_dim=16, vocab_size=DRAFT_CONFIG["vocab_size"],
                         tie_word_embeddings=False, eos_token_id=0, bos_token_id=0, pad_token_id=0)
    torch.manual_seed(0)
    Qwen3ForCausalLM(config).save_pretrained(hf)
    tokenizer.save_pretrained(hf)
    ir = out / "ir"
    main_export(str(hf), str(ir), task="text-generation-with-past")
    tok, detok = convert_tokenizer(tokenizer, with_detokenizer=True)
    ov.save_model(tok, str(ir / "openvino_tokenizer.xml"))
    ov.save_model(detok, str(ir / "openvino_detokenizer.xml"))


def fixture_pair() -> bool:
    """Whether the committed trained pair is there (draft checkpoint and target IR)."""
    return (FIXTURES / "draft-ref" / "model.safetensors").is_file() and (FIXTURES / "target" / "openvino_model.xml").is_file()


def draft_checkpoint(factory) -> Path:
    if fixture_pair():
        return FIXTURES / "draft-ref"
    return once("draft-ckpt", factory, write_checkpoint)


def target_dir(factory) -> Path:
    """The target matching `draft_checkpoint()`."""
    if fixture_pair():
        return FIXTURES / "target"
    return once("target", factory, build_target) / "ir"


def draft_gguf(factory) -> Path:
    """A dflash GGUF of `draft_checkpoint()`: the committed Q4_K_M file, or one written here."""
    if fixture_pair() and (FIXTURES / "draft-Q4_K_M.gguf").is_file():
        return FIXTURES / "draft-Q4_K_M.gguf"
    from gguf2ov.tools.gguf_writer import write_dflash_gguf

    # Q8_0: K-quants need rows of 256 and the tiny draft's are 64 wide.
    return once("draft-gguf", factory, lambda p: write_dflash_gguf(draft_checkpoint(factory), p / "draft.gguf",
                                                                   mix="Q8_0")) / "draft.gguf"


def target_with_config(target: Path, out: Path, **changes) -> Path:
    """A copy of a target whose config.json differs (the IR files are linked, not copied)."""
    for f in target.iterdir():
        if f.is_file() and f.name != "config.json":
            (out / f.name).symlink_to(f.resolve())
    config = json.loads((target / "config.json").read_text())
    config.update(changes)
    (out / "config.json").write_text(json.dumps(config, indent=2))
    return out
