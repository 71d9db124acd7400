"""Per-architecture maps between llama.cpp GGUF files and Hugging Face checkpoints.

The architecture knowledge lives in `tensor_maps/<arch>.yaml` (shipped as `gguf2ov.tensor_maps`);
this module holds the mechanism: finding, loading and validating a map. The loaded map
(`arch_map.ArchMap`) has one object per job: it builds the HF config from GGUF metadata
(`metadata.py`), matches tensor names strictly (`tensors.py`), states shapes (`shapes.py`), writes
GGUF back (`writer.py`). The rules a map names (value types and bounds, shape expressions, and the
ops that undo what llama.cpp did to a tensor, each with its reverse so a map can also write GGUF)
live in `rules.py`.

Map sections:
- `arch`: equals `general.architecture`; `extends`: a skeleton map merged underneath;
  `unset: {section: [keys]}` drops what the skeleton has and this map does not;
  `strip_hf_prefix`: a prefix every HF name of the map loses (the DFlash draft is the decoder
  skeleton without `model.`).
- `hf`: fixed config fields (architectures, model_type, ...).
- `config`: HF key (dotted keys nest) -> a rule `{from: key | [keys] (first present wins), type,
  add, default, optional, len, map, constant, min, max, above, below, length, flag, ambiguous_when,
  choices}`. `{arch}` in a key is the map's arch. Writing GGUF: `write_also` lists more GGUF keys
  written with the value; `hf_aliases` lists other HF keys that may hold it (transformers 5 nests some).
  Metadata comes from untrusted files, so every rule that reads a value declares its `type` (what
  the file must state, after `len`: int, float (stored as F32 or F64, never an integer type),
  number (either), bool, str, or a one-item list such as [int] for a list of them); `min`, `max`
  (inclusive), `above` and `below` (exclusive) bound the value written (each item of a list),
  `below: KEY` keeps it under another config value (a token id under vocab_size) and
  `length: KEY` makes a list as long as another (one layer type per layer).
  Derived values: `over: KEY` with `as: int | float` divides the file's value by another config
  value (a head size from a total; `int` refuses a remainder), and writing multiplies it back
  (truncated to an integer, as llama.cpp's converter truncates); `periodic: {every: KEY, then:,
  else:}` makes a `length`-long list when the file states none (item i is `then` when (i + 1) is a
  multiple of KEY's value: every 4th layer full attention); `per_block: true` marks a list the
  file states per GGUF block, whose items for `trailing_blocks` are dropped; `layered: true` reads a
  value the file may state per layer (an array, as Ollama writes head counts) when its non-zero
  items agree, and `layered: TYPE` reads the items at the layers whose `layer_types` entry is TYPE
  (written back as a list by layer type when two rules state one key); `tensor_absent: TEMPLATE` with
  `in_layers: TYPE` is true when no layer of that type holds the tensor; `write_default: true` writes
  `default` back when the HF config does not state the value (a key llama.cpp's loader requires);
  `widened_last: {count: KEY, factor: F, sets: FLAG}` also reads a list of one value per layer whose
  last KEY items are F times the others' (the others' value, and FLAG set true; any other list is
  refused), and writes that list back when the config sets FLAG (Gemma 4 E2B's double-wide MLPs).
- `tensors`: GGUF name template (`{N}` = block index) -> HF template, or `{to:, ops: [...],
  aliases: [other GGUF templates of the same tensor, read but never written]}`, or `{refuse: why}`:
  a layout the map cannot read, refused in one error line with why.
- `layer_tensors`: layer type -> tensors like `tensors`, which apply to the layers of that type only
  (config `layer_types`): one GGUF name may mean one tensor in one layer type and be refused in
  another (llama.cpp's `attn_qkv`: a linear layer's in_proj_qkv, a full layer's fused Q/K/V).
- `optional`: like `tensors`, copied when present; `null` accepts a tensor but does not write it.
- `trailing_blocks`: blocks after the decoder's that the file counts in its block count and the
  model does not run (llama.cpp's MTP block): `count` (a config rule for how many), `counted_in`
  (the config key it is taken off), `hf` (the config key that records it), `what` (for messages),
  `tensors` and `optional` (the blocks' templates: accepted and dropped; a count the tensors do not
  fit is one error). Files are written back without them.
- `groups`: named sets of tensors that are present all together or not at all.
- `group_hf`: group name -> fixed config fields that apply when the file holds that group (a
  variant of the architecture that the tensors tell apart, e.g. DFlash 2 within `dflash`). A file
  that states another value for one of them (through a config rule) contradicts its own tensors
  and is refused.
- `shapes`: HF template -> expected PyTorch shape, as expressions over config keys; not in a map with
  a `target:` section, whose shapes are its layer kinds' (`gguf2ov/targets/layers/`).
- `legacy`: config rules an older converter used (only used to write GGUF in the old layout).
- `compare`: HF config key -> other places a published config may hold it; the keys `check`
  compares with a reference.
- `checkpoint`: how a checkpoint folder's tensor names become the map's: `rename` (prefix -> prefix:
  transformers 5 saves some models' decoders under `model.language_model.`), `ignore` (prefixes of
  tensors of other parts of the folder's model, a vision tower or an MTP block), `text_config_of`
  (model types whose config.json holds this model's config as `text_config`: a VLM whose language
  model is built alone).
- `not_run`: kinds of file of the architecture that OpenVINO GenAI does not run (a DSpark draft among
  `dflash` files), each with `what`, `carries`, `genai`, `instead` and `when` (`tensors` present,
  `metadata` values; without `when`, every file: a map that only names and refuses its architecture).
  `map_for` refuses such a file in one line, `inspect` names it (`not_run.py`).
- `target`: how `gguf2ov target` builds the architecture (a map without it is no target): `mixers`
  (layer type -> the kind of layer that mixes tokens in it), `mlp` (the kind of every layer's MLP),
  `layer` (the decoder layer's norms and residual steps, Llama's when absent), `forward` (options
  of its forward: norms scaling by 1 + w, a scaled embedding, q/k norms, ...), `sliding` (which
  layers slide when a config states no layer_types), `head_dim` (a layer type's own head size key),
  `rope_factors` (the layer types a file's rope_freqs turns) and `refuse` (config keys of variants
  not built, with why). The kinds are
  `gguf2ov/targets/layers/`; `gguf2ov/targets/decoder.py` reads this section and holds it against them.

Maps are found in the shipped `tensor_maps/` and in the folders named by GGUF2OV_MAPS (paths
separated like PATH) or passed as `maps_dir`: adding an architecture is one YAML file there.
"""

