"""How far a target's forms are from the GGUF file's exact grid: weights, logits over held-out text, and
the greedy text of the fixture prompts.

    python -m benchmarks.target_fidelity TARGET.gguf --targets split=DIR,folded=DIR,int4=DIR
        [--reference folded] [--text FILE] [--prompts FILE] [--json FILE]

For each target folder:
- weights: every Linear's and the embedding's weight as the IR computes it (`ir_weights`: a split
  weight's offset added back), against the file's dequantized tensor: the largest |change| in units of
  its group's step, the scale its codes count in (`quants.step_changes`: d*sc per 32 for Q4_K/Q5_K,
  per 16 for Q6_K), over every weight of every tensor. The issue's bound for a default form is 1e-3;
- logits: teacher-forced over held-out text (the fixture corpus' templates drawn with another seed,
  and English prose the fixture never saw), in sequences of `--length` tokens, against the reference
  form (`--reference`) compiled in exact arithmetic (`EXACT`: f32, no dynamic quantization, f32 KV
  cache): mean and largest KL(reference || form) per token in nats, and the share of tokens whose
  top-1 agrees; each form compiled three ways: `exact`, `f32` (the f32 hint, as acceptance runs; the
  plugin's dynamic quantization and KV cache as the model's runtime options and the CPU set them) and
  `defaults` (no properties: what GenAI's users run; bf16 on a CPU with AVX512_BF16 or AMX);
- greedy text: LLMPipeline, 100 new tokens per fixture prompt, with the f32 hint and with no properties,
  against the reference form's in exact arithmetic: identical on how many prompts.

    python -m benchmarks.target_fidelity --fixtures all [--json FILE]

builds the forms of each fixture family's target GGUF itself (`FIXTURES`: the plain fixture target as the
project's writer makes it Q4_K_M, the hybrid, mixture-of-experts, gpt-oss and Gemma 4 fixtures' llama.cpp
files) and states them against its folded grid on its own prompts: `int4` (the lean form, as `gguf2ov target
--weight-format int4` builds it), `int4-all` (`--all-layers`: the table and the head in int4 too) and, for
the hybrid, `int4-gdn` (its Gated DeltaNet projections in int4 too, which the lean form keeps in int8).
Every weight the file stores block-quantized is measured, experts included (MXFP4's step: its E8M0 scale
halved, the unit of ggml's doubled E2M1 values).
"""

import argparse
import json
import random
import sys
from pathlib import Path

import numpy as np

from benchmarks.common import REPO, short_commit

PROSE = ("The history of the printing press begins in the middle of the fifteenth century, when a goldsmith "
         "combined movable metal type, an oil-based ink and a screw press. Within a few decades printing "
         "shops had spread to most of the large towns of Europe, and the price of books fell so far that "
         "ordinary people could own them. Water boils at a lower temperature on a mountain because the air "
         "pressure there is lower, so the molecules of water need less energy to escape into the air.")
MODES = {"exact": None, "f32": {"INFERENCE_PRECISION_HINT": "f32"}, "defaults": {}}  # None: EXACT


def held_out_text(paragraphs: int = 120, seed: int = 20261202) -> str:
    """The fixture corpus' generator with another seed (its own is fixture_training.SEED), then prose."""
    from fixtures.fixture_training import paragraph

    rng = random.Random(seed)
    return "\n".join(paragraph(rng) for _ in range(paragraphs)) + "\n" + PROSE + "\n"


def weight_changes(gguf: Path, target: Path) -> dict:
    """{tensor: largest |IR weight - dequantized| in steps of its group}, each tensor the file stores
    block-quantized (every Linear, the table, and the experts of a mixture; a tied head is the table)."""
    from gguf2ov.gguf.quants import step_changes
    from gguf2ov.ir.irweights import ir_weights
    from gguf2ov.ir.variants import parse_variant
    from gguf2ov.job import Job
    from gguf2ov.sources import TargetBuild, model_source

    source = Job(target_spec=TargetBuild(model_source(gguf, "target"), parse_variant("fp32"))).target_source
    out = {}
    for name, values in (ir_weights(target) | expert_weights(target, source.expected)).items():
        stored = source.quantized(name) if name in source.expected else None
        if stored is None and name == "lm_head.weight":
            stored = source.quantized("model.embed_tokens.weight")
        if stored is not None and stored[1].name not in ("F32", "F16", "BF16"):
            raw, qtype = stored
            out[name] = float(step_changes(values, raw() if callable(raw) else raw, qtype).max())
    return out


