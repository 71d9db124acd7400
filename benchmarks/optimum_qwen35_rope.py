"""optimum-intel 2.2.0's export of `qwen3_5_text` turns every token of a multi-token step by one RoPE
position once OpenVINO's paged conversion has run (GenAI's continuous batching, DFlash included): the
upstream reproducer of benchmarks/optimum_qwen35_rope.md.

Standalone on purpose (transformers 5.2.0, optimum-intel 2.2.0, openvino and openvino-genai 2026.4.1;
nothing of gguf2ov), so that it can go upstream as it is. Run it with the Python of an environment
holding those (fixtures/make_hybrid_fixture.py makes one, build/tf52 or $GGUF2OV_TF52_ENV):

    $GGUF2OV_TF52_ENV/bin/python benchmarks/optimum_qwen35_rope.py [--work DIR] [--ir DIR] [--json FILE]

1. a tiny random Qwen3_5ForCausalLM (layers L F L F, initializer_range 0.2 so that its greedy tokens
   depend on every input), exported by optimum-intel (`text-generation-with-past`, fp32); or `--ir`, an
   export already made (fixtures/tiny-hybrid/target);
2. the positions: the graph's rotary cosines after `paged_attention_transformation`, computed for one
   step of 4 tokens at positions 5-8 and for each of those tokens decoded alone; each token of the step
   is named by the position whose cosines it gets;
3. the text: greedy tokens of `LLMPipeline` stateful (ATTENTION_BACKEND=SDPA) and in continuous batching
   (a SchedulerConfig), on 10 random prompts, 32 new tokens each, in exact arithmetic;
4. 2 and 3 again for the same IR with one edit: RoPE's positions read from `position_ids`.
"""

import argparse
import json
import shutil
import sys
from pathlib import Path

EXACT = {"INFERENCE_PRECISION_HINT": "f32", "DYNAMIC_QUANTIZATION_GROUP_SIZE": "0", "KV_CACHE_PRECISION": "f32"}
PAST, BLOCK = 5, 4
PROMPTS, NEW_TOKENS, SEED = 10, 32, 0
LAYERS = ["linear_attention", "full_attention"] * 2


def export_tiny(work: Path) -> Path:
    import torch
    from optimum.exporters.openvino import main_export
    from transformers import Qwen3_5ForCausalLM, Qwen3_5TextConfig

    torch.manual_seed(SEED)
    cfg = Qwen3_5TextConfig(
        vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=len(LAYERS), layer_types=LAYERS,
        num_attention_heads=4, num_key_value_heads=2, head_dim=16, linear_num_key_heads=2, linear_num_value_heads=2,
        linear_key_head_dim=16, linear_value_head_dim=16, tie_word_embeddings=True, initializer_range=0.2,
        bos_token_id=1, eos_token_id=2, pad_token_id=0)
    Qwen3_5ForCausalLM(cfg).save_pretrained(work / "hf")
    main_export(str(work / "hf"), str(work / "optimum"), task="text-generation-with-past")
    return work / "optimum"


def read_position_ids(src: Path, dst: Path) -> Path:
    """The export with one edit: the positions its rotary embedding turns by are `position_ids`, where
    the export has arange(past, past + L), `past` the length of its first key cache."""
    import openvino as ov

    shutil.copytree(src, dst, dirs_exist_ok=True)
    model = ov.Core().read_model(src / "openvino_model.xml")
    position_ids = next(p for p in model.inputs if "position_ids" in p.get_names())
    rotary = upstream(next(op for op in model.get_ordered_ops() if op.get_type_name() == "Cos"))
    # arange(past, past + L) [L] -> Reshape [1, 1, L] -> Broadcast to mRoPE's [3, B, L] -> ... -> Cos
    reshape = next(op for op in rotary.values() if op.get_type_name() == "Reshape"
                   and op.input_value(0).get_node().get_type_name() == "Range")
    reshape.output(0).replace(ov.opset13.unsqueeze(position_ids, ov.opset13.constant([0])).output(0))
    model.validate_nodes_and_infer_types()
    ov.save_model(model, dst / "openvino_model.xml", compress_to_fp16=False)
    return dst


