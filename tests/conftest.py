"""The test session's set-up: no network, the fixtures, and the helper modules importable by name.

The tests mirror the package: one folder per wing and layer (gguf/, maps/, hf/, ir/, draft/,
target/, runtime/, checks/, stages/, cli/, tools/), the job, the whole runs and what cuts across
them at the top. The helper modules (dflash_builders, target_builders, ggufs, opened, ...) stay
here, and this folder is put on sys.path so that a test in any folder imports them by name; the
repository is too (at the end, shadowing nothing), so that a test imports a benchmark script as
`python -m benchmarks.NAME` runs it (benchmark_scripts.benchmark).
"""

import os
import sys

# No network at test time: anything that tries a hub fails fast instead of hanging.
os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from pathlib import Path  # noqa: E402

import pytest  # noqa: E402

TESTS = Path(__file__).resolve().parent
REPO = TESTS.parent
if str(TESTS) not in sys.path:
    sys.path.insert(0, str(TESTS))
if str(REPO) not in sys.path:
    sys.path.append(str(REPO))
FIXTURES = REPO / "fixtures" / "tiny-dflash"


@pytest.fixture(scope="session")
def fixtures_dir() -> Path:
    if not FIXTURES.exists():
        pytest.fail(f"fixtures missing at {FIXTURES}: run python fixtures/make_fixtures.py")
    return FIXTURES


# --- built once per session: what tests in several folders start from ------------------------------
# Each goes through dflash_builders.once, the session memo the helper modules use too.

@pytest.fixture(scope="session")
def fixture_draft_as(fixtures_dir, tmp_path_factory):
    """The fixture draft (draft-Q4_K_M.gguf) exported and verified as a variant, once per session and
    variant: `fixture_draft_as("gguf")` is the stages.export.ExportResult (its folder: `out_dir`)."""
    import dflash_builders as b

    from gguf2ov.ir.variants import parse_variant
    from gguf2ov.job import Job, Options

    def export(variant: str):
        name = f"fixture-draft-{variant}"
        b.once(name, tmp_path_factory, lambda path: Job.of(fixtures_dir / "draft-Q4_K_M.gguf", None, Options(
            progress=False)).export(path / "draft", parse_variant(variant)))
        return b.made(name)

    return export


@pytest.fixture(scope="session")
def fixture_draft(fixture_draft_as) -> Path:
    """The folder of the fixture draft exported in fp32, as `gguf2ov export` writes it by default."""
    return Path(fixture_draft_as("fp32").out_dir)


@pytest.fixture(scope="session")
def heavy_widening(fixtures_dir, tmp_path_factory):
    """The fixture target widened with `gguf2ov widen-target`'s defaults into a 31M-parameter target
    that computes the same function, heavy enough on a CPU for the draft to pay off: the demo's
    target (tools.widen.WidenResult; the folder: `heavy_target`)."""
    import dflash_builders as b

    from gguf2ov.cli.widen import widen_target

    b.once("heavy-target", tmp_path_factory,
           lambda path: widen_target(fixtures_dir / "target-hf", path / "target", progress=False))
    return b.made("heavy-target")


@pytest.fixture(scope="session")
def heavy_target(heavy_widening) -> Path:
    return Path(heavy_widening.out_dir)


@pytest.fixture(scope="session")
def optimum_target(tmp_path_factory):
    """The fixture target as optimum-cli exports it in a format (a label of optimum_targets.FORMATS),
    each made once per session: `optimum_target("int4")`; `widened=True`: the widened fixture target
    (optimum_targets.widened_hf), heavy enough for the draft to pay off."""
    import optimum_targets as ot

    def export(label: str, widened: bool = False) -> Path:
        if widened:
            return ot.optimum_target(tmp_path_factory, label, ot.widened_hf(tmp_path_factory), name="widened")
        return ot.optimum_target(tmp_path_factory, label)

    return export


@pytest.fixture(scope="session")
def q4_k_m(fixtures_dir, tmp_path_factory) -> Path:
    """A Q4_K_M GGUF of the fixture target (the writer's mix: Q4_K and Q6_K), with its vocabulary."""
    import dflash_builders as b

    from gguf2ov.tools.gguf_writer import write_gguf

    return b.once("target-q4-k-m", tmp_path_factory, lambda path: write_gguf(
        fixtures_dir / "target-hf", path / "target-Q4_K_M.gguf", "qwen3", tokenizer_dir=fixtures_dir / "target-hf",
        mix="Q4_K_M")) / "target-Q4_K_M.gguf"
