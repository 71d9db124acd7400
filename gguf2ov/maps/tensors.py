"""A map's tensor table: which rule names each GGUF tensor (by its template, alias, layer type and
block), the checks that a file's tensors fit the table, one job each, and the plan that names every
tensor of a file in HF terms.
"""

import re
from dataclasses import dataclass, field

from ..errors import Gguf2ovError
from .messages import capped, layers_text
from .rules import apply_ops, config_get, is_int, shape_through


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


class TensorMatcher:
    """The tensor `rules` of the map at `path` (for messages), `trailing` its blocks after the decoder's;
    `metadata` reads the config a file states (`MetadataReader`), `shapes` the map's own statement of
    the shapes (`StatedShapes`)."""

    def __init__(self, arch: str, path: str, rules: list, trailing: dict | None, metadata, shapes):
        self.arch, self.path, self.rules, self.trailing = arch, path, rules, trailing
        self.metadata, self._shapes = metadata, shapes

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
        """Everything that keeps this map from converting the file, one check after another; empty when
        it fits. The shapes checked are the map's own (a target's are its kinds', checked once they are
        known: `targets/source.py`)."""
        n_blocks = config.get("num_hidden_layers")
        if n_blocks is not None and not (is_int(n_blocks) and n_blocks >= 0):
            return [f"num_hidden_layers is {n_blocks!r}: the file's block count is not a number of layers"]
        survey = _Survey(self, gguf, config)
        found = {**survey.names, **self._missing(gguf, survey), "shapes": self._wrong_shapes(gguf, survey, config)}
        return survey.block_count(gguf) + [f"{label}: {capped(found[key])}"
                                           for key, label in self._labels(gguf, survey) if found.get(key)]

    def _labels(self, gguf, survey) -> list[tuple[str, str]]:
        beyond = survey.n_blocks + survey.trailing if survey.n_blocks is not None else None
        labels = [("unmatched", "tensors the map does not know"), ("ambiguous", "tensors matched twice"),
                  ("misplaced", "tensors in a layer of another type"),
                  ("refused", f"refused ({self.path} cannot read this layout)"), ("missing", "missing tensors"),
                  ("partial", "incomplete tensor group, missing")]
        if self.trailing and survey.trailing:
            n = survey.n_blocks
            blocks = f"{n}{f'..{n + survey.trailing - 1}' if survey.trailing > 1 else ''}"
            labels.append(("trailing", f"{self.metadata.stated_key(gguf, self.trailing['count'])} is "
                                       f"{survey.trailing}, but the {self.trailing['what']} (block {blocks}) lacks"))
        return labels + [("beyond", f"tensors beyond block_count {beyond}"), ("shapes", "wrong shapes")]

    def _missing(self, gguf, survey) -> dict[str, list[str]]:
        """The tensors the file lacks: of the map's required entries, of a group it holds part of, of the
        blocks after the decoder's."""
        out = {"missing": [], "partial": [], "trailing": []}
        groups_present = {r.group for r, _ in survey.matched.values() if r.group}
        n_blocks, trailing = survey.n_blocks, survey.trailing
        for rule in self.rules:
            if rule.refuse or not (rule.required or rule.group in groups_present):
                continue
            if rule.trailing:
                blocks = range(n_blocks, n_blocks + trailing) if trailing and is_int(n_blocks) else []
                out["trailing"] += _absent(gguf, rule, blocks)
                continue
            blocks = [n for n in sorted(survey.layers) if self.applies(rule, n, survey.config)] \
                if rule.per_layer else [None]
            out["partial" if rule.group else "missing"] += _absent(gguf, rule, blocks)
        return out

    def _wrong_shapes(self, gguf, survey, config) -> list[str]:
        """The tensors whose stored shape is not the one the map states."""
        return self._shapes.wrong(gguf, survey.matched, config)

    def plan(self, gguf, config: dict | None = None) -> list[PlanEntry]:
        """One entry per GGUF tensor, in file order; raises one error listing every breach."""
        if config is None:
            config = self.metadata.hf_config(gguf, allow_ambiguous=True)
        if problems := self.problems(gguf, config):
            raise Gguf2ovError(f"{gguf.path} does not fit the {self.arch} map ({self.path}): " + "; ".join(problems),
                               hint="pass --map with a map that covers this file")
        entries = []
        for name, info in gguf.tensors.items():
            rule, n = self.match(name, config)[0]
            entries.append(PlanEntry(name, rule.hf_name(n), info.qtype, shape_through(rule.ops, info.shape), rule.ops))
        return entries

    @staticmethod
    def iter_tensors(gguf, plan: list[PlanEntry], config: dict):
        """Yield (hf_name, float32 array, gguf_name, qtype) tensor by tensor, ops applied."""
        for entry in plan:
            if entry.hf_name is None:
                continue
            x = gguf.load(entry.gguf_name)
            if entry.ops:
                where = f"{entry.hf_name} (from {entry.gguf_name}, {entry.qtype.name})"
                x = apply_ops(entry.ops, x, config, where=where)
            yield entry.hf_name, x, entry.gguf_name, entry.qtype


