"""The report layer: every result a command shows renders as text, JSON and Markdown.

Results come from real runs on the committed fixtures where that is cheap (inspect, convert, check,
export with its verify, drift), and are built from their dataclasses where a run is slow (accept,
run, widen-target, the tap scan and the offset it settles, the DFlash 2 selector).
"""

import json
import math

import pytest

from gguf2ov.job import Job, Options
from gguf2ov.report import Table, fmt_cell, render, to_jsonable
from gguf2ov.stages.accept import AcceptResult, PromptAcceptance


def _no_constant(name):
    raise ValueError(f"{name} in JSON")  # NaN / Infinity are not JSON


def three_forms(result, title: str = "a report"):
    """Render `result` three ways; check what every form must hold and return them."""
    text = render(result, "text", title=title)
    raw = render(result, "json")
    data = json.loads(raw, parse_constant=_no_constant)
    assert data == to_jsonable(result)
    md = render(result, "markdown", title=title)
    assert text.startswith(title) and md.startswith(f"## {title}")
    for table in result.tables():
        assert table.title in text
        assert f"### {table.title}" in md
        assert "| " + " | ".join(table.headers) + " |\n|" + "---|" * len(table.headers) in md
        assert all(h in text for h in table.headers)
    for line in result.summary():
        assert line in text and f"- {line}" in md
    return text, data, md


def in_all(figure: str, text: str, md: str) -> None:
    assert figure in text and figure in md, figure


# --- real runs ---------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def gguf(fixtures_dir):
    return fixtures_dir / "draft-Q4_K_M.gguf"


def test_inspect_result(gguf):
    from gguf2ov.stages.inspect import inspect

    text, data, md = three_forms(inspect(gguf))
    fc = next(t for t in data["tensors"] if t["gguf_name"] == "fc.weight")
    assert fc["n_bytes"] == 73728 and fc["hf_name"] == "fc.weight" and data["type_counts"]["Q4_K"] == 13
    assert "fc.weight                 Q4_K  [512, 256]   [256, 512]        73728  fc.weight" in text
    assert "| fc.weight | Q4_K | [512, 256] | [256, 512] | 73728 | fc.weight |" in md
    in_all("25 tensors", text, md)


def test_convert_result(gguf, tmp_path):

    result = Job.of(gguf, None, Options(progress=False)).convert(tmp_path / "hf")
    text, data, md = three_forms(result)
    assert data["n_tensors"] == 25 and data["target_layer_ids_written"] == [1, 2] and data["dtype"] == "bf16"
    in_all("written dflash_config.target_layer_ids = [1, 2]", text, md)
    assert "| layers.1.mlp.down_proj.weight | blk.1.ffn_down.weight | Q6_K |" in md


@pytest.fixture(scope="module")
def check_result(gguf, fixtures_dir):
    from opened import check

    return check(gguf, fixtures_dir / "draft-ref", progress=False)


def test_check_result_in_full_and_as_the_terminal_shows_it(check_result):
    from gguf2ov.stages.check import TerminalView

    text, data, md = three_forms(check_result)
    assert data["passed"] is True and len(data["tensors"]) == 25
    worst = check_result.worst_first()[0]
    pearson = fmt_cell(worst.pearson)
    assert data["tensors"][[t["name"] for t in data["tensors"]].index(worst.name)]["pearson"] == pytest.approx(worst.pearson)
    assert f"| {worst.name} |" in md and pearson in md and pearson in text
    in_all(f"PASS: 25 tensors correlate >= {check_result.min_corr}", text, md)
    # every tensor in the full report, the worst 20 on the terminal
    assert all(f"| {t.name} |" in md for t in check_result.tensors)
    terminal = render(TerminalView(check_result), "text")
    assert "... 5 more (the JSON and Markdown reports list every tensor)" in terminal
    assert "| Q6_K | 2 | 2 |" in md
    assert any(line.split()[:3] == ["Q6_K", "2", "2"] for line in text.splitlines())


@pytest.fixture(scope="module")
def export_result(fixture_draft_as):
    return fixture_draft_as("fp32")  # Job.of(gguf).export(...), made once per session (tests/conftest.py)