def upstream(node) -> dict:
    """Every node `node` is computed from, by name."""
    seen, stack = {}, [node]
    while stack:
        n = stack.pop()
        if n.get_name() not in seen:
            seen[n.get_name()] = n
            stack += [i.get_source_output().get_node() for i in n.inputs()]
    return seen


def step_positions(xml: Path) -> list[int | None]:
    """The position each token of one 4-token step at positions 5-8 is turned by after the paged
    conversion: the position whose one-token step gives the same cosines (None: none does)."""
    import numpy as np
    import openvino as ov
    from openvino._offline_transformations import paged_attention_transformation

    model = ov.Core().read_model(xml)
    paged_attention_transformation(model)
    cos = next(op for op in model.get_ordered_ops() if op.get_type_name() == "Cos").output(0)
    params = [n for n in upstream(cos.get_node()).values() if n.get_type_name() == "Parameter"]
    request = ov.Core().compile_model(ov.Model([ov.opset13.result(cos)], params), "CPU", EXACT).create_infer_request()

    def cosines(past: int, tokens: int):
        values = {"input_ids": np.zeros(tokens), "position_ids": np.arange(past, past + tokens),
                  "max_context_len": np.array(past + tokens)}
        feeds = {p.get_friendly_name(): values[p.get_friendly_name()].astype(p.get_element_type().to_dtype())
                 for p in params}
        return next(iter(request.infer(feeds).values())).copy()

    step = cosines(PAST, BLOCK)  # [tokens, 1, rotary dims]
    alone = {PAST + i: cosines(PAST + i, 1)[0] for i in range(BLOCK)}
    return [next((p for p, c in alone.items() if np.allclose(step[i], c, atol=1e-6)), None) for i in range(BLOCK)]


def greedy_differences(folder: Path) -> dict:
    """Greedy tokens of the random prompts, stateful and in continuous batching."""
    import numpy as np
    import openvino as ov
    import openvino_genai as ov_genai

    rng = np.random.default_rng(SEED)
    prompts = [rng.integers(3, 256, int(rng.integers(4, 24))).tolist() for _ in range(PROMPTS)]
    scheduler = ov_genai.SchedulerConfig()
    scheduler.enable_prefix_caching = False
    out = {}
    for mode, extra in (("stateful", {"ATTENTION_BACKEND": "SDPA"}), ("continuous batching",
                                                                      {"scheduler_config": scheduler})):
        pipe = ov_genai.LLMPipeline(str(folder), "CPU", **extra, **EXACT)
        cfg = pipe.get_generation_config()
        cfg.max_new_tokens, cfg.ignore_eos, cfg.do_sample = NEW_TOKENS, True, False
        out[mode] = [list(pipe.generate(ov.Tensor(np.array([p], dtype=np.int64)), cfg).tokens[0]) for p in prompts]
        del pipe
    a, b = out["stateful"], out["continuous batching"]
    first = [next((i for i, (x, y) in enumerate(zip(s, c)) if x != y), None) for s, c in zip(a, b)]
    return {"prompts": PROMPTS, "new_tokens": NEW_TOKENS, "differ": sum(f is not None for f in first),
            "first_different_token": first}


def main(argv=None) -> int:
    import importlib.metadata as md

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--work", type=Path, default=Path("build/optimum_qwen35_rope"))
    parser.add_argument("--ir", type=Path, help="an optimum-intel export of a qwen3_5_text model (default: made here)")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    args.work.mkdir(parents=True, exist_ok=True)
    exported = args.ir or export_tiny(args.work)
    edited = read_position_ids(exported, args.work / "position_ids")
    result = {"versions": {p: md.version(p) for p in ("transformers", "optimum-intel", "openvino", "openvino-genai")},
              "step": f"{BLOCK} tokens at positions {PAST}-{PAST + BLOCK - 1}"}
    for label, folder in (("optimum-intel export", exported), ("the same, RoPE from position_ids", edited)):
        result[label] = {"positions after the paged conversion": step_positions(folder / "openvino_model.xml"),
                         "greedy tokens, stateful vs continuous batching": greedy_differences(folder)}
    text = json.dumps(result, indent=2)
    print(text)
    if args.json:
        args.json.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
