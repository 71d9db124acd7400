"""A VLM's image encoder from llama.cpp's mmproj GGUF: `openvino_vision_embeddings_model`, built weight by weight.

optimum-intel's image-text-to-text export of a Gemma 4 VLM traces `get_image_features` (transformers 5.5.4's
Gemma4VisionModel, then the image's Gemma4MultimodalEmbedder) into a model that takes what GenAI's
preprocessing makes of an image (`pixel_values` [B, patches, 3 * p * p] in [0, 1], each patch's rows y, x,
channel; `image_position_ids` [B, patches, 2], (x, y) per patch, -1 for padding) and returns one row per soft
token in the text model's width (`last_hidden_state` [tokens, text hidden]). This module writes that graph
from the mmproj's tensors, read through the map's `mmproj:` section (tensor_maps/gemma4.yaml):

- patches scaled to [-1, 1], the patch projection, the x and y position embeddings (zero on padding);
- each encoder layer: RMSNorm (x * w) before and after attention and the MLP; q, k norms with weights and a
  v norm without; 2-D RoPE (the head's first half turned by x, the second by y, each NEOX-style, base 100);
  bidirectional attention over the real patches with scale 1; a GELU-tanh gated MLP;
- the pooler: padding zeroed, each k x k block of patches averaged by its position, scaled by sqrt(hidden),
  and the blocks no patch fell in dropped;
- the embedder: RMSNorm without weight, then the projection to the text width.
"""

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ..errors import Gguf2ovError
from ..ir.graph_ops import apply_rope, const, dim, linear, named, repeat_kv, rms_norm
from ..ir.graph_ops import ops as _ops

# the soft-token budgets transformers' Gemma4ImageProcessor takes (max_soft_tokens), and its default
IMAGE_TOKENS = (70, 140, 280, 560, 1120)
MAX_SOFT_TOKENS = 280
INPUTS = ("pixel_values", "image_position_ids")
OUTPUT = "last_hidden_state"
# the additive mask of padding keys: finite, so a padding query's row (dropped later) stays finite
MASKED = float(np.finfo(np.float32).min)


@dataclass
class VisionSource:
    """An mmproj opened through the map: the HF vision_config it states and its tensors by HF name."""

    path: Path
    config: dict           # HF Gemma4VisionConfig keys
    text_hidden: int       # the width the embedder projects to
    names: dict            # HF name -> GGUF name
    layouts: dict          # HF name -> layout the file stores it in
    gguf: object
    allow_nonfinite: bool = False                 # NaN and Inf values written, counted (else refused)
    nonfinite: dict = field(default_factory=dict)  # HF name -> NaN/Inf values written (allow_nonfinite)

    def tensor(self, hf_name: str) -> np.ndarray:
        """The float32 values of a constant of the vision model, their NaN and Inf refused naming the tensor
        (or, allowed, counted), as the language model's weights are (ir/weights.py `check_finite`)."""
        from ..finite import count_nonfinite, nonfinite_error

        gguf_name = self.names[hf_name]
        values = self.gguf.load(gguf_name)
        if self.layouts.get(hf_name) == "patch_kernel":  # [hidden, 3, p, p] -> HF's [hidden, p * p * 3]
            values = values.transpose(0, 2, 3, 1).reshape(values.shape[0], -1)
        values = np.ascontiguousarray(values, dtype=np.float32)
        if bad := count_nonfinite(values):
            if not self.allow_nonfinite:
                where = f"--mmproj {self.path}: {hf_name} (from {gguf_name}, {self.gguf.info(gguf_name).qtype.name})"
                raise nonfinite_error(where, bad, values.size)
            self.nonfinite[hf_name] = bad
        return values

    def has(self, hf_name: str) -> bool:
        return hf_name in self.names


