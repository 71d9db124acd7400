"""The draft's own token embedding and lm_head: a draft that GenAI attaches without copying the target's.

A DFlash draft as exported reads the embeddings of its block (`inputs_embeds`) and returns hidden
states (`last_hidden_state`); GenAI 2026.4.1 completes it when it attaches it (openvino.genai
`dflash_strategy.cpp` and `dflash_model_transforms.cpp`; the 2026.4.1 wheel holds the same
messages and node names):
- `attach_target_embedding_to_draft`: the target's token-embedding table into a Gather on a new
  `input_ids` input;
- `attach_target_lm_head_to_draft`: the weight side of the target's last MatMul into a MatMul that
  makes `logits`.
Both clone the weight's subgraph with `eagle3::clone_node_recursive`, which copies every Constant's
bytes into the heap as stored (`Constant(type, shape, data_ptr)`), also from a memory-mapped target;
the draft compiled on its own then repacks the head's codes once more. GenAI decides from the names
alone: a draft that takes `input_ids` and returns `logits` is compiled as it is. A VLM target feeds
the draft `inputs_embeds` from its text-embeddings model, so there only the head is grafted (a
VLM draft must keep `inputs_embeds`).

`attach_head` gives the draft those pieces itself, in a form of its own (`HeadForm`): as the target
stores them (`stored`: the same function as GenAI's graft, read from the draft's memory-mapped file
instead of a heap copy) or requantized by NNCF (the draft only proposes, so its copy changes the
acceptance, never the text). The Gather and the MatMul are those of GenAI's graft, after the draft's
own final norm and its seed-row slice. `plain_draft` is the inverse: the draft as exported, which
every check of this tool runs (the checks read the target's embedding and head themselves).
"""

import json
from dataclasses import dataclass

import numpy as np

from ..errors import Gguf2ovError
from ..ir.graph_ops import const, named
from ..ir.graph_ops import ops as _ops

HEAD_RT_INFO = ("gguf2ov", "draft_head")
EMBEDDING_NODE = "draft_head.embed_tokens/Gather"
HEAD_NODE = "draft_head.lm_head/MatMul"
INPUT_IDS, INPUTS_EMBEDS, LOGITS, LAST_HIDDEN_STATE = "input_ids", "inputs_embeds", "logits", "last_hidden_state"


@dataclass(frozen=True)
class HeadForm:
    """How a draft holds the target's token embedding and lm_head.

    `embedding` / `head`: None keeps the weight as the target stores it; a `nncf_weights.WeightSpec`
    requantizes it. `graft` leaves both to GenAI (the plain draft)."""

    name: str
    embedding: object = None
    head: object = None
    graft: bool = False


def head_form(name: str) -> HeadForm:
    """`graft`, `stored`, or an NNCF int4/int8 name for the requantized head (`int4_asym_g32`: the
    embedding stays as stored, the Gather reading only the rows of the block's tokens)."""
    from ..ir.nncf_weights import WeightSpec
    from ..ir.variants import parse_variant

    name = name.strip().lower()
    if name == "graft":
        return HeadForm("graft", graft=True)
    if name == "stored":
        return HeadForm("stored")
    try:
        variant = parse_variant(name)
    except Gguf2ovError:
        variant = None
    if variant is None or not variant.nncf or variant.ratio not in (None, 1.0) or variant.all_layers:
        raise Gguf2ovError(f"unknown draft head {name!r}",
                           hint="use graft, stored, int8 or int4_{sym|asym}_g{16|32|64|128}")
    mode = f"int{variant.bits}_{'sym' if variant.sym else 'asym'}"
    return HeadForm(variant.name, head=WeightSpec(mode, variant.group_size or -1))


# --- the draft made whole --------------------------------------------------------------------------

# The .xml bytes the Gather, the MatMul and their weights' decompression add (measured on the fixture drafts)
HEAD_XML_BYTES = 12_000


def draft_grid(own: "OwnHead | None") -> str:
    """The grid (ir.weights.GRIDS) a `gguf` variant's weights take in a draft: a draft with its own head
    (`own`) is exported for the pair's memory, so its grid takes the folded form too, which the CPU plugin
    runs from as stored (an 8B draft's compact Q4_K_M grid held 1.20 GiB private after one call, 2.1x its
    0.59 GB; folded, 0.85 GiB for 0.84 GB: measured); any other draft keeps the compact one."""
    return "compact" if own is None else "folded"