import dataclasses
import os
import re
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

import yaml

from ..errors import Gguf2ovError
from ..gguf.read import GgufFile, open_gguf
from ..work import count
from .arch_map import ArchMap, CheckpointLayout
from .messages import short
from .metadata import MetadataReader
from .not_run import kind_of, not_run_entries
from .shapes import StatedShapes
from .tensors import PlanEntry, TensorMatcher, TensorRule
from .writer import GgufWriter
from .rules import OPS, VALUE_TYPES, is_number, valid_shape_expr, valid_type

TOP_LEVEL_KEYS = {"arch", "extends", "unset", "strip_hf_prefix", "hf", "config", "tensors", "optional", "groups",
                  "group_hf", "shapes", "legacy", "compare", "target", "layer_tensors", "trailing_blocks",
                  "checkpoint", "not_run", "mmproj"}  # mmproj: a VLM's projector file (targets/vision.py)
TARGET_KEYS = {"mixers", "mlp", "layer", "forward", "sliding", "head_dim", "refuse", "rope_factors"}
TRAILING_KEYS = {"count", "counted_in", "hf", "what", "tensors", "optional"}
CHECKPOINT_KEYS = {"rename", "ignore", "text_config_of", "vocabulary"}
# Sections whose entries `unset` can drop (the ones that are mappings).
UNSET_SECTIONS = ("hf", "config", "tensors", "optional", "groups", "group_hf", "shapes", "legacy", "compare")
# Extra folders of maps, separated like PATH (os.pathsep).
MAPS_ENV = "GGUF2OV_MAPS"
RULE_KEYS = {"from", "tensor_absent", "type", "add", "default", "optional", "len", "map", "constant", "min", "max",
             "above", "below", "length", "flag", "ambiguous_when", "choices", "write_also", "hf_aliases", "over", "as",
             "periodic", "per_block", "layered", "write_default", "in_layers", "widened_last"}
