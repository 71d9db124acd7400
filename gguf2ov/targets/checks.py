"""What GenAI needs of a target IR, checked in one place: by `gguf2ov target` before its folder is put
in place, and by `verify --target` (and so by `run`) on any target, optimum-intel's exports included.

`target_findings(model, config)` reads the graph and converts a copy of it as GenAI does when a draft
attaches (OpenVINO's SDPAToPagedAttention); only the converted rotary tables are compiled
(`positions.py`). What each layer must come out as is its kind's (`layers/`): its state variables,
and the paged op the conversion makes of it.
Without a config this tool can build (a VLM's language model, an architecture it does not know),
the checks that need no layer kinds still run: the locators, the embedding and the head GenAI picks.
"""

from ..findings import Finding
from ..errors import Gguf2ovError, library_message
from ..names import LOCATORS_KEY
from .ir import embedding_lookup, genai_embedding, genai_head, logits_matmul, pattern_fallback_layers, read_locators

INPUTS = ("input_ids", "attention_mask", "position_ids", "beam_idx")
GROUP = "target"


def target_findings(model, config=None, taps=(), paged=None, num_layers: int | None = None,
                    embedding_model=None) -> list[Finding]:
    """The findings on a target `ov.Model` against its TargetConfig (None: one this tool does not build,
    `num_layers` then from its config.json). `taps`: the layer ids a draft will read, which must have
    locators. `paged`: the paged-conversion finding when made already (`paged_finding`).
    `embedding_model`: the model that looks token ids up, when it is not `model` (a VLM's
    text-embeddings model)."""
    out = []
    n_layers = config.num_layers if config is not None else num_layers
    if config is not None:
        out += [_inputs(model), _logits(model, config), _states(model, config)]
    out.append(_locators(model, n_layers, config.hidden_size if config is not None else None, list(taps)))
    out += _attach_points(model, embedding_model if embedding_model is not None else model)
    if config is not None:
        out += paged if paged is not None else paged_findings(model, config)
    return out


def _finding(name: str, ok: bool, reason: str, status: str | None = None) -> Finding:
    return Finding(name, GROUP, status or ("pass" if ok else "fail"), reason)


def port_name(port) -> str:
    """A port's tensor name, or its node's name when it has none (a Parameter added by hand)."""
    return min(port.get_names(), default=port.get_node().get_friendly_name())


def _inputs(model) -> Finding:
    names = [port_name(p) for p in model.inputs]
    return _finding("target-inputs", tuple(names) == INPUTS, ", ".join(names))


def _logits(model, c) -> Finding:
    out = model.outputs
    vocab = out[0].get_partial_shape()[-1] if out else None
    ok = len(out) == 1 and "logits" in out[0].get_names() and vocab.is_static and vocab.get_length() == c.vocab_size
    return _finding("target-logits", ok, f"{[port_name(o) for o in out]}, vocabulary {vocab} (config {c.vocab_size})")


def expected_states(c) -> list[str]:
    """Every state variable the target keeps, by its layers' kinds."""
    from .decoder import layer_kinds

    return sorted(v for i, kind in layer_kinds(c) for v in kind.states(c, i))


def _states(model, c) -> Finding:
    from collections import Counter

    variables = sorted(v.get_info().variable_id for v in model.get_variables())
    kinds = ", ".join(f"{n} {kind}" for kind, n in Counter(c.mixers).items())
    return _finding("target-state", variables == expected_states(c),
                    f"{len(variables)} state variables ({len(expected_states(c))} for {c.num_layers} layers: {kinds})")


