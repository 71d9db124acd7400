"""A map run backwards, HF checkpoint -> GGUF: the metadata its `config` rules write (`legacy`: in the
layout an older converter wrote), and each tensor's GGUF name with the map's ops reversed. What
fixtures, tests and benchmarks write GGUF files with (`tools/gguf_writer.py`).
"""

import copy

from ..errors import Gguf2ovError
from .rules import apply_ops, config_get, is_number


class GgufWriter:
    def __init__(self, arch: str, path: str, config_rules: dict, legacy: dict, tensor_rules: list):
        self.arch, self.path = arch, path
        self.config_rules, self.legacy, self.tensor_rules = config_rules, legacy, tensor_rules

    def gguf_metadata(self, hf_config: dict, legacy: bool = False) -> dict:
        """GGUF keys and values from an HF config: the `config` rules run backwards."""
        rules = dict(self.config_rules)
        if legacy:
            rules.update(self.legacy)
        out, by_type = {}, {}
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
            if (widened := rule.get("widened_last")) and config_get(hf_config, widened["sets"]):
                value = widened_list(value, widened, hf_config)
            if isinstance(rule.get("layered"), str):  # one value of the layers of a type
                by_type.setdefault(rule["from"][0].replace("{arch}", self.arch), {})[rule["layered"]] = value
                continue
            for key in [rule["from"][0], *rule.get("write_also", [])]:
                out[key.replace("{arch}", self.arch)] = value
        for key, values in by_type.items():
            out[key] = per_layer(values, config_get(hf_config, "layer_types"))
        return out

    def gguf_name_for(self, hf_name: str) -> tuple[str, tuple]:
        """(GGUF name, ops to reverse) for an HF tensor name."""
        for rule in self.tensor_rules:
            if rule.hf and (m := rule.hf_re.fullmatch(hf_name)):
                return rule.gguf_name(m.group(1) if rule.per_layer else None), rule.ops
        raise Gguf2ovError(f"{hf_name}: no GGUF name for this tensor in the {self.arch} map ({self.path})")

    def to_gguf(self, hf_name: str, x, config: dict):
        """(GGUF name, array) with the map's ops reversed."""
        gguf_name, ops = self.gguf_name_for(hf_name)
        return gguf_name, apply_ops(ops, x, config, reverse=True, where=hf_name)


def widened_list(value, widened: dict, hf_config: dict):
    """What a `widened_last` rule writes when its flag is set: one item per layer, the last `count` layers'
    `factor` times the value (as llama.cpp's converter writes Gemma 4 E2B's feed_forward_length)."""
    layers, count = config_get(hf_config, "num_hidden_layers"), config_get(hf_config, widened["count"]) or 0
    if not (isinstance(layers, int) and isinstance(count, int) and 0 < count < layers):
        return value
    return [value] * (layers - count) + [value * widened["factor"]] * count


def per_layer(values: dict, layer_types):
    """What `layered: TYPE` rules write for one key: the value, where they state one; else one item per
    layer, its type's (as llama.cpp's converter writes Gemma 4's key/value heads)."""
    distinct = set(values.values())
    if len(distinct) == 1 or not isinstance(layer_types, list) or not set(layer_types) <= set(values):
        return next(iter(values.values()))
    return [values[t] for t in layer_types]
