"""llama.cpp's own converter on qwen3_5_text checkpoints, read through tensor_maps/qwen35.yaml.

    python -m benchmarks.llamacpp.qwen35           # writes tests/data/qwen35-mtp-llamacpp-F16.gguf
    python -m benchmarks.llamacpp.qwen35 --check   # and compares larger random checkpoints (below)
    python -m benchmarks.llamacpp.qwen35 --moe     # writes tests/data/qwen35moe-mtp-llamacpp-F16.gguf

Needs llama.cpp built by benchmarks/llamacpp/tools.py (0c1e570: its convert_hf_to_gguf.py and gguf-py,
llama-quantize). The converter does not know the fixture tokenizer's pre-tokenizer hash: it is told
it is qwen2's (`benchmarks.llamacpp.tools.convert`).

The committed file is tests/qwen35_data.py's checkpoint (one linear and one full layer, 2 key / 4
value heads, an MTP block) converted to F16, which holds its values exactly; test_hybrid_target.py
reads it back and compares it with that checkpoint, regenerated. `--moe` writes the qwen35moe file of
test_hybrid_moe_target.py's checkpoint the same way (one linear and one full layer, 8 experts top 2, a
shared expert, an MTP block with its experts; the checkpoint's fused gate_up_proj, which the converter
splits into ffn_gate_exps and ffn_up_exps).

`--check` converts a random checkpoint of 8 layers (L L L F twice, hidden 256, 2 key / 4 value heads
of 32) with `--no-mtp` and, with MTP weights added, without it; both to F32 and through
llama-quantize to Q4_K_M. For each file it prints how many tensors our map reads back bit-identical
to the checkpoint and the largest difference (the norms' + 1 and ssm_a's exp are llama.cpp's float32
arithmetic), and how far the target built from it (fp32 from F32, gguf from Q4_K_M) is from
transformers' forward on the file's own weights, logits and every locator over two stateful steps.
"""

import argparse
import json
import shutil
import subprocess
import tempfile
from pathlib import Path

from benchmarks.common import REPO
from benchmarks.llamacpp.tools import built, convert, quantize, tool
from tests import qwen35_data

def random_checkpoint(out: Path, mtp: bool) -> Path:
    """8 layers L L L F twice, hidden 256, 4/2 heads of 64, 2 key / 4 value heads of 32 (llama.cpp
    takes dv = dk), untied; with `mtp`, an MTP block as the hub's checkpoints carry one."""
    import torch
    from safetensors.torch import load_file, save_file
    from transformers import Qwen3_5ForCausalLM, Qwen3_5TextConfig

    config = Qwen3_5TextConfig(vocab_size=512, hidden_size=256, intermediate_size=512, num_hidden_layers=8,
                               num_attention_heads=4, num_key_value_heads=2, head_dim=64, linear_num_key_heads=2,
                               linear_num_value_heads=4, linear_key_head_dim=32, linear_value_head_dim=32,
                               linear_conv_kernel_dim=4, max_position_embeddings=4096, tie_word_embeddings=False,
                               rope_parameters={"rope_type": "default", "rope_theta": 1e6, "partial_rotary_factor": 0.25,
                                                "mrope_section": [3, 3, 2]})  # 8 rotary pairs
    torch.manual_seed(0)
    model = Qwen3_5ForCausalLM(config)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("linear_attn.norm.weight"):
                p.copy_(1 + 0.3 * torch.randn_like(p))
            elif name.endswith("A_log"):
                p.copy_(torch.log(torch.rand_like(p) * 4 + 0.2))
            elif name.endswith("dt_bias"):
                p.copy_(torch.randn_like(p))
            else:
                p.copy_((0.3 if "norm" in name else 0.08) * torch.randn_like(p))
    model.save_pretrained(out)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(qwen35_data.TOKENIZER / name, out / name)
    if mtp:  # one full-attention layer's shapes, and the block's fc and norms
        cfg = json.loads((out / "config.json").read_text())
        (out / "config.json").write_text(json.dumps(cfg | {"mtp_num_hidden_layers": 1}, indent=2))
        state = load_file(str(out / "model.safetensors"))
        g = torch.Generator().manual_seed(1)
        full = "model.language_model.layers.3."
        for k, v in list(state.items()):
            if k.startswith(full):
                state["mtp.layers.0." + k[len(full):]] = 0.1 * torch.randn(v.shape, generator=g)
        state["mtp.fc.weight"] = 0.1 * torch.randn(256, 512, generator=g)
        for n in ("pre_fc_norm_embedding", "pre_fc_norm_hidden", "norm"):
            state[f"mtp.{n}.weight"] = 0.1 * torch.randn(256, generator=g)
        save_file(state, str(out / "model.safetensors"), metadata={"format": "pt"})
    return out