def _locators(model, n_layers, hidden, taps) -> Finding:
    """`hidden_states_decoder_layers`: one locator per layer on a live node of the hidden width, every
    tap among them; without the annotation, GenAI's name-pattern fallback must find the taps."""
    try:
        layers = read_locators(model)
    except Gguf2ovError as e:
        return _finding("target-locators", False, e.message)
    if layers is None:
        found = pattern_fallback_layers(model, taps)
        if taps and len(found) == len(taps):
            return _finding("target-locators", True, f"no {LOCATORS_KEY} rt_info: GenAI will use its name-pattern "
                            f"fallback, which finds the MLP residual add of layers {sorted(found)} (Llama/Qwen-style "
                            "blocks); re-export the target with optimum-intel >= 2.2 to be sure", status="warn")
        return _finding("target-locators", False, f"no {LOCATORS_KEY} rt_info, and GenAI's name-pattern fallback "
                        f"finds {len(found)} of the {len(taps)} draft layers ({sorted(found)}): GenAI will refuse the "
                        f"pair (\"Eagle3 fallback found {len(found)} outputs for {len(taps)} requested target layers\")")
    nodes = {}
    for op in model.get_ordered_ops():
        nodes.setdefault(op.get_friendly_name(), []).append(op)
    problems = []
    if n_layers is not None and len(layers) != n_layers:
        problems.append(f"{len(layers)} locators for {n_layers} layers")
    bad = []
    for k, loc in sorted(layers.items()):
        found = nodes.get(loc.get("producer"), [])
        index = int(loc.get("output_index", 0))
        if len(found) != 1 or index >= found[0].get_output_size():
            bad.append(str(k))
            continue
        shape = found[0].output(index).get_partial_shape()
        if hidden is not None and (shape.rank.is_dynamic or shape.rank.get_length() != 3 or not shape[2].is_static
                                   or shape[2].get_length() != hidden):
            bad.append(f"{k} ({shape})")
    if bad:
        problems.append(f"producer(s) of layer(s) {', '.join(bad[:6])} not in the target graph"
                        + (f" as one [.., .., {hidden}] output" if hidden else ""))
    if absent := [i for i in taps if i not in layers]:
        problems.append(f"no locator for draft layer id(s) {absent}")
    if problems:
        return _finding("target-locators", False, "; ".join(problems))
    width = f" of the hidden width {hidden}" if hidden else ""
    return _finding("target-locators", True, f"{len(layers)} locators, every producer found in the graph{width}")


def _attach_points(model, embedding_model) -> list[Finding]:
    """Where GenAI attaches the draft: the embedding Gather and the head MatMul it picks by its own
    rules must be the ones that look up `input_ids` and make `logits` (the tap scan and drift read
    the target there too)."""
    out = []
    try:
        lookup = embedding_lookup(embedding_model, "the target")
        picked = genai_embedding(embedding_model)
        same = picked is not None and picked.get_name() == lookup.get_name()
        table = lookup.input_value(0).get_partial_shape()
        out.append(_finding("target-embedding", same, f"token embedding {lookup.get_friendly_name()} over a {table} "
                            "table" + ("" if same else f", but GenAI picks "
                                       f"{picked.get_friendly_name() if picked else 'no Gather'} to attach the draft")))
    except Gguf2ovError as e:
        out.append(_finding("target-embedding", False, e.message + ": GenAI cannot attach the draft's block"))
    try:
        head = logits_matmul(model, "the target")
        picked = genai_head(model)
        same = picked is not None and picked.get_name() == head.get_name()
        vocab = head.get_output_partial_shape(0)[-1]
        out.append(_finding("target-head", same, f"lm_head {head.get_friendly_name()}, {vocab} logits"
                            + ("" if same else ", but GenAI's find_llm_matmul does not reach it")))
    except Gguf2ovError as e:
        out.append(_finding("target-head", False, e.message + ": GenAI cannot score the draft's rows"))
    return out


def paged_findings(model, c) -> list[Finding]:
    """What GenAI's SDPAToPagedAttention makes of the graph (`target-paged`), and the positions RoPE
    turns a step's tokens by in the converted graph (`target-positions`)."""
    from .positions import NAME, positions_finding

    try:
        paged = paged_model(model)
    except RuntimeError as e:
        return [_finding("target-paged", False, f"SDPAToPagedAttention failed: {library_message(e)}"),
                _finding(NAME, False, "not checked: the paged conversion failed", status="skip")]
    return [_paged_finding(paged, model, c), positions_finding(paged, model)]