@pytest.mark.slow
def test_export_result(export_result):
    text, data, md = three_forms(export_result)
    assert data["rt_info"]["dflash/target_layer_ids"] == "1,2" and data["state_variables"] == 4
    assert data["verify"]["ok"] is True  # the nested verify result reaches the JSON
    assert "| dflash/target_layer_ids | 1,2 |" in md
    assert any(line.split() == ["dflash/target_layer_ids", "1,2"] for line in text.splitlines())
    assert any(line.split() == ["dflash/embedding_input", "as_fed"] for line in text.splitlines())
    in_all("verify PASS", text, md)


@pytest.mark.slow
def test_verify_result(export_result):
    result = export_result.verify
    text, data, md = three_forms(result)
    assert data["ok"] is True and data["figures"]["rows"] == data["figures"]["block"] - 1
    block_rows = result.finding("block-rows")
    assert {"name": "block-rows", "group": "behaviour", "status": "pass", "reason": block_rows.reason} in data["checks"]
    assert f"| behaviour | block-rows | pass | {block_rows.reason} |" in md
    assert block_rows.reason in text


@pytest.mark.slow
def test_drift_result(gguf, tmp_path):

    result = Job.of(gguf, None, Options(progress=False)).drift(tmp_path / "variants", variants=["fp32", "int8"])
    text, data, md = three_forms(result)
    int8 = next(v for v in data["variants"] if v["name"] == "int8")
    assert int8["verified"] is True and 0 < int8["rel_err"] < 0.05
    shown = f"{100 * int8['rel_err']:.3f}%"
    in_all(shown, text, md)
    assert "\n| int8 | " in md and "\n| fp32 | " in md
    in_all("2 variants under", text, md)


# --- built from their dataclasses --------------------------------------------------------------------

def _acceptance(**changes) -> PromptAcceptance:
    base = dict(prompt=None, identical=True, generated_tokens=100, accepted_tokens=80, draft_candidates=90,
                target_steps=20, acceptance_rate=80 / 90, accepted_share=0.8, mean_acceptance_length=5.0,
                tok_s_target=100.0, tok_s_draft=250.0, speedup=2.5)
    return PromptAcceptance(**{**base, **changes})


def _accept_result(verdict="PASS", reasons=()) -> AcceptResult:
    p = _acceptance(prompt="The red fox")
    return AcceptResult("target", "draft", "CPU", "f32", 100, 7, 1, (p,), _acceptance(), verdict, tuple(reasons),
                        (0.9, 0.8, float("nan")))


def test_accept_result():
    text, data, md = three_forms(_accept_result())
    assert data["verdict"] == "PASS" and data["speedup"] == 2.5 and data["accepted_tokens"] == 80
    assert data["per_position_acceptance"] == [0.9, 0.8, None]  # NaN: null in JSON
    assert "| 3 | never proposed |" in md
    assert "| all | yes | 100 | 80 | 90 | 20 | 0.8889 | 0.8000 | 5.0000 | 100.00 | 250.00 | 2.5000 |" in md
    in_all("speedup 2.50x", text, md)


def test_accept_result_gives_each_reason_a_line():
    result = _accept_result("SLOW", ["proposals are accepted but generation is 0.36x the target alone"])
    text, data, md = three_forms(result)
    assert "verdict: SLOW\nreason: proposals are accepted" in text and "\\n" not in text
    assert "- reason: proposals are accepted" in md and data["reasons"] == list(result.reasons)


def test_run_result():
    from gguf2ov.run import RunResult, StageOutcome

    stages = [StageOutcome("convert", "pass", 1.5, "25 tensors", 3 << 20), StageOutcome("check", "skip", 0.0, "no --reference"),
              StageOutcome("accept:fp32", "pass", 3.0, "PASS", 5 << 30)]
    result = RunResult("draft.gguf", "target", "out", "PASS", stages, {"accept:fp32": _accept_result()})
    text, data, md = three_forms(result, "gguf2ov run")
    assert [s["status"] for s in data["stages"]] == ["pass", "skip", "pass"]
    assert data["results"]["accept:fp32"]["speedup"] == 2.5  # a stage's result, with its flat view
    assert "| convert | PASS | 1.5 s | 3.0 MiB | 25 tensors |" in md and "| accept:fp32 | PASS | 3.0 s | 5.0 GiB |" in md
    assert data["stages"][2]["peak_rss"] == 5 << 30
    assert "| fp32 | PASS | yes | 80/100 |" in md
    in_all("verdict: PASS", text, md)


