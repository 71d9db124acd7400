"""A map file read and validated: the YAML of `tensor_maps/<arch>.yaml` (its `extends` skeleton merged
underneath, `unset` and `strip_hf_prefix` applied), every section checked, and the `ArchMap` made of
them. A map may come from a user (--map, GGUF2OV_MAPS): whatever is wrong with it is one error line
naming the file.

The language itself, section by section, is docs/maps.md ("The map language"). A config rule's keys are
one entry each in `RULE_KEYS` (what the key means and the check of its value), which the docs' table of
rule keys is tested against; what a key does is `metadata.py`'s (reading) and `writer.py`'s (writing).
"""

import dataclasses
import re
from collections.abc import Callable
from dataclasses import dataclass
from importlib import resources

import yaml

from ..errors import Gguf2ovError
from .arch_map import ArchMap, CheckpointLayout
from .not_run import not_run_entries
from .rules import OPS, VALUE_TYPES, is_number, valid_shape_expr, valid_type
from .tensors import TensorRule

TOP_LEVEL_KEYS = {"arch", "extends", "unset", "strip_hf_prefix", "hf", "config", "tensors", "optional", "groups",
                  "group_hf", "shapes", "legacy", "compare", "target", "layer_tensors", "trailing_blocks",
                  "checkpoint", "not_run", "mmproj"}
TARGET_KEYS = {"mixers", "mlp", "layer", "forward", "sliding", "head_dim", "refuse", "rope_factors"}
TRAILING_KEYS = {"count", "counted_in", "hf", "what", "tensors", "optional"}
CHECKPOINT_KEYS = {"rename", "ignore", "text_config_of", "vocabulary"}
# Sections whose entries `unset` can drop (the ones that are mappings).
UNSET_SECTIONS = ("hf", "config", "tensors", "optional", "groups", "group_hf", "shapes", "legacy", "compare")
# Values a command-line option can set in place of a config rule's `add` (rule key `flag`). Each is
# a keyword of MetadataReader.hf_config and an option of the commands that read GGUFs, so a new one needs
# Python; its option is the name with dashes (flag_option).
KNOWN_FLAGS = ("target_layer_offset",)
_PLACEHOLDER = re.compile(r"\{(\w*)\}")


def shipped_dir():
    """The shipped maps' folder (`tensor_maps/`, packaged as gguf2ov.tensor_maps): where `extends` finds a
    skeleton its map's own folder lacks."""
    return resources.files("gguf2ov.tensor_maps")


# --- config rules: one entry per key -------------------------------------------------------------

@dataclass(frozen=True)
class RuleKey:
    doc: str                                          # what the key means (docs/maps.md's table of rule keys)
    check: Callable[[object, dict], bool] | None = None   # (its value, the whole rule) -> whether valid
    needs: str = ""                                   # what a valid value is, for the error line


def _bound(key: str, words: str) -> RuleKey:
    return RuleKey(f"the value written is {words} this number (each item of a list)", lambda v, r: is_number(v),
                   f"{key} must be a number")


_LAYERED = "layered is true or a layer type; in_layers a layer type, with a tensor_absent template of {N}"
_OVER_AS = "over (a config key) and as (int or float) go together"

