"""Running an exported DFlash draft IR the way GenAI feeds it, in bounded memory.

Inputs of one draft call: the block's token embeddings (seed token then mask tokens, embedded with
the target's table), the target hidden states of the new context, position ids over context and
block, an all-ones attention mask and beam_idx. The output has one row per block token after the
seed (the seed row is dropped), scored by the target's lm_head.

Compiling a float32 IR costs twice its size on the CPU plugin (the memory-mapped weights plus the
plugin's repacked copy: 2.16 GB peak for a 1 GB IR, measured), so a 1 B draft in fp32 would need
8-9 GB just to be run once. `run_draft()` therefore runs the IR one segment at a time when it can
(the context projection, then each decoder layer, cut at optimum's node names), each segment read
afresh from the memory-mapped file, compiled, run for every call and released: the peak is about
one layer's weights twice, whatever the draft's size. Layers are independent in their state, so
running layer by layer gives exactly the whole graph's outputs and state lengths.
"""

from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

import numpy as np

from ..errors import Gguf2ovError
from ..names import IR_XML
from ..numerics import compile_exact

CONTEXT_NODE = "__module.hidden_norm/aten::mul/Multiply_1"
LAYER_OUTPUT = "__module.layers.{}/aten::add/Add_1"
# Synthetic run: two steps, so the second one exercises the KV state written by the first.
CONTEXT_STEPS = (5, 3)
SEED = 0

SEGMENT_INPUT, SEGMENT_CONTEXT = "segment_input", "segment_context"


@dataclass(frozen=True)
class DraftRun:
    outputs: list[np.ndarray]      # last_hidden_state per call
    cache: list[list[int]]         # per call, the distinct sequence lengths of the state variables
    segments: int                  # 1: the whole graph at once


def run_draft(xml_path, calls: list[dict], chained: bool = True, segmented: bool = True) -> DraftRun:
    """Run the draft IR on `calls` (feeds from `block_feeds`).

    chained: consecutive calls share the KV state (GenAI's steps); otherwise each call starts empty.
    """
    import openvino as ov

    from ..draft.head import plain_draft

    core = ov.Core()

    def read():  # a draft with its own embedding and head runs as exported: the checks bring the target's
        return plain_draft(core.read_model(str(xml_path)))

    layers = _layer_count(read()) if segmented else None
    if layers is None:
        return _run_whole(read(), calls, chained)
    context = _run_segment(_cut(read(), None, layers), calls, {}, chained=False)[0]
    hidden = [c["inputs_embeds"] for c in calls]
    cache: list[list[int]] = [[] for _ in calls]
    for i in range(layers):
        sub = _cut(read(), i, layers)
        extra = [{SEGMENT_INPUT: h, SEGMENT_CONTEXT: c} for h, c in zip(hidden, context)]
        hidden, lengths = _run_segment(sub, calls, extra, chained)
        cache = [sorted(set(a) | set(b)) for a, b in zip(cache, lengths)]
    return DraftRun(hidden, cache, layers + 1)


def _layer_count(model) -> int | None:
    """Decoder layers when the graph can be cut at optimum's names (stateful, one output), else None."""
    names = {op.get_friendly_name() for op in model.get_ops()}
    if len(model.outputs) != 1 or not model.get_sinks() or CONTEXT_NODE not in names:
        return None
    n = 0
    while LAYER_OUTPUT.format(n) in names:
        n += 1
    return n or None


def _cut(model, layer: int | None, layers: int):
    """The sub-model of one segment: `layer` None is the context projection; a layer reads its input
    and the context features from new parameters and keeps only its own state."""
    from openvino import opset13 as ops

    nodes = {op.get_friendly_name(): op for op in model.get_ops()}
    context = nodes[CONTEXT_NODE]
    if layer is None:
        results = [ops.result(context.output(0))]
        return _model(results, [], "context")
    hidden = context.get_output_partial_shape(0)[2]
    new_context = ops.parameter([-1, -1, hidden], np.float32, name=SEGMENT_CONTEXT)
    _replace(context.output(0), new_context)
    if layer > 0:
        new_input = ops.parameter([-1, -1, hidden], np.float32, name=SEGMENT_INPUT)
        _replace(nodes[LAYER_OUTPUT.format(layer - 1)].output(0), new_input)
    if layer == layers - 1:
        results = [ops.result(model.output(0).get_node().input_value(0))]
    else:
        results = [ops.result(nodes[LAYER_OUTPUT.format(layer)].output(0))]
    return _model(results, model.get_sinks(), f"layer{layer}")


def _replace(output, parameter) -> None:
    parameter.output(0).get_tensor().set_names({parameter.get_friendly_name()})
    for target in list(output.get_target_inputs()):
        target.replace_source_output(parameter.output(0))