def paged_model(model):
    """A copy of `model` converted as GenAI converts a target when a draft attaches (RuntimeError when
    OpenVINO cannot)."""
    from openvino._offline_transformations import paged_attention_transformation

    paged = model.clone()
    paged_attention_transformation(paged)
    return paged


# SDPAToPagedAttention (2026.4.1) carries SDPA's sixth input, the sinks, into this input of the paged attention
PAGED_SINKS_INPUT = 20


def _paged_finding(paged, model, c) -> Finding:
    """The converted graph: every layer's kind converted (attention to a paged attention with the
    config's key/value heads, head size and window; a Gated DeltaNet layer to its paged recurrence and
    conv, with their state tables), no state op left, which DFlash refuses, and every locator's
    producer still there."""
    from collections import Counter

    from .decoder import layer_kinds

    ops = paged.get_ordered_ops()
    left = [op.get_type_name() for op in ops if op.get_type_name() in ("ReadValue", "Assign")]
    expected = [made for i, kind in layer_kinds(c) for made in kind.paged(c, i)]
    wrong = [f"{len(left)} state ops left ({', '.join(sorted(set(left)))}): DFlash refuses unmanaged state"] if left else []
    found = Counter(op.get_type_name() for op in ops)
    for op_type, n in Counter(e["op"] for e in expected).items():
        if found[op_type] != n:
            wrong.append(f"{found[op_type]} {op_type} for {n} layers")
    attention = [e for e in expected if "heads" in e]
    caches = {}  # the layer whose cache an attention reads (a kind's "cache", else its own) -> that cache
    for i, (op, want) in enumerate(zip([op for op in ops if op.get_type_name() == "PagedAttentionExtension"], attention)):
        rt = op.get_rt_info()
        heads = [int(rt[k].astype(int)) for k in ("num_k_heads", "k_head_size")] if "num_k_heads" in rt else None
        window, sinks = _constant(op.input_value(10)), _sink_count(op)
        if heads != want["heads"] or window != want["window"] or sinks != want.get("sinks", 0):
            wrong.append(f"attention {i}: heads {heads}, window {window}, sinks {sinks} (expected {want['heads']}, "
                         f"{want['window']}, {want.get('sinks', 0)})")
        cache = op.input_value(3).get_node().get_friendly_name()
        owner = want.get("cache", ("attention", i))
        if caches.setdefault(owner, cache) != cache:
            wrong.append(f"attention {i} reads {cache}, not {caches[owner]}, the cache of layer {owner}")
    if len(set(caches.values())) != len(caches):
        wrong.append("attentions of layers with their own keys and values read one cache")
    shared = sum(1 for e in attention if "cache" in e and e["cache"] != e["layer"])
    inputs = {port_name(p): p.get_partial_shape() for p in paged.inputs}
    for name, shape in (e["table"] for e in expected if "table" in e):
        have = inputs.get(name)
        if have is None or [d.get_length() if d.is_static else -1 for d in have] != shape:
            wrong.append(f"state table {name} is {have if have is not None else 'absent'} (expected "
                         f"{[d if d >= 0 else '?' for d in shape]})")
    nodes = {op.get_friendly_name() for op in ops}
    if gone := [k for k, loc in sorted((read_locators(model) or {}).items()) if loc.get("producer") not in nodes]:
        wrong.append(f"the producers of locator(s) {gone[:6]} are gone after the conversion")
    kinds = ", ".join(f"{n} {op_type}" for op_type, n in Counter(e["op"] for e in expected).items())
    window = f", sliding windows {c.sliding_window} where configured" if c.sliding_window else ""
    window += ", attention sinks kept" if any(e.get("sinks") for e in attention) else ""
    reads = f", {shared} of them over an earlier layer's key/value cache (shared KV)" if shared else ""
    return _finding("target-paged", not wrong, "; ".join(wrong[:4]) if wrong else f"{kinds} for {c.num_layers} layers"
                    f"{reads}, no state op left, every locator kept{window}")