@dataclass(frozen=True)
class OwnHead:
    """The target's embedding and lm_head as a draft holds them in `form`; `target` is the
    runtime.target.TargetIR they are read from."""

    form: HeadForm
    target: object

    def pieces(self) -> list[tuple[str, object, object]]:
        """(name, the target's weight output, its spec) of what the draft takes: the embedding table
        (a text target's) and the head's weight."""
        t = self.target
        embedding = [] if t.kind == "vlm" else [("embed_tokens", t.embedding.input_value(0), self.form.embedding)]
        return embedding + [("lm_head", t.head.input_value(1), self.form.head)]

    def stored_bytes(self) -> int:
        """The bytes its weights add to the draft's .bin (a tied table stored once)."""
        from ..ir.nncf_weights import subgraph_constants
        from ..ir.variants import nncf_bytes

        total, seen = HEAD_XML_BYTES, set()
        for _, output, spec in self.pieces():
            if spec is not None:
                total += nncf_bytes(spec, [d.get_length() for d in output.get_partial_shape()])
                continue
            for node in subgraph_constants(output):
                if node.get_name() not in seen:
                    seen.add(node.get_name())
                    total += node.get_byte_size()
        return total

    def record(self) -> dict:
        return {"draft_head": self.form.name, "draft_head_target": str(self.target.path),
                "folded_grid": draft_grid(self) == "folded"}

    def attach(self, model, postpone=None):
        """`attach_head` of this head onto `model`."""
        return attach_head(model, self.target, self.form, postpone)


def attach_head(model, target, form: HeadForm, postpone=None):
    """Give the draft `model` (as exported: inputs_embeds in, last_hidden_state out) the target's
    token embedding (a text target only) and lm_head in `form`, in place; returns the model.

    `target` is the runtime.target.TargetIR; `postpone(type, shape, make, name)` makes the requantized
    weights' constants while the IR is saved (ir.weights.WeightForms.postponing), so that a 248320 x
    4096 head is never whole in float32."""
    if form.graft:
        return model
    ops = _ops()
    described, made = {"form": form.name}, {}

    def weight(output, spec, name, gather, transposed=True):
        key = (output.get_node().get_name(), output.get_index(), spec)
        if key not in made:  # a tied table is held once
            made[key] = _weight(target, output, spec, postpone, name, gather, transposed)
        return made[key]

    if target.kind != "vlm":  # GenAI embeds a VLM draft's block with the target's own embeddings model
        table = weight(target.embedding.input_value(0), form.embedding, "embed_tokens", gather=True)
        embeds = _parameter(model, INPUTS_EMBEDS)
        ids = ops.parameter([-1, -1], np.int64, name=INPUT_IDS)
        ids.output(0).get_tensor().set_names({INPUT_IDS})
        lookup = named(ops.gather(table, ids, const(0, np.int64)), EMBEDDING_NODE)
        for consumer in list(embeds.output(0).get_target_inputs()):
            consumer.replace_source_output(lookup.output(0))
        model.add_parameters([ids])
        model.remove_parameter(embeds)
        described["embedding"] = _describe_weight(form.embedding)
    head = target.head
    w = weight(head.input_value(1), form.head, "lm_head", gather=False, transposed=head.get_transpose_b())
    result = _result(model, LAST_HIDDEN_STATE)
    logits = named(ops.matmul(result.input_value(0), w, head.get_transpose_a(), head.get_transpose_b()), HEAD_NODE)
    out = ops.result(logits)
    out.output(0).get_tensor().set_names({LOGITS})
    model.add_results([out])
    model.remove_result(result)
    described["head"] = _describe_weight(form.head)
    model.validate_nodes_and_infer_types()
    model.set_rt_info(json.dumps(described, sort_keys=True), list(HEAD_RT_INFO))
    return model


def plain_draft(model):
    """The draft as exported, in place: a Gather of its own table on `input_ids` becomes the
    `inputs_embeds` input again, and its own head's MatMul gives back `last_hidden_state`; a plain
    draft is returned as it is."""
    ops = _ops()
    ids = next((p for p in model.get_parameters() if INPUT_IDS in p.output(0).get_names()), None)
    if ids is not None:
        lookup = next(t.get_node() for t in ids.output(0).get_target_inputs())
        embeds = ops.parameter(lookup.get_output_partial_shape(0), np.float32, name=INPUTS_EMBEDS)
        embeds.output(0).get_tensor().set_names({INPUTS_EMBEDS})
        for consumer in list(lookup.output(0).get_target_inputs()):
            consumer.replace_source_output(embeds.output(0))
        model.add_parameters([embeds])
        model.remove_parameter(ids)
    result = next((r for r in model.get_results() if LOGITS in r.output(0).get_names()), None)
    if result is not None:
        hidden = ops.result(_head_matmul(result).input_value(0))
        hidden.output(0).get_tensor().set_names({LAST_HIDDEN_STATE})
        model.add_results([hidden])
        model.remove_result(result)
    if ids is not None or result is not None:
        model.validate_nodes_and_infer_types()
    return model