def _model(results, sinks, name: str):
    """A model of what `results` need, with the Assign of every state variable they read."""
    import openvino as ov

    seen: set = set()
    nodes = list(_walk(results, seen))
    variables = {n.get_variable_id() for n in nodes if n.get_type_name() == "ReadValue"}
    kept = [s for s in sinks if s.get_variable_id() in variables]
    nodes += _walk(kept, seen)
    params = [n for n in nodes if n.get_type_name() == "Parameter"]
    return ov.Model(results, kept, params, name)


def _walk(starts, seen: set):
    """Every node the `starts` depend on (themselves included) not yet in `seen`.

    Keyed by the node's unique name: Python wrappers of nodes come and go, and their id() is reused.
    """
    stack = list(starts)
    while stack:
        node = stack.pop()
        if node.get_name() not in seen:
            seen.add(node.get_name())
            yield node
            stack.extend(v.get_node() for v in node.input_values())


def _run_segment(model, calls, extra, chained: bool):
    # verify's behaviour checks, drift and the tap scan compare these outputs: exact on every CPU
    compiled = compile_exact(model)
    request = compiled.create_infer_request()
    names = {n for p in compiled.inputs for n in p.get_names()}
    outputs, lengths = [], []
    for k, call in enumerate(calls):
        if not chained:
            request.reset_state()
        feeds = {**call, **(extra[k] if extra else {})}
        request.infer({n: _typed(v, compiled, n) for n, v in feeds.items() if n in names})
        outputs.append(request.get_tensor(compiled.outputs[0]).data.copy())
        lengths.append(sorted({s.state.shape[2] for s in request.query_state()}))
    return outputs, lengths


def _typed(value, compiled, name):
    port = next(p for p in compiled.inputs if name in p.get_names())
    return np.asarray(value).astype(port.get_element_type().to_dtype(), copy=False)


def _run_whole(model, calls, chained: bool) -> DraftRun:
    compiled = compile_exact(model)  # as _run_segment
    request = compiled.create_infer_request()
    names = {n for p in compiled.inputs for n in p.get_names()}
    out_port = next((o for o in compiled.outputs if "last_hidden_state" in o.get_names()), compiled.outputs[0])
    outputs, cache = [], []
    for call in calls:
        if not chained:
            request.reset_state()
        request.infer({n: _typed(v, compiled, n) for n, v in call.items() if n in names})
        outputs.append(request.get_tensor(out_port).data.copy())
        cache.append(sorted({s.state.shape[2] for s in request.query_state()}))
    return DraftRun(outputs, cache, 1)


class DraftIR:
    def __init__(self, path):
        self.path = Path(path)
        if not (self.path / IR_XML).is_file():
            raise Gguf2ovError(f"{self.path} is not a draft folder: {IR_XML} is missing")

    @cached_property
    def config(self):
        """The draft's config.json, validated (draft.config.DraftConfig)."""
        from ..draft.config import read_draft_config

        return read_draft_config(self.path)

    def run_blocks(self, blocks: list[tuple[np.ndarray, np.ndarray]]) -> list[np.ndarray]:
        """Each (block embeddings [B, H], context hidden [C, n_ids*H]) on its own empty cache -> rows [B-1, H]."""
        calls = [block_feeds(e, c) for e, c in blocks]
        return [o[0] for o in run_draft(self.path / IR_XML, calls, chained=False).outputs]


def block_feeds(block_embeds: np.ndarray, context_hidden: np.ndarray, past: int = 0) -> dict[str, np.ndarray]:
    """One draft call: `past` context positions already cached, new context, then the block."""
    b, c = len(block_embeds), len(context_hidden)
    return {
        "inputs_embeds": block_embeds[None].astype(np.float32),
        "hidden_states": context_hidden[None].astype(np.float32),
        "position_ids": np.arange(past, past + c + b, dtype=np.int64)[None],
        "attention_mask": np.ones((1, past + c + b), dtype=np.int64),
        "beam_idx": np.zeros(1, dtype=np.int32),
    }


def synthetic_steps(hidden: int, fc_in: int, block: int, stateful: bool) -> list[dict]:
    """Two draft calls as GenAI makes them: new target context + a block of `block` embeddings."""
    rng = np.random.default_rng(SEED)
    steps, past = [], 0
    for ctx in CONTEXT_STEPS if stateful else CONTEXT_STEPS[:1]:
        steps.append(block_feeds(rng.standard_normal((block, hidden), dtype=np.float32),
                                 rng.standard_normal((ctx, fc_in), dtype=np.float32), past))
        past += ctx  # only the committed target context stays in the cache, not the block
    return steps