class _Survey:
    """Each tensor of a file sorted by what the map makes of it: matched to one rule (`matched`), or
    named by what is wrong (`names`: unmatched, ambiguous, misplaced, refused, beyond); the layers the
    file holds tensors for."""

    def __init__(self, table: TensorMatcher, gguf, config: dict):
        self.table, self.config = table, config
        self.n_blocks = config.get("num_hidden_layers")
        trailing = table.trailing
        self.trailing = (config_get(config, trailing["hf"]) or 0) if trailing else 0
        self.names = {k: [] for k in ("unmatched", "ambiguous", "misplaced", "refused", "beyond")}
        self.matched, self.layers = {}, set()
        for name in gguf.tensors:
            kind, what = self._sort(name)
            if kind == "matched":
                self.matched[name] = what
            else:
                self.names[kind].append(what)

    def _sort(self, name: str):
        table, config = self.table, self.config
        candidates = table.match(name)
        if not candidates:
            return "unmatched", name
        found = [(r, n) for r, n in candidates if table.applies(r, n, config)]
        n = candidates[0][1]
        if not found:
            if n is not None and (self.n_blocks is None or n >= self.n_blocks + self.trailing):
                return "beyond", name
            return "misplaced", f"{name} ({self._kinds(candidates)}, but {self._where(n)})"
        if refusal := next((r for r, _ in found if r.refuse), None):
            kind = f"a {refusal.layer_type} layer" if refusal.layer_type else "this model"
            return "refused", f"{name}: in {kind}, {refusal.refuse}"
        if len(found) > 1:
            return "ambiguous", f"{name} ({' / '.join(r.gguf for r, _ in found)})"
        rule, n = found[0]
        if n is not None and not rule.trailing:
            self.layers.add(n)
        return "matched", found[0]

    def _kinds(self, candidates) -> str:
        kinds = sorted({r.layer_type or "decoder" for r, _ in candidates if not r.trailing}) or \
            [self.table.trailing["what"]]
        return f"a {' / '.join(kinds)} tensor"

    def _where(self, n: int) -> str:
        types, trailing = config_get(self.config, "layer_types"), self.table.trailing
        if isinstance(types, list) and n < len(types):
            return f"layer {n} is {types[n]}"
        if trailing and n >= (self.n_blocks or 0):
            return f"block {n} is the {trailing['what']}"
        return f"block {n} is a decoder layer"

    def block_count(self, gguf) -> list[str]:
        """A block count the tensors cannot support, as one statement: not a list of every tensor of every
        absent layer (a file claiming 10^6 layers would cost seconds, gigabytes and a huge message); the
        per-layer checks then only look at the layers the file does hold."""
        n_blocks, table = self.n_blocks, self.table
        if not (n_blocks and len(self.layers) < n_blocks and any(r.per_layer and r.required and not r.trailing
                                                                  for r in table.rules)):
            return []
        return [f"{table.metadata.source_key(gguf, 'num_hidden_layers')} is {n_blocks + self.trailing} but the file "
                f"holds tensors for {layers_text(sorted(self.layers))} only"
                + (f" besides the {table.trailing['what']}" if self.trailing else "")]


def _absent(gguf, rule, blocks) -> list[str]:
    return [rule.gguf_name(n) for n in blocks if not any(name in gguf.tensors for name in rule.gguf_names(n))]
