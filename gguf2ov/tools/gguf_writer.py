"""Write a checkpoint as a GGUF, the way llama.cpp's converter and quantizer do (a DFlash draft by
default; any architecture a map describes).

Names and metadata come from the architecture's map (`tensor_maps/dflash.yaml`) run backwards, so a
file written here converts back with the same map. The type mix is llama.cpp's `llama-quant.cpp` for the chosen
`mix`; blocks are quantized with `gguf2ov.gguf.quants` (llama.cpp's reference quantizers).
gguf-py has no DFLASH constants: the arch and keys are written as raw strings.
"""

import os
import re
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, GGUFWriter, TokenType

from ..errors import Gguf2ovError
from ..hf.checkpoint import Checkpoint, read_json_object
from ..maps.load import load_map
from ..progress import progress as progress_bar
from ..targets.source import ROPE_FACTORS, rope_factors_of

Q = GGMLQuantizationType
ARCH = "dflash"
QUANT_VERSION = 2  # GGML_QNT_VERSION
# mix -> (default type for 2-D weights, general.file_type as llama.cpp numbers it)
MIXES = {"Q4_K_M": (Q.Q4_K, 15), "Q8_0": (Q.Q8_0, 7), "MXFP4_MOE": (Q.MXFP4, 38), "F16": (Q.F16, 1), "F32": (Q.F32, 0)}
# llama.cpp's fallbacks when a row (ne[0]) is not a whole number of 256-weight super-blocks.
K_FALLBACK = {Q.Q4_K: Q.Q5_0, Q.Q5_K: Q.Q5_1, Q.Q6_K: Q.Q8_0}


@dataclass(frozen=True)
class GgufWriteResult:
    path: str
    n_tensors: int
    type_counts: dict[str, int]
    metadata_keys: list[str]


def use_more_bits(i: int, n: int) -> bool:
    """llama.cpp's layers that get more bits in *_M mixes: the first and last eighth, every third."""
    return i < n // 8 or i >= 7 * n // 8 or (i - n // 8) % 3 == 2


def tensor_type(gguf_name: str, shape: tuple[int, ...], mix: str, n_layers: int,
                n_expert: int = 1, pure: bool = False) -> GGMLQuantizationType:
    """The GGML type llama.cpp's quantizer picks for a tensor under `mix` (no importance matrix).
    `n_expert`: the model's expert count (`{arch}.expert_count`), which some of its rules read.
    `pure`: `llama-quantize --pure`, the mix's default type for every tensor it quantizes (MXFP4_MOE puts
    MXFP4 on the experts only, so a dense draft in MXFP4 is written `--pure`)."""
    default, _ = MIXES[mix]
    dims = len(shape) - next((i for i, d in enumerate(shape) if d != 1), len(shape))  # ggml_n_dims: ne {H, 1} is 1-D
    if dims < 2 or not gguf_name.endswith("weight") or "norm" in gguf_name or "ssm_conv1d" in gguf_name or \
            "ffn_gate_inp" in gguf_name:
        # norms, 1-D tensors, raw parameters (conv bases), recurrent layers' conv kernels and expert routers
        # (shared experts' gates too) stay F32, as llama.cpp writes them
        return Q.F32
    qtype = default
    if pure:
        pass
    elif mix == "MXFP4_MOE":  # the experts (ggml ne[2] > 1) in MXFP4, every other weight and the head in Q8_0
        qtype = Q.MXFP4 if len(shape) >= 3 and shape[-3] > 1 else Q.Q8_0
    elif mix == "Q4_K_M":
        layer = re.match(r"blk\.(\d+)\.", gguf_name)
        if gguf_name == "output.weight":
            qtype = Q.Q6_K
        # ffn_down names the experts' and a shared expert's too (ffn_down_exps, ffn_down_shexp)
        elif layer and re.search(r"\.(attn_v|ffn_down[a-z_]*)\.weight$", gguf_name) and \
                use_more_bits(int(layer[1]), n_layers):
            qtype = Q.Q6_K
        if n_expert == 8:  # llama-quant.cpp's rules for 8-expert models
            if re.search(r"\.attn_[kv]\.weight$", gguf_name):
                qtype = Q.Q8_0
            elif gguf_name.endswith(".attn_output.weight"):
                qtype = Q.Q5_K
    ne0 = shape[-1]
    if ne0 % GGML_QUANT_SIZES[qtype][0]:
        qtype = K_FALLBACK.get(qtype, qtype)
    if ne0 % GGML_QUANT_SIZES[qtype][0]:
        qtype = Q.F16
    return qtype