# Values a command-line option can set in place of a config rule's `add` (rule key `flag`). Each is
# a keyword of MetadataReader.hf_config and an option of the commands that read GGUFs, so a new one needs
# Python; its option is the name with dashes (flag_option).
KNOWN_FLAGS = ("target_layer_offset",)
_PLACEHOLDER = re.compile(r"\{(\w*)\}")


# --- loading and validation ----------------------------------------------------------------------

def _maps_dir():
    return resources.files("gguf2ov.tensor_maps")


def map_dirs(maps_dir=None) -> list:
    """Where maps are found, in order: the shipped folder, then `maps_dir` (a folder or a list of
    them), then the folders in GGUF2OV_MAPS. A shipped map is never replaced by a user's one of the
    same name (pass --map for that)."""
    extra = [] if maps_dir is None else [maps_dir] if isinstance(maps_dir, (str, os.PathLike)) else list(maps_dir)
    extra += [d for d in os.environ.get(MAPS_ENV, "").split(os.pathsep) if d]
    return [_maps_dir(), *(Path(d) for d in extra)]


def _arch_files(maps_dir=None) -> dict:
    """arch -> (its YAML file, the name messages give it), over every map folder (the first folder
    holding a name wins)."""
    found = {}
    for i, folder in enumerate(map_dirs(maps_dir)):
        if not folder.is_dir():
            continue
        for p in sorted(folder.iterdir(), key=lambda p: p.name):
            if p.name.endswith(".yaml") and not p.name.startswith("_"):
                found.setdefault(p.name[:-5], (p, f"tensor_maps/{p.name}" if i == 0 else str(p)))
    return found


def supported_arches(maps_dir=None) -> list[str]:
    """The architectures a map converts (not those whose map only names and refuses them)."""
    return [arch for arch in known_arches(maps_dir) if not load_map(arch, maps_dir=maps_dir).refuses_every_file]


def known_arches(maps_dir=None) -> list[str]:
    """Every architecture a map names, converted or refused."""
    return sorted(_arch_files(maps_dir))


def load_map(arch: str | None = None, path=None, maps_dir=None) -> ArchMap:
    """The map of `arch` (or the file at `path`), read and validated once per process and file
    version: every stage of a job asks for it, and reading one means reading and merging its
    skeleton too. Callers do not change the map they are given."""
    if path is not None:
        return _cached_build(Path(path), str(path))
    files = _arch_files(maps_dir)
    if arch is None:
        raise Gguf2ovError("the file names no architecture (general.architecture is missing)",
                           hint=f"pass --map; known maps: {', '.join(supported_arches(maps_dir))}")
    # general.architecture comes from an untrusted file: it only selects a map by its file name in
    # a map folder (never a path)
    if not isinstance(arch, str) or arch not in files:
        raise Gguf2ovError(f"no map for architecture {short(arch)}; supported: {', '.join(supported_arches(maps_dir))}",
                           hint=f"write a tensor map YAML for it and pass --map, or put it in a folder named by "
                                f"{MAPS_ENV}")
    resource, name = files[arch]
    return _cached_build(resource, name)


def _cached_build(resource, name: str) -> ArchMap:
    # keyed by the file's identity and version, so a map edited on disk is read again
    try:
        st = Path(str(resource)).stat()
        version = (st.st_mtime_ns, st.st_size)
    except OSError:
        version = None  # a packaged resource that is not a file: it does not change
    key = (str(resource), name, version)
    if key not in _LOADED:
        count("map loads")
        _LOADED[key] = _build(_read_yaml(resource), name)
    return _LOADED[key]


_LOADED: dict[tuple, ArchMap] = {}


def map_data(arch: str | None, maps_dir=None, path=None) -> dict:
    """A map's YAML content (the map of `arch`, or the file at `path`) with `extends` resolved: one
    self-contained map (to write a variant of it, or to keep beside what it built)."""
    load_map(arch, path, maps_dir)  # the same checks and messages
    return _read_yaml(Path(path) if path is not None else _arch_files(maps_dir)[arch][0])