@dataclass
class OwnPieces:
    """What a draft IR holds of the target: its embedding table (None: GenAI's graft, or a VLM's
    draft) and its head's MatMul (None: graft), and what `attach_head` recorded of their form."""

    table: object = None
    head: object = None
    described: dict | None = None


def own_pieces(model) -> OwnPieces:
    """The draft's own embedding table and head, found by the names GenAI reads (read before
    `plain_draft` takes them off: the nodes stay alive)."""
    ids = next((p for p in model.get_parameters() if INPUT_IDS in p.output(0).get_names()), None)
    result = next((r for r in model.get_results() if LOGITS in r.output(0).get_names()), None)
    table = next(t.get_node() for t in ids.output(0).get_target_inputs()).input_value(0) if ids is not None else None
    return OwnPieces(table, _head_matmul(result) if result is not None else None, own_head(model))


def agreement(pieces: OwnPieces, target, rows: int = 64, seed: int = 0) -> dict:
    """The draft's own pieces against the target's, on `rows` token ids spread over the vocabulary:
    their embedding rows, and the logits of hidden rows that point at those tokens (the target head's
    own rows, which it scores highest; random rows where its weight is not [vocab, hidden]): max
    relative difference, and for the head its top-1 agreement; where a piece's shape differs from
    the target's, the two shapes. Compiles both heads once (the CPU plugin repacks each: about its
    stored size)."""
    from ..ir.irweights import gather_rows, matmul_rows

    out = {}
    if pieces.table is not None and target.kind != "vlm":
        own, theirs = pieces.table.get_partial_shape(), target.embedding.input_value(0).get_partial_shape()
        if own != theirs:
            out["embedding_shapes"] = [str(own), str(theirs)]
        else:
            ids = np.linspace(0, own[0].get_length() - 1, rows).astype(np.int64)
            a, b = gather_rows(pieces.table)(ids), target.embed(ids)
            out["embedding_max_rel_diff"] = float(np.abs(a - b).max() / max(float(np.abs(b).max()), 1e-30))
    if pieces.head is not None:
        own, theirs = pieces.head.get_output_partial_shape(0), target.head.get_output_partial_shape(0)
        width, vocab = pieces.head.input_value(0).get_partial_shape(), theirs[theirs.rank.get_length() - 1]
        if own[own.rank.get_length() - 1] != vocab or width[width.rank.get_length() - 1].get_length() != target.hidden_size:
            out["head_shapes"] = [str(own), str(theirs)]
        else:
            ids = np.linspace(0, vocab.get_length() - 1, rows).astype(np.int64)
            x = (target.rows(target.head.input_value(1))(ids) if target.head.get_transpose_b() else
                 np.random.default_rng(seed).standard_normal((rows, target.hidden_size)).astype(np.float32))
            a, b = matmul_rows(pieces.head)(x), target.head_logits(x)
            out["head_max_rel_diff"] = float(np.abs(a - b).max() / max(float(np.abs(b).max()), 1e-30))
            out["head_top1_agreement"] = float(np.mean(a.argmax(-1) == b.argmax(-1)))
    return out


def own_head(model) -> dict | None:
    """What a draft IR holds of its own (the rt_info `attach_head` wrote), or None for a plain draft."""
    if not model.has_rt_info(list(HEAD_RT_INFO)):
        return None
    return json.loads(model.get_rt_info(list(HEAD_RT_INFO)).astype(str))


def _head_matmul(result):
    node = result.input_value(0).get_node()
    if node.get_type_name() != "MatMul":
        raise Gguf2ovError(f"the draft's logits output comes from a {node.get_type_name()}, not from its head's MatMul")
    return node


def _parameter(model, name: str):
    found = next((p for p in model.get_parameters() if name in p.output(0).get_names()), None)
    if found is None:
        raise Gguf2ovError(f"the draft has no {name} input to give its own embedding to")
    return found


def _result(model, name: str):
    found = next((r for r in model.get_results() if name in r.output(0).get_names()), None)
    if found is None:
        raise Gguf2ovError(f"the draft has no {name} output to give its own head to")
    return found


def _weight(target, output, spec, postpone, name: str, gather: bool, transposed: bool = True):
    """The target's weight `output` as the draft holds it: the stored subgraph, shared until saved, or
    NNCF's compression of its rows (read from the target as stored, 64 MB of float32 at a time)."""
    from ..ir.irweights import copy_weight
    from ..ir.nncf_weights import streamed_compression

    if spec is None:
        return copy_weight(output)
    if not transposed:
        raise Gguf2ovError("the target's lm_head multiplies by its weight untransposed: only a [vocab, hidden] "
                           "head can be requantized for the draft", hint="use --draft-head stored")
    if postpone is None:
        raise Gguf2ovError("a requantized draft head is made while the IR is saved: pass postpone")
    shape = [d.get_length() for d in output.get_partial_shape()]
    rows = target.rows(output)
    return streamed_compression(lambda start, stop: rows(np.arange(start, stop)), shape, spec,
                                postpone, f"self.{name}.weight", gather)


