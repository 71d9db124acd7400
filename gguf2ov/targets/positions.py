"""Whether RoPE turns every token of a step by its own position once OpenVINO's paged conversion has
run, as GenAI runs it when a draft is attached (and for any continuous-batching pipeline).

A draft's proposals are verified in one target step over K + 1 tokens, and a prompt is one step too:
each token must be turned as it would be if it were decoded alone. A graph whose RoPE reads
`position_ids` does that. optimum-intel 2.2.0's export of `qwen3_5_text` does not read them (its
text branch calls the model without them): it counts positions as arange(past, past + L), `past` the
length of its first key cache. The paged conversion makes `past` max_context_len - 1 and L 1 (a step's
tokens become a batch of single tokens), so every token of a step is turned as the step's last one:
correct for one-token decoding, wrong for a prompt and for every verify pass. The greedy text then
changes with a draft attached (benchmarks/optimum_qwen35_rope.md).

The check computes the rotary tables (every Sin and Cos of the converted graph, with what they need
of its inputs) for one step of BLOCK tokens and for the same tokens decoded one at a time, and
compares them row by row. Nothing of the model's weights is compiled.
"""

import numpy as np

from ..errors import library_message
from ..findings import Finding

NAME = "target-positions"
BLOCK, PAST = 4, 5  # one step of 4 tokens at positions 5..8, against 4 one-token steps
ROTARY_OPS = ("Sin", "Cos")
FIX = ("fix: build the target with gguf2ov target CHECKPOINT_OR_GGUF (its RoPE reads position_ids; the same "
       "prompts then give the same text with the draft attached)")


def _feed(name: str, past: int, tokens: int):
    """The value of a paged model's input for one sequence's step of `tokens` tokens after `past`
    (one KV block); None for an input the rotary tables should not depend on."""
    return {"input_ids": np.zeros(tokens), "position_ids": np.arange(past, past + tokens),
            "max_context_len": np.array(past + tokens), "past_lens": np.array([past]),
            "subsequence_begins": np.array([0, tokens]), "block_indices_begins": np.array([0, 1]),
            "block_indices": np.array([0])}.get(name)


def upstream(outputs) -> tuple[dict, list[str]]:
    """The Parameters (by name) and the state variables the `outputs` are computed from."""
    params, states, seen = {}, [], set()
    stack = [o.get_node() for o in outputs]
    while stack:
        node = stack.pop()
        if node.get_name() in seen:
            continue
        seen.add(node.get_name())
        if node.get_type_name() == "Parameter":
            params[min(node.output(0).get_names(), default=node.get_friendly_name())] = node
            continue
        if node.get_type_name() == "ReadValue":
            states.append(node.get_variable_id())
        stack += [i.get_source_output().get_node() for i in node.inputs()]
    return params, sorted(states)


def rotary_outputs(model) -> list:
    return [op.output(0) for op in model.get_ordered_ops() if op.get_type_name() in ROTARY_OPS]


def position_source(model) -> str:
    """What the rotary tables of a (stateful) target are computed from, in words."""
    params, states = upstream(rotary_outputs(model))
    if "position_ids" in params:
        return "position_ids"
    if states:
        return (f"the length of state {states[0]} (position_ids is not read)" if len(states) == 1 else
                f"the lengths of states {', '.join(states)} (position_ids is not read)")
    return f"{', '.join(sorted(params)) or 'constants'} (position_ids is not read)"


def _tables(params: dict, rotary: list):
    """A function (past, tokens) -> the rotary tables of that step, compiled once."""
    import openvino as ov

    from ..numerics import compile_exact

    sub = ov.Model([ov.opset13.result(o) for o in rotary], list(params.values()), "rotary tables")
    request = compile_exact(sub).create_infer_request()

    def tables(past: int, tokens: int) -> list[np.ndarray]:
        feeds = {name: _feed(name, past, tokens).astype(node.get_element_type().to_dtype())
                 for name, node in params.items()}
        return [np.array(t) for t in request.infer(feeds).values()]

    return tables


def _token_axis(block: np.ndarray, single: np.ndarray) -> int | None:
    """The axis along which a step's table has one entry per token: BLOCK in the step's, 1 in a
    one-token step's, the other axes alike. None when the tables are not per token."""
    if block.ndim != single.ndim:
        return None
    axes = [a for a in range(block.ndim) if block.shape[a] != single.shape[a]]
    if len(axes) == 1 and block.shape[axes[0]] == BLOCK and single.shape[axes[0]] == 1:
        return axes[0]
    return None


def _as_decoded(block: np.ndarray, singles: list[np.ndarray]) -> list[int | None] | None:
    """For each token of the step, the token whose one-token step gives its rotary angles (None: no
    token's); None when the tables cannot be read per token."""
    axis = _token_axis(block, singles[0])
    if axis is None and block.shape == singles[0].shape:  # one table for the whole step
        rows = [block] * BLOCK
    elif axis is None:
        return None
    else:
        rows = [np.take(block, [i], axis=axis) for i in range(BLOCK)]
    return [next((j for j, s in enumerate(singles) if np.allclose(row, s, rtol=0, atol=1e-5)), None) for row in rows]


def positions_finding(paged, model) -> Finding:
    """`target-positions` of a target `model` (as read) and its paged conversion `paged`."""
    rotary = rotary_outputs(paged)
    if not rotary:
        return Finding(NAME, "target", "warn", "no Sin or Cos in the graph: where RoPE takes its positions from "
                                               "was not checked")
    params, states = upstream(rotary)
    unknown = sorted(n for n in params if _feed(n, PAST, BLOCK) is None)
    if states or unknown:
        return Finding(NAME, "target", "warn", f"the rotary tables depend on {', '.join(states + unknown)} after the "
                                               "paged conversion: where RoPE takes its positions from was not checked")
    try:
        tables = _tables(params, rotary)
        block = tables(PAST, BLOCK)
        singles = [tables(PAST + i, 1) for i in range(BLOCK)]
    except RuntimeError as e:
        return Finding(NAME, "target", "warn", f"the rotary tables do not compute alone ({library_message(e)}): "
                                               "where RoPE takes its positions from was not checked")
    span = f"positions {PAST}-{PAST + BLOCK - 1}"
    wrong = []
    for k, table in enumerate(block):
        got = _as_decoded(table, [s[k] for s in singles])
        if got is None:
            return Finding(NAME, "target", "warn", f"the rotary table {rotary[k].get_node().get_friendly_name()} is "
                                                   "not one row per token: positions not checked")
        if got != list(range(BLOCK)):
            wrong.append(got)
    if not wrong:
        return Finding(NAME, "target", "pass", f"a step of {BLOCK} tokens at {span} turns each token by its own "
                                               f"position, as decoding them one at a time does (RoPE from "
                                               f"{position_source(model)})")
    got = wrong[0]
    if len(set(got)) == 1 and got[0] is not None:
        turned = f"every token is turned as position {PAST + got[0]}"
    else:
        turned = "its tokens are turned as positions " + ", ".join("?" if j is None else str(PAST + j) for j in got)
    return Finding(NAME, "target", "fail",
                   f"RoPE positions come from {position_source(model)}: after OpenVINO's paged conversion, which "
                   f"GenAI runs when a draft is attached, in a step of {BLOCK} tokens at {span} {turned}: every "
                   "prompt and every verify pass of the draft's proposals is computed at wrong positions (the target "
                   f"alone in continuous batching too), and the greedy text changes with a draft attached; {FIX}")
