"""Acceptance of each draft head form on the fixture pairs: what the draft's own embedding and lm_head
cost in proposals accepted, against GenAI's graft of the target's.

For every fixture pair the draft GGUF is exported as `gguf` with each `--draft-head` form (graft: the
plain draft; stored; int8; int4 at group 16, 32 and 128 where the hidden size allows) and run on the
target in GenAI against one target-alone baseline (`gguf2ov accept`'s run: 5 prompts x 100 tokens,
K = 7, f32): identical text, tokens accepted and drafted. The pairs:

    tiny-dflash    fixtures/tiny-dflash/target (optimum's int8 export) and its draft
    tiny-dflash2   the same target and the DFlash 2 draft
    tiny-hybrid    the target `gguf2ov target` builds from fixtures/tiny-hybrid/target-Q4_K_M.gguf, its draft
    tiny-moe       likewise for fixtures/tiny-moe
    tiny-vlm       fixtures/tiny-vlm/target (VLMPipeline: only the head is the draft's own) and its draft

`--vocab-experiment` adds drafts whose own int4 head scores only the N tokens most frequent in the
fixture corpus (fixtures/tiny-dflash/corpus-sample.txt, tokenized by the target), scattered back into
the full vocabulary with -inf elsewhere (EAGLE-3's and llama.cpp's `d2t`): what a reduced head costs
in acceptance. Results: results/draft-head.json and .md.

    python -m benchmarks.bench_draft_head [--pairs tiny-dflash,tiny-vlm] [--forms graft,stored,int4_asym_g32]
                                          [--vocab-experiment]
"""

import argparse
import json
import shutil
import sys
from datetime import datetime, timezone
from pathlib import Path

import numpy as np

from benchmarks.common import REPO, RESULTS

FIXTURES = REPO / "fixtures"
WORK = RESULTS / "draft-head-work"
FORMS = ("graft", "stored", "int8", "int4_asym_g16", "int4_asym_g32", "int4_asym_g128", "int4_sym_g32", "int4_sym_g128")
VOCAB_SHARES = (0.5, 0.25)


def pairs() -> dict:
    """name -> (target folder, draft GGUF, prompts file)."""
    return {
        "tiny-dflash": (FIXTURES / "tiny-dflash" / "target", FIXTURES / "tiny-dflash" / "draft-Q4_K_M.gguf",
                        FIXTURES / "tiny-dflash" / "prompts.txt"),
        "tiny-dflash2": (FIXTURES / "tiny-dflash" / "target", FIXTURES / "tiny-dflash2" / "draft-Q4_K_M.gguf",
                         FIXTURES / "tiny-dflash2" / "prompts.txt"),
        "tiny-hybrid": (built_target("tiny-hybrid"), FIXTURES / "tiny-hybrid" / "draft-Q4_K_M.gguf",
                        FIXTURES / "tiny-hybrid" / "prompts.txt"),
        "tiny-moe": (built_target("tiny-moe"), FIXTURES / "tiny-moe" / "draft-Q4_K_M.gguf",
                     FIXTURES / "tiny-moe" / "prompts.txt"),
        "tiny-vlm": (FIXTURES / "tiny-vlm" / "target", FIXTURES / "tiny-vlm" / "draft-Q4_K_M.gguf",
                     FIXTURES / "tiny-vlm" / "prompts.txt"),
    }


def built_target(fixture: str) -> Path:
    """The target `gguf2ov target` builds from the fixture's Q4_K_M GGUF (the file's grid), once."""
    from gguf2ov.job import Job, Options
    from gguf2ov.sources import model_source
    from gguf2ov.cli import args as a

    out = WORK / f"{fixture}-target"
    if not (out / "openvino_model.xml").is_file():
        shutil.rmtree(out, ignore_errors=True)
        build = a.target_build(tokenizer_dir=FIXTURES / fixture / "target")
        Job(target_spec=build(model_source(FIXTURES / fixture / "target-Q4_K_M.gguf", "target")),
            options=Options(progress=False)).build_target(out)
    return out


def export(draft: Path, target: Path, head: str, out: Path) -> Path:
    from gguf2ov.ir.variants import parse_variant
    from gguf2ov.job import Job, Options

    if not (out / "openvino_model.xml").is_file():
        Job.of(draft, target, Options(progress=False, draft_head=head)).export(out, parse_variant("gguf"), overwrite=True)
    return out


def reduced_head(draft_dir: Path, target, ids: np.ndarray, out: Path) -> Path:
    """A copy of the own-int4-head draft whose head scores only `ids`, scattered into the full vocabulary."""
    import openvino as ov
    from openvino import opset13 as ops

    from gguf2ov.draft.head import own_pieces
    from gguf2ov.ir.irweights import evaluate
    from gguf2ov.ir.nncf_weights import WeightSpec, compress_weight

    shutil.rmtree(out, ignore_errors=True)
    shutil.copytree(draft_dir, out)
    model = ov.Core().read_model(str(draft_dir / "openvino_model.xml"))
    head = own_pieces(model).head
    rows = evaluate(target.head.input_value(1))[ids]
    weight = compress_weight(rows, WeightSpec("int4_asym", 32), "self.lm_head.weight")
    small = ops.matmul(head.input_value(0), weight, False, True)  # [B, T, N]
    rows_shape = ops.slice(ops.shape_of(small, "i64"), ops.constant(np.array([0])), ops.constant(np.array([2])),
                           ops.constant(np.array([1])))
    shape = ops.concat([rows_shape, ops.constant(np.array([target.vocab_size]))], 0)
    full = ops.broadcast(ops.constant(np.float32(-np.inf)), shape)
    scattered = ops.scatter_update(full, ops.constant(ids.astype(np.int64)), small, ops.constant(np.int64(2)))
    for target_input in list(head.output(0).get_target_inputs()):
        target_input.replace_source_output(scattered.output(0))
    ov.save_model(model, str(out / "openvino_model.xml"), compress_to_fp16=False)
    return out