def _sink_count(op) -> int:
    """How many sink logits a paged attention adds to its softmax (input 20, [1, heads, 1, 1]; empty
    without sinks)."""
    if op.get_input_size() <= PAGED_SINKS_INPUT:
        return 0
    shape = op.input_value(PAGED_SINKS_INPUT).get_partial_shape()
    return shape[1].get_length() if shape.rank.get_length() == 4 and shape.is_static and shape[0].get_length() else 0


def _constant(output):
    """The value of a small constant subgraph (a paged attention's sliding window)."""
    import openvino as ov
    from openvino.passes import ConstantFolding, Manager

    sub = ov.Model([ov.opset13.result(output)], [], "value").clone()
    manager = Manager()
    manager.register_pass(ConstantFolding())
    manager.run_passes(sub)
    node = sub.get_results()[0].input_value(0).get_node()
    return int(node.get_data().reshape(-1)[0]) if node.get_type_name() == "Constant" else None


# --- what the CPU plugin compiles it into ---------------------------------------------------------

def expected_compiled(c) -> dict[str, int]:
    """{op type: count} the compiled model must hold, by its layers' kinds (`compiled(c, i)`; empty
    when no kind states any: such a target is not compiled to check it)."""
    from collections import Counter

    from .decoder import layer_kinds

    total = Counter()
    for i, kind in layer_kinds(c):
        total.update(kind.compiled(c, i))
    return dict(total)


def compiled_finding(xml, c, checked_on: str = "") -> Finding | None:
    """What OpenVINO's CPU plugin makes of the IR at `xml` (of config `c`), stateful and after
    SDPAToPagedAttention (GenAI's conversion when a draft attaches): the runtime model's layer types
    counted against what the kinds expect, e.g. 3 GatherMatmul per mixture-of-experts layer and no
    Tile or ScatterElementsUpdate left (the dense trace, 13-30x slower per decode step, would remain
    if the plugin's rewrite did not match). Compiled with the plugin's defaults, as GenAI runs it.
    `checked_on`: what the IR is when it is not the target itself (`probe.py`). None when no kind
    expects anything of the compiled model."""
    from collections import Counter

    import openvino as ov
    from openvino._offline_transformations import paged_attention_transformation

    from ..numerics import compile_plain

    expected = expected_compiled(c)
    if not expected:
        return None
    problems, weights = [], Counter()
    for form in ("stateful", "paged"):
        model = ov.Core().read_model(str(xml))
        if form == "paged":
            try:
                paged_attention_transformation(model)
            except RuntimeError as e:
                return _finding("target-compiled", False, f"SDPAToPagedAttention failed: {library_message(e)}")
        try:
            runtime = compile_plain(model).get_runtime_model()
        except RuntimeError as e:
            return _finding("target-compiled", False, f"the {form} model does not compile on CPU: {library_message(e)}")
        del model
        ops = runtime.get_ordered_ops()
        found = Counter(op.get_rt_info()["layerType"].astype(str) for op in ops)
        if wrong := [f"{found[t]} {t} (expected {n})" for t, n in expected.items() if found[t] != n]:
            problems.append(f"{form}: {', '.join(wrong)}")
        if form == "stateful":
            weights = Counter(op.input_value(1).get_element_type().get_type_name() for op in ops
                              if op.get_rt_info()["layerType"].astype(str) == "GatherMatmul")
    held = ", ".join(f"{n} {t}" for t, n in expected.items() if n) or "nothing"
    absent = [t for t, n in expected.items() if not n]
    text = f"{held}" + (f", no {' or '.join(absent)}" if absent else "") + ", stateful and paged"
    if weights:
        text += f" (fused weights: {', '.join(f'{n} {t}' for t, n in sorted(weights.items()))})"
    if checked_on:
        text += f"; {checked_on}"
    return _finding("target-compiled", not problems, "; ".join(problems) + (f"; {checked_on}" if checked_on else "")
                    if problems else text)
