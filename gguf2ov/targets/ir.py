"""A target IR as GenAI reads it: its hidden-state locators, its token-embedding Gather and its lm_head
MatMul, found by the graph's structure and by GenAI's own rules.

By structure (what the tap scan, drift and `verify` read the target through): the embedding is the
Gather that looks up the `input_ids` Parameter in a constant table, the head the MatMul that produces
the `logits` output (through an Add, a Transpose or a softcap, as GenAI's `find_llm_matmul` allows);
tied heads share the embedding's constant. Node names are not used for that: optimum names them
`aten::embedding`/`aten::linear` in f32 exports and `ov_ext::embedding`/`ov_ext::linear` in 16-bit
and compressed ones.

By GenAI's rules (openvino.genai `eagle3_model_transforms.cpp` find_embedding_gather, `utils.cpp`
find_llm_matmul, `eagle3::find_decoder_layer_hidden_state_outputs`): the first Gather in topological
order whose table has more than 1000 rows or a name with `embed_tokens` / `embedding`; the MatMul
feeding the first output; and, without the annotation, the layers' residual adds by name. A target
works with a draft when GenAI's picks are the structural ones (`checks.py`).
"""

import json

from ..errors import Gguf2ovError
from ..names import LOCATORS_KEY

# Between the logits output and the head's MatMul, what GenAI's find_llm_matmul steps over.
_HEAD_WRAPPERS = ("Add", "Transpose", "Convert")


def read_locators(model) -> dict[int, dict] | None:
    """{layer id: {"producer": node name, "output_index": i}} from the target IR, or None."""
    rt = model.get_rt_info()
    if LOCATORS_KEY not in rt:
        return None
    try:
        layers = json.loads(rt[LOCATORS_KEY].astype(str))["layers"]
        return {int(k): v for k, v in layers.items()}
    except (ValueError, KeyError, TypeError) as e:
        raise Gguf2ovError(f"the target's {LOCATORS_KEY} rt_info is not valid JSON with a 'layers' map: {e}") from e



def _from_constants(output, seen: dict) -> bool:
    """Whether `output` is computed from constants alone (a weight, through any decompression)."""
    node = output.get_node()
    key = node.get_name()
    if key not in seen:
        kind = node.get_type_name()
        seen[key] = kind == "Constant" or (kind not in ("Parameter", "ReadValue") and node.get_input_size() > 0
                                           and all(_from_constants(v, seen) for v in node.input_values()))
    return seen[key]


def _token_ids(model):
    """The Parameter that takes token ids: `input_ids`, or the one input of a text-embeddings model."""
    params = model.get_parameters()
    named = next((p for p in params if "input_ids" in p.output(0).get_names()), None)
    return named if named is not None or len(params) != 1 else params[0]


def embedding_lookup(model, where) -> "object":
    """The Gather that turns the token-id Parameter into embeddings: its indices come from the
    Parameter (through Converts), its data is a constant [vocab, hidden] subgraph. Where several do
    (Gemma 4's per-layer embeddings beside the token embedding), the one whose rows are as wide as the
    head's input."""
    ids, found = _token_ids(model), []
    if ids is not None:
        frontier, seen = [ids.output(0)], {}
        while frontier:
            output = frontier.pop()
            for target in output.get_target_inputs():
                node = target.get_node()
                if node.get_type_name() == "Gather" and target.get_index() == 1:
                    table = node.input_value(0)
                    if table.get_partial_shape().rank.get_length() == 2 and _from_constants(table, seen):
                        found.append(node)
                elif node.get_type_name() == "Convert":
                    frontier.append(node.output(0))
    if len(found) > 1:
        hidden = logits_matmul(model, where).input_value(0).get_partial_shape()[-1]
        found = [n for n in found if n.input_value(0).get_partial_shape()[1] == hidden] or found
    if found:
        return found[0]
    raise Gguf2ovError(f"{where}: no token-embedding lookup found: looked for a Gather of the input_ids Parameter "
                       "in a constant [vocab, hidden] table",
                       hint="export the target with optimum-intel (text-generation-with-past) or `gguf2ov target`")


def logits_matmul(model, where) -> "object":
    """The MatMul that makes the `logits` output from a constant weight (GenAI grafts its weight
    onto the draft), found through an Add, a Transpose, a Convert or a tanh softcap."""
    result = next((o for o in model.outputs if "logits" in o.get_names()), model.outputs[0] if model.outputs else None)
    node = result.get_node() if result is not None else None
    seen = {}
    for _ in range(6):
        if node is None:
            break
        kind = node.get_type_name()
        if kind == "MatMul" and _from_constants(node.input_value(1), seen):
            return node
        if kind == "Result" or kind in _HEAD_WRAPPERS:
            node = node.input_value(0).get_node()
        elif kind == "Multiply" and node.input_value(0).get_node().get_type_name() == "Tanh":  # cap * tanh(x / cap)
            node = node.input_value(0).get_node().input_value(0).get_node()
            node = node.input_value(0).get_node() if node.get_type_name() == "Divide" else None
        else:
            break
    raise Gguf2ovError(f"{where}: no lm_head found: looked for the MatMul of a constant weight that makes the "
                       "logits output (directly or through Add, Transpose or a tanh softcap)",
                       hint="export the target with optimum-intel (text-generation-with-past) or `gguf2ov target`")


def genai_embedding(model):
    """The Gather GenAI attaches a draft's block to (find_embedding_gather): the first Gather in
    topological order whose table has more than 1000 rows or a name with embed_tokens / embedding."""
    for op in model.get_ordered_ops():
        if op.get_type_name() != "Gather":
            continue
        data = op.input_value(0)
        ps = data.get_partial_shape()
        name = data.get_node().get_friendly_name()
        big = ps.rank.is_static and ps.rank.get_length() >= 2 and ps[0].is_static and ps[0].get_length() > 1000
        if big or "embed_tokens" in name or "embedding" in name:
            return op
    return None


def genai_head(model):
    """The MatMul GenAI grafts onto a draft (find_llm_matmul): the one feeding the first output,
    directly or through a Divide -> Tanh -> Multiply softcap (None: not a MatMul)."""
    head = model.output(0).get_node().input_value(0).get_node()
    if head.get_type_name() == "Multiply" and head.input_value(0).get_node().get_type_name() == "Tanh":
        head = head.input_value(0).get_node().input_value(0).get_node().input_value(0).get_node()
    return head if head.get_type_name() == "MatMul" else None


def pattern_fallback_layers(target, ids) -> dict[int, str]:
    """What GenAI does without the annotation: per id, the first Add named `layers.<id>/` whose second
    input is MatMul(Multiply(...)), the MLP residual add of a Llama/Qwen-style block (GenAI's
    eagle3::find_decoder_layer_hidden_state_outputs). {id: the Add's name} for the ids it finds."""
    found = {}
    for op in target.get_ordered_ops():
        if op.get_type_name() != "Add" or op.get_input_size() < 2:
            continue
        mlp = op.input_value(1).get_node()
        if mlp.get_type_name() != "MatMul" or mlp.input_value(0).get_node().get_type_name() != "Multiply":
            continue
        name = op.get_friendly_name()
        for i in ids:
            if i not in found and f"layers.{i}/" in name:
                found[i] = name
    return found