def shipped_maps(maps_dir=None) -> list[ArchMap]:
    """Every map that a file's architecture can select (those that only refuse their architecture too)."""
    return [load_map(arch, maps_dir=maps_dir) for arch in known_arches(maps_dir)]


def config_default(arch: str, hf_key: str):
    """The default the `arch` map states for `hf_key` (e.g. dflash's block_size), None if none."""
    return load_map(arch).metadata.config_default(hf_key)


def flag_default(flag: str, maps_dir=None):
    """What a map adds where `flag` is not given (dflash: -1 to the target layers), when every map
    with that flag agrees; None otherwise. For a converted folder that did not record the value."""
    adds = {add for m in shipped_maps(maps_dir) if (add := m.metadata.flag_add(flag)) is not None}
    return adds.pop() if len(adds) == 1 else None


def compared_keys(extra: "ArchMap | None" = None) -> dict[str, dict]:
    """Config keys `check` compares, over every map (a key missing on both sides is skipped):
    {HF key: {"places": [where a config may hold it, first present wins], "default": value or None,
    "flag": the rule's flag or None}}, in map order."""
    out = {}
    for amap in [*shipped_maps(), *([extra] if extra is not None else [])]:
        for key, others in amap.compare.items():
            rule = amap.config.get(key, {})
            entry = out.setdefault(key, {"places": [key], "default": None, "flag": None})
            entry["places"] += [p for p in others if p not in entry["places"]]
            entry["default"] = entry["default"] if entry["default"] is not None else rule.get("default")
            entry["flag"] = entry["flag"] or rule.get("flag")
    return out


@dataclass(frozen=True)
class MappedGguf:
    """A GGUF file read through its map: the HF config it states and the plan for every tensor."""
    gguf: GgufFile
    amap: ArchMap
    config: dict
    plan: list[PlanEntry]
    target_layer_offset: int | None = None  # as given (None: the map's own)

    def tensors(self):
        """(hf_name, float32 array, gguf_name, qtype), tensor by tensor."""
        return self.amap.tensors.iter_tensors(self.gguf, self.plan, self.config)


def open_mapped(gguf_path, map_path=None, target_layer_offset=None, allow_ambiguous: bool = False,
                amap: ArchMap | None = None) -> MappedGguf:
    """Open a GGUF, choose its map (`amap` when the caller chose it already), build the HF config and the
    strict tensor plan.

    `allow_ambiguous` takes the map's default where the file cannot settle a value (target layer ids
    of an old-layout dflash file): for uses that do not write a checkpoint, or that name the shift.
    """
    gguf = gguf_path if isinstance(gguf_path, GgufFile) else open_gguf(gguf_path)  # or opened once by the caller
    amap = amap if amap is not None else map_for(gguf, map_path)
    if target_layer_offset is not None and amap.metadata.flag_rule("target_layer_offset") is None:
        raise Gguf2ovError(f"--target-layer-offset does not apply to {amap.arch}: its map ({amap.path}) has no "
                           "target layer ids")
    config = amap.metadata.hf_config(gguf, target_layer_offset=target_layer_offset, allow_ambiguous=allow_ambiguous)
    return MappedGguf(gguf, amap, config, amap.tensors.plan(gguf, config), target_layer_offset)


def map_for(gguf, path=None, maps_dir=None) -> ArchMap:
    """The map for a file: `path` if given (its arch must match), else the one its arch names. A file of
    a kind the map names as not run in GenAI (`not_run`) is refused here (not_run.NotRunError), once for
    every command."""
    amap = load_map(gguf.arch, path, maps_dir)
    if amap.arch != gguf.arch:
        raise Gguf2ovError(f"{gguf.path} is {short(gguf.arch)} but the map {amap.path} is for {amap.arch!r}")
    if (kind := kind_of(amap.not_run, gguf)) is not None:
        raise kind.error(gguf.path)
    return amap