def corpus_ids(target) -> np.ndarray:
    """Token ids of the fixture corpus, most frequent first (ties by id)."""
    text = (FIXTURES / "tiny-dflash" / "corpus-sample.txt").read_text()
    tokens = np.concatenate([target.tokenize(line) for line in text.splitlines() if line.strip()])
    counts = np.bincount(tokens, minlength=target.vocab_size)
    return np.lexsort((np.arange(len(counts)), -counts))


def measure(name: str, forms: tuple, vocab_experiment: bool, say=print) -> dict:
    from gguf2ov.runtime.genai import GenerationSettings, read_prompts
    from gguf2ov.runtime.target import TargetIR
    from gguf2ov.stages.accept import run_acceptance, target_alone

    target_dir, draft, prompts_file = pairs()[name]
    prompts = read_prompts(prompts_file)
    settings = GenerationSettings()
    target = TargetIR.open(target_dir)
    baseline = target_alone(target, prompts, settings, progress=False)
    rows = {}
    forms = [f for f in forms if not (f.endswith("g128") and target.hidden_size < 128)]
    drafts = {form: export(draft, target_dir, form, WORK / name / form) for form in forms}
    if vocab_experiment and target.kind != "vlm":
        order = corpus_ids(target)
        for share in VOCAB_SHARES:
            keep = np.sort(order[:int(share * target.vocab_size)])
            drafts[f"int4_asym_g32, top {len(keep)} tokens"] = reduced_head(drafts["int4_asym_g32"], target, keep,
                                                                             WORK / name / f"top{len(keep)}")
    for form, folder in drafts.items():
        r = run_acceptance(target, folder, prompts, settings, baseline=baseline, progress=False)
        o = r.overall
        rows[form] = {"identical": o.identical,
                      "accepted": o.accepted_tokens, "generated": o.generated_tokens, "drafted": o.draft_candidates,
                      "accepted_per_drafted": round(o.acceptance_rate, 4), "pipeline": r.pipeline,
                      "draft_bytes": sum(p.stat().st_size for p in folder.glob("openvino_model.*"))}
        say(f"[bench] {name} {form}: {rows[form]}")
    graft = rows["graft"]["accepted_per_drafted"]
    for row in rows.values():
        row["drop_of_drafted"] = round(graft - row["accepted_per_drafted"], 4)
    return {"target": str(target_dir), "draft": str(draft), "prompts": len(prompts), "forms": rows}


def markdown(report: dict) -> str:
    lines = ["# Draft head forms on the fixture pairs", "",
             "`gguf2ov accept`'s run (5 prompts x 100 new tokens, K = 7, f32) of the fixture draft exported as `gguf` "
             "with each `--draft-head`, against one target-alone baseline. drop: accepted/drafted of the graft minus "
             "the form's.", "",
             "| pair | head | identical | accepted/generated | accepted/drafted | drop | draft IR |",
             "|---|---|---|---|---|---|---|"]
    for name, r in report["pairs"].items():
        for form, row in r["forms"].items():
            lines.append(f"| {name} | {form} | {'yes' if row['identical'] else 'NO'} | "
                         f"{row['accepted']}/{row['generated']} | {row['accepted_per_drafted']:.4f} | "
                         f"{row['drop_of_drafted']:+.4f} | {row['draft_bytes'] / 2**20:.2f} MiB |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--pairs", help="comma-separated (default: every fixture pair)")
    p.add_argument("--forms", default=",".join(FORMS), help="comma-separated `--draft-head` forms (default: all; "
                   "graft first, the one the others are compared with)")
    p.add_argument("--vocab-experiment", action="store_true")
    args = p.parse_args(argv)
    names = args.pairs.split(",") if args.pairs else ["tiny-dflash", "tiny-dflash2", "tiny-hybrid", "tiny-moe", "tiny-vlm"]
    path = RESULTS / "draft-head.json"
    report = json.loads(path.read_text()) if path.is_file() else {"pairs": {}}
    say = lambda s: print(s, file=sys.stderr, flush=True)  # noqa: E731
    for name in names:
        report["pairs"][name] = measure(name, tuple(args.forms.split(",")), args.vocab_experiment, say) | {
            "measured": datetime.now(timezone.utc).isoformat(timespec="seconds")}
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(report, indent=2) + "\n")
        (RESULTS / "draft-head.md").write_text(markdown(report))
    print(markdown(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
