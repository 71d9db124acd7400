"""The map of one architecture as an object: the HF config built from GGUF metadata (and the GGUF
metadata built back from an HF config), and the strict plan that names every GGUF tensor in HF terms.

`maps.load` loads and validates maps from their YAML files (the format is documented there); the rules a
map names (value types and bounds, shape expressions, tensor ops) live in `maps.rules`.
"""

import copy
import re
from dataclasses import dataclass, field

from ..errors import Gguf2ovError
from .rules import (MAX_LIST, BadShapeValue, apply_ops, config_get, config_set, eval_shape, has_type, is_array, is_int,
                    is_number, out_of_bounds, plain_value, shape_through, type_words, value_items)


@dataclass(frozen=True)
class TensorRule:
    gguf: str                 # template, may contain {N}
    hf: str | None            # None: accepted but not written
    ops: tuple = ()
    required: bool = True
    group: str | None = None
    gguf_re: re.Pattern = field(default=None, compare=False, repr=False)
    hf_re: re.Pattern = field(default=None, compare=False, repr=False)
    layer_type: str | None = None  # applies to the layers of this type only (`layer_tensors`)
    refuse: str | None = None      # a layout the map cannot read: why, for the error
    aliases: tuple = ()            # other GGUF templates of the same tensor (read, never written)
    alias_res: tuple = field(default=(), compare=False, repr=False)
    trailing: bool = False         # a tensor of the blocks after the decoder's (`trailing_blocks`)

    def gguf_name(self, n=None) -> str:
        return self.gguf.replace("{N}", str(n))

    def gguf_names(self, n=None) -> list[str]:
        """The names the tensor may have in a file: its template's, then its aliases'."""
        return [t.replace("{N}", str(n)) for t in (self.gguf, *self.aliases)]

    def hf_name(self, n=None) -> str | None:
        return None if self.hf is None else self.hf.replace("{N}", str(n))

    @property
    def per_layer(self) -> bool:
        return "{N}" in self.gguf


@dataclass(frozen=True)
class PlanEntry:
    gguf_name: str
    hf_name: str | None       # None: dropped (see warnings)
    qtype: object
    shape: tuple[int, ...]    # PyTorch order
    ops: tuple = ()


