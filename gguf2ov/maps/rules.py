"""The value rules and tensor ops that the YAML maps name, with no knowledge of maps themselves.

What a map's words mean: the value `type`s and bounds of config rules, dotted config keys, the
`shapes` expression evaluator, and the tensor `ops` (each llama.cpp transform with its reverse).
Kept apart from `maps` (loading and validating maps) as a leaf, so code that only needs a config
value or an op does not depend on the map machinery.
"""

import ast
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from ..errors import Gguf2ovError

# Value types a config rule declares: (test, words for messages), tested on the value as `read`
# gives it (a GGUF integer type as int, F32/F64 as float). A float must be stored as a float, as
# llama.cpp's loader requires of its float keys (an epsilon stored as the integer 0 is a malformed
# file, not 0.0), and be finite (NaN or Inf in a config is never meant); `number` is for a rule
# whose value a file may state either way. An integer must also fit in int64 (see out_of_bounds).
VALUE_TYPES = {
    "int": (lambda v: isinstance(v, int) and not isinstance(v, bool), "an integer"),
    "float": (lambda v: isinstance(v, float) and math.isfinite(v), "a finite float (GGUF F32 or F64)"),
    "number": (lambda v: isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v),
               "a finite number"),
    "bool": (lambda v: isinstance(v, bool), "true or false"),
    "str": (lambda v: isinstance(v, str), "a string"),
}
# A list in a config (target layer ids, one type per layer) has at most this many items: a file's
# array can be as long as the file, and as Python objects it would take 8-30x its size.
MAX_LIST = 1 << 16
_LIST_WORDS = {"int": "integers", "float": "finite floats", "number": "finite numbers", "bool": "true/false values",
               "str": "strings"}


# --- ops: one per llama.cpp transform, with its reverse ------------------------------------------

def _add(x, value, config, reverse=False):
    # Runs in fp32 on purpose: the file holds these tensors as F32, so w + 1 - 1 is exact enough
    # to reproduce the checkpoint the converter read (up to the fp32 rounding it did itself).
    x = np.asarray(x, dtype=np.float32)
    return x - np.float32(value) if reverse else x + np.float32(value)


