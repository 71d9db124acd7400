"""A draft records which embeddings it is fitted to be fed (gguf2ov/draft/embedding.py): in its IR's rt_info, in
config.json and in a GGUF written from that config, read back when the GGUF is converted; an IR without the record
is read from its graph and config.json.

On fixtures/tiny-gemma4's draft, which states Gemma's embedding scale sqrt(32): fitted for the table's rows (an LLM
target, or no target) it multiplies its inputs_embeds by that scale; fitted for a VLM folder's text embeddings,
already scaled, by nothing. The IRs are built in memory, never exported."""

import json

import numpy as np
import pytest

from gguf2ov.draft.embedding import AS_FED, SCALED, TABLE_ROWS, form_of, graph_scale
from gguf2ov.draft.graph import build_draft_ir, build_draft_model
from gguf2ov.ir.variants import parse_variant
from opened import open_draft
from test_target_fixtures import _dir, _json

NAME = "tiny-gemma4"


def _rt(model) -> dict:
    return {"/".join(k): model.get_rt_info(list(k)).astype(str)
            for k in (("dflash", "embedding_input"), ("dflash", "embedding_input_scale"),
                      ("dflash", "embedding_applied_scale")) if model.has_rt_info(list(k))}


def _ir(draft):
    return build_draft_ir(draft, parse_variant("gguf"), progress=False)[0]


@pytest.fixture(scope="module")
def scale() -> float:
    return _json(NAME, "draft-ref/config.json")["dflash_config"]["input_embedding_scale"]


def test_the_ir_records_the_form_it_is_fitted_for_and_its_graph_applies_it(scale):
    draft = open_draft(_dir(NAME) / "draft-Q4_K_M.gguf")
    rows = _ir(draft)
    assert _rt(rows) == {"dflash/embedding_input": TABLE_ROWS, "dflash/embedding_input_scale": "1.0",
                         "dflash/embedding_applied_scale": repr(draft.config.input_embedding_scale)}
    assert graph_scale(rows) == pytest.approx(scale, rel=1e-6)
    form = form_of(rows, None)
    assert (form.form, form.source, form.input_scale) == (TABLE_ROWS, "rt_info", 1.0)
    assert form.trained == pytest.approx(scale, rel=1e-6)

    measured = scale * (1 + 3e-8)  # a VLM folder's own sqrt(32), as its text embeddings model's norms give it
    draft.config = draft.config.fitted(measured)
    vlm = _ir(draft)
    assert _rt(vlm) == {"dflash/embedding_input": SCALED, "dflash/embedding_input_scale": repr(measured),
                        "dflash/embedding_applied_scale": "1.0"}
    assert graph_scale(vlm) == 1.0  # no multiply left in the graph
    assert draft.config.raw["dflash_config"]["embedding_input_scale"] == measured  # config.json says so too
    assert form_of(vlm, None).form == SCALED


def test_a_draft_that_states_no_scale_takes_what_it_is_fed():
    draft = open_draft(_dir("tiny-dflash") / "draft-Q4_K_M.gguf")
    model = _ir(draft)
    assert _rt(model)["dflash/embedding_input"] == AS_FED and graph_scale(model) == 1.0


def test_an_ir_without_the_record_is_read_from_its_graph_and_config(scale):
    """IRs exported before the record was written: their graph's multiply, and config.json's stated scale."""
    draft = open_draft(_dir(NAME) / "draft-Q4_K_M.gguf")
    config = draft.config.raw
    rows = build_draft_model(draft.config, draft.f32, draft.f32)  # no rt_info at all
    form = form_of(rows, config)
    assert (form.form, form.source) == (TABLE_ROWS, "graph and config.json")
    assert form.applied == pytest.approx(scale, rel=1e-6) and form.input_scale == pytest.approx(1.0)
    fitted = draft.config.fitted(scale)
    plain_config = json.loads(json.dumps(fitted.raw))
    del plain_config["dflash_config"]["embedding_input_scale"]  # as such a config.json says it
    vlm = build_draft_model(fitted, draft.f32, draft.f32)
    form = form_of(vlm, plain_config)
    assert (form.form, form.applied) == (SCALED, 1.0) and form.input_scale == pytest.approx(scale)
    assert form_of(vlm, None).input_scale is None  # no config.json: nothing says


def test_the_gguf_records_the_form_and_converts_back_to_it(tmp_path, scale):
    """A draft GGUF written from a config records the embeddings it is fitted for (dflash.embedding_input_scale,
    beside llama.cpp's dflash.embedding_scale: 1, the table's rows, when the config states none); converted, the
    draft multiplies by what that form leaves of its scale."""
    import shutil

    from gguf import GGUFReader

    from gguf2ov.tools.gguf_writer import write_dflash_gguf

    def field(path, key):
        f = GGUFReader(path).fields[key]
        return float(f.parts[f.data[0]][0])

    rows = write_dflash_gguf(_dir(NAME) / "draft-ref", tmp_path / "rows.gguf", mix="F32").path
    assert field(rows, "dflash.embedding_input_scale") == 1.0
    assert field(rows, "dflash.embedding_scale") == pytest.approx(scale)
    draft = open_draft(rows)
    assert draft.config.embedding_input_scale == 1.0 and draft.config.input_embedding_scale == pytest.approx(scale)

    fitted = tmp_path / "fitted"
    fitted.mkdir()
    shutil.copy(_dir(NAME) / "draft-ref/model.safetensors", fitted)
    config = _json(NAME, "draft-ref/config.json")
    config["dflash_config"]["embedding_input_scale"] = scale
    (fitted / "config.json").write_text(json.dumps(config))
    gguf = write_dflash_gguf(fitted, tmp_path / "fitted.gguf", mix="F32").path
    assert field(gguf, "dflash.embedding_input_scale") == pytest.approx(scale)
    draft = open_draft(gguf)
    assert draft.config.embedding_input_scale == pytest.approx(scale) and draft.config.input_embedding_scale == 1.0
    assert _rt(_ir(draft))["dflash/embedding_input"] == SCALED


def test_a_gguf_of_a_draft_without_a_scale_records_nothing_more(tmp_path):
    from gguf import GGUFReader

    from gguf2ov.tools.gguf_writer import write_dflash_gguf

    path = write_dflash_gguf(_dir("tiny-dflash") / "draft-ref", tmp_path / "plain.gguf", mix="F32").path
    assert not {"dflash.embedding_scale", "dflash.embedding_input_scale"} & set(GGUFReader(path).fields)


@pytest.mark.parametrize("value", [0.0, -1.0, float("nan")])
def test_an_input_scale_that_is_no_positive_number_is_refused(value):
    from gguf2ov.draft.config import draft_config
    from gguf2ov.errors import Gguf2ovError

    config = _json(NAME, "draft-ref/config.json")
    config["dflash_config"]["embedding_input_scale"] = value
    with pytest.raises(Gguf2ovError, match="embedding_input_scale"):
        draft_config(config, "config.json")
    assert np.isfinite(draft_config(_json(NAME, "draft-ref/config.json"), "x").embedding_input_scale)
