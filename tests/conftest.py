import os

# No network at test time: anything that tries a hub fails fast instead of hanging.
os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from pathlib import Path  # noqa: E402

import pytest  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
FIXTURES = REPO / "fixtures" / "tiny-dflash"


@pytest.fixture(scope="session")
def fixtures_dir() -> Path:
    if not FIXTURES.exists():
        pytest.fail(f"fixtures missing at {FIXTURES}: run python fixtures/make_fixtures.py")
    return FIXTURES


@pytest.fixture(scope="session")
def fixture_draft_ir(tmp_path_factory, fixtures_dir) -> Path:
    """The fixture draft GGUF exported as fp32 (`gguf2ov export`), once per session."""
    from gguf2ov.job import Job, Options

    out = tmp_path_factory.mktemp("fixture-draft") / "tiny-dflash"
    Job.of(fixtures_dir / "draft-Q4_K_M.gguf", None, Options(progress=False)).export(out)
    return out