def write_dflash_gguf(checkpoint_dir, out_path, tokenizer_dir=None, mix: str = "Q4_K_M", legacy: bool = False,
                      progress: bool = False, tokenizer_pre: str = "qwen2", pure: bool = False) -> GgufWriteResult:
    """Write the HF DFlash draft in `checkpoint_dir` as a GGUF draft at `out_path`.

    `legacy=True` writes the first llama.cpp DFlash layout (target layers unshifted, mask token
    under `dflash.mask_token_id`). `tokenizer_dir` is the target's HF folder (tokenizer and config.json), whose
    vocabulary is written as llama.cpp's DFlash converter writes it from `--target-model-dir`: with the target's
    own converter (`vocabulary_of`), a gpt2-style BPE by default (`tokenizer_pre` names its pre-tokenizer).
    A draft that states the embedding scale it was trained with (`dflash.embedding_scale`) also records the
    embeddings it is fitted to be fed (`dflash.embedding_input_scale`: its config's, else 1, the table's rows,
    which llama.cpp feeds; gguf2ov/draft/embedding.py).
    """
    return write_gguf(checkpoint_dir, out_path, ARCH, tokenizer_dir, mix, legacy, progress, tokenizer_pre, pure=pure)


def write_gguf(checkpoint_dir, out_path, arch: str, tokenizer_dir=None, mix: str = "Q4_K_M", legacy: bool = False,
               progress: bool = False, tokenizer_pre: str = "qwen2", extra_metadata: dict | None = None,
               maps_dir=None, pure: bool = False) -> GgufWriteResult:
    """Write the HF checkpoint in `checkpoint_dir` as an `arch` GGUF, its map run backwards.

    `extra_metadata`: GGUF keys the map does not write back (a vocabulary size it only reads).
    `pure`: `llama-quantize --pure` (see `tensor_type`).
    """
    if mix not in MIXES:
        raise Gguf2ovError(f"unknown type mix {mix!r}; choose one of {', '.join(MIXES)}")
    checkpoint_dir = Path(checkpoint_dir)
    config = read_json_object(checkpoint_dir / "config.json")
    if arch == ARCH:
        config = with_embedding_form(config)
    amap = load_map(arch, maps_dir=maps_dir)
    checkpoint = Checkpoint(checkpoint_dir)
    n_layers = config["num_hidden_layers"]

    writer = GGUFWriter(path=None, arch=arch)
    writer.add_name(checkpoint_dir.name)
    writer.add_file_type(MIXES[mix][1])
    if MIXES[mix][0] not in (Q.F32, Q.F16):
        writer.add_quantization_version(QUANT_VERSION)
    metadata = amap.writer.gguf_metadata(config, legacy=legacy) | (extra_metadata or {})
    # Each key is written once. The tokenizer's special token ids (bos, eos, padding) come from
    # gguf-py's SpecialVocab, the only source llama.cpp's converter writes them from; the map would
    # write the same keys again from config.json (gguf-py keeps the last and warns).
    tokenizer_keys = set()
    if tokenizer_dir is not None:
        tokenizer_keys = _add_tokenizer(writer, Path(tokenizer_dir), config.get("vocab_size"), tokenizer_pre,
                                        vocabulary_of(amap, Path(tokenizer_dir)))
    for key, value in metadata.items():
        if key not in tokenizer_keys:
            add_value(writer, key, value)

    counts = {}
    n_expert = metadata.get(f"{arch}.expert_count", 1)
    renamed = amap.checkpoint.names(checkpoint.shapes, amap.arch, checkpoint_dir)  # the map's names for the stored ones
    names = stacked_experts(renamed)
    for hf_name in progress_bar(list(names), desc="quantizing", enabled=progress, unit="tensor"):
        # float32 whatever the checkpoint holds (often BF16): the quantizers take float32
        parts = [renamed[p] for p in names[hf_name]]
        values = np.stack([checkpoint.load(p) for p in parts]) if parts else checkpoint.load(renamed[hf_name])
        values = np.asarray(values, dtype=np.float32)
        gguf_name, values = amap.writer.to_gguf(hf_name, values, config)
        qtype = tensor_type(gguf_name, values.shape, mix, n_layers, n_expert, pure)
        _add_tensor(writer, gguf_name, values, qtype)
        counts[qtype.name] = counts.get(qtype.name, 0) + 1

    if amap.target is not None and (factors := rope_factors_of(config, amap)) is not None:
        _add_tensor(writer, ROPE_FACTORS, factors, Q.F32)  # as llama.cpp's converter adds it
        counts[Q.F32.name] = counts.get(Q.F32.name, 0) + 1

    out_path = Path(out_path)
    write_atomically(writer, out_path)
    return GgufWriteResult(str(out_path), sum(counts.values()), counts, sorted(metadata))


