"""Which embeddings a DFlash draft IR is fitted to be fed: recorded in its rt_info, and read back.

A draft trained on a Gemma target's embedding states the scale it was trained with, S
(`dflash_config.input_embedding_scale`, llama.cpp's `dflash.embedding_scale`): its block's embeddings were the
target table's rows times S. What GenAI feeds a draft's `inputs_embeds` depends on the target:
- an LLM target: the rows of its token-embedding table, unscaled (GenAI grafts the table onto the draft; a
  draft holding the target's table gathers the same rows), as llama.cpp's DFlash feeds them too;
- a VLM folder: its text embeddings model's output, Gemma's sqrt(hidden) in it already.
A draft is fitted to one of the two (draft.config.DraftConfig.fitted): it multiplies its inputs_embeds by S / F,
F being the scale the embeddings it expects already carry (1: the table's rows; a VLM folder's own, which
`runtime.target.TargetIR.embeds_scale` measures). Fed the other form, it attaches, keeps greedy text identical
and is accepted less, or never: with the scale applied twice, 0 of 500 tokens on fixtures/tiny-gemma4's text
prompts instead of 222.

The form is recorded in the IR's rt_info beside the DFlash keys GenAI reads (`RT_INFO`), in config.json
(`dflash_config.embedding_input_scale`), and so in a GGUF written from that config (`dflash.embedding_input_scale`,
tensor_maps/dflash.yaml). `form_of` reads it back; a draft IR exported before the record was written is read
from its graph (the Multiply of its inputs_embeds by a constant) and the scale its config.json states.
"""

from dataclasses import dataclass

from ..ir.irweights import constant_values
from .config import EMBEDDING_INPUT_SCALE, EMBEDDING_SCALE, SCALE_ROUNDING, DraftConfig, draft_value

# rt_info keys (GenAI reads none of them): the form the draft is fitted for (INPUT_FORMS), the scale the
# embeddings of that form carry over the table's rows, and the factor the draft multiplies them by itself
FORM_KEY = ("dflash", "embedding_input")
INPUT_SCALE_KEY = ("dflash", "embedding_input_scale")
APPLIED_SCALE_KEY = ("dflash", "embedding_applied_scale")
RT_INFO = (FORM_KEY, INPUT_SCALE_KEY, APPLIED_SCALE_KEY)
TABLE_ROWS, SCALED, AS_FED = "table_rows", "scaled_embeddings", "as_fed"
INPUT_FORMS = {
    TABLE_ROWS: "the target table's rows, as GenAI grafts them onto an LLM target's draft",
    SCALED: "embeddings already scaled by {scale:.4g}, as a VLM folder's text embeddings model makes them",
    AS_FED: "whatever the target feeds: the draft states no embedding scale",
}


@dataclass(frozen=True)
class EmbeddingForm:
    """What a draft multiplies its inputs_embeds by (`applied`) and the scale, over the target table's rows, of the
    embeddings it is fitted to be fed (`input_scale`; None when nothing says); `source`: where this was read."""

    applied: float
    input_scale: float | None
    source: str

    @property
    def trained(self) -> float | None:
        """The scale the draft was trained with: what reaches its first layer, over the table's rows."""
        return None if self.input_scale is None else self.applied * self.input_scale

    def describe(self) -> str:
        """What the draft is fitted for, in words."""
        if self.form is None:
            return "an embedding form it does not record"
        return INPUT_FORMS[self.form].format(scale=self.input_scale)

    @property
    def form(self) -> str | None:
        """TABLE_ROWS, SCALED or AS_FED (None when the input scale is unknown)."""
        if self.input_scale is None:
            return None
        if not same_scale(self.input_scale, 1.0):
            return SCALED
        return AS_FED if same_scale(self.applied, 1.0) else TABLE_ROWS


def same_scale(a: float, b: float, rel: float = SCALE_ROUNDING) -> bool:
    return abs(a - b) <= rel * max(abs(a), abs(b))


def record_form(model, config: DraftConfig) -> None:
    """Write the form `config` is fitted for into the draft `model`'s rt_info."""
    form = EmbeddingForm(config.input_embedding_scale, config.embedding_input_scale, "rt_info")
    model.set_rt_info(form.form, list(FORM_KEY))
    model.set_rt_info(repr(form.input_scale), list(INPUT_SCALE_KEY))
    model.set_rt_info(repr(form.applied), list(APPLIED_SCALE_KEY))


def form_of(model, config: dict | None) -> EmbeddingForm:
    """The form the draft IR `model` (as exported: inputs_embeds in) is fitted for: its rt_info's record, else its
    graph's multiply of inputs_embeds and the scales its config.json (`config`, None without one) states."""
    if all(model.has_rt_info(list(k)) for k in (INPUT_SCALE_KEY, APPLIED_SCALE_KEY)):
        try:
            return EmbeddingForm(float(model.get_rt_info(list(APPLIED_SCALE_KEY)).astype(str)),
                                 float(model.get_rt_info(list(INPUT_SCALE_KEY)).astype(str)), "rt_info")
        except ValueError:
            pass  # a malformed record: the graph says what the draft does
    applied = graph_scale(model)
    if config is None or not isinstance(config.get("dflash_config"), dict):
        return EmbeddingForm(applied, None, "graph")
    trained, stated = (draft_value(config, k) for k in (EMBEDDING_SCALE, EMBEDDING_INPUT_SCALE))
    if stated is not None and _number(stated):
        return EmbeddingForm(applied, float(stated), "graph and config.json")
    trained = float(trained) if trained is not None and _number(trained) else 1.0
    return EmbeddingForm(applied, trained / applied if applied else None, "graph and config.json")


def graph_scale(model) -> float:
    """The constant factor the draft's graph multiplies its inputs_embeds by before anything else reads them
    (1.0 without one)."""
    embeds = next((p for p in model.inputs if "inputs_embeds" in p.get_names()), None)
    if embeds is None:
        return 1.0
    for target in embeds.get_target_inputs():
        node = target.get_node()
        if node.get_type_name() != "Multiply":
            continue
        other = node.input_value(1 - target.get_index()).get_node()
        values = constant_values(other)
        if values is not None and values.size == 1:
            return float(values.reshape(-1)[0])
    return 1.0


def _number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0