def test_widen_result():
    from gguf2ov.tools.widen import WidenResult

    result = WidenResult("wide", "target-hf", (4, 6), (512, 768), (1_000_000, 1_500_000),
                         {"logits": 2.5e-6, "final norm": 1.25e-5}, 4, {"f32": 40},
                         {"openvino_model.bin": 6_000_000}, 3.5)
    text, data, md = three_forms(result)
    assert data["layers"] == [4, 6] and data["max_abs_diff"]["final norm"] == 1.25e-5
    assert "| decoder layers | 4 | 6 |" in md and "| final norm | 1.250e-05 |" in md
    assert "1.250e-05" in text
    in_all("max |diff| 1.25e-05", text, md)


def _tap_scan(verdict="fits"):
    from gguf2ov.checks.taps import TapScan, TapSet

    sets = [TapSet("configured", [1, 2], 0, -2.5, 0.625, 3.5, [0.75, 0.5], 0.5, 0.875),
            TapSet("shift -1", [0, 1], -1, -4.0, 0.25, 1.0, [0.25, 0.25], 0.125, 0.125)]
    return TapScan("draft", "target", [1, 2], sets, "configured", [1, 2], 0, 0.375, 0.0, verdict, 16, 7, 2, 1.5)


@pytest.mark.slow
def test_target_result(fixtures_dir, tmp_path):
    from opened import build_target

    result = build_target(fixtures_dir / "target-hf", tmp_path / "t", progress=False)
    text, data, md = three_forms(result)
    assert data["locators"]["0"] == "__module.model.layers.0/aten::add/Add_1"
    assert "| runtime_options/KV_CACHE_PRECISION | f16 |" in md
    in_all("target checks: 8/8 pass", text, md)


def test_tap_scan():
    scan = _tap_scan()
    text, data, md = three_forms(scan)
    assert data["verdict"] == "fits" and data["sets"][0]["top1"] == 0.625
    assert "| configured | [1, 2] | - | 0.8750 | -2.5000 | 0.6250 | 3.5000 | 0.7500 | 0.5000 |" in md
    in_all("configured ids [1, 2] fit best", text, md)


def test_offset_decision():
    from gguf2ov.checks.taps import OffsetDecision

    decision = OffsetDecision("draft.gguf", [2, 3], ["dflash.target_layers may be either layout"],
                              {-1: [1, 2], 0: [2, 3]}, {}, -1, [1, 2], _tap_scan())
    text, data, md = three_forms(decision)
    assert data["offset"] == -1 and data["choices"] == {"-1": [1, 2], "0": [2, 3]}
    assert "### Target layer offset, measured" in md and "| offset -1 | [1, 2] |" in md
    in_all("chosen: --target-layer-offset -1 -> target_layer_ids [1, 2]", text, md)


def test_drift_result_with_the_dflash2_selector():
    from gguf2ov.checks.selector import SelectorGain
    from gguf2ov.stages.drift import DriftResult, VariantDrift

    v = VariantDrift("int4_sym_g16", "out/int4_sym_g16", 1_500_000, 0.0625, 0.998, None, None, 0.875, 0.01, 0.99,
                     True, [])
    gain = SelectorGain(blocks=8, proposals=3, top_k=4, top1_accepted=1.5, selector_accepted=2.25,
                        top1_by_position=[0.75, 0.5, 0.25], selector_by_position=[0.875, 0.75, 0.625])
    result = DriftResult("draft.gguf", "out", "target", 8, 24, [v], None, 2.0, {}, gain)
    text, data, md = three_forms(result)
    assert data["selector"]["selector_accepted"] == 2.25 and data["variants"][0]["top1_agreement"] == 0.875
    assert "### DFlash 2 selector, offline" in md and "| selector path | 2.2500 | 0.8750 | 0.7500 | 0.6250 |" in md
    in_all("6.250%", text, md)  # rel err
    in_all("2.25 accepted tokens per block against 1.50", text, md)


# --- the formats themselves --------------------------------------------------------------------------

def test_cells_from_untrusted_files_stay_on_one_line_and_in_their_column():
    from dataclasses import dataclass

    @dataclass
    class Result:
        name: str
        value: float

        def tables(self):
            return [Table("Values", ["name", "value"], [[self.name, self.value]])]

        def summary(self):
            return [f"{self.name}: {self.value}"]

    result = Result("a|b\nfake: line", math.inf)
    md = render(result, "markdown")
    assert "| a\\|b\\nfake: line | inf |" in md
    assert "\nfake: line" not in render(result, "text")
    assert json.loads(render(result, "json"), parse_constant=_no_constant) == {"name": "a|b\nfake: line",
                                                                                 "value": None}