RULE_KEYS = {
    "from": RuleKey("the GGUF key the value is read from, or a list of keys (the first present wins); `{arch}` "
                    "in a key is the map's arch",
                    lambda v, r: isinstance(v, str) or isinstance(v, list) and all(isinstance(k, str) for k in v),
                    "from names a GGUF key or a list of them"),
    "tensor_absent": RuleKey("instead of `from`: the value is true when the file holds no tensor of this name (tied "
                             "embeddings: llama.cpp then writes no output.weight)",
                             lambda v, r: isinstance(v, str), "tensor_absent names a GGUF tensor"),
    "type": RuleKey("what the file must state (after `len`): int, float (stored as F32 or F64, never an integer "
                    "type), number (either), bool, str, or a one-item list such as [int] for a list of them; every "
                    "rule that reads metadata declares it (metadata comes from untrusted files)",
                    lambda v, r: valid_type(v), f"type is one of {', '.join(VALUE_TYPES)}, or a one-item list such as "
                                                "[int] for a list"),
    "add": RuleKey("a number added to the value (each item of a list); writing subtracts it",
                   lambda v, r: OPS["add"].check(v), "add must be a number"),
    "default": RuleKey("the value when the file states none"),
    "optional": RuleKey("true: the config leaves the key out when the file states none"),
    "len": RuleKey("true: the value is the length of the file's array"),
    "map": RuleKey("file value -> config value (types exact: 1 is not true); writing maps back",
                   lambda v, r: isinstance(v, dict), "map must be a mapping of file values to config values"),
    "constant": RuleKey("the value, whenever the file states the key"),
    "min": _bound("min", "at least"),
    "max": _bound("max", "at most"),
    "above": _bound("above", "above"),
    "below": RuleKey("the value written is below this number, or below another config key's value (a token id "
                     "under vocab_size)", lambda v, r: isinstance(v, str) or is_number(v),
                     "below names another config key or is a number"),
    "length": RuleKey("another config key: the list is as long as its value (one layer type per layer)",
                      lambda v, r: isinstance(v, str), "length names another config key"),
    "flag": RuleKey(f"a command-line option that settles the value in place of `add` ({', '.join(KNOWN_FLAGS)})",
                    lambda v, r: v in KNOWN_FLAGS, f"flag is one of {', '.join(KNOWN_FLAGS)}"),
    "ambiguous_when": RuleKey("signs that the file cannot settle a flagged value, then refused until the flag is "
                              "given: a list of `has` or `lacks` (a GGUF key) or `contains` (an item), each with a "
                              "`why`",
                              lambda v, r: isinstance(v, list) and all(
                                  isinstance(c, dict) and len(set(c) & {"has", "lacks", "contains"}) == 1 and "why" in c
                                  for c in v),
                              "each ambiguous_when entry needs one of has/lacks/contains and a why"),
    "choices": RuleKey("offset -> the converter that writes it, for the message of a flagged value",
                       lambda v, r: isinstance(v, dict), "choices must map offsets to the converters that write them"),
    "write_also": RuleKey("more GGUF keys written with the value"),
    "hf_aliases": RuleKey("other HF keys that may hold the value when writing (transformers 5 nests some)"),
    "over": RuleKey("another config key the file's value is divided by (a head size from a total); writing "
                    "multiplies it back (truncated to an integer, as llama.cpp's converter truncates)",
                    lambda v, r: isinstance(v, str) and "as" in r, _OVER_AS),
    "as": RuleKey("with `over`: int (a remainder is refused) or float",
                  lambda v, r: v in ("int", "float") and "over" in r, _OVER_AS),
    "periodic": RuleKey("{every: KEY, then:, else:}: a `length`-long list when the file states none; item i is "
                        "`then` when i + 1 is a multiple of KEY's value (every 4th layer full attention), else `else`",
                        lambda v, r: isinstance(v, dict) and set(v) == {"every", "then", "else"},
                        "periodic must hold every (a config key), then and else (the item of every every-th layer, "
                        "and of the others)"),
    "per_block": RuleKey("true: a list the file states per GGUF block, whose items for `trailing_blocks` are dropped"),
    "layered": RuleKey("true: the file may state the value per layer (an array, as Ollama writes head counts), read "
                       "when its non-zero items agree; a layer type: the items at the layers whose `layer_types` entry "
                       "is that type (written back as a list by layer type when two rules state one key)",
                       lambda v, r: isinstance(v, (bool, str)), _LAYERED),
    "write_default": RuleKey("true: writing GGUF writes `default` when the HF config does not state the value (a key "
                             "llama.cpp's loader requires)", lambda v, r: not v or "default" in r,
                             "write_default needs a default"),
    "in_layers": RuleKey("a layer type, with a `tensor_absent` template of {N}: true when no layer of that type "
                         "holds the tensor",
                         lambda v, r: isinstance(v, str) and isinstance(r.get("tensor_absent"), str)
                         and "{N}" in r["tensor_absent"], _LAYERED),
    "widened_last": RuleKey("{count: KEY, factor: F, sets: FLAG}: also reads a list of one value per layer whose "
                            "last KEY items are F times the others' (the others' value, and FLAG set true; any other "
                            "list is refused), and writes that list back when the config sets FLAG (Gemma 4 E2B's "
                            "double-wide MLPs)",
                            lambda v, r: isinstance(v, dict) and set(v) == {"count", "factor", "sets"}
                            and isinstance(v["count"], str) and isinstance(v["sets"], str)
                            and isinstance(v["factor"], int) and v["factor"] > 1,
                            "widened_last must hold count (a config key), factor (an integer above 1) and sets (the "
                            "config key set true when the file states the widened list)"),
}


def rule_keys_table() -> str:
    """The Markdown table of the config rule keys, as docs/maps.md holds it."""
    rows = [f"| `{key}` | {entry.doc} |" for key, entry in RULE_KEYS.items()]
    return "\n".join(["| key | meaning |", "|---|---|", *rows])


# --- reading ---------------------------------------------------------------------------------------

def read_map(resource, seen=()) -> dict:
    """A map file's YAML content with `extends` merged underneath (`unset` applied) and `strip_hf_prefix`
    applied: one self-contained map."""
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
        base = resource.parent / base_name if (resource.parent / base_name).is_file() else shipped_dir() / base_name
        if str(base) in seen:
            raise Gguf2ovError(f"tensor map {name}: extends loop through {base_name}")
        base_data = read_map(base, seen + (str(base),))
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


# --- validating ------------------------------------------------------------------------------------

def build_map(data: dict, name: str) -> ArchMap:
    """The ArchMap of a map's content (`read_map`), every section validated; `name` is the map in messages."""
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
    return ArchMap(arch, name, dict(data.get("hf") or {}), config, rules, shapes, legacy, group_hf,
                   {k: list(v) for k, v in compare.items()}, _target(data.get("target"), bad), trailing,
                   _checkpoint(data.get("checkpoint") or {}, bad), not_run_entries(data.get("not_run"), bad),
                   _mmproj(data.get("mmproj"), bad))


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