def _describe_weight(spec) -> str:
    return "stored" if spec is None else f"{spec.mode}" + (f"_g{spec.group_size}" if spec.group_size != -1 else "")


# --- which head a draft takes ------------------------------------------------------------------------

DEFAULT_OWN = "int4_asym_g32"
# Below this, what GenAI's graft copies does not matter beside the draft: the plain draft is kept
# (smaller on disk, and it attaches to any export of the target's model).
MIN_SAVING = 64 << 20


@dataclass(frozen=True)
class HeadChoice:
    """Whether a draft brings the target's embedding and lm_head itself, and why.

    `graft_bytes`: what GenAI's graft holds in the pair (its heap copies of the table and the head as
    stored, and the head compiled again for the draft); `own_bytes`: what the draft's own pieces hold
    (the head compiled in its form; the table is read from the draft's mapped file, a few rows a
    step); `added_bytes`: what they add to the draft folder."""

    form: str
    reason: str
    graft_bytes: int
    own_bytes: int
    added_bytes: int
    own: OwnHead | None = None

    @property
    def folded_grid(self) -> bool:
        """Whether the draft's grid takes the folded form (`draft_grid`)."""
        return draft_grid(self.own) == "folded"

    def summary(self) -> str:
        grid = "; the draft's grid folded, as the CPU plugin runs it without private copies" if self.folded_grid else ""
        return f"draft head: {self.form} ({self.reason}{grid})"


def _bytes_of(output, spec) -> int:
    from ..ir.nncf_weights import subgraph_constants
    from ..ir.variants import nncf_bytes

    if spec is not None:
        return nncf_bytes(spec, [d.get_length() for d in output.get_partial_shape()])
    return sum(node.get_byte_size() for node in subgraph_constants(output))


def choose_head(target, requested: str = "auto") -> HeadChoice:
    """The head a draft for `target` (a runtime.target.TargetIR) takes: `requested` (graft, stored,
    an int4/int8 name), or for `auto` its own `DEFAULT_OWN` head where that saves the pair at least
    `MIN_SAVING` over GenAI's graft, else the graft."""
    weight = target.head.input_value(1)
    shape = [d.get_length() for d in weight.get_partial_shape()]
    table = _bytes_of(target.embedding.input_value(0), None) if target.kind != "vlm" else None
    choice = decide(requested, table, _bytes_of(weight, None), shape, target.tied)
    own = OwnHead(head_form(choice.form), target) if choice.form != "graft" else None
    return HeadChoice(choice.form, choice.reason, choice.graft_bytes, choice.own_bytes, choice.added_bytes, own)


def decide(requested: str, table_bytes: int | None, head_bytes: int, head_shape, tied: bool = False) -> HeadChoice:
    """`choose_head` from the target's figures: its table's and head's stored bytes (`table_bytes`
    None: a VLM target, whose draft keeps GenAI's embedding), the head's [vocab, hidden] shape, and
    whether the head is the table. What a target about to be built will hold decides the same way."""
    from ..ir.variants import nncf_bytes
    from ..report import human_bytes

    form = head_form(DEFAULT_OWN if requested == "auto" else requested)
    # GenAI clones the table and the head apart, tied or not, and compiles the head's copy again
    graft = (table_bytes or 0) + 2 * head_bytes
    own_head = head_bytes if form.head is None else nncf_bytes(form.head, head_shape)
    own_table = 0 if table_bytes is None else table_bytes if form.embedding is None else nncf_bytes(form.embedding, head_shape)
    shared = tied and form.head is None and form.embedding is None  # one stored table serves both
    added = HEAD_XML_BYTES + own_head + (0 if shared else own_table)
    copied = "lm_head" if table_bytes is None else "embedding table and lm_head"
    if requested != "auto":
        reason = "as asked" + ("" if form.graft else f": GenAI's graft would hold {human_bytes(graft)} of the target's "
                               f"{copied} in the pair, the draft's own {human_bytes(own_head)}")
    elif graft - own_head >= MIN_SAVING:
        reason = (f"GenAI's graft would hold {human_bytes(graft)} of the target's {copied} in the pair (copies and "
                  f"the head compiled again), the draft's own {form.name} head {human_bytes(own_head)}; the draft "
                  f"folder grows by {human_bytes(added)}")
    else:
        reason = (f"GenAI's graft holds only {human_bytes(graft)} of the target's {copied} in the pair, under "
                  f"{human_bytes(MIN_SAVING)}: the plain draft is kept (smaller on disk, and it attaches to any "
                  "export of the target)")
        form = head_form("graft")
    if form.graft:
        own_head = added = 0
    return HeadChoice(form.name, reason, graft, own_head, added)
