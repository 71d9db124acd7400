"""The shapes a map states (`shapes:`, expressions over config keys), for a model no layer kinds
describe (the DFlash draft, a map made for `convert`), and the check of a file's stored shapes
against expected ones, whoever states them: the map, or a target's layer kinds
(`targets/decoder.py`), through the same function.
"""

from collections.abc import Callable, Iterable

from ..errors import Gguf2ovError
from .messages import short
from .rules import BadShapeValue, eval_shape, shape_through


class StatedShapes:
    """`shapes` (HF template -> expressions) over the map's tensor `rules`; `applies(rule, n, config)`
    tells which blocks a rule names, `key_text(hf_key)` names a config key and its GGUF sources."""

    def __init__(self, shapes: dict, rules: list, applies: Callable[..., bool], key_text: Callable[[str], str]):
        self.exprs, self._rules, self._applies, self._key_text = shapes, rules, applies, key_text

    def hf_shapes(self, config: dict, groups=()) -> dict[str, tuple]:
        """The model's tensors as the map states them: every HF name its required entries (and the
        entries of `groups`) produce under `config`, with the expected shape; a dimension the config
        cannot settle (a vocabulary a file does not state) is None."""
        out = {}
        for rule in self._rules:
            if rule.hf is None or not (rule.required or rule.group in groups):
                continue
            expr = self.exprs.get(rule.hf)
            for n in range(int(config["num_hidden_layers"])) if rule.per_layer else [None]:
                if n is not None and not self._applies(rule, n, config):
                    continue
                out[rule.hf_name(n)] = None if expr is None else tuple(_dimension(e, config) for e in expr)
        return out

    def shape_for(self, hf_template: str, config: dict) -> list[int] | None:
        """The PyTorch shape the map expects for an HF name template under `config` (None: not stated)."""
        expr = self.exprs.get(hf_template)
        return None if expr is None else [eval_shape(e, config) for e in expr]

    def wrong(self, gguf, matched: dict, config: dict) -> list[str]:
        """What is wrong with the stored shapes of a file's tensors, {GGUF name: (rule, block)} each, against
        the shapes the map states under `config`."""
        rule_of = {rule.hf_name(n): rule for rule, n in matched.values() if rule.hf}
        tensors = [(name, gguf.tensors[name].shape, rule.hf_name(n), rule.ops) for name, (rule, n) in matched.items()
                   if rule.hf]
        return wrong_shapes(tensors, lambda hf_name: self.expected(rule_of[hf_name], config))

    def expected(self, rule, config: dict):
        """The HF shape of the tensor `rule` names under `config` (None: not stated, or a key the shape
        needs is not stated: transformers will check); one error per bad key."""
        try:
            return self.shape_for(rule.hf, config) if rule.hf else None
        except KeyError:
            return None
        except BadShapeValue as e:
            # one message per bad key, not per tensor (wrong_shapes drops repeats)
            raise Gguf2ovError(f"{self._key_text(e.key)} is {short(e.value)}, not {e.wanted}: the expected "
                               "tensor shapes cannot be computed from the file's metadata") from None
        except (TypeError, ArithmeticError) as e:
            raise Gguf2ovError(f"the expected shape of {rule.hf} cannot be computed from the file's metadata "
                               f"({e}): a key it needs has a wrong type or value") from e


def stored_shape(ops, hf_shape) -> list[int]:
    """The shape a file must hold a tensor in: its HF shape before the map's `ops`."""
    return list(shape_through(ops, hf_shape, reverse=True))


def wrong_shapes(tensors: Iterable[tuple], expected: Callable) -> list[str]:
    """What is wrong with the stored shapes of `tensors`, (GGUF name, stored shape, HF name, ops) each,
    against `expected(HF name)`: the HF shape (None: not stated), which may raise one error per bad key."""
    out = []
    for gguf_name, shape, hf_name, ops in tensors:
        try:
            want = expected(hf_name)
        except Gguf2ovError as e:
            if e.message not in out:  # the same bad key breaks many tensors' shapes
                out.append(e.message)
            continue
        if want is None:
            continue
        want = stored_shape(ops, want)
        # (a rule's ops may take more than one stored shape to the map's: `to_rank`)
        if tuple(want) != tuple(shape) and shape_through(ops, shape) != shape_through(ops, want):
            out.append(f"{gguf_name} is {list(shape)}, expected {want} for {hf_name}")
    return out


def _dimension(expr, config: dict):
    try:
        return eval_shape(expr, config)
    except KeyError:
        return None