def _texts(value) -> bool:
    return isinstance(value, dict) and all(isinstance(k, str) and isinstance(v, str) for k, v in value.items())


def _names(value) -> bool:
    return isinstance(value, list) and all(isinstance(v, str) for v in value)


def _vision_tensors(value) -> bool:
    def entry(gguf, hf):
        hf = hf.get("hf") if isinstance(hf, dict) and set(hf) <= {"hf", "layout"} \
            and isinstance(hf.get("layout", ""), str) else hf
        return isinstance(gguf, str) and isinstance(hf, str) and not _template_problem(gguf, hf)

    return isinstance(value, dict) and all(entry(g, h) for g, h in value.items())


def _vision_defaults(value) -> bool:
    def rule(v):
        return (isinstance(v, dict) and set(v) == {"from", "default"} and isinstance(v["from"], str)) or \
            isinstance(v, (int, float, str)) and not isinstance(v, bool)

    return isinstance(value, dict) and all(isinstance(k, str) and rule(v) for k, v in value.items())


# `mmproj:`, how a VLM's projector file is read (targets/vision.py): key -> (required, check, what it holds)
MMPROJ_KEYS = {
    "projector_type": (True, lambda v: isinstance(v, str) and bool(v), "the projector type the file states"),
    "config": (True, _texts, "vision config key -> the GGUF key it is read from"),
    "defaults": (True, _vision_defaults, "vision config key -> a value, or {from: GGUF key, default: value}"),
    "tensors": (True, _vision_tensors, "GGUF template -> HF name, or {hf: HF name, layout: how the file stores it}"),
    "optional": (False, _vision_tensors, "like tensors, for tensors read when the file holds them"),
    "prefixes": (True, _names, "the prefixes of the image tensors' names"),
    "refuse": (False, _texts, "a tensor name's ending -> why a file holding it is refused"),
    "architecture": (True, lambda v: isinstance(v, str) and bool(v), "the VLM folder's architecture"),
    "model_type": (True, lambda v: isinstance(v, str) and bool(v), "the VLM folder's model type"),
    "tokens": (True, _texts, "config key -> the text of a special token in the text file's vocabulary"),
    "required_tokens": (True, _names, "the keys of `tokens` the vocabulary must hold"),
}


def _mmproj(section, bad) -> dict | None:
    if section is None:
        return None
    if not isinstance(section, dict):
        raise bad("mmproj must be a mapping (how a VLM's projector file is read)")
    if unknown := set(section) - set(MMPROJ_KEYS):
        raise bad(f"mmproj: unknown keys {sorted(unknown)}; allowed: {sorted(MMPROJ_KEYS)}")
    if missing := sorted(k for k, (required, _, _) in MMPROJ_KEYS.items() if required and k not in section):
        raise bad(f"mmproj: missing {missing}")
    for key, value in section.items():
        if not MMPROJ_KEYS[key][1](value):
            raise bad(f"mmproj {key} must hold {MMPROJ_KEYS[key][2]}")
    if absent := [k for k in section["required_tokens"] if k not in section["tokens"]]:
        raise bad(f"mmproj required_tokens: {absent} not in tokens")
    return section


def _rule(hf_key, rule, arch, bad, typed: bool = True) -> dict:
    if isinstance(rule, str):
        rule = {"from": rule}
    if not isinstance(rule, dict) or ("from" in rule) == ("tensor_absent" in rule):
        raise bad(f"config {hf_key}: expected a GGUF key or a mapping with `from:` (or `tensor_absent:`)")
    if unknown := set(rule) - set(RULE_KEYS):
        raise bad(f"config {hf_key}: unknown rule keys {sorted(unknown)}; allowed: {sorted(RULE_KEYS)}")
    for key, value in rule.items():
        entry = RULE_KEYS[key]
        if entry.check is not None and not entry.check(value, rule):
            raise bad(f"config {hf_key}: {entry.needs}")
    if typed and "from" in rule and "constant" not in rule and "type" not in rule:
        # the value comes from an untrusted file: the map must say what it may be
        raise bad(f"config {hf_key}: a rule that reads metadata needs a `type` ({', '.join(VALUE_TYPES)}, or a "
                  f"one-item list such as [int])")
    sources = rule.get("from", [])
    sources = sources if isinstance(sources, list) else [sources]
    return dict(rule, **{"from": [s.replace("{arch}", arch) for s in sources]})


def _template_problem(gguf: str, hf: str | None, aliases=()) -> str | None:
    """What is wrong with a tensor entry's name templates, or None."""
    for template in (gguf, hf or "", *aliases):
        if any(p != "N" for p in _PLACEHOLDER.findall(template)) or template.count("{") != template.count("}"):
            return f"bad template {template!r} (the only placeholder is {{N}})"
    if hf is not None and ("{N}" in gguf) != ("{N}" in hf):
        return "{N} must appear in both the GGUF and the HF name"
    if any(("{N}" in a) != ("{N}" in gguf) for a in aliases):
        return "an alias must have {N} where the name has it"
    return None


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
    if problem := _template_problem(gguf, hf, aliases):
        raise bad(f"tensor {gguf}: {problem}")
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