def _unpermute_qk(x, args, config, reverse=False):
    # llama.cpp's LlamaModel.permute interleaves the two rotary halves of each head so its
    # NORM-style RoPE can rotate adjacent pairs: reshape(n_head, 2, head_dim/2, in).swapaxes(1, 2).
    # Undoing it swaps the same axes back; permuting again is the reverse.
    n_head = config_get(config, args["heads"])
    if not isinstance(n_head, int) or n_head <= 0 or x.shape[0] % (2 * n_head):
        raise Gguf2ovError(f"unpermute_qk: {x.shape[0]} rows do not split into {n_head} heads of rotary pairs")
    rows = x.shape[0] // n_head
    halves = (n_head, 2, rows // 2) if reverse else (n_head, rows // 2, 2)
    return x.reshape(*halves, *x.shape[1:]).swapaxes(1, 2).reshape(x.shape)


def _untile_heads(x, args, config, reverse=False):
    # llama.cpp's _LinearAttentionVReorderBase._reorder_v_heads: where fewer key than value heads
    # share a recurrent layer, its converter stores the value heads tiled ([heads / groups, groups,
    # size], value head j at j % groups * r + j // groups) so that ggml can repeat the key heads by
    # tiling; transformers' order is grouped ([groups, heads / groups, size]: value head j reads key
    # head j // r). Along `axis` (rows 0 or columns 1), after the first `after` entries.
    groups, heads, size, after = (_arg_value(args, key, config) for key in ("groups", "heads", "size", "after"))
    axis = args.get("axis", 0)
    if not (groups > 0 and heads > 0 and size > 0 and heads % groups == 0 and 0 <= after
            and x.ndim > axis and x.shape[axis] == after + heads * size):
        raise Gguf2ovError(f"untile_heads: axis {axis} of {list(x.shape)} does not hold {after} entries and then "
                           f"{heads} heads of {size} in {groups} groups")
    index = _untile_index(groups, heads, size, after, reverse)
    return np.take(np.asarray(x), index, axis=axis)


def _untile_index(groups: int, heads: int, size: int, after: int, reverse: bool = False) -> np.ndarray:
    # reading, HF's grouped entry (g, j, e) takes the stored (j, g, e); writing, the other way round
    ratio = heads // groups
    order = (ratio, groups, size) if not reverse else (groups, ratio, size)
    index = np.arange(heads * size).reshape(order).transpose(1, 0, 2).reshape(-1)
    return np.concatenate([np.arange(after), after + index])


def _untile_columns(args, config, width: int):
    """The column order of untile_heads along columns (None along rows)."""
    if args.get("axis", 0) != 1:
        return None
    groups, heads, size, after = (_arg_value(args, key, config) for key in ("groups", "heads", "size", "after"))
    if not (groups > 0 and heads > 0 and size > 0 and heads % groups == 0 and width == after + heads * size):
        raise Gguf2ovError(f"untile_heads: {width} columns do not hold {after} and then {heads} heads of {size} in "
                           f"{groups} groups")
    return _untile_index(groups, heads, size, after)


def _log_negated(x, arg, config, reverse=False):
    # llama.cpp stores a recurrent layer's A_log as ssm_a = -exp(A_log); computed in float64, rounded once.
    # A finite ssm_a that is not negative has no A_log, and an A_log whose exp is beyond float32 no
    # ssm_a: refused (NaN and Inf pass through, to the writers' own check).
    x = np.asarray(x, dtype=np.float64)
    if reverse:
        out = -np.exp(x)
        if bad := int(np.count_nonzero(np.isfinite(x) & (out < -_F32_MAX))):
            raise Gguf2ovError(f"{bad} of {x.size} values have an exp beyond float32 (A_log up to "
                               f"{np.nanmax(x):.6g}; ssm_a = -exp(A_log))")
        return out.astype(np.float32)
    if bad := int(np.count_nonzero(x >= 0)):  # NaN compares false: it passes
        raise Gguf2ovError(f"{bad} of {x.size} values are not negative (up to {np.nanmax(x):.6g}): ssm_a = "
                           "-exp(A_log) is below 0, and the log of a value that is not has no A_log",
                           hint="the tensor's data in the file is broken: re-download or re-convert the GGUF")
    return np.log(-x).astype(np.float32)


_F32_MAX = float(np.finfo(np.float32).max)


def _unsqueeze(x, axis, config, reverse=False):
    # llama.cpp squeezes a [C, 1, K] conv kernel to [C, K]
    return np.squeeze(x, axis) if reverse else np.expand_dims(x, axis)


def _unsqueeze_shape(shape, axis, reverse=False):
    shape = list(shape)
    return tuple(shape[:axis] + shape[axis + 1:]) if reverse else tuple(shape[:axis] + [1] + shape[axis:])


def _to_rank(x, rank, config, reverse=False):
    # ggml drops a tensor's trailing 1-sized dimensions where llama.cpp writes a file itself
    # (llama-quantize writes a [1, H] tensor, ne {H, 1}, as ne {H}) and its loader takes either;
    # its converter keeps them. Read: leading 1s (numpy order) up to `rank`; written: without them.
    x = np.asarray(x)
    return x.reshape(_to_rank_shape(x.shape, rank, reverse))


def _to_rank_shape(shape, rank, reverse=False):
    shape = tuple(shape)
    if reverse:
        while len(shape) > 1 and shape[0] == 1:
            shape = shape[1:]
        return shape
    return (1,) * max(rank - len(shape), 0) + shape


def _arg_value(args: dict, key: str, config: dict) -> int:
    value = args.get(key, 0)
    try:
        value = eval_shape(value, config)
    except (KeyError, BadShapeValue, ValueError, TypeError) as e:
        raise Gguf2ovError(f"untile_heads: {key} = {value!r} cannot be computed from the config ({e})") from None
    return value


def _check_add(arg):
    return isinstance(arg, (int, float)) and not isinstance(arg, bool)


def _check_heads(arg):
    return isinstance(arg, dict) and set(arg) == {"heads"} and isinstance(arg["heads"], str)


def _check_untile(arg):
    return (isinstance(arg, dict) and {"groups", "heads", "size"} <= set(arg) <= {"groups", "heads", "size", "after", "axis"}
            and arg.get("axis", 0) in (0, 1) and not isinstance(arg.get("axis", 0), bool)
            and all(valid_shape_expr(arg[k]) for k in ("groups", "heads", "size", "after") if k in arg))


def _check_true(arg):
    return arg is True


def _check_axis(arg):
    return isinstance(arg, int) and not isinstance(arg, bool) and 0 <= arg <= 3


@dataclass(frozen=True)
class Op:
    apply: Callable[..., np.ndarray]  # (x, arg, config, reverse=False)
    check: Callable[[object], bool]   # whether a map's argument is valid
    takes: str                # the argument, in words, for messages
    examples: tuple = ()      # valid arguments (with a config where "n" is a head count of 4), for tests
    # moves whole rows and changes no value: it applies to stored quantized rows too (a callable: for
    # the arguments it says)
    rows_only: bool | Callable[[object], bool] = False
    exact: bool = True        # its reverse gives back the very float32 values (else to float32 rounding)
    shape: Callable | None = None   # (shape, arg, reverse=False) -> the shape it makes (None: unchanged)
    # (arg, config, width) -> the columns it takes, in order (x[:, order]), when it only moves whole columns
    columns: Callable | None = None
    domain: Callable | None = None  # maps any values into those the op reads (for tests)


OPS = {
    "add": Op(_add, _check_add, "a number, e.g. add: -1.0", (-1.0, 0.5)),
    "unpermute_qk": Op(_unpermute_qk, _check_heads, "{heads: <config key>}", ({"heads": "n"},), rows_only=True),
    "untile_heads": Op(_untile_heads, _check_untile,
                       "{groups: <expr>, heads: <expr>, size: <expr>, after: <expr>, axis: 0 or 1}",
                       ({"groups": 2, "heads": "n", "size": 4, "after": 16}, {"groups": 3, "heads": 6, "size": 1,
                                                                              "axis": 1}),
                       rows_only=lambda arg: arg.get("axis", 0) == 0, columns=_untile_columns),
    "log_negated": Op(_log_negated, _check_true, "true", (True,), exact=False,
                      domain=lambda x: -np.abs(x) - np.float32(0.125)),
    "unsqueeze": Op(_unsqueeze, _check_axis, "an axis, 0 to 3", (1,), shape=_unsqueeze_shape),
    "to_rank": Op(_to_rank, lambda arg: _check_axis(arg) and arg >= 1, "a rank, 1 to 3", (3,), shape=_to_rank_shape),
}


def moves_rows_only(ops) -> bool:
    """Whether every op only moves whole rows (so it can move a quantized tensor's stored rows)."""
    def rows_only(name, arg):
        flag = OPS[name].rows_only
        return flag(arg) if callable(flag) else flag

    return all(rows_only(name, arg) for name, arg in ops)


def columns_moved(ops, config, width: int) -> np.ndarray | None:
    """When every op only moves whole columns (of a [rows, width] tensor): the order the stored columns
    take, `hf = stored[:, order]`; else None. A stored grid then multiplies the inputs in that order."""
    order = np.arange(width)
    for name, arg in ops:
        moved = OPS[name].columns(arg, config, width) if OPS[name].columns is not None else None
        if moved is None:
            return None
        order = order[moved]
    return order


def shape_through(ops, shape, reverse=False) -> tuple:
    """The shape a tensor of `shape` has after `ops` (reverse: before them)."""
    shape = tuple(shape)
    for name, arg in (reversed(ops) if reverse else ops):
        if OPS[name].shape is not None:
            shape = OPS[name].shape(shape, arg, reverse)
    return shape


def apply_ops(ops, x, config, reverse=False, where: str | None = None):
    """`x` through a map entry's ops (reverse: undone, last first). A value outside what an op takes is
    refused by the op, naming `where` (the tensor) and the op; NaN and Inf pass through silently (numpy
    warns of nothing), for the writer to count and refuse by name."""
    for name, arg in (reversed(ops) if reverse else ops):
        try:
            with np.errstate(all="ignore"):
                x = OPS[name].apply(x, arg, config, reverse=reverse)
        except Gguf2ovError as e:
            if where is None:
                raise
            raise Gguf2ovError(f"{where}: map op {name}{' (reversed)' if reverse else ''}: "
                               f"{e.message.removeprefix(name + ': ')}", hint=e.hint) from e
    return x



# --- config values ----------------------------------------------------------------------------

def is_number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def is_array(value) -> bool:
    """A metadata array: a list, or the compact forms `read` keeps large arrays in (a numpy array, or
    gguf.read's StringArray, a Sequence: named by its base, so that this leaf imports no reader)."""
    return isinstance(value, (np.ndarray, Sequence)) and not isinstance(value, (str, bytes))


def plain_value(value):
    """A metadata value as plain Python (large arrays arrive as numpy arrays or a StringArray)."""
    if isinstance(value, np.ndarray):
        return value.tolist()
    return list(value) if is_array(value) else value


def value_items(value) -> list:
    return value if isinstance(value, list) else [value]


def has_type(value, declared) -> bool:
    if isinstance(declared, list):
        test = VALUE_TYPES[declared[0]][0]
        return isinstance(value, list) and all(test(v) for v in value)
    return VALUE_TYPES[declared][0](value)


def valid_type(declared) -> bool:
    if isinstance(declared, list) and len(declared) == 1:
        declared = declared[0]
    return isinstance(declared, str) and declared in VALUE_TYPES


def type_words(declared) -> str:
    return f"a list of {_LIST_WORDS[declared[0]]}" if isinstance(declared, list) else VALUE_TYPES[declared][1]


def out_of_bounds(value, rule) -> str | None:
    """What is wrong with a value against the rule's min / max / above / below (a number; `below`
    naming another config key is checked once the config is built), or None."""
    for v in value_items(value):
        if not is_number(v):
            continue
        if is_int(v) and not -2**63 <= v < 2**63:  # what readers of the config (GenAI, rt_info) hold it in
            return "outside the 64-bit integer range"
        if "min" in rule and v < rule["min"]:
            return f"below {rule['min']}"
        if "max" in rule and v > rule["max"]:
            return f"above {rule['max']}"
        if "above" in rule and v <= rule["above"]:
            return f"not above {rule['above']}"
        if is_number(rule.get("below")) and v >= rule["below"]:
            return f"not below {rule['below']}"
    return None


def config_get(config: dict, dotted: str):
    """config["a"]["b"] for "a.b", None where any part is missing."""
    node = config
    for part in dotted.split("."):
        if not isinstance(node, dict) or part not in node:
            return None
        node = node[part]
    return node


def config_set(config: dict, dotted: str, value) -> None:
    *parents, last = dotted.split(".")
    node = config
    for part in parents:
        node = node.setdefault(part, {})
    node[last] = value



# --- shape expressions ------------------------------------------------------------------------

# Shape expressions: config keys (dotted), integers, + - * //, and len().
def eval_shape(expr, config):
    if isinstance(expr, int):
        return expr
    return _eval_node(ast.parse(str(expr), mode="eval").body, config)


class BadShapeValue(Exception):
    """A config key a shape expression reads holds the wrong kind of value (from an untrusted file)."""

    def __init__(self, key: str, value, wanted: str):
        super().__init__(key)
        self.key, self.value, self.wanted = key, value, wanted


def _shape_key(node, config):
    key = ast.unparse(node)
    value = config_get(config, key)
    if value is None:
        raise KeyError(key)
    return key, value


def _eval_node(node, config):
    # Every value read must be an int (not bool): a string or list times a large int would make
    # Python repeat it ('ab' * 10**9) instead of failing.
    if isinstance(node, ast.Constant) and isinstance(node.value, int) and not isinstance(node.value, bool):
        return node.value
    if isinstance(node, (ast.Name, ast.Attribute)):
        key, value = _shape_key(node, config)
        if not isinstance(value, int) or isinstance(value, bool):
            raise BadShapeValue(key, value, "an integer")
        return value
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "len" and len(node.args) == 1:
        if not isinstance(node.args[0], (ast.Name, ast.Attribute)):
            raise ValueError(f"unsupported shape expression {ast.unparse(node)!r}: len() takes a config key")
        key, value = _shape_key(node.args[0], config)
        if not isinstance(value, list):
            raise BadShapeValue(key, value, "a list")
        return len(value)
    if isinstance(node, ast.BinOp) and type(node.op) in _BINOPS:
        return _BINOPS[type(node.op)](_eval_node(node.left, config), _eval_node(node.right, config))
    raise ValueError(f"unsupported shape expression {ast.unparse(node)!r}")


def valid_shape_expr(expr) -> bool:
    if isinstance(expr, int):
        return True
    try:
        tree = ast.parse(str(expr), mode="eval")
    except SyntaxError:
        return False
    allowed = (ast.Expression, ast.Constant, ast.Name, ast.Attribute, ast.Load, ast.Call, ast.BinOp, *_BINOPS)
    calls = [n for n in ast.walk(tree) if isinstance(n, ast.Call)]
    calls_ok = all(isinstance(n.func, ast.Name) and n.func.id == "len" and len(n.args) == 1 and not n.keywords
                   and isinstance(n.args[0], (ast.Name, ast.Attribute)) for n in calls)
    return calls_ok and all(isinstance(n, allowed) for n in ast.walk(tree))


_BINOPS = {ast.Add: lambda a, b: a + b, ast.Sub: lambda a, b: a - b, ast.Mult: lambda a, b: a * b,
           ast.FloorDiv: lambda a, b: a // b}
