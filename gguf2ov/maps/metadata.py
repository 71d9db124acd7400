"""A map's `config` rules run forwards: the HF config a GGUF's metadata states (`hf_config`), with
every value's type and bounds checked (metadata comes from untrusted files), the values derived
from others (`over`, `periodic`), the blocks after the decoder's taken off (`trailing_blocks`), the
fixed fields of the tensor groups a file holds (`group_hf`), and the values a command-line flag
settles (`flag`, `ambiguous_when`). The rules' words are `rules.py`'s; the format, `schema.py`'s.
"""

import copy
from collections.abc import Callable

from ..errors import Gguf2ovError
from .messages import flag_option, short
from .rules import (MAX_LIST, config_get, config_set, has_type, is_array, is_int, is_number, out_of_bounds,
                    plain_value, type_words, value_items)


class MetadataReader:
    """The `config` rules of the map at `path` (for messages) for architecture `arch`; `match(gguf_name)`
    tells which tensor rules (and so which groups) a file's tensor falls under."""

    def __init__(self, arch: str, path: str, hf: dict, rules: dict, group_hf: dict, trailing: dict | None,
                 match: Callable[[str], list]):
        self.arch, self.path, self.hf, self.rules = arch, path, hf, rules
        self.group_hf, self.trailing, self._match = group_hf, trailing, match

    def hf_config(self, gguf, target_layer_offset=None, allow_ambiguous=False) -> dict:
        """The full HF config.json content: fixed `hf` fields plus every key the file states."""
        flags = {"target_layer_offset": target_layer_offset}
        out = copy.deepcopy(self.hf)
        missing, deferred = [], []
        for hf_key, rule in self.rules.items():
            if "over" in rule or by_layer_type(rule) or "widened_last" in rule or \
                    ("periodic" in rule and self.stated_key(gguf, rule) is None):
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
    def stated_key(gguf, rule):
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
        key, source = self.trailing["counted_in"], self.stated_key(gguf, rule)
        blocks = config_get(config, key)
        if not is_int(blocks):
            return
        if count >= blocks:
            raise Gguf2ovError(f"{gguf.path}: {source} is {count}, but {self.source_key(gguf, key)} is {blocks}: no "
                               f"decoder layer is left before the {self.trailing['what']}",
                               hint="the file's metadata is malformed; re-convert it")
        config_set(config, key, blocks - count)
        config_set(config, self.trailing["hf"], count)
        for hf_key, r in self.rules.items():
            value = config_get(config, hf_key)
            if r.get("per_block") and isinstance(value, list) and len(value) == blocks:
                config_set(config, hf_key, value[:blocks - count])

    def _derived_value(self, gguf, hf_key, rule, config: dict):
        """A value made from another config value: `over` (the file's value divided by it), `periodic`
        (a layer pattern, when the file states no list), or read at the layers of one type (`layered:
        TYPE`, `tensor_absent` with `in_layers: TYPE`: by the config's layer_types)."""
        if by_layer_type(rule):
            return self._at_layers_of_type(gguf, hf_key, rule, config)
        if "widened_last" in rule:
            return self._widened_last(gguf, hf_key, rule, config)
        if "over" in rule:
            value = self._config_value(gguf, hf_key, rule, {}, True)
            if value in (_MISSING, _ABSENT):
                return value
            divisor, source = config_get(config, rule["over"]), self.stated_key(gguf, rule)
            if not (is_number(divisor) and divisor > 0):
                return _MISSING
            if rule["as"] == "int":
                if not (is_int(value) and is_int(divisor) and value % divisor == 0):
                    raise Gguf2ovError(f"{gguf.path}: {source} = {short(value)} is not a multiple of {rule['over']} = "
                                       f"{short(divisor)} (from {self.source_key(gguf, rule['over'])}): {hf_key} "
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
            source = self.source_key(gguf, pattern["every"])
        if bound := out_of_bounds(value, rule):
            raise Gguf2ovError(f"{gguf.path}: {hf_key} would be {short(value)} (from {source}), {bound}",
                               hint="the file's metadata is malformed; re-download or re-convert the file")
        return value

    def _at_layers_of_type(self, gguf, hf_key, rule, config: dict):
        """`layered: TYPE`: a value the file states once, or per layer (the items at the layers of TYPE,
        which must agree: Gemma 4's key/value heads, one count for its sliding layers and one for its
        global ones); `tensor_absent` with `in_layers: TYPE`: whether no layer of TYPE holds the tensor."""
        types = config_get(config, "layer_types")
        if not isinstance(types, list):
            return _MISSING
        layer_type = rule.get("in_layers") or rule["layered"]
        layers = [n for n, t in enumerate(types) if t == layer_type]
        if "tensor_absent" in rule:
            return bool(layers) and all(rule["tensor_absent"].replace("{N}", str(n)) not in gguf.tensors
                                        for n in layers)
        source = self.stated_key(gguf, rule)
        if source is None or not layers or not is_array(gguf.metadata[source]):
            return self._config_value(gguf, hf_key, dict(rule, layered=False), {}, True)
        items = plain_value(gguf.metadata[source])
        if len(items) != len(types):
            raise Gguf2ovError(f"{gguf.path}: {source} has {len(items)} entries for {len(types)} layers",
                               hint="the file's metadata is malformed")
        stated = sorted({items[n] for n in layers}, key=repr)
        if len(stated) != 1:
            raise Gguf2ovError(f"{gguf.path}: {source} states {hf_key} per layer ({short(items)}), with "
                               f"{len(stated)} different values in its {layer_type} layers, where this map reads one",
                               hint="a per-layer geometry is not supported")
        value = stated[0]
        if not has_type(value, rule["type"]) or (bound := out_of_bounds(value, rule)):
            raise Gguf2ovError(f"{gguf.path}: {hf_key} would be {short(value)} (from {source}), "
                               f"{bound if has_type(value, rule['type']) else 'not ' + type_words(rule['type'])}",
                               hint="the file's metadata is malformed; re-download or re-convert the file")
        return value

    def _widened_last(self, gguf, hf_key, rule, config: dict):
        """`widened_last: {count: KEY, factor: F, sets: FLAG}`: a value the file states once, or per layer with
        the last KEY layers' items F times the others' (llama.cpp's converter writes Gemma 4 E2B's double-wide
        MLPs so): the others' value, and FLAG set true in the config. Any other list is refused."""
        source, widened = self.stated_key(gguf, rule), rule["widened_last"]
        stated = gguf.metadata[source] if source else None
        items = plain_value(stated) if source and is_array(stated) and len(stated) <= MAX_LIST else None
        if items is None or not has_type(items, [rule["type"]]) or len(set(items)) == 1:
            return self._config_value(gguf, hf_key, rule, {}, True)  # one value, or an error of its own
        layers, count = config_get(config, "num_hidden_layers"), config_get(config, widened["count"])
        if not (is_int(layers) and is_int(count)):
            return _MISSING
        base = items[0]
        expected = [base] * (layers - count) + [base * widened["factor"]] * count
        if not 0 < count < layers or items != expected:
            raise Gguf2ovError(f"{gguf.path}: {source} states {hf_key} per layer ({short(items)}), where this map "
                               f"reads one value for every layer, or {widened['factor']} times it in the last "
                               f"{widened['count']} ({short(count)}) layers ({widened['sets']})",
                               hint="a per-layer geometry is not supported")
        if bound := out_of_bounds(base, rule):
            raise Gguf2ovError(f"{gguf.path}: {hf_key} would be {short(base)} (from {source}), {bound}",
                               hint="the file's metadata is malformed; re-download or re-convert the file")
        config_set(config, widened["sets"], True)
        return base

    def _refuse_contradiction(self, gguf, group: str, fields: dict, config: dict) -> None:
        """A group's fixed config fields are what a model with those tensors is: a value the file
        states for one of them (through a config rule) and that differs contradicts its tensors."""
        for key, fixed in fields.items():
            rule = self.rules.get(key, {})
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
        return {rule.group for name in gguf.tensors for rule, _ in self._match(name) if rule.group}

    def config_default(self, hf_key: str):
        """The value the map takes for `hf_key` when the file does not state it (None: no default)."""
        return self.rules.get(hf_key, {}).get("default")

    def flag_rule(self, flag: str):
        """(hf_key, gguf_key) of the config rule a command-line flag overrides, or None."""
        for hf_key, rule in self.rules.items():
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
        for hf_key, rule in self.rules.items():
            value = config_get(config, hf_key)
            key = rule.get("below")
            key = key if isinstance(key, str) else None  # a number is a bound of its own (out_of_bounds)
            if value is None or not (key or rule.get("length")):
                continue
            source = self.source_key(gguf, hf_key)
            if key and is_int(limit := config_get(config, key)):
                if high := [v for v in value_items(value) if is_number(v) and v >= limit]:
                    raise Gguf2ovError(f"{gguf.path}: {hf_key} would be {short(value)} (from {source}), but "
                                       f"{key} is {limit} (from {self.source_key(gguf, key)}): {short(high[0])} "
                                       f"is out of range", hint="the file's metadata is malformed")
            if (key := rule.get("length")) and is_int(limit := config_get(config, key)) and \
                    isinstance(value, list) and len(value) != limit:
                raise Gguf2ovError(f"{gguf.path}: {hf_key} has {len(value)} entries (from {source}), but {key} "
                                   f"is {limit} (from {self.source_key(gguf, key)})",
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
        return self.ambiguity(gguf, self.rules[found[0]], plain_value(gguf.metadata[found[1]]))

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

    def flag_add(self, flag: str) -> int | None:
        """What the map adds where `flag` is not given (dflash: -1 to the target layer ids), None
        when no rule of the map takes the flag."""
        found = self.flag_rule(flag)
        return self.rules[found[0]].get("add", 0) if found else None

    def key_text(self, hf_key: str) -> str:
        """An HF config key with the GGUF key(s) it comes from, for messages."""
        sources = self.rules.get(hf_key, {}).get("from", [])
        return f"{hf_key} (from {' or '.join(sources)})" if sources else hf_key

    def source_key(self, gguf, hf_key: str) -> str:
        """The GGUF key the file states `hf_key` with, for messages (the HF key if none)."""
        sources = self.rules.get(hf_key, {}).get("from", [])
        return next((k for k in sources if k in gguf.metadata), sources[0] if sources else hf_key)


def by_layer_type(rule) -> bool:
    """Whether a rule reads its value at the layers of one type (`layered: TYPE`, `in_layers: TYPE`)."""
    return isinstance(rule.get("layered"), str) or "in_layers" in rule


_MISSING = object()
_ABSENT = object()
