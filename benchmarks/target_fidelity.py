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
    block-quantized (every Linear and the table of a Q4_K_M file)."""
    from gguf2ov.gguf.quants import step_changes
    from gguf2ov.ir.irweights import ir_weights
    from gguf2ov.ir.variants import parse_variant
    from gguf2ov.job import Job
    from gguf2ov.sources import TargetBuild, model_source

    source = Job(target_spec=TargetBuild(model_source(gguf, "target"), parse_variant("fp32"))).target_source
    out = {}
    for name, values in ir_weights(target).items():
        stored = source.quantized("model.embed_tokens.weight" if name == "lm_head.weight" else name)
        if stored is not None:
            raw, qtype = stored
            out[name] = float(step_changes(values, raw() if callable(raw) else raw, qtype).max())
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


def main(argv=None) -> int:
    from gguf2ov.numerics import EXACT

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("gguf", type=Path)
    p.add_argument("--targets", required=True, help="label=folder,... (the forms to state)")
    p.add_argument("--reference", default="folded", help="the label whose exact arithmetic is the reference")
    p.add_argument("--text", type=Path, help="held-out text (default: the fixture generator's, another seed, and prose)")
    p.add_argument("--prompts", type=Path, default=REPO / "fixtures" / "tiny-dflash" / "prompts.txt")
    p.add_argument("--length", type=int, default=256, help="tokens per sequence")
    p.add_argument("--sequences", type=int, help="at most this many sequences of the text")
    p.add_argument("--json", type=Path)
    args = p.parse_args(argv)
    targets = {k: Path(v) for k, v in (item.split("=", 1) for item in args.targets.split(","))}
    text = args.text.read_text() if args.text else held_out_text()
    import openvino_genai as g

    tokenizer = g.Tokenizer(str(targets[args.reference]))
    ids = np.asarray(tokenizer.encode(text).input_ids.data[0], dtype=np.int64)
    seqs = [ids[i:i + args.length] for i in range(0, len(ids) - args.length + 1, args.length)][:args.sequences]
    prompts = [line for line in args.prompts.read_text().splitlines() if line.strip()]
    reference = logits(targets[args.reference], seqs, EXACT)
    reference_text = greedy(targets[args.reference], prompts, EXACT)
    report = {"gguf": str(args.gguf), "reference": f"{args.reference}, exact arithmetic", "sequences": len(seqs),
              "length": args.length, "prompts": len(prompts), "provenance": provenance(), "forms": {}}
    for label, folder in targets.items():
        changes = weight_changes(args.gguf, folder)
        worst = max(changes, key=changes.get)
        row = {"largest_change_in_steps": changes[worst], "worst_tensor": worst}
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
    print(report["markdown"])
    if args.json:
        args.json.write_text(json.dumps(report, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