@dataclass
class ArchMap:
    arch: str
    path: str                 # where the map came from, for messages
    hf: dict
    config: dict
    rules: list[TensorRule]
    shapes: dict
    legacy: dict
    group_hf: dict = field(default_factory=dict)
    compare: dict = field(default_factory=dict)   # HF key -> [other places a config may hold it]
    target: dict | None = None                    # how gguf2ov target builds it (None: not a target)
    trailing: dict | None = None                  # blocks after the decoder's (`trailing_blocks`)
    checkpoint: dict = field(default_factory=dict)  # how a checkpoint's names become the map's

    # -- config ------------------------------------------------------------------------------------

    def hf_config(self, gguf, target_layer_offset=None, allow_ambiguous=False) -> dict:
        """The full HF config.json content: fixed `hf` fields plus every key the file states."""
        flags = {"target_layer_offset": target_layer_offset}
        out = copy.deepcopy(self.hf)
        missing, deferred = [], []
        for hf_key, rule in self.config.items():
            if "over" in rule or ("periodic" in rule and self._stated(gguf, rule) is None):
                deferred.append((hf_key, rule))  # computed from other config values, once they are known
                continue
            value = self._config_value(gguf, hf_key, rule, flags, allow_ambiguous)
            if value is _MISSING:
                missing.append(f"{hf_key} (from {' or '.join(rule['from'])})")
            elif value is not _ABSENT:
                config_set(out, hf_key, value)
        if not missing:
            self._trailing_blocks(gguf, out, flags)
            for hf_key, rule in deferred:
                value = self._derived_value(gguf, hf_key, rule, out)
                if value is _MISSING:
                    missing.append(f"{hf_key} (from {' or '.join(rule['from'])})")
                elif value is not _ABSENT:
                    config_set(out, hf_key, value)
        if missing:
            raise Gguf2ovError(f"{gguf.path}: metadata needed by the {self.arch} map ({self.path}) is missing: "
                               + ", ".join(missing))
        for group in sorted(self.groups_present(gguf)):
            fields = self.group_hf.get(group, {})
            self._refuse_contradiction(gguf, group, fields, out)
            out.update(copy.deepcopy(fields))
        self._require_relations(gguf, out)
        return out

    @staticmethod
    def _stated(gguf, rule):
        """The GGUF key the file states the rule's value with, or None."""
        return next((k for k in rule.get("from", []) if k in gguf.metadata), None)

    def _trailing_blocks(self, gguf, config: dict, flags) -> None:
        """`trailing_blocks`: the blocks after the decoder's that block_count counts (llama.cpp's MTP
        block) are taken off the layer count, and off the lists the file states per block."""
        if self.trailing is None:
            return
        rule = self.trailing["count"]
        count = self._config_value(gguf, self.trailing["hf"], rule, flags, True)
        if count in (_MISSING, _ABSENT) or not count:
            return
        key, source = self.trailing["counted_in"], self._stated(gguf, rule)
        blocks = config_get(config, key)
        if not is_int(blocks):
            return
        if count >= blocks:
            raise Gguf2ovError(f"{gguf.path}: {source} is {count}, but {self._source_key(gguf, key)} is {blocks}: no "
                               f"decoder layer is left before the {self.trailing['what']}",
                               hint="the file's metadata is malformed; re-convert it")
        config_set(config, key, blocks - count)
        config_set(config, self.trailing["hf"], count)
        for hf_key, r in self.config.items():
            value = config_get(config, hf_key)
            if r.get("per_block") and isinstance(value, list) and len(value) == blocks:
                config_set(config, hf_key, value[:blocks - count])

    def _derived_value(self, gguf, hf_key, rule, config: dict):
        """A value made from another config value: `over` (the file's value divided by it) or
        `periodic` (a layer pattern, when the file states no list)."""
        if "over" in rule:
            value = self._config_value(gguf, hf_key, rule, {}, True)
            if value in (_MISSING, _ABSENT):
                return value
            divisor, source = config_get(config, rule["over"]), self._stated(gguf, rule)
            if not (is_number(divisor) and divisor > 0):
                return _MISSING
            if rule["as"] == "int":
                if not (is_int(value) and is_int(divisor) and value % divisor == 0):
                    raise Gguf2ovError(f"{gguf.path}: {source} = {short(value)} is not a multiple of {rule['over']} = "
                                       f"{short(divisor)} (from {self._source_key(gguf, rule['over'])}): {hf_key} "
                                       "would not be a whole number", hint="the file's metadata is malformed")
                value = value // divisor
            else:
                value = value / divisor
        else:
            pattern = rule["periodic"]
            every, count = config_get(config, pattern["every"]), config_get(config, rule["length"])
            if not (is_int(every) and is_int(count)):
                return _MISSING
            value = [pattern["then"] if (i + 1) % every == 0 else pattern["else"] for i in range(count)]
            source = self._source_key(gguf, pattern["every"])
        if bound := out_of_bounds(value, rule):
            raise Gguf2ovError(f"{gguf.path}: {hf_key} would be {short(value)} (from {source}), {bound}",
                               hint="the file's metadata is malformed; re-download or re-convert the file")
        return value

    def _refuse_contradiction(self, gguf, group: str, fields: dict, config: dict) -> None:
        """A group's fixed config fields are what a model with those tensors is: a value the file
        states for one of them (through a config rule) and that differs contradicts its tensors."""
        for key, fixed in fields.items():
            rule = self.config.get(key, {})
            source = next((k for k in rule.get("from", []) if k in gguf.metadata), None)
            value = config_get(config, key)
            if source is None or value is None or (type(value), value) == (type(fixed), fixed):
                continue
            model = (fields.get("architectures") or [group])[0]
            raise Gguf2ovError(f"{gguf.path}: {source} is {short(plain_value(gguf.metadata[source]))} (it sets {key}), "
                               f"but the file holds the {group} tensors, and the {self.arch} map ({self.path}) makes "
                               f"such a model {model} with {key} = {short(fixed)}",
                               hint="the file contradicts itself; re-convert it from its checkpoint, or pass --map with "
                                    f"a map whose group_hf does not fix {key} if the model really has {short(value)}")

    def groups_present(self, gguf) -> set[str]:
        """The tensor groups of which the file holds at least one tensor."""
        if not self.group_hf:
            return set()
        return {rule.group for name in gguf.tensors for rule, _ in self.match(name) if rule.group}

    def config_default(self, hf_key: str):
        """The value the map takes for `hf_key` when the file does not state it (None: no default)."""
        return self.config.get(hf_key, {}).get("default")

    def flag_rule(self, flag: str):
        """(hf_key, gguf_key) of the config rule a command-line flag overrides, or None."""
        for hf_key, rule in self.config.items():
            if rule.get("flag") == flag:
                return hf_key, rule["from"][0]
        return None

    def _config_value(self, gguf, hf_key, rule, flags, allow_ambiguous):
        if "tensor_absent" in rule:  # e.g. tied embeddings: llama.cpp then writes no output.weight
            return rule["tensor_absent"] not in gguf.tensors
        source = next((k for k in rule["from"] if k in gguf.metadata), None)
        if source is None:
            if "default" in rule:
                return rule["default"]
            return _ABSENT if rule.get("optional") else _MISSING
        if "constant" in rule:
            return rule["constant"]
        stated = gguf.metadata[source]
        # The file's value enters here: as plain Python, and of the type the rule declares.
        if rule.get("len") and is_array(stated):
            value = len(stated)
        elif rule.get("layered") and is_array(stated) and len(stated) <= MAX_LIST:
            value = self._layered(gguf, hf_key, source, plain_value(stated))
        elif is_array(stated) and len(stated) > MAX_LIST:
            raise Gguf2ovError(f"{gguf.path}: {source} holds {len(stated)} items, more than {hf_key} can "
                               f"(at most {MAX_LIST})", hint="the file's metadata is malformed")
        else:
            value = plain_value(stated)
        if not has_type(value, rule["type"]):
            raise Gguf2ovError(f"{gguf.path}: {source} is {short(value)}, not {type_words(rule['type'])} "
                               f"(it sets {hf_key})", hint="the file's metadata is malformed; re-download or "
                               "re-convert the file")
        flag = rule.get("flag")
        offset = rule.get("add", 0)
        if flag and flags.get(flag) is not None:
            offset = flags[flag]
        elif flag and not allow_ambiguous:
            self._refuse_if_ambiguous(gguf, hf_key, rule, source, value)
        stated = value
        if offset:
            value = [v + offset for v in value] if isinstance(value, list) else value + offset
        if "map" in rule:
            # exact types: True must not find a key 1, nor 1.0 a key True
            table = {(type(k), k): v for k, v in rule["map"].items()}
            if unknown := [v for v in value_items(value) if (type(v), v) not in table]:
                raise Gguf2ovError(f"{gguf.path}: {source} holds {short(unknown[0])}; the {self.arch} map knows "
                                   f"{sorted(rule['map'], key=str)}")
            value = [table[type(v), v] for v in value] if isinstance(value, list) else table[type(value), value]
        if "over" in rule:
            return value  # bounded once divided (_derived_value)
        if bound := out_of_bounds(value, rule):
            shift = f", offset {offset:+}" if offset else ""
            hint = self._choices_text(rule, stated) if flag else None
            raise Gguf2ovError(f"{gguf.path}: {hf_key} would be {short(value)} (from {source} = {short(stated)}"
                               f"{shift}), {bound}", hint=hint or "the file's metadata is malformed; re-download or "
                               "re-convert the file")
        return value

    @staticmethod
    def _layered(gguf, hf_key, source, items: list):
        """`layered`: a value stated per layer (as Ollama writes head counts) is read when the layers that
        state one (non-zero) agree; a layer type without it (0: a recurrent layer's KV heads) has none."""
        stated = sorted({v for v in items if v != 0}, key=repr)
        if len(stated) == 1:
            return stated[0]
        raise Gguf2ovError(f"{gguf.path}: {source} states {hf_key} per layer ({short(items)}), with "
                           f"{len(stated)} different values where this map reads one for every layer",
                           hint="a per-layer geometry is not supported")

    def _require_relations(self, gguf, config: dict) -> None:
        """`below` and `length`: bounds one config value takes from another the file states."""
        for hf_key, rule in self.config.items():
            value = config_get(config, hf_key)
            key = rule.get("below")
            key = key if isinstance(key, str) else None  # a number is a bound of its own (out_of_bounds)
            if value is None or not (key or rule.get("length")):
                continue
            source = self._source_key(gguf, hf_key)
            if key and is_int(limit := config_get(config, key)):
                if high := [v for v in value_items(value) if is_number(v) and v >= limit]:
                    raise Gguf2ovError(f"{gguf.path}: {hf_key} would be {short(value)} (from {source}), but "
                                       f"{key} is {limit} (from {self._source_key(gguf, key)}): {short(high[0])} "
                                       f"is out of range", hint="the file's metadata is malformed")
            if (key := rule.get("length")) and is_int(limit := config_get(config, key)) and \
                    isinstance(value, list) and len(value) != limit:
                raise Gguf2ovError(f"{gguf.path}: {hf_key} has {len(value)} entries (from {source}), but {key} "
                                   f"is {limit} (from {self._source_key(gguf, key)})",
                                   hint="the file's metadata is malformed")

    @staticmethod
    def ambiguity(gguf, rule, value) -> list[str]:
        """Why the file cannot settle a flagged value (the `ambiguous_when` signs it shows)."""
        reasons = []
        for cond in rule.get("ambiguous_when", []):
            if ("has" in cond and cond["has"] in gguf.metadata) or \
               ("lacks" in cond and cond["lacks"] not in gguf.metadata) or \
               ("contains" in cond and isinstance(value, list) and cond["contains"] in value):
                reasons.append(cond["why"])
        return reasons

    def flag_ambiguity(self, gguf, flag: str) -> list[str]:
        """Why `flag` must be settled for this file (empty: the file settles it, or the map has no such flag)."""
        found = self.flag_rule(flag)
        if found is None or found[1] not in gguf.metadata:
            return []
        return self.ambiguity(gguf, self.config[found[0]], plain_value(gguf.metadata[found[1]]))

    def _refuse_if_ambiguous(self, gguf, hf_key, rule, source, value):
        reasons = self.ambiguity(gguf, rule, value)
        if reasons:
            raise Gguf2ovError(
                f"{gguf.path}: cannot tell how {source} = {short(value)} was written ({'; '.join(reasons)}), so "
                f"{hf_key} is not settled: {self._choices_text(rule, value)}",
                hint=f"check the draft's original config, then pass {flag_option(rule['flag'])} explicitly; or give "
                     "--target (the target's OpenVINO folder) and the tap scan measures which layers the draft "
                     "fits")

    @staticmethod
    def _choices_text(rule, value) -> str:
        parts = []
        for offset, meaning in rule.get("choices", {}).items():
            ids = [v + offset for v in value] if isinstance(value, list) else value + offset
            bad = " (invalid)" if out_of_bounds(ids, rule) else ""
            parts.append(f"{flag_option(rule['flag'])} {offset} if written by {meaning}: {short(ids)}{bad}")
        return "; ".join(parts)

    def gguf_metadata(self, hf_config: dict, legacy: bool = False) -> dict:
        """GGUF keys and values from an HF config: the `config` rules run backwards."""
        rules = dict(self.config)
        if legacy:
            rules.update(self.legacy)
        out = {}
        for hf_key, rule in rules.items():
            value = next((v for k in [hf_key, *rule.get("hf_aliases", [])]
                          if (v := config_get(hf_config, k)) is not None), None)
            if value is None and rule.get("write_default"):
                value = copy.deepcopy(rule.get("default"))
            if value is None or "constant" in rule or rule.get("len") or not rule["from"]:
                continue
            if "over" in rule:
                factor = config_get(hf_config, rule["over"])
                if not is_number(factor):
                    continue
                value = value * factor
                value = int(value) if rule.get("type") == "int" else value  # as llama.cpp's converter truncates
            if "map" in rule:
                back = {v: k for k, v in rule["map"].items()}
                value = [back[v] for v in value] if isinstance(value, list) else back[value]
            if rule.get("add"):
                value = [v - rule["add"] for v in value] if isinstance(value, list) else value - rule["add"]
            if rule.get("type") == "float" and is_number(value):
                value = float(value)  # a config may say 10000 where the file must hold a float (F32)
            for key in [rule["from"][0], *rule.get("write_also", [])]:
                out[key.replace("{arch}", self.arch)] = value
        return out

    # -- tensors -----------------------------------------------------------------------------------

    def match(self, gguf_name: str, config: dict | None = None):
        """[(rule, block index or None)] for every rule whose GGUF template (or alias) matches the name;
        with `config`, only the rules that apply to that block (its layer type, or a trailing block)."""
        found = []
        for rule in self.rules:
            for pattern in (rule.gguf_re, *rule.alias_res):
                if m := pattern.fullmatch(gguf_name):
                    found.append((rule, int(m.group(1)) if rule.per_layer else None))
                    break
        if config is not None:
            found = [(rule, n) for rule, n in found if self.applies(rule, n, config)]
        return found

    def applies(self, rule, n, config: dict) -> bool:
        """Whether `rule` names a tensor of block `n` under `config`: a decoder layer (of the rule's
        layer type), or a trailing block."""
        if not rule.per_layer:
            return True
        layers = config.get("num_hidden_layers")
        if not is_int(layers):
            return False
        if rule.trailing:
            return layers <= n < layers + (config_get(config, self.trailing["hf"]) or 0)
        if n >= layers:
            return False
        if rule.layer_type is None:
            return True
        types = config_get(config, "layer_types")
        return isinstance(types, list) and n < len(types) and types[n] == rule.layer_type

    def problems(self, gguf, config: dict) -> list[str]:
        """Everything that keeps this map from converting the file; empty when it fits."""
        n_blocks = config.get("num_hidden_layers")
        if n_blocks is not None and not (is_int(n_blocks) and n_blocks >= 0):
            return [f"num_hidden_layers is {n_blocks!r}: the file's block count is not a number of layers"]
        unmatched, ambiguous, beyond, mismatched, missing, partial = [], [], [], [], [], []
        refused, misplaced, trailing_missing = [], [], []
        trailing = (config_get(config, self.trailing["hf"]) or 0) if self.trailing else 0
        types = config_get(config, "layer_types")
        seen, layers = {}, set()
        for name, info in gguf.tensors.items():
            candidates = self.match(name)
            found = [(r, n) for r, n in candidates if self.applies(r, n, config)]
            if not candidates:
                unmatched.append(name)
                continue
            n = candidates[0][1]
            if not found:
                if n is not None and (n_blocks is None or n >= n_blocks + trailing):
                    beyond.append(name)
                else:
                    kinds = sorted({r.layer_type or "decoder" for r, _ in candidates if not r.trailing}) or \
                        [self.trailing["what"]]
                    where = f"layer {n} is {types[n]}" if isinstance(types, list) and n < len(types) else \
                        f"block {n} is the {self.trailing['what']}" if self.trailing and n >= (n_blocks or 0) else \
                        f"block {n} is a decoder layer"
                    misplaced.append(f"{name} (a {' / '.join(kinds)} tensor, but {where})")
                continue
            if refusal := next((r for r, _ in found if r.refuse), None):
                kind = f"a {refusal.layer_type} layer" if refusal.layer_type else "this model"
                refused.append(f"{name}: in {kind}, {refusal.refuse}")
                continue
            if len(found) > 1:
                ambiguous.append(f"{name} ({' / '.join(r.gguf for r, _ in found)})")
                continue
            rule, n = found[0]
            if n is not None and not rule.trailing:
                layers.add(n)
            seen[name] = rule
            try:
                expected = self._expected_shape(rule, n, config)
            except Gguf2ovError as e:
                if e.message not in mismatched:  # the same bad key breaks many tensors' shapes
                    mismatched.append(e.message)
                continue
            if expected is not None and tuple(expected) != tuple(info.shape) and \
                    shape_through(rule.ops, info.shape) != shape_through(rule.ops, expected):
                # (a rule's ops may take more than one stored shape to the map's: `to_rank`)
                mismatched.append(f"{name} is {list(info.shape)}, expected {list(expected)} for {rule.hf_name(n)}")
        out = []
        # A block count the tensors cannot support is one statement, not a list of every tensor of
        # every absent layer (a file claiming 10^6 layers would cost seconds, gigabytes and a huge
        # message); the per-layer check below then only looks at the layers the file does hold.
        if n_blocks and len(layers) < n_blocks and any(r.per_layer and r.required and not r.trailing
                                                       for r in self.rules):
            out.append(f"{self._source_key(gguf, 'num_hidden_layers')} is {n_blocks + trailing} but the file holds "
                       f"tensors for {_layers_text(sorted(layers))} only"
                       + (f" besides the {self.trailing['what']}" if trailing else ""))
        groups_present = {r.group for r in seen.values() if r.group}
        for rule in self.rules:
            if rule.refuse or not (rule.required or rule.group in groups_present):
                continue
            if rule.trailing:
                blocks = range(n_blocks, n_blocks + trailing) if trailing and is_int(n_blocks) else []
                trailing_missing.extend(self._absent(gguf, rule, blocks))
                continue
            blocks = [n for n in sorted(layers) if self.applies(rule, n, config)] if rule.per_layer else [None]
            (partial if rule.group else missing).extend(self._absent(gguf, rule, blocks))
        if trailing_missing:
            count_key = self._stated(gguf, self.trailing["count"])
            trailing_label = (f"{count_key} is {trailing}, but the {self.trailing['what']} (block "
                              f"{n_blocks}{f'..{n_blocks + trailing - 1}' if trailing > 1 else ''}) lacks")
        for label, names in (("tensors the map does not know", unmatched), ("tensors matched twice", ambiguous),
                             ("tensors in a layer of another type", misplaced),
                             (f"refused ({self.path} cannot read this layout)", refused),
                             ("missing tensors", missing),
                             ("incomplete tensor group, missing", partial),
                             (trailing_label if trailing_missing else "", trailing_missing),
                             (f"tensors beyond block_count {n_blocks + trailing}" if n_blocks is not None else
                              "tensors beyond block_count None", beyond), ("wrong shapes", mismatched)):
            if names:
                out.append(f"{label}: {capped(names)}")
        return out

    @staticmethod
    def _absent(gguf, rule, blocks) -> list[str]:
        return [rule.gguf_name(n) for n in blocks if not any(name in gguf.tensors for name in rule.gguf_names(n))]

    def _key_text(self, hf_key: str) -> str:
        """An HF config key with the GGUF key(s) it comes from, for messages."""
        sources = self.config.get(hf_key, {}).get("from", [])
        return f"{hf_key} (from {' or '.join(sources)})" if sources else hf_key

    def _source_key(self, gguf, hf_key: str) -> str:
        """The GGUF key the file states `hf_key` with, for messages (the HF key if none)."""
        sources = self.config.get(hf_key, {}).get("from", [])
        return next((k for k in sources if k in gguf.metadata), sources[0] if sources else hf_key)

    def plan(self, gguf, config: dict | None = None) -> list[PlanEntry]:
        """One entry per GGUF tensor, in file order; raises one error listing every breach."""
        if config is None:
            config = self.hf_config(gguf, allow_ambiguous=True)
        if problems := self.problems(gguf, config):
            raise Gguf2ovError(f"{gguf.path} does not fit the {self.arch} map ({self.path}): " + "; ".join(problems),
                               hint="pass --map with a map that covers this file")
        entries = []
        for name, info in gguf.tensors.items():
            rule, n = self.match(name, config)[0]
            entries.append(PlanEntry(name, rule.hf_name(n), info.qtype, shape_through(rule.ops, info.shape), rule.ops))
        return entries

    def iter_tensors(self, gguf, plan: list[PlanEntry], config: dict):
        """Yield (hf_name, float32 array, gguf_name, qtype) tensor by tensor, ops applied."""
        for entry in plan:
            if entry.hf_name is None:
                continue
            x = gguf.load(entry.gguf_name)
            if entry.ops:
                x = apply_ops(entry.ops, x, config)
            yield entry.hf_name, x, entry.gguf_name, entry.qtype

    def flag_add(self, flag: str) -> int | None:
        """What the map adds where `flag` is not given (dflash: -1 to the target layer ids), None
        when no rule of the map takes the flag."""
        found = self.flag_rule(flag)
        return self.config[found[0]].get("add", 0) if found else None

    def hf_shapes(self, config: dict, groups=()) -> dict[str, tuple]:
        """The model's tensors as the map states them: every HF name its required entries (and the
        entries of `groups`) produce under `config`, with the expected shape; a dimension the config
        cannot settle (a vocabulary a file does not state) is None."""
        out = {}
        for rule in self.rules:
            if rule.hf is None or not (rule.required or rule.group in groups):
                continue
            expr = self.shapes.get(rule.hf)
            for n in range(int(config["num_hidden_layers"])) if rule.per_layer else [None]:
                if n is not None and not self.applies(rule, n, config):
                    continue
                out[rule.hf_name(n)] = None if expr is None else tuple(_dimension(e, config) for e in expr)
        return out

    def shape_for(self, hf_template: str, config: dict) -> list[int] | None:
        """The PyTorch shape the map expects for an HF name template under `config` (None: not stated)."""
        expr = self.shapes.get(hf_template)
        return None if expr is None else [eval_shape(e, config) for e in expr]

    def _expected_shape(self, rule, n, config):
        """The shape the file must hold the tensor in: the map's HF shape before the rule's ops."""
        try:
            shape = self.shape_for(rule.hf, config) if rule.hf else None
            return None if shape is None else list(shape_through(rule.ops, shape, reverse=True))
        except KeyError:
            return None  # the file does not state a key the shape needs; transformers will check
        except BadShapeValue as e:
            # one message per bad key, not per tensor (problems() drops repeats)
            raise Gguf2ovError(f"{self._key_text(e.key)} is {short(e.value)}, not {e.wanted}: the expected "
                               "tensor shapes cannot be computed from the file's metadata") from None
        except (TypeError, ArithmeticError) as e:
            raise Gguf2ovError(f"the expected shape of {rule.hf} cannot be computed from the file's metadata "
                               f"({e}): a key it needs has a wrong type or value") from e

    def checkpoint_names(self, names, where) -> dict[str, str]:
        """{the map's HF name: the checkpoint's} for a checkpoint's tensor names (`checkpoint`: prefixes
        renamed, tensors of other models in the folder dropped)."""
        rename = self.checkpoint.get("rename") or {}
        ignore = tuple(self.checkpoint.get("ignore") or ())
        out = {}
        for name in names:
            if ignore and name.startswith(ignore):
                continue
            new = next((to + name[len(prefix):] for prefix, to in rename.items() if name.startswith(prefix)), name)
            if new in out:
                raise Gguf2ovError(f"{where}: {out[new]} and {name} are both {new} to the {self.arch} map",
                                   hint="the checkpoint holds the model twice; keep one copy")
            out[new] = name
        return out

    # -- reverse: HF checkpoint -> GGUF ------------------------------------------------------------

    def gguf_name_for(self, hf_name: str) -> tuple[str, tuple]:
        """(GGUF name, ops to reverse) for an HF tensor name."""
        for rule in self.rules:
            if rule.hf and (m := rule.hf_re.fullmatch(hf_name)):
                return rule.gguf_name(m.group(1) if rule.per_layer else None), rule.ops
        raise Gguf2ovError(f"{hf_name}: no GGUF name for this tensor in the {self.arch} map ({self.path})")

    def to_gguf(self, hf_name: str, x, config: dict):
        """(GGUF name, array) with the map's ops reversed."""
        gguf_name, ops = self.gguf_name_for(hf_name)
        return gguf_name, apply_ops(ops, x, config, reverse=True)