def compare(gguf: Path, hf: Path, variant: str, work: Path) -> dict:
    import numpy as np
    import openvino as ov
    import torch
    from transformers import AutoModelForCausalLM

    from gguf2ov.hf.checkpoint import Checkpoint
    from gguf2ov.ir.variants import parse_variant
    from gguf2ov.ir.weights import save_ir
    from gguf2ov.targets.checks import target_findings
    from gguf2ov.targets.graph import build_target_ir, target_forms
    from tests import target_builders as tb
    from tests.opened import open_target

    source = open_target(gguf)
    checkpoint = Checkpoint(hf)
    same, worst = 0, 0.0
    for name in source.expected:
        stored = "model.language_model." + name[len("model."):] if name.startswith("model.") else name
        a, b = source.f32(name), checkpoint.load(stored)
        same += bool(np.array_equal(a, b))
        worst = max(worst, float(np.abs(a - b).max() / max(np.abs(b).max(), 1e-30)))
    out = work / f"{gguf.stem}-{variant}"
    out.mkdir()
    forms = target_forms(source, parse_variant(variant))
    save_ir(build_target_ir(forms), out, forms)
    reference = AutoModelForCausalLM.from_pretrained(str(hf), dtype=torch.float32)
    reference.load_state_dict({n: torch.from_numpy(np.array(source.f32(n))) for n in source.expected}, strict=False)
    steps = tb.steps(512)
    with torch.no_grad():
        ref = reference(torch.tensor(np.concatenate(steps))[None], output_hidden_states=True)
    xml = out / "openvino_model.xml"
    runs = tb.run_steps(xml, steps, tb.locators(xml), properties={"KV_CACHE_PRECISION": "f32"})
    logits = tb.relative(np.concatenate([r[0] for r in runs], axis=1), ref.logits.numpy())
    hidden = max(tb.relative(np.concatenate([r[1][i] for r in runs], axis=1), ref.hidden_states[i + 1].numpy())
                 for i in runs[0][1])
    checks = {f.name: f.status for f in target_findings(ov.Core().read_model(str(xml)), source.config)}
    return {"file": gguf.name, "mtp": source.config.raw.get("mtp_num_hidden_layers"), "tensors": len(source.expected),
            "bit_identical": same, "worst_tensor": worst, "variant": variant, "transcoded": len(forms.transcoded),
            "logits": logits, "worst_locator": hidden, "checks": sorted(set(checks.values()))}


PROMPTS = ("The capital of France is", "Once upon a time", "1, 2, 3, 4,", "def main():", "Hello world")


def greedy_llamacpp(gguf: Path, prompt: str, n: int) -> str:
    """llama.cpp's greedy continuation of `prompt` (llama-completion, temperature 0, 2 threads)."""
    done = subprocess.run([str(tool("llama-completion")), "-m", str(gguf), "-p", prompt, "-n", str(n),
                           "--temp", "0", "-t", "2", "-no-cnv", "--no-warmup"], stdin=subprocess.DEVNULL,
                          capture_output=True, timeout=300)
    text = done.stdout.decode("utf-8", errors="replace")  # a random model's pieces split characters
    if done.returncode or not text.startswith(prompt):
        raise SystemExit(f"llama-completion failed:\n{done.stderr.decode(errors='replace')[-2000:]}")
    text = text[len(prompt):]
    return text[:-2] if text.endswith("\n\n") else text  # llama-completion ends its output with an empty line


def greedy_ours(xml: Path, tokenizer, prompt: str, n: int) -> str:
    """The target IR's greedy continuation, stateful, compiled in float32."""
    import numpy as np

    from gguf2ov.numerics import compile_exact

    request = compile_exact(xml).create_infer_request()
    ids, new, past = np.array(tokenizer.encode(prompt), np.int64), [], 0
    for _ in range(n):
        logits = request.infer({"input_ids": ids[None], "attention_mask": np.ones((1, past + len(ids)), np.int64),
                                "position_ids": np.arange(past, past + len(ids))[None],
                                "beam_idx": np.zeros(1, np.int32)})["logits"]
        past += len(ids)
        ids = np.array([int(logits[0, -1].argmax())], np.int64)
        new.append(int(ids[0]))
    return tokenizer.decode(new)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="also compare larger random checkpoints")
    parser.add_argument("--moe", action="store_true", help="write the qwen35moe file instead")
    args = parser.parse_args()
    if built() is None:
        raise SystemExit("llama.cpp is not built: run `python -m benchmarks.llamacpp.tools` first")
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        if args.moe:
            out = convert(qwen35_data.write_moe_checkpoint(work / "data-hf"), qwen35_data.MOE_LLAMACPP_FILE, "f16")
            print(f"{out.relative_to(REPO)}: {out.stat().st_size} bytes")
            return
        hf = qwen35_data.write_checkpoint(work / "data-hf")
        convert(hf, qwen35_data.LLAMACPP_FILE, "f16")
        print(f"{qwen35_data.LLAMACPP_FILE.relative_to(REPO)}: {qwen35_data.LLAMACPP_FILE.stat().st_size} bytes")
        if not args.check:
            return
        rows = []
        for mtp in (False, True):
            name = "mtp" if mtp else "no-mtp"
            ckpt = random_checkpoint(work / f"hf-{name}", mtp)
            f32 = convert(ckpt, work / f"qwen35-{name}-F32.gguf", "f32", *([] if mtp else ["--no-mtp"]))
            q4 = quantize(f32, work / f"qwen35-{name}-Q4_K_M.gguf")
            rows += [compare(f32, ckpt, "fp32", work), compare(q4, ckpt, "gguf", work)]
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(str(qwen35_data.TOKENIZER))
        for row in rows:
            gguf = work / row["file"]
            xml = work / f"{gguf.stem}-{row['variant']}" / "openvino_model.xml"
            if row["variant"] == "gguf":
                # llama.cpp multiplies Q4_K weights by 8-bit activations; dequantized to F32 by
                # llama-quantize, it runs the file's own model in float32, as the target does
                gguf = quantize(gguf, work / f"{gguf.stem}-dequantized-F32.gguf", "F32")
                row["llamacpp_ran"] = gguf.name
            pairs = [(greedy_llamacpp(gguf, p, 16), greedy_ours(xml, tokenizer, p, 16)) for p in PROMPTS]
            row["greedy_equal_to_llamacpp"] = f"{sum(a == b for a, b in pairs)}/{len(pairs)}"
            print(json.dumps(row))


if __name__ == "__main__":
    main()