def open_mmproj(path, text_hidden: int, section: dict, allow_nonfinite: bool = False) -> VisionSource:
    """The mmproj at `path`, checked against the map's `mmproj:` section and the text model's width: one
    error line for a file of another projector, a key or tensor missing, or a width that does not match.
    Its NaN and Inf values are refused as the vision model is built, unless `allow_nonfinite`."""
    from ..gguf.read import open_gguf

    path = Path(path)
    gguf = open_gguf(path)
    if gguf.get("general.type") != "mmproj" and gguf.arch != "clip":
        raise Gguf2ovError(f"--mmproj {path} is not an mmproj file (general.architecture {gguf.arch!r})",
                           hint="give the mmproj GGUF llama.cpp's converter writes with --mmproj")
    wanted = section["projector_type"]
    projector = gguf.get("clip.vision.projector_type") or gguf.get("clip.projector_type")
    if projector != wanted:
        audio = gguf.get("clip.audio.projector_type")
        what = (f"an audio projector ({audio}) and no image projector" if projector is None and audio
                else f"projector {projector!r}")
        raise Gguf2ovError(f"--mmproj {path} holds {what}; this target builds images through {wanted!r} only",
                           hint=f"give the {wanted} mmproj of the same model")
    config = {}
    for hf_key, key in section["config"].items():
        value = gguf.get(key)
        if value is None:
            raise Gguf2ovError(f"--mmproj {path} has no {key} (the vision {hf_key})")
        config[hf_key] = _number(path, key, value, float if hf_key == "rms_norm_eps" else int)
    for hf_key, rule in section["defaults"].items():
        if isinstance(rule, dict):
            config[hf_key] = _number(path, rule["from"], gguf.get(rule["from"], rule["default"]), int)
        else:
            config[hf_key] = rule
    heads = config["num_attention_heads"]
    if config["hidden_size"] % heads or (config["hidden_size"] // heads) % 4:
        raise Gguf2ovError(f"--mmproj {path}: a vision width of {config['hidden_size']} does not split into "
                           f"{heads} heads of a size 2-D RoPE turns (a multiple of 4)")
    if config.pop("projection_dim") != text_hidden:
        raise Gguf2ovError(f"--mmproj {path} projects images to width {gguf.get('clip.vision.projection_dim')}, but "
                           f"the text model's width is {text_hidden}",
                           hint="give the mmproj converted from the same checkpoint as the text GGUF")
    config["head_dim"] = config["hidden_size"] // config["num_attention_heads"]
    config["num_key_value_heads"] = config["num_attention_heads"]
    names, layouts = {}, {}
    for group, required in ((section["tensors"], True), (section.get("optional") or {}, False)):
        for gguf_name, rule in group.items():
            hf, layout = (rule["hf"], rule.get("layout")) if isinstance(rule, dict) else (rule, None)
            for n in (range(config["num_hidden_layers"]) if "{N}" in gguf_name else [None]):
                g, h = (gguf_name, hf) if n is None else (gguf_name.format(N=n), hf.format(N=n))
                if g in gguf.tensors:
                    names[h] = g
                    if layout:
                        layouts[h] = layout
                elif required:
                    raise Gguf2ovError(f"--mmproj {path} has no tensor {g}", hint="give an mmproj of a Gemma 4 VLM")
    images = [t for t in gguf.tensors if t.startswith(tuple(section["prefixes"]))]  # an audio tower's are left out
    for suffix, why in (section.get("refuse") or {}).items():
        if found := sorted(t for t in images if t.endswith(suffix)):
            raise Gguf2ovError(f"--mmproj {path}: {why} ({found[0]})")
    config["standardize"] = "model.vision_tower.std_bias" in names
    for hf_name, shape in _shapes(config, text_hidden).items():
        got = gguf.info(names[hf_name]).shape if hf_name in names else shape
        if tuple(got) != shape and not (hf_name.endswith("position_embedding_table") and got[::2] == shape[::2]):
            raise Gguf2ovError(f"--mmproj {path}: tensor {names[hf_name]} is {list(got)}, not {list(shape)} (vision "
                               f"width {config['hidden_size']}, text width {text_hidden})",
                               hint="give the mmproj converted from the same checkpoint as the text GGUF")
    return VisionSource(path, config, text_hidden, names, layouts, gguf, allow_nonfinite)


def _number(path, key: str, value, kind):
    """A metadata value of the mmproj as a positive int or float, else one error line."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0 or \
            (kind is int and int(value) != value):
        raise Gguf2ovError(f"--mmproj {path}: {key} is {value!r}, not a positive {kind.__name__}")
    return kind(value)


def _shapes(c: dict, text_hidden: int) -> dict:
    """HF name -> the shape (PyTorch order, as the file stores it) each tensor has in this geometry (the position
    table's length is the file's own)."""
    h, i, p, hd = c["hidden_size"], c["intermediate_size"], c["patch_size"], c["head_dim"]
    inner = c["num_attention_heads"] * hd
    t = "model.vision_tower."
    shapes = {t + "patch_embedder.input_proj.weight": (h, 3, p, p),
              t + "patch_embedder.position_embedding_table": (2, 0, h),
              "model.embed_vision.embedding_projection.weight": (text_hidden, h)}
    for n in range(c["num_hidden_layers"]):
        layer = f"{t}encoder.layers.{n}."
        shapes |= {layer + f"self_attn.{x}_proj.linear.weight": (inner, h) for x in "qkv"}
        shapes |= {layer + "self_attn.o_proj.linear.weight": (h, inner),
                   layer + "self_attn.q_norm.weight": (hd,), layer + "self_attn.k_norm.weight": (hd,),
                   layer + "mlp.gate_proj.linear.weight": (i, h), layer + "mlp.up_proj.linear.weight": (i, h),
                   layer + "mlp.down_proj.linear.weight": (h, i)}
        norms = ("input", "post_attention", "pre_feedforward", "post_feedforward")
        shapes |= {layer + f"{norm}_layernorm.weight": (h,) for norm in norms}
    if c["standardize"]:
        shapes |= {t + "std_bias": (h,), t + "std_scale": (h,)}
    return shapes


# the vision model's nodes (.xml), per encoder layer and besides (measured on the one-layer fixture: 132 KB)
XML_LAYER_BYTES, XML_BASE_BYTES = 60_000, 80_000


def vision_ir_bytes(source: VisionSource) -> int:
    """The bytes of openvino_vision_embeddings_model (.bin in float32, and .xml)."""
    weights = sum(4 * source.gguf.info(name).n_elements for name in source.names.values())
    return weights + XML_BASE_BYTES + XML_LAYER_BYTES * source.config["num_hidden_layers"]


def vision_config(source: VisionSource) -> dict:
    """The vision_config a Gemma4ForConditionalGeneration's config.json holds for this tower."""
    c = source.config
    table = source.gguf.info(source.names["model.vision_tower.patch_embedder.position_embedding_table"]).shape
    return {"model_type": "gemma4_vision", "hidden_size": c["hidden_size"], "intermediate_size": c["intermediate_size"],
            "num_hidden_layers": c["num_hidden_layers"], "num_attention_heads": c["num_attention_heads"],
            "num_key_value_heads": c["num_key_value_heads"], "head_dim": c["head_dim"],
            "hidden_activation": c["hidden_activation"], "patch_size": c["patch_size"],
            "pooling_kernel_size": c["pooling_kernel_size"], "position_embedding_size": int(table[1]),
            "rms_norm_eps": c["rms_norm_eps"], "standardize": c["standardize"], "use_clipped_linears": False,
            "rope_parameters": {"rope_type": "default", "rope_theta": c["rope_theta"]}}


def mmproj_section(amap, path) -> dict:
    """The `mmproj:` section of `amap`, the map the text model is built as; refused for a map without one."""
    if not amap.mmproj:
        raise Gguf2ovError(f"--mmproj {path}: a {amap.arch} target is built as a text model only",
                           hint="leave --mmproj out")
    return amap.mmproj


def vlm_config(text_config: dict, source: VisionSource, vocabulary, section: dict) -> dict:
    """config.json of the VLM folder: a Gemma4ForConditionalGeneration's, its text_config the text GGUF's, its
    vision_config the mmproj's, and the special tokens' ids found in the text file's vocabulary by the
    strings the map names (the image's required: VLMPipeline puts the image between them)."""
    ids = {}
    where = {str(t): i for i, t in enumerate(vocabulary or ())}
    for key, token in section["tokens"].items():
        if token in where:
            ids[key] = where[token]
        elif key in section["required_tokens"]:
            raise Gguf2ovError(f"the text GGUF's vocabulary has no {token!r} ({key}), which the image prompt needs",
                               hint="give the text GGUF of the same VLM as the mmproj")
    text = {k: v for k, v in text_config.items() if k != "architectures"}
    return {"architectures": [section["architecture"]], "model_type": section["model_type"], **ids,
            "text_config": text, "vision_config": vision_config(source), "audio_config": None,
            "tie_word_embeddings": text.get("tie_word_embeddings", True)}


def preprocessor_config(source: VisionSource, max_soft_tokens: int) -> dict:
    """preprocessor_config.json: transformers' Gemma4ImageProcessor with the mmproj's patch size and pooling
    (Gemma 4 scales pixels to [-1, 1] in the graph; the file's mean and std are 0 and 1)."""
    g, c = source.gguf, source.config
    mean = [float(v) for v in g.get("clip.vision.image_mean", [0.0] * 3)]
    std = [float(v) for v in g.get("clip.vision.image_std", [1.0] * 3)]
    return {"image_processor_type": "Gemma4ImageProcessor", "do_convert_rgb": True,
            "do_normalize": (mean, std) != ([0.0] * 3, [1.0] * 3), "do_rescale": True, "do_resize": True,
            "image_mean": mean, "image_std": std, "max_soft_tokens": max_soft_tokens,
            "patch_size": c["patch_size"], "pooling_kernel_size": c["pooling_kernel_size"], "resample": 3,
            "rescale_factor": 1 / 255}


# --- the graph -------------------------------------------------------------------------------------

def build_vision_model(source: VisionSource):
    """The `ov.Model` optimum exports as openvino_vision_embeddings_model, from `source`'s tensors."""
    import openvino as ov

    o, c, w = _ops(), source.config, source.tensor
    pixels = o.parameter([-1, -1, 3 * c["patch_size"] ** 2], np.float32, name=INPUTS[0])
    positions = o.parameter([-1, -1, 2], np.int64, name=INPUTS[1])
    for p in (pixels, positions):
        p.output(0).get_tensor().set_names({p.get_friendly_name()})
    padding = o.reduce_logical_and(o.equal(positions, const(-1, np.int64)), const([-1], np.int64), False)  # [B, N]
    pad3 = o.unsqueeze(padding, const([-1], np.int64))
    clamped = o.maximum(positions, const(0, np.int64))

    tower = "vision_tower"
    scaled = o.subtract(o.multiply(pixels, const(2.0)), const(1.0))
    x = linear(scaled, const(w(f"model.{tower}.patch_embedder.input_proj.weight")),
               f"{tower}.patch_embedder.input_proj")
    table = w(f"model.{tower}.patch_embedder.position_embedding_table")  # [2, P, hidden]
    embedded = [o.gather(const(table[i]), _axis(clamped, i), const(0, np.int64)) for i in range(2)]
    x = o.add(x, o.select(pad3, const(0.0), o.add(*embedded)))

    cos_sin = _rope_2d(positions, c["head_dim"], c["rope_theta"])
    keep = o.select(o.unsqueeze(o.unsqueeze(padding, const([1], np.int64)), const([1], np.int64)),
                    const(MASKED), const(0.0))  # [B, 1, 1, N]: padding keys hidden
    for i in range(c["num_hidden_layers"]):
        x = _encoder_layer(x, i, c, w, cos_sin, keep)

    # the pooler (Gemma4VisionPooler): k x k blocks of patches averaged by position
    k = c["pooling_kernel_size"]
    x = o.select(pad3, const(0.0), x)
    length = o.divide(dim(pixels, 1), const(k * k, np.int64))  # patches // k^2 (optimum's output_length)
    blocks = o.divide(clamped, const(k, np.int64))
    width = o.divide(o.add(o.reduce_max(_axis(clamped, 0), const([-1], np.int64), True), const(1, np.int64)),
                     const(k, np.int64))
    index = o.add(_axis(blocks, 0), o.multiply(width, _axis(blocks, 1)))  # [B, N]
    weights = o.one_hot(index, o.squeeze(length, const([0], np.int64)), const(1.0 / (k * k)), const(0.0), -1)
    x = o.matmul(weights, x, True, False)  # [B, L, hidden]
    found = o.reduce_logical_or(o.not_equal(weights, const(0.0)), const([1], np.int64), False)  # [B, L]
    x = o.multiply(x, const(np.float32(c["hidden_size"] ** 0.5)))
    x = o.gather_nd(x, o.transpose(o.non_zero(found, "i64"), const([1, 0], np.int64)))  # [tokens, hidden]
    if c["standardize"]:
        x = o.multiply(o.subtract(x, const(w(f"model.{tower}.std_bias"))), const(w(f"model.{tower}.std_scale")))

    # the embedder (Gemma4MultimodalEmbedder): RMSNorm without a weight, then the projection
    x = rms_norm(x, np.ones(c["hidden_size"], np.float32), c["rms_norm_eps"],
                 "embed_vision.embedding_pre_projection_norm")
    x = linear(x, const(w("model.embed_vision.embedding_projection.weight")), "embed_vision.embedding_projection")
    result = o.result(x)
    result.output(0).get_tensor().set_names({OUTPUT})
    return ov.Model([result], [pixels, positions], "vision_embeddings")


def _axis(x, i: int):
    """x[..., i] of an [..., 2] tensor."""
    o = _ops()
    return o.gather(x, const(i, np.int64), const(-1, np.int64))


def _rope_2d(positions, head_dim: int, theta: float):
    """(cos, sin) per spatial axis, each [B, N, 1, head_dim / 2]: transformers' Gemma4VisionRotaryEmbedding, which
    gives x and y the same frequencies over half the head each."""
    o = _ops()
    spatial = head_dim // 2
    exponents = np.arange(0, spatial, 2, dtype=np.int64).astype(np.float32) / spatial
    inv_freq = (1.0 / theta ** exponents).astype(np.float32)
    tables = []
    for i in range(2):
        freqs = o.multiply(o.unsqueeze(o.convert(_axis(positions, i), "f32"), const([-1], np.int64)), const(inv_freq))
        emb = o.unsqueeze(o.concat([freqs, freqs], -1), const([2], np.int64))
        tables.append((o.cos(emb), o.sin(emb)))
    return tables


def _rope(x, tables, head_dim: int):
    """apply_multidimensional_rope over [B, N, heads, head_dim]: the first half turned by x, the second by y."""
    o = _ops()
    part = head_dim // 2
    halves = o.split(x, const(-1, np.int64), 2)
    return o.concat([apply_rope(halves.output(i), cos, sin, part // 2) for i, (cos, sin) in enumerate(tables)], -1)


def _encoder_layer(x, i: int, c: dict, w, tables, keep):
    o = _ops()
    p = f"model.vision_tower.encoder.layers.{i}."
    scope = f"vision_tower.encoder.layers.{i}."
    eps, heads, kv, hd = c["rms_norm_eps"], c["num_attention_heads"], c["num_key_value_heads"], c["head_dim"]

    def norm(y, name):
        return rms_norm(y, w(p + name + ".weight"), eps, scope + name)

    def heads_of(y, name, count):
        y = linear(y, const(w(p + f"self_attn.{name}.linear.weight")), scope + f"self_attn.{name}")
        return o.reshape(y, const([0, 0, count, hd], np.int64), True)

    h = norm(x, "input_layernorm")
    q = _rope(norm(heads_of(h, "q_proj", heads), "self_attn.q_norm"), tables, hd)
    k = _rope(norm(heads_of(h, "k_proj", kv), "self_attn.k_norm"), tables, hd)
    v = rms_norm(heads_of(h, "v_proj", kv), np.ones(hd, np.float32), eps, scope + "self_attn.v_norm")
    order = const([0, 2, 1, 3], np.int64)
    q, k, v = (o.transpose(t, order) for t in (q, k, v))
    k, v = (repeat_kv(t, kv, heads // kv, hd) for t in (k, v))
    scores = o.add(o.matmul(q, k, False, True), keep)  # scale 1.0
    attn = o.transpose(o.matmul(o.softmax(scores, -1), v, False, False), order)
    attn = o.reshape(attn, const([0, 0, heads * hd], np.int64), True)
    attn = linear(attn, const(w(p + "self_attn.o_proj.linear.weight")), scope + "self_attn.o_proj")
    x = o.add(x, norm(attn, "post_attention_layernorm"))

    h = norm(x, "pre_feedforward_layernorm")
    gate = linear(h, const(w(p + "mlp.gate_proj.linear.weight")), scope + "mlp.gate_proj")
    up = linear(h, const(w(p + "mlp.up_proj.linear.weight")), scope + "mlp.up_proj")
    mlp = linear(o.multiply(o.gelu(gate, "tanh"), up), const(w(p + "mlp.down_proj.linear.weight")),
                 scope + "mlp.down_proj")
    return named(o.add(x, norm(mlp, "post_feedforward_layernorm")), f"__module.{scope}/aten::add/Add_1")
