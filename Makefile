# The two set-up commands of the README. Both create .venv first (scripts/install.sh, idempotent).
FIX := fixtures/tiny-dflash
OUT ?= out/demo
PYTEST_ARGS ?=

.PHONY: demo test install fixtures bench

install:
	bash scripts/install.sh

# The main job on the committed fixtures: convert, check, export, verify, requantize, drift,
# acceptance runs, report.
demo: install
	.venv/bin/gguf2ov run $(FIX)/draft-Q4_K_M.gguf --target $(FIX)/target \
	    --reference $(FIX)/draft-ref -o $(OUT) --overwrite

test: install
	HF_HUB_OFFLINE=1 .venv/bin/python -m pytest -q $(PYTEST_ARGS)

fixtures: install
	.venv/bin/python fixtures/make_fixtures.py

bench: install
	.venv/bin/python benchmarks/bench_dequant.py