def _read_yaml(resource, seen=()) -> dict:
    name = str(resource)
    try:
        data = yaml.safe_load(resource.read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError) as e:
        raise Gguf2ovError(f"cannot read tensor map {name}: {' '.join(str(e).split())}") from e
    if not isinstance(data, dict):
        raise Gguf2ovError(f"tensor map {name} is not a mapping")
    if unknown := set(data) - TOP_LEVEL_KEYS:
        raise Gguf2ovError(f"tensor map {name}: unknown sections {sorted(unknown)}; allowed: {sorted(TOP_LEVEL_KEYS)}")
    unset = data.get("unset") or {}
    if not isinstance(unset, dict) or not all(k in UNSET_SECTIONS and isinstance(v, list) for k, v in unset.items()):
        raise Gguf2ovError(f"tensor map {name}: unset must map sections ({', '.join(UNSET_SECTIONS)}) to lists of "
                           "their keys")
    if base_name := data.get("extends"):
        base = resource.parent / base_name if (resource.parent / base_name).is_file() else _maps_dir() / base_name
        if str(base) in seen:
            raise Gguf2ovError(f"tensor map {name}: extends loop through {base_name}")
        base_data = _read_yaml(base, seen + (str(base),))
        for section, keys in unset.items():
            if absent := [k for k in keys if k not in (base_data.get(section) or {})]:
                raise Gguf2ovError(f"tensor map {name}: unset {section}: {absent} not in {base_name}")
            base_data[section] = {k: v for k, v in base_data[section].items() if k not in keys}
        data = _merge(base_data, {k: v for k, v in data.items() if k not in ("extends", "unset")})
    elif unset:
        raise Gguf2ovError(f"tensor map {name}: unset needs extends")
    if prefix := data.get("strip_hf_prefix"):
        if not isinstance(prefix, str):
            raise Gguf2ovError(f"tensor map {name}: strip_hf_prefix must be a string")
        data = _strip_hf_prefix(data, prefix)
    return data


def _strip_hf_prefix(data: dict, prefix: str) -> dict:
    def strip(hf):
        if isinstance(hf, str):
            return hf[len(prefix):] if hf.startswith(prefix) else hf
        if isinstance(hf, dict) and isinstance(hf.get("to"), str):
            return dict(hf, to=strip(hf["to"]))
        return hf

    def names(section):
        return {k: strip(v) for k, v in section.items()} if isinstance(section, dict) else section

    out = dict(data)
    for key in ("tensors", "optional"):
        if key in out:
            out[key] = names(out[key])
    if isinstance(out.get("groups"), dict):
        out["groups"] = {g: names(body) for g, body in out["groups"].items()}
    if isinstance(out.get("shapes"), dict):
        out["shapes"] = {strip(k): v for k, v in out["shapes"].items()}
    return out


def _merge(base: dict, child: dict) -> dict:
    out = dict(base)
    for key, value in child.items():
        out[key] = _merge(base[key], value) if isinstance(value, dict) and isinstance(base.get(key), dict) else value
    return out