def with_embedding_form(config: dict) -> dict:
    """A draft config that states the embedding scale it was trained with, with the embeddings it is fitted to be
    fed stated too: its own, else 1 (the table's rows, which llama.cpp feeds). Other configs as they are."""
    from ..draft.config import EMBEDDING_INPUT_SCALE, EMBEDDING_SCALE

    dflash = config.get("dflash_config")
    if not isinstance(dflash, dict) or dflash.get(EMBEDDING_SCALE) in (None, 1) or EMBEDDING_INPUT_SCALE in dflash:
        return config
    return {**config, "dflash_config": {**dflash, EMBEDDING_INPUT_SCALE: 1.0}}


_EXPERT = re.compile(r"^(?P<head>.+\.experts)\.(?P<e>\d+)\.(?P<tail>\w+)\.weight$")


def stacked_experts(names) -> dict[str, tuple[str, ...]]:
    """{tensor: the per-expert tensors it stacks, or () for a tensor as stored}, in the checkpoint's
    order: a mixture of experts' 2-D weights `mlp.experts.{e}.gate_proj.weight` (as save_pretrained
    writes qwen3_moe) become one [E, N, K] tensor `mlp.experts.gate_proj`, as llama.cpp's converter
    stacks them into `ffn_gate_exps`."""
    out, stacks = {}, {}
    for name in names:
        if m := _EXPERT.match(name):
            stack = f"{m['head']}.{m['tail']}"
            stacks.setdefault(stack, {})[int(m["e"])] = name
            out.setdefault(stack, ())
        else:
            out[name] = ()
    for stack, parts in stacks.items():
        if sorted(parts) != list(range(len(parts))):
            raise Gguf2ovError(f"{stack}: experts {sorted(parts)[:8]} are not numbered 0..{len(parts) - 1}")
        out[stack] = tuple(parts[e] for e in range(len(parts)))
    return out


def _add_tensor(writer: GGUFWriter, name: str, values: np.ndarray, qtype) -> None:
    from ..gguf.quants import quantize

    if qtype == Q.F32:
        writer.add_tensor(name, np.ascontiguousarray(values, dtype=np.float32))
    elif qtype == Q.F16:
        writer.add_tensor(name, np.ascontiguousarray(values, dtype=np.float16))
    else:
        writer.add_tensor(name, quantize(values, qtype), raw_dtype=qtype)


def add_value(writer: GGUFWriter, key: str, value) -> None:
    # llama.cpp writes counts and ids as uint32 and hyperparameters as float32.
    if isinstance(value, bool):
        writer.add_bool(key, value)
    elif isinstance(value, int):
        (writer.add_uint32 if value >= 0 else writer.add_int32)(key, value)
    elif isinstance(value, float):
        writer.add_float32(key, value)
    elif isinstance(value, str):
        writer.add_string(key, value)
    elif isinstance(value, list) and value:
        writer.add_array(key, value)
    else:
        raise Gguf2ovError(f"cannot write metadata {key} = {value!r} to GGUF")


def vocabulary_of(amap, tokenizer_dir: Path) -> str:
    """The vocabulary (tokenizer.ggml.model) llama.cpp's converter writes from `tokenizer_dir` into a file of
    `amap`'s architecture: a target's own (its map's `checkpoint.vocabulary`); for a draft, the target's whose
    folder `tokenizer_dir` is (its config.json's model type, as a map's HF model type or a VLM's it reads the
    text config of), as its DFlash converter takes it from --target-model-dir; gpt2 where no map names one,
    and for a byte-level BPE whatever the map says (Gemma 4's converter refuses one: the tiny VLM fixture's
    files were converted with the gpt2 writer, benchmarks/llamacpp/gemma4_vlm.py)."""
    from ..maps.load import shipped_maps

    tokenizer = tokenizer_dir / "tokenizer.json"
    if tokenizer.is_file() and (read_json_object(tokenizer).get("decoder") or {}).get("type") == "ByteLevel":
        return "gpt2"
    if amap.target is not None:
        return amap.checkpoint.vocabulary
    config = tokenizer_dir / "config.json"
    model_type = read_json_object(config).get("model_type") if config.is_file() else None
    target = next((m for m in shipped_maps() if model_type is not None and
                   (m.hf.get("model_type") == model_type or model_type in m.checkpoint.text_config_of)), None)
    return target.checkpoint.vocabulary if target is not None else "gpt2"


def _add_tokenizer(writer: GGUFWriter, tokenizer_dir: Path, vocab_size, pre: str, vocabulary: str = "gpt2") -> set[str]:
    """The tokenizer's `vocabulary` (`vocabulary_of`) as llama.cpp's converter writes it. Returns the keys it
    wrote."""
    before = set(writer.kv_data[0])
    if vocabulary == "gemma4":
        _add_gemma4_vocabulary(writer, tokenizer_dir)
    elif vocabulary == "gpt2":
        _add_gpt2_vocabulary(writer, tokenizer_dir, vocab_size, pre)
    else:
        raise Gguf2ovError(f"writing a {vocabulary} vocabulary into a GGUF is not implemented",
                           hint="the writer writes gpt2 and gemma4 vocabularies")
    return set(writer.kv_data[0]) - before