def expert_weights(target: Path, names) -> dict:
    """{tensor: float32 [E, N, K]} of the batched MatMuls' weights (a mixture's experts), named by the constant
    each form stores them in (`self.` + the source's tensor name), evaluated as the IR computes them."""
    from gguf2ov.ir.irweights import evaluate, read_model, weight_param_name

    out = {}
    for op in read_model(Path(target)).get_ordered_ops():
        if op.get_type_name() != "MatMul" or weight_param_name(op) is not None:
            continue
        stack, seen, found = [op.input_value(1).get_node()], set(), None
        while stack and found is None:
            node = stack.pop()
            if node.get_name() in seen or node.get_type_name() in ("Parameter", "ReadValue"):
                continue
            seen.add(node.get_name())
            name = node.get_friendly_name().removeprefix("self.")
            found = name if node.get_type_name() == "Constant" and name in names else None
            stack.extend(v.get_node() for v in node.input_values())
        if found is not None and op.input_value(1).get_partial_shape().rank.get_length() == 3:
            out[found] = evaluate(op.input_value(1))
    return out


def logits(target: Path, ids: list[np.ndarray], properties: dict) -> list[np.ndarray]:
    """Teacher-forced logits of each sequence (a fresh state each)."""
    import openvino as ov

    request = ov.Core().compile_model(str(target / "openvino_model.xml"), "CPU", properties).create_infer_request()
    out = []
    for seq in ids:
        request.reset_state()
        n = len(seq)
        request.infer({"input_ids": seq[None], "attention_mask": np.ones((1, n), np.int64),
                       "position_ids": np.arange(n, dtype=np.int64)[None], "beam_idx": np.zeros(1, np.int32)})
        out.append(request.get_tensor("logits").data[0].astype(np.float64).copy())
    return out


def kld(reference: list, candidate: list) -> dict:
    from gguf2ov.checks.selector import log_softmax

    per_token, agree = [], 0
    for p, q in zip(reference, candidate):
        lp, lq = log_softmax(p), log_softmax(q)
        per_token.extend((np.exp(lp) * (lp - lq)).sum(-1).tolist())
        agree += int((p.argmax(-1) == q.argmax(-1)).sum())
    return {"kld_mean": float(np.mean(per_token)), "kld_max": float(np.max(per_token)),
            "top1_agreement": agree / len(per_token), "tokens": len(per_token)}


def greedy(target: Path, prompts: list[str], properties: dict, tokens: int = 100) -> list[str]:
    from gguf2ov.runtime.genai import generation_config, make_pipeline
    from gguf2ov.runtime.target import TargetIR

    pipe = make_pipeline(TargetIR.open(target), "CPU", properties)
    cfg = generation_config(pipe, tokens, None)
    return [pipe.generate([p], cfg).texts[0] for p in prompts]


def provenance() -> dict:
    from datetime import datetime, timezone
    from importlib.metadata import version

    return {"date": datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M+00:00"), "commit": short_commit(),
            "openvino": version("openvino"), "openvino_genai": version("openvino-genai")}