def _build(data: dict, name: str) -> ArchMap:
    def bad(msg):
        return Gguf2ovError(f"tensor map {name}: {msg}")

    arch = data.get("arch")
    if not isinstance(arch, str) or not arch:
        raise bad("`arch` must name the general.architecture it maps")
    config = {k: _rule(k, v, arch, bad) for k, v in (data.get("config") or {}).items()}
    legacy = {k: _rule(k, v, arch, bad, typed=False) for k, v in (data.get("legacy") or {}).items()}
    for hf_key, rule in config.items():
        for key in ("below", "length", "over"):
            if isinstance(rule.get(key), str) and rule[key] not in config:
                raise bad(f"config {hf_key}: {key}: {rule[key]} is not a config key of this map")
        if "periodic" in rule and not (isinstance(rule.get("length"), str) and rule["periodic"].get("every") in config):
            raise bad(f"config {hf_key}: periodic needs `length` and an `every` that is a config key of this map")
    rules = [_tensor_rule(g, v, True, None, bad) for g, v in (data.get("tensors") or {}).items()]
    for layer_type, body in (data.get("layer_tensors") or {}).items():
        if not isinstance(body, dict):
            raise bad(f"layer_tensors {layer_type} must be a mapping of tensors")
        for g, v in body.items():
            rule = _tensor_rule(g, v, True, None, bad)
            if not rule.per_layer:
                raise bad(f"layer_tensors {layer_type}: {g} is not a per-layer template ({{N}})")
            rules.append(dataclasses.replace(rule, layer_type=layer_type))
    trailing = _trailing_blocks(data.get("trailing_blocks"), config, arch, bad)
    if trailing is not None:
        for names, required in ((trailing["tensors"], True), (trailing.get("optional", []), False)):
            for g in names:
                rule = _tensor_rule(g, None, required, None, bad)
                if not rule.per_layer:
                    raise bad(f"trailing_blocks: {g} is not a per-block template ({{N}})")
                rules.append(dataclasses.replace(rule, trailing=True))
    rules += [_tensor_rule(g, v, False, None, bad) for g, v in (data.get("optional") or {}).items() if g]
    for group, body in (data.get("groups") or {}).items():
        if not isinstance(body, dict):
            raise bad(f"group {group} must be a mapping of tensors")
        rules += [_tensor_rule(g, v, False, group, bad) for g, v in body.items()]
    hf_templates = [r.hf for r in rules if r.hf]
    if dup := sorted({h for h in hf_templates if hf_templates.count(h) > 1}):
        raise bad(f"HF names produced twice: {dup}")
    shapes = data.get("shapes") or {}
    if shapes and data.get("target") is not None:
        raise bad("a map with a `target:` section states no `shapes`: a target's shapes are its layer kinds' "
                  "(gguf2ov/targets/layers/)")
    for hf, expr in shapes.items():
        if hf not in hf_templates:
            raise bad(f"shape given for {hf}, which no tensor entry produces")
        if not isinstance(expr, list):
            raise bad(f"shape of {hf} must be a list")
        for e in expr:
            if not valid_shape_expr(e):
                raise bad(f"shape of {hf}: {e!r} is not an expression of config keys, integers, + - * // and len()")
    group_hf = data.get("group_hf") or {}
    groups = {r.group for r in rules if r.group}
    for group, fields in group_hf.items():
        if group not in groups:
            raise bad(f"group_hf names {group!r}, which is not a group of this map")
        if not isinstance(fields, dict):
            raise bad(f"group_hf {group} must be a mapping of config fields")
    compare = data.get("compare") or {}
    for key, places in compare.items():
        if key not in config:
            raise bad(f"compare names {key!r}, which is not a config key of this map")
        if not isinstance(places, list) or not all(isinstance(p, str) for p in places):
            raise bad(f"compare {key} must list the other places a config may hold it")
    return _with_jobs(ArchMap(arch, name, dict(data.get("hf") or {}), config, rules, shapes, legacy, group_hf,
                              {k: list(v) for k, v in compare.items()}, _target(data.get("target"), bad), trailing,
                              _checkpoint(data.get("checkpoint") or {}, bad), not_run_entries(data.get("not_run"), bad),
                              data.get("mmproj")))


def _with_jobs(amap: ArchMap) -> ArchMap:
    """`amap` with its jobs made from its sections: the metadata reader asks the tensor table which groups
    a file holds, the table checks shapes with the stated ones, which name keys as the reader does."""
    amap.metadata = MetadataReader(amap.arch, amap.path, amap.hf, amap.config, amap.group_hf, amap.trailing,
                                   lambda name: amap.tensors.match(name))
    amap.shapes = StatedShapes(amap.stated_shapes, amap.rules, lambda *a: amap.tensors.applies(*a),
                               amap.metadata.key_text)
    amap.tensors = TensorMatcher(amap.arch, amap.path, amap.rules, amap.trailing, amap.metadata, amap.shapes)
    amap.writer = GgufWriter(amap.arch, amap.path, amap.config, amap.legacy, amap.rules)
    return amap


def _target(target, bad) -> dict | None:
    if target is not None and (
            not isinstance(target, dict) or set(target) - TARGET_KEYS or not isinstance(target.get("mixers"), dict)
            or not all(isinstance(k, str) and isinstance(v, str) for k, v in target["mixers"].items())
            or not isinstance(target.get("mlp"), str) or not isinstance(target.get("forward", {}), dict)
            or not isinstance(target.get("layer", []), list)):
        raise bad("target must hold `mixers` (layer type -> kind), `mlp` (a kind) and optionally `layer` (the "
                  "decoder layer's steps) and `forward` (a mapping of forward options)")
    return target


