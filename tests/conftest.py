"""The test session's set-up: no network, the fixtures, and the helper modules importable by name.

The tests mirror the package: one folder per wing and layer (gguf/, maps/, hf/, ir/, draft/,
target/, runtime/, checks/, stages/, cli/, tools/), the job, the whole runs and what cuts across
them at the top. The helper modules (dflash_builders, target_builders, ggufs, opened, ...) stay
here, and this folder is put on sys.path so that a test in any folder imports them by name.
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
FIXTURES = REPO / "fixtures" / "tiny-dflash"


@pytest.fixture(scope="session")
def fixtures_dir() -> Path:
    if not FIXTURES.exists():
        pytest.fail(f"fixtures missing at {FIXTURES}: run python fixtures/make_fixtures.py")
    return FIXTURES