# Tokens llama.cpp's Gemma 4 converter keeps visible (user-defined), so that its chat parser reads them
GEMMA4_VISIBLE = ("<|channel>", "<channel|>", "<|tool_call>", "<tool_call|>", "<|tool_response>", "<tool_response|>",
                  '<|"|>')


def _add_gemma4_vocabulary(writer: GGUFWriter, tokenizer_dir: Path) -> None:
    """Gemma 4's SentencePiece-style BPE, as llama.cpp's `Gemma4Model.set_vocab` writes it: gguf-py's
    LlamaHfVocab tokens (every score -1000), the chat parser's tokens user-defined, the merges and special ids
    (SpecialVocab, the mask token left to the map as for gpt2), no space prefix, bos always."""
    from gguf.vocab import LlamaHfVocab, SpecialVocab

    vocab = LlamaHfVocab(tokenizer_dir)
    tokens, scores, types = [], [], []
    for text, score, kind in vocab.all_tokens():
        tokens.append(text)
        scores.append(score)
        types.append(TokenType.USER_DEFINED if text.decode() in GEMMA4_VISIBLE else kind)
    writer.add_tokenizer_model("gemma4")
    writer.add_token_list(tokens)
    writer.add_token_scores(scores)
    writer.add_token_types(types)
    SpecialVocab(tokenizer_dir, load_merges=True, special_token_types=_SPECIAL_TYPES).add_to_gguf(writer, quiet=True)
    writer.add_add_space_prefix(False)
    if "tokenizer.ggml.add_bos_token" not in writer.kv_data[0]:  # each key once (gguf-py keeps the last and warns)
        writer.add_add_bos_token(True)


# The special ids gguf-py's SpecialVocab writes: the mask token is written from the draft config through the
# map (its key differs between the current and the first DFlash layout).
_SPECIAL_TYPES = ("bos", "eos", "unk", "sep", "pad", "cls")


def _add_gpt2_vocabulary(writer: GGUFWriter, tokenizer_dir: Path, vocab_size, pre: str) -> None:
    """A gpt2-style BPE vocabulary, as llama.cpp's `get_vocab_base` + `_set_vocab_gpt2` write it."""
    from gguf.vocab import SpecialVocab
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    vocab = tokenizer.get_vocab()
    vocab_size = vocab_size or len(vocab)
    reverse = {i: tok for tok, i in vocab.items()}
    added = tokenizer.get_added_vocab()
    decoder = tokenizer.added_tokens_decoder
    tokens, types = [], []
    for i in range(vocab_size):
        if i not in reverse:  # holes in the id range are padded, as llama.cpp does
            tokens.append(f"[PAD{i}]")
            types.append(TokenType.UNUSED)
        elif reverse[i] in added:
            special = decoder[i].special if i in decoder else False
            tokens.append(reverse[i])
            types.append(TokenType.CONTROL if special or _looks_special(reverse[i]) else TokenType.USER_DEFINED)
        else:
            tokens.append(reverse[i])
            types.append(TokenType.NORMAL)
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre(pre)
    writer.add_token_list(tokens)
    writer.add_token_types(types)
    special = SpecialVocab(tokenizer_dir, load_merges=True, n_vocab=len(tokens), special_token_types=_SPECIAL_TYPES)
    special.add_to_gguf(writer, quiet=True)


def _looks_special(token: str) -> bool:
    # llama.cpp's does_token_look_special: <|...|>, <...> and ChatGLM-style [gMASK] markers.
    return bool(re.fullmatch(r"<\|.*\|>|<[^<>\s]+>|\[[a-zA-Z]+\]", token))


def write_atomically(writer: GGUFWriter, out_path: Path, write_tensors=None) -> None:
    """Write next to `out_path` and rename, so the file appears only when complete.

    `write_tensors()` writes the tensor data (default: the tensors added to `writer`).
    """
    out_path = Path(out_path)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{out_path.name}.", dir=out_path.parent)
    os.close(fd)
    try:
        writer.write_header_to_file(path=Path(tmp))
        writer.write_kv_data_to_file()
        if write_tensors is None:
            writer.write_tensors_to_file()
        else:
            writer.write_ti_data_to_file()
            write_tensors()
        writer.close()
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)  # mkstemp makes it private; a finished file gets the usual mode
        os.replace(tmp, out_path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