def _checkpoint(checkpoint, bad) -> CheckpointLayout:
    from ..gguf.tokenizer import MODELS

    if not isinstance(checkpoint, dict) or set(checkpoint) - CHECKPOINT_KEYS \
            or not all(isinstance(k, str) and isinstance(v, str) for k, v in (checkpoint.get("rename") or {}).items()) \
            or not all(isinstance(p, str) for p in checkpoint.get("ignore") or []) \
            or not all(isinstance(t, str) for t in checkpoint.get("text_config_of") or []) \
            or checkpoint.get("vocabulary", "gpt2") not in MODELS:
        raise bad("checkpoint must hold `rename` (prefix -> prefix), `ignore` (prefixes), `text_config_of` "
                  f"(model types) and `vocabulary` (one of {', '.join(MODELS)})")
    return CheckpointLayout(dict(checkpoint.get("rename") or {}), tuple(checkpoint.get("ignore") or ()),
                            tuple(checkpoint.get("text_config_of") or ()), checkpoint.get("vocabulary", "gpt2"))


def _trailing_blocks(section, config, arch, bad) -> dict | None:
    if section is None:
        return None
    if not isinstance(section, dict) or set(section) - TRAILING_KEYS \
            or not {"count", "counted_in", "hf", "what", "tensors"} <= set(section) \
            or not isinstance(section["tensors"], list) or not isinstance(section.get("optional", []), list):
        raise bad("trailing_blocks must hold `count` (a config rule), `counted_in` and `hf` (config keys), `what` "
                  "and `tensors` (and optionally `optional`), the block templates")
    if section["counted_in"] not in config:
        raise bad(f"trailing_blocks: counted_in {section['counted_in']} is not a config key of this map")
    return dict(section, count=_rule("trailing_blocks.count", section["count"], arch, bad))


def _rule(hf_key, rule, arch, bad, typed: bool = True) -> dict:
    if isinstance(rule, str):
        rule = {"from": rule}
    if not isinstance(rule, dict) or ("from" in rule) == ("tensor_absent" in rule):
        raise bad(f"config {hf_key}: expected a GGUF key or a mapping with `from:` (or `tensor_absent:`)")
    if unknown := set(rule) - RULE_KEYS:
        raise bad(f"config {hf_key}: unknown rule keys {sorted(unknown)}; allowed: {sorted(RULE_KEYS)}")
    reads_metadata = "from" in rule and "constant" not in rule
    sources = rule.get("from", [])
    sources = sources if isinstance(sources, list) else [sources]
    rule = dict(rule, **{"from": [s.replace("{arch}", arch) for s in sources]})
    declared = rule.get("type")
    if typed and reads_metadata and declared is None:
        # the value comes from an untrusted file: the map must say what it may be
        raise bad(f"config {hf_key}: a rule that reads metadata needs a `type` ({', '.join(VALUE_TYPES)}, or a "
                  f"one-item list such as [int])")
    if declared is not None and not valid_type(declared):
        raise bad(f"config {hf_key}: unknown type {declared!r}; known: {', '.join(VALUE_TYPES)}, or [int] etc. for "
                  f"a list")
    for key in ("min", "max", "above"):
        if key in rule and not is_number(rule[key]):
            raise bad(f"config {hf_key}: {key} must be a number")
    if "length" in rule and not isinstance(rule["length"], str):
        raise bad(f"config {hf_key}: length names another config key")
    if "below" in rule and not (isinstance(rule["below"], str) or is_number(rule["below"])):
        raise bad(f"config {hf_key}: below names another config key or is a number")
    if "add" in rule and not OPS["add"].check(rule["add"]):
        raise bad(f"config {hf_key}: add must be a number")
    if ("over" in rule) != ("as" in rule) or rule.get("as", "int") not in ("int", "float") \
            or not isinstance(rule.get("over", ""), str):
        raise bad(f"config {hf_key}: over (a config key) and as (int or float) go together")
    periodic = rule.get("periodic")
    if periodic is not None and not (isinstance(periodic, dict) and set(periodic) == {"every", "then", "else"}):
        raise bad(f"config {hf_key}: periodic must hold every (a config key), then and else (the item of every "
                  "every-th layer, and of the others)")
    if not isinstance(rule.get("layered", False), (bool, str)) or ("in_layers" in rule and not (
            isinstance(rule["in_layers"], str) and "tensor_absent" in rule and "{N}" in rule["tensor_absent"])):
        raise bad(f"config {hf_key}: layered is true or a layer type; in_layers a layer type, with a tensor_absent "
                  "template of {N}")
    widened = rule.get("widened_last")
    if widened is not None and not (isinstance(widened, dict) and set(widened) == {"count", "factor", "sets"} and
                                    isinstance(widened["count"], str) and isinstance(widened["sets"], str) and
                                    isinstance(widened["factor"], int) and widened["factor"] > 1):
        raise bad(f"config {hf_key}: widened_last must hold count (a config key), factor (an integer above 1) and "
                  "sets (the config key set true when the file states the widened list)")
    if rule.get("write_default") and "default" not in rule:
        raise bad(f"config {hf_key}: write_default needs a default")
    if "flag" in rule and rule["flag"] not in KNOWN_FLAGS:
        raise bad(f"config {hf_key}: unknown flag {rule['flag']!r}; known: {sorted(KNOWN_FLAGS)}")
    for cond in rule.get("ambiguous_when", []):
        if not isinstance(cond, dict) or len(set(cond) & {"has", "lacks", "contains"}) != 1 or "why" not in cond:
            raise bad(f"config {hf_key}: each ambiguous_when entry needs one of has/lacks/contains and a why")
    return rule