def markdown(report: dict) -> str:
    lines = [f"{report['provenance']['date']}, commit {report['provenance']['commit']}, openvino "
             f"{report['provenance']['openvino']}. Against `{Path(report['gguf']).name}`'s exact grid ({report['reference']}); {report['sequences']} held-out "
             f"sequences of {report['length']} tokens; greedy text of {report['prompts']} prompts x 100 tokens.", "",
             "| form | largest weight change, group steps | KLD mean / max (exact) | top-1 (exact) | KLD mean / max "
             "(f32 hint) | top-1 (f32 hint) | KLD mean / max (defaults) | top-1 (defaults) | greedy text identical "
             "(f32 hint / defaults; the prompts that part) |", "|" + "---|" * 9]
    for label, r in report["forms"].items():
        cells = [f"{r['largest_change_in_steps']:.1e}"]
        for m in MODES:
            cells += [f"{r[m]['kld_mean']:.1e} / {r[m]['kld_max']:.1e}", f"{r[m]['top1_agreement']:.4f}"]
        cells.append(f"{r['greedy_identical_f32']}/{report['prompts']} / {r['greedy_identical_defaults']}/{report['prompts']}"
                     + "".join(f" ({m}: {', '.join(str(i + 1) for i in r[f'greedy_parted_{m}'])})"
                               for m in ("f32", "defaults") if r[f"greedy_parted_{m}"]))
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def families_markdown(report: dict) -> str:
    """One row per fixture and form: the docs' table (docs/targets.md, the lean form)."""
    lines = ["| fixture | form | largest weight change, group steps | KLD mean / max, exact | top-1, exact | KLD mean, "
             "top-1: f32 hint | greedy text identical: f32 hint, defaults |", "|" + "---|" * 7]
    for name, r in report["fixtures"].items():
        n = r["prompts"]
        for label, f in r["forms"].items():
            lines.append(f"| {name} | {label} | {f['largest_change_in_steps']:.1e} | {f['exact']['kld_mean']:.1e} / "
                         f"{f['exact']['kld_max']:.1e} | {f['exact']['top1_agreement']:.4f} | {f['f32']['kld_mean']:.1e}, "
                         f"{f['f32']['top1_agreement']:.4f} | {f['greedy_identical_f32']}/{n}, "
                         f"{f['greedy_identical_defaults']}/{n} |")
    return "\n".join(lines) + "\n"


# The fixture families' target GGUFs (None: the plain fixture target, which the project's writer makes Q4_K_M)
FIXTURES = {"tiny-dflash": None, "tiny-hybrid": "target-Q4_K_M.gguf", "tiny-moe": "target-Q4_K_M.gguf",
            "tiny-gptoss": "target-MXFP4_MOE.gguf", "tiny-gemma4": "target-Q4_K_M.gguf"}


def fixture_forms(name: str, work: Path) -> tuple[Path, dict]:
    """(the fixture's target GGUF, {label: target folder}) of its folded grid and the int4 forms, built in `work`."""
    from gguf2ov.ir.variants import TARGET_GROUP_FALLBACK, TARGET_GROUP_SIZE, variant_from_flags
    from gguf2ov.job import Job, Options
    from gguf2ov.sources import TargetBuild, model_source

    folder = REPO / "fixtures" / name
    gguf = folder / FIXTURES[name] if FIXTURES[name] else work / f"{name}-Q4_K_M.gguf"
    if not gguf.is_file():
        from gguf2ov.tools.gguf_writer import write_gguf

        write_gguf(folder / "target-hf", gguf, "qwen3", tokenizer_dir=folder / "target-hf", mix="Q4_K_M")
    lean = dict(group_size=None, default_group_size=TARGET_GROUP_SIZE, group_fallback=TARGET_GROUP_FALLBACK)
    forms = {"folded": (variant_from_flags("gguf"), False), "int4": (variant_from_flags("int4", **lean), False),
             "int4-all": (variant_from_flags("int4", all_layers=True, **lean), False)}
    if name == "tiny-hybrid":
        forms["int4-gdn"] = (variant_from_flags("int4", **lean), True)
    out = {}
    for label, (variant, gdn_int4) in forms.items():
        job = Job(target_spec=TargetBuild(model_source(gguf, "target"), variant), options=Options(progress=False))
        if gdn_int4:  # what the lean form keeps in int8, in int4 too
            job.target_source.int8_weights = {}
        out[label] = work / f"{name}-{label}"
        job.build_target(out[label], overwrite=True)
    return gguf, out


