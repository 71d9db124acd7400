# The two set-up commands of the README. Both create .venv first (scripts/install.sh, idempotent):
# the demo with the core alone, the tests with everything.
FIX := fixtures/tiny-dflash
OUT ?= out/demo
PYTEST_ARGS ?=

.PHONY: demo test test-fast install install-core fixtures bench

# Everything: the core, the CPU build of PyTorch, optimum and optimum-intel (tests, fixtures).
install:
	bash scripts/install.sh

# The core alone, no PyTorch: all the demo needs. A .venv that has everything keeps it.
install-core:
	bash scripts/install.sh --core

# The main job on the committed fixtures: convert, check, export, verify, requantize, drift,
# acceptance runs, report.
# The fixture target is too light for speculation to pay off on a CPU: the demo widens it into a
# 31M-parameter target that computes the same function (seconds, in NumPy and OpenVINO), so the
# draft still applies.
demo: install-core
	.venv/bin/gguf2ov widen-target $(FIX)/target-hf -o out/heavy-target --overwrite --quiet
	.venv/bin/gguf2ov run $(FIX)/draft-Q4_K_M.gguf --target out/heavy-target \
	    --reference $(FIX)/draft-ref --prompts $(FIX)/prompts.txt -o $(OUT) --overwrite

# The tests not marked slow run on two workers (pytest-xdist: one a core here), the slow ones (GenAI runs, whose
# speed figures a second worker would disturb) one at a time after them.
test: install
	HF_HUB_OFFLINE=1 .venv/bin/python -m pytest -q -n 2 -m "not slow" $(PYTEST_ARGS)
	HF_HUB_OFFLINE=1 .venv/bin/python -m pytest -q -m slow $(PYTEST_ARGS)

# The edit loop: every test not marked slow (no GenAI run, whole job or real file). CI runs `test`.
test-fast: install
	HF_HUB_OFFLINE=1 .venv/bin/python -m pytest -q -n 2 -m "not slow" $(PYTEST_ARGS)

# The DFlash 2 fixture is trained against the v1 fixture's target, so it is rebuilt after it.
fixtures: install
	.venv/bin/python fixtures/make_fixtures.py
	.venv/bin/python fixtures/make_fixtures.py --dflash2

bench: install
	.venv/bin/python -m benchmarks.bench_dequant