def _tensor_rule(gguf, value, required, group, bad) -> TensorRule:
    aliases, refuse = [], None
    if value is None or isinstance(value, str):
        hf, ops = value, []
    elif isinstance(value, dict) and set(value) == {"refuse"} and isinstance(value["refuse"], str):
        hf, ops, refuse, required = None, [], value["refuse"], False
    elif isinstance(value, dict) and set(value) <= {"to", "ops", "aliases"} and "to" in value:
        hf, ops, aliases = value["to"], value.get("ops") or [], value.get("aliases") or []
        if not isinstance(aliases, list) or not all(isinstance(a, str) for a in aliases):
            raise bad(f"tensor {gguf}: aliases must list GGUF name templates")
    else:
        raise bad(f"tensor {gguf}: expected an HF name, null, {{to:, ops:, aliases:}} or {{refuse: why}}")
    for template in (gguf, hf or "", *aliases):
        if any(p != "N" for p in _PLACEHOLDER.findall(template)) or template.count("{") != template.count("}"):
            raise bad(f"tensor {gguf}: bad template {template!r} (the only placeholder is {{N}})")
    if hf is not None and ("{N}" in gguf) != ("{N}" in hf):
        raise bad(f"tensor {gguf}: {{N}} must appear in both the GGUF and the HF name")
    if any(("{N}" in a) != ("{N}" in gguf) for a in aliases):
        raise bad(f"tensor {gguf}: an alias must have {{N}} where the name has it")
    parsed = []
    for op in ops:
        if not isinstance(op, dict) or len(op) != 1:
            raise bad(f"tensor {gguf}: each op is a one-key mapping like `add: -1.0`")
        (op_name, arg), = op.items()
        if op_name not in OPS:
            raise bad(f"tensor {gguf}: unknown op {op_name!r}; known: {sorted(OPS)}")
        if not OPS[op_name].check(arg):
            raise bad(f"tensor {gguf}: op {op_name} takes {OPS[op_name].takes}, got {arg!r}")
        parsed.append((op_name, arg))
    return TensorRule(gguf, hf, tuple(parsed), required, group, _template_re(gguf), _template_re(hf) if hf else None,
                      refuse=refuse, aliases=tuple(aliases), alias_res=tuple(_template_re(a) for a in aliases))


def _template_re(template: str) -> re.Pattern:
    # {N} matches at most 9 digits: a name with thousands of digits in its layer index (int() refuses
    # more than 4300) is simply a tensor the map does not know.
    return re.compile(re.escape(template).replace(r"\{N\}", r"(\d{1,9})"))