def measure(gguf: Path, targets: dict, reference_label: str, prompts: list[str], text: str, length: int,
            sequences: int | None) -> dict:
    """Each form of `targets` against the reference form's exact arithmetic: weights, logits, greedy text."""
    from gguf2ov.numerics import EXACT
    import openvino_genai as g

    tokenizer = g.Tokenizer(str(targets[reference_label]))
    ids = np.asarray(tokenizer.encode(text).input_ids.data[0], dtype=np.int64)
    seqs = [ids[i:i + length] for i in range(0, len(ids) - length + 1, length)][:sequences]
    reference = logits(targets[reference_label], seqs, EXACT)
    reference_text = greedy(targets[reference_label], prompts, EXACT)
    report = {"gguf": str(gguf), "reference": f"{reference_label}, exact arithmetic", "sequences": len(seqs),
              "length": length, "prompts": len(prompts), "provenance": provenance(), "forms": {}}
    for label, folder in targets.items():
        changes = weight_changes(gguf, folder)
        worst = max(changes, key=changes.get)
        row = {"largest_change_in_steps": changes[worst], "worst_tensor": worst, "tensors_measured": len(changes)}
        for mode, props in MODES.items():
            row[mode] = kld(reference, logits(folder, seqs, EXACT if props is None else props))
        for mode in ("f32", "defaults"):
            texts = greedy(folder, prompts, MODES[mode])
            row[f"greedy_identical_{mode}"] = sum(a == b for a, b in zip(texts, reference_text))
            row[f"greedy_parted_{mode}"] = [i for i, (a, b) in enumerate(zip(texts, reference_text)) if a != b]
        report["forms"][label] = row
        print(f"{label}: largest weight change {row['largest_change_in_steps']:.2e} steps ({worst}); "
              + "; ".join(f"{m}: KLD mean {row[m]['kld_mean']:.2e} max {row[m]['kld_max']:.2e}, top-1 "
                          f"{row[m]['top1_agreement']:.4f}" for m in MODES)
              + f"; greedy text identical: f32 {row['greedy_identical_f32']}/{len(prompts)}, defaults "
                f"{row['greedy_identical_defaults']}/{len(prompts)}", flush=True)
    report["markdown"] = markdown(report)
    return report


def main(argv=None) -> int:
    import tempfile

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("gguf", type=Path, nargs="?")
    p.add_argument("--targets", help="label=folder,... (the forms to state)")
    p.add_argument("--fixtures", help=f"comma-separated fixtures to build and state (all: {', '.join(FIXTURES)})")
    p.add_argument("--reference", default="folded", help="the label whose exact arithmetic is the reference")
    p.add_argument("--text", type=Path, help="held-out text (default: the fixture generator's, another seed, and prose)")
    p.add_argument("--prompts", type=Path, default=REPO / "fixtures" / "tiny-dflash" / "prompts.txt")
    p.add_argument("--length", type=int, default=256, help="tokens per sequence")
    p.add_argument("--sequences", type=int, help="at most this many sequences of the text")
    p.add_argument("--json", type=Path)
    args = p.parse_args(argv)
    if (args.targets is None) == (args.fixtures is None) or (args.targets is not None and args.gguf is None):
        p.error("give GGUF --targets label=folder,..., or --fixtures")
    text = args.text.read_text() if args.text else held_out_text()
    if args.targets is not None:
        targets = {k: Path(v) for k, v in (item.split("=", 1) for item in args.targets.split(","))}
        prompts = [line for line in args.prompts.read_text().splitlines() if line.strip()]
        report = measure(args.gguf, targets, args.reference, prompts, text, args.length, args.sequences)
        print(report["markdown"])
    else:
        names = list(FIXTURES) if args.fixtures == "all" else args.fixtures.split(",")
        report = {"fixtures": {}}
        with tempfile.TemporaryDirectory(prefix="fidelity-") as work:
            for name in names:
                gguf, targets = fixture_forms(name, Path(work))
                prompts = [line for line in (REPO / "fixtures" / name / "prompts.txt").read_text().splitlines()
                           if line.strip()]
                report["fixtures"][name] = measure(gguf, targets, "folded", prompts, text, args.length, args.sequences)
                print(f"## {name}\n\n" + report["fixtures"][name]["markdown"], flush=True)
        report["markdown"] = families_markdown(report)
        print(report["markdown"])
    if args.json:
        args.json.write_text(json.dumps(report, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