_MISSING = object()
_ABSENT = object()


def _dimension(expr, config: dict):
    try:
        return eval_shape(expr, config)
    except KeyError:
        return None
MAX_LISTED = 10  # names shown in one listing of an error message


def capped(names, limit: int = MAX_LISTED) -> str:
    """Comma-separated names, at most `limit` of them, then "... and K more"."""
    names = list(names)
    text = ", ".join(_clip(str(n)) for n in names[:limit])
    return text + (f", ... and {len(names) - limit} more" if len(names) > limit else "")


def _clip(text: str, limit: int = 200) -> str:
    return text if len(text) <= limit else f"{text[:limit - 20]}...({len(text)} chars)"


def short(value, limit: int = 60) -> str:
    """repr(value) for a message, at most `limit` characters (a value from a file can be any size)."""
    if isinstance(value, list) and len(value) > limit:  # a value from a file can be any length
        text = repr(value[:limit])[:-1] + f", ... ({len(value)} items)]"
    else:
        text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _layers_text(layers: list[int]) -> str:
    if not layers:
        return "no layer"
    if layers == list(range(len(layers))):
        return f"layers 0..{layers[-1]}" if len(layers) > 1 else "layer 0"
    return f"layers {capped(layers)}"


def flag_option(flag: str) -> str:
    """The command-line option of a rule's `flag`."""
    return "--" + flag.replace("_", "-")
