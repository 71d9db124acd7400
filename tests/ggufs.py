"""Tiny synthetic GGUF files for tests, written with gguf-py's own GGUFWriter."""

import numpy as np
from gguf import GGMLQuantizationType, GGUFValueType, GGUFWriter
from gguf.quants import quantize

Q = GGMLQuantizationType


def write_gguf(path, arch: str | None, kv: dict, tensors: dict) -> None:
    """kv: key -> value or (value, GGUFValueType); tensors: name -> float32 array in PyTorch
    shape, or (array, qtype) to store it quantized with gguf-py."""
    w = GGUFWriter(path, arch or "unused")
    if arch is None:
        del w.kv_data[0]["general.architecture"]
    for key, value in kv.items():
        if isinstance(value, tuple):
            value, vtype = value
            if vtype == GGUFValueType.ARRAY:
                w.add_array(key, value)
            else:
                w.add_key_value(key, value, vtype)
        elif isinstance(value, bool):
            w.add_bool(key, value)
        elif isinstance(value, int):
            w.add_uint32(key, value)
        elif isinstance(value, float):
            w.add_float32(key, value)
        elif isinstance(value, str):
            w.add_string(key, value)
        else:
            w.add_array(key, value)
    for name, value in tensors.items():
        array, qtype = value if isinstance(value, tuple) else (value, None)
        if qtype in (None, Q.F32):
            w.add_tensor(name, np.ascontiguousarray(array, dtype=np.float32))
        elif qtype == Q.F16:
            w.add_tensor(name, np.ascontiguousarray(array, dtype=np.float16))
        elif qtype == Q.I64:
            w.add_tensor(name, np.ascontiguousarray(array, dtype=np.int64))
        else:
            w.add_tensor(name, quantize(np.asarray(array, dtype=np.float32), qtype), raw_dtype=qtype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


# Small geometry: hidden 64, 4 heads x 16, 2 KV heads, ffn 96, 2 layers, 3 target layers.
DRAFT = dict(hidden=64, heads=4, kv_heads=2, head_dim=16, ffn=96, layers=2, target_layers=[2, 5, 8])


def dflash_kv(legacy: bool = False, mask: int = 151669, **overrides) -> dict:
    g = dict(DRAFT, **overrides)
    kv = {
        "dflash.block_count": g["layers"], "dflash.embedding_length": g["hidden"],
        "dflash.feed_forward_length": g["ffn"], "dflash.attention.head_count": g["heads"],
        "dflash.attention.head_count_kv": g["kv_heads"], "dflash.attention.key_length": g["head_dim"],
        "dflash.attention.value_length": g["head_dim"], "dflash.attention.layer_norm_rms_epsilon": 1e-6,
        "dflash.rope.freq_base": 1000000.0, "dflash.context_length": 40960, "dflash.block_size": 16,
        # llama.cpp writes HF id + 1; its first converter wrote them as is and used dflash.mask_token_id.
        "dflash.target_layers": (g["target_layers"] if legacy else [i + 1 for i in g["target_layers"]],
                                 GGUFValueType.ARRAY),
    }
    kv["dflash.mask_token_id" if legacy else "tokenizer.ggml.mask_token_id"] = mask
    return kv


def dflash_tensors(rng, qtype=None, **overrides) -> dict:
    """GGUF name -> (array in PyTorch shape, qtype) for a v1 DFlash draft."""
    g = dict(DRAFT, **overrides)
    h, q, kv, f = g["hidden"], g["heads"] * g["head_dim"], g["kv_heads"] * g["head_dim"], g["ffn"]
    out = {
        "fc.weight": (rng.standard_normal((h, len(g["target_layers"]) * h)), qtype),
        "enc.output_norm.weight": rng.standard_normal(h),
        "output_norm.weight": rng.standard_normal(h),
    }
    for n in range(g["layers"]):
        out |= {
            f"blk.{n}.attn_norm.weight": rng.standard_normal(h),
            f"blk.{n}.ffn_norm.weight": rng.standard_normal(h),
            f"blk.{n}.attn_q.weight": (rng.standard_normal((q, h)), qtype),
            f"blk.{n}.attn_k.weight": (rng.standard_normal((kv, h)), qtype),
            f"blk.{n}.attn_v.weight": (rng.standard_normal((kv, h)), qtype),
            f"blk.{n}.attn_output.weight": (rng.standard_normal((h, q)), qtype),
            f"blk.{n}.attn_q_norm.weight": rng.standard_normal(g["head_dim"]),
            f"blk.{n}.attn_k_norm.weight": rng.standard_normal(g["head_dim"]),
            f"blk.{n}.ffn_gate.weight": (rng.standard_normal((f, h)), qtype),
            f"blk.{n}.ffn_up.weight": (rng.standard_normal((f, h)), qtype),
            f"blk.{n}.ffn_down.weight": (rng.standard_normal((h, f)), qtype),
        }
    return {k: (v if isinstance(v, tuple) else (v, None)) for k, v in out.items()}


def write_dflash(path, seed: int = 0, legacy: bool = False, qtype=None, kv_extra=None, tensors_extra=None,
                 drop=(), **overrides) -> dict:
    rng = np.random.default_rng(seed)
    tensors = dflash_tensors(rng, qtype, **overrides) | (tensors_extra or {})
    for name in drop:
        del tensors[name]
    kv = dflash_kv(legacy, **overrides) | (kv_extra or {})
    write_gguf(path, "dflash", kv, tensors)
    return tensors


def decoder_kv(arch: str, layers: int = 2, hidden: int = 64, heads: int = 4, kv_heads: int = 2,
               head_dim: int = 16, ffn: int = 96, vocab: int = 40) -> dict:
    return {
        f"{arch}.block_count": layers, f"{arch}.embedding_length": hidden, f"{arch}.feed_forward_length": ffn,
        f"{arch}.attention.head_count": heads, f"{arch}.attention.head_count_kv": kv_heads,
        f"{arch}.attention.key_length": head_dim, f"{arch}.attention.value_length": head_dim,
        f"{arch}.attention.layer_norm_rms_epsilon": 1e-6, f"{arch}.rope.freq_base": 10000.0,
        f"{arch}.context_length": 512, "tokenizer.ggml.tokens": [f"t{i}" for i in range(vocab)],
        "tokenizer.ggml.bos_token_id": 1, "tokenizer.ggml.eos_token_id": 2,
    }


def decoder_tensors(rng, names_per_layer: list[str], layers: int = 2, hidden: int = 64, heads: int = 4,
                    kv_heads: int = 2, head_dim: int = 16, ffn: int = 96, vocab: int = 40,
                    output: bool = False) -> dict:
    q, kv = heads * head_dim, kv_heads * head_dim
    shapes = {"attn_q": (q, hidden), "attn_k": (kv, hidden), "attn_v": (kv, hidden), "attn_output": (hidden, q),
              "ffn_gate": (ffn, hidden), "ffn_up": (ffn, hidden), "ffn_down": (hidden, ffn),
              "attn_q_norm": (head_dim,), "attn_k_norm": (head_dim,)}
    out = {"token_embd.weight": rng.standard_normal((vocab, hidden)), "output_norm.weight": rng.standard_normal(hidden)}
    if output:
        out["output.weight"] = rng.standard_normal((vocab, hidden))
    for n in range(layers):
        for name in names_per_layer:
            if name.endswith(".bias"):  # a projection's bias: one value per output row
                out[f"blk.{n}.{name}"] = rng.standard_normal(shapes[name[:-5]][:1])
            else:
                out[f"blk.{n}.{name}.weight"] = rng.standard_normal(shapes.get(name, (hidden,)))
    return out


# --- a random model built from a map alone ---------------------------------------------------------

def _rule_value(rule, config: dict):
    """An HF value the rule accepts: small, in range, of its declared type."""
    declared = rule["type"]
    if isinstance(declared, list):
        n = config.get(rule["length"]) if rule.get("length") else 2
        if "map" in rule:
            choices = list(rule["map"].values())
            return [choices[i % len(choices)] for i in range(n)]
        item = _rule_value(dict(rule, type=declared[0]), config)
        return [item + i for i in range(n)] if isinstance(item, int) and not isinstance(item, bool) else [item] * n
    if "map" in rule:
        return next(iter(rule["map"].values()))
    if declared == "int":  # a token id (below the vocabulary) is its least, a size 4
        return rule.get("min", 0) if "below" in rule else min(max(4, rule.get("min", 4)), rule.get("max", 4))
    return {"float": 0.5, "number": 0.5, "bool": True, "str": "x"}[declared]


def model_from_map(amap, rng, layers: int = 2):
    """(HF config, {HF name: float32 array}, extra GGUF metadata) for a random model that uses every
    tensor and config rule of `amap`: values are multiples of 1/256 in [-4, 4), so that the map's ops
    (+-1.0, row permutations) are exact in float32 both ways."""
    from gguf2ov.maps.rules import config_get

    config, extra = {}, {}
    # the model holds every group's tensors: a key a group fixes takes that value
    fixed = {k: v for fields in amap.group_hf.values() for k, v in fields.items()}
    # `below` / `length` read other keys: those first
    ordered = sorted(amap.config.items(), key=lambda kv: isinstance(kv[1].get("below"), str) or "length" in kv[1])
    for key, rule in ordered:
        if "tensor_absent" in rule or "constant" in rule:
            continue  # derived from the file
        value = layers if key == "num_hidden_layers" else fixed[key] if key in fixed else _rule_value(rule, config)
        node = config
        *parents, last = key.split(".")
        for part in parents:
            node = node.setdefault(part, {})
        node[last] = value
        if rule.get("len"):  # read from an array's length: the GGUF states it as a count instead
            extra[rule["from"][0]] = value
    state = {}
    kinds = _target_shapes(amap, config) if amap.target is not None else {}  # a target's shapes are its kinds'
    for rule in amap.rules:
        if rule.hf is None:
            continue
        for n in range(layers) if rule.per_layer else [None]:
            if amap.tensors.applies(rule, n, config):  # a layer of the rule's layer type
                # a tensor no one gives a shape: any will do
                shape = kinds.get(rule.hf_name(n)) or amap.shapes.shape_for(rule.hf, config) or [4]
                state[rule.hf_name(n)] = (rng.integers(-1024, 1024, size=shape) / 256).astype(np.float32)
    assert config_get(config, "num_hidden_layers") == layers
    return config, state, extra


def _target_shapes(amap, config: dict) -> dict:
    """The shapes a target map's layer kinds read under `config`, other layouts' tensors included."""
    from gguf2ov.targets.config import target_config
    from gguf2ov.targets.decoder import stored_shapes

    return stored_shapes(target_config(merged(amap.hf, config), f"a model from {amap.path}", amap))


def merged(fixed: dict, config: dict) -> dict:
    """A map's fixed `hf` fields with `config` on top, nested dicts merged (as reading a GGUF merges them)."""
    out = dict(fixed)
    for key, value in config.items():
        out[key] = merged(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
    return out


def write_checkpoint_folder(folder, config: dict, state: dict) -> None:
    import json

    from safetensors.numpy import save_file

    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(config))
    save_file(state, str(folder / "model.safetensors"))
