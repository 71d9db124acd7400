"""Time and peak memory of `gguf2ov check` on a draft far larger than the test fixture.

Builds a random dflash draft (BF16 reference checkpoint), writes it as a Q4_K_M GGUF with
gguf2ov.tools.gguf_writer, converts that GGUF to a checkpoint folder, then checks, each in a fresh
process so that peak RSS belongs to the check alone:
  1. the GGUF (converted in memory) against the reference,
  2. the converted folder against the reference.
  3. the GGUF against another model of the same shapes: the worst case, where every tensor fails
     and the reference is searched for swaps before the check gives up on it.
The check holds one source tensor, its reference tensor and float64 chunks at a time, so its
peak should sit near the import baseline plus a few times the largest tensor, not the model size.

    python -m benchmarks.bench_check                   # hidden 2048, 2 layers (~120M parameters)
    python -m benchmarks.bench_check --layers 4 --keep /tmp/bench-draft

Measured on 2 shared CPU cores (load ~5), hidden 2048, 2 layers, 5 target layers: 121.6M
parameters, largest tensor fc.weight 21M elements (80 MiB in f32), reference 232 MiB BF16, GGUF
69 MiB. Setup: reference 5 s, Q4_K_M GGUF 31 s, convert 2.4 s.
  source              time    peak RSS over imports    peak anonymous over imports
  GGUF (Q4_K_M)       4.5 s   416 MiB                  206 MiB
  converted folder    4.8 s   557 MiB                  201 MiB
  another model       5.7 s   416 MiB                  206 MiB
RSS also counts the memory-mapped GGUF and safetensors pages read so far (reclaimable page
cache); the anonymous peak, about 2.5 x the largest tensor in f32, is the check's own memory.
Q4_K tensors correlate 0.9975 (rel_err 0.071), Q6_K 0.9998 (0.018), F32 1.0.
"""

import argparse
import json
import math
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from gguf2ov.job import Job, Options


def build_reference(folder: Path, hidden: int, layers: int, heads: int, kv_heads: int, ffn: int, n_targets: int,
                    seed: int = 0):
    import torch
    from safetensors.torch import save_file

    head_dim = 128
    config = {
        "architectures": ["DFlashDraftModel"], "model_type": "qwen3", "hidden_size": hidden,
        "num_hidden_layers": layers, "num_attention_heads": heads, "num_key_value_heads": kv_heads,
        "head_dim": head_dim, "intermediate_size": ffn, "rms_norm_eps": 1e-6, "rope_theta": 1000000.0,
        "max_position_embeddings": 32768, "tie_word_embeddings": False,
        "dflash_config": {"target_layer_ids": [1 + 8 * i for i in range(n_targets)], "mask_token_id": 151669,
                          "block_size": 16},
    }
    g = torch.Generator().manual_seed(seed)

    def mat(rows, cols):  # built in bf16 directly: the reference is held once, not in f32 as well
        return (torch.randn(rows, cols, generator=g) * 0.02).bfloat16()

    def norm(n):
        return (1 + 0.1 * torch.randn(n, generator=g)).bfloat16()

    sd = {"fc.weight": mat(hidden, n_targets * hidden), "hidden_norm.weight": norm(hidden), "norm.weight": norm(hidden)}
    for i in range(layers):
        p = f"layers.{i}."
        sd |= {
            p + "input_layernorm.weight": norm(hidden), p + "post_attention_layernorm.weight": norm(hidden),
            p + "self_attn.q_proj.weight": mat(heads * head_dim, hidden),
            p + "self_attn.k_proj.weight": mat(kv_heads * head_dim, hidden),
            p + "self_attn.v_proj.weight": mat(kv_heads * head_dim, hidden),
            p + "self_attn.o_proj.weight": mat(hidden, heads * head_dim),
            p + "self_attn.q_norm.weight": norm(head_dim), p + "self_attn.k_norm.weight": norm(head_dim),
            p + "mlp.gate_proj.weight": mat(ffn, hidden), p + "mlp.up_proj.weight": mat(ffn, hidden),
            p + "mlp.down_proj.weight": mat(hidden, ffn),
        }
    folder.mkdir(parents=True, exist_ok=True)
    save_file(sd, str(folder / "model.safetensors"))
    (folder / "config.json").write_text(json.dumps(config, indent=2))


def _status_mib(field: str) -> int | None:
    """VmRSS / VmHWM of this process in MiB (Linux), None elsewhere."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return round(int(line.split()[1]) / 1024)
    except OSError:
        pass
    return None


def _reset_peak() -> bool:
    # ru_maxrss survives execve (a child starts with its parent's peak), so the peak is read from
    # VmHWM, reset here once the imports are done.
    try:
        Path("/proc/self/clear_refs").write_text("5")
        return True
    except OSError:
        return False


class _AnonSampler:
    """Peak RssAnon, sampled every 5 ms: VmHWM also counts the memory-mapped safetensors and GGUF
    pages the check has read, which are page cache the kernel can drop, not the check's own memory."""

    def __init__(self):
        import threading

        self.peak, self._stop = _status_mib("RssAnon") or 0, threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self):
        while not self._stop.wait(0.005):
            self.peak = max(self.peak, _status_mib("RssAnon") or 0)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()


def measure(source: str, reference: str) -> dict:
    """Run in a child process: one check, with the RSS before it (imports) and at its peak."""
    import gguf2ov.stages.check  # noqa: F401  imports first, so the baseline includes numpy, torch, gguf
    import safetensors.torch  # noqa: F401
    from gguf2ov.job import Job, Options

    baseline, anon_baseline = _status_mib("VmRSS"), _status_mib("RssAnon")
    reset = _reset_peak()
    with _AnonSampler() as anon:
        start = time.perf_counter()
        result = Job.of(source, options=Options(progress=False)).check(reference)
        seconds = time.perf_counter() - start
    peak = _status_mib("VmHWM") if reset else round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)
    by_qtype = {q.qtype: {"count": q.count, "mean_pearson": round(q.mean_pearson, 5),
                          "min_pearson": round(q.min_pearson, 5), "mean_rel_err": round(q.mean_rel_err, 5)}
                for q in result.by_qtype}
    return {"source": source, "passed": result.passed, "tensors": len(result.tensors), "seconds": round(seconds, 2),
            "rss_after_imports_mib": baseline, "peak_rss_mib": peak,
            "peak_over_imports_mib": None if peak is None or baseline is None else peak - baseline,
            "anon_after_imports_mib": anon_baseline, "peak_anon_mib": anon.peak,
            "peak_anon_over_imports_mib": None if anon_baseline is None else anon.peak - anon_baseline,
            "by_qtype": by_qtype}


def _in_child(source: Path, reference: Path) -> dict:
    out = subprocess.run([sys.executable, __file__, "--measure", str(source), str(reference)],
                         check=True, capture_output=True, text=True)
    return json.loads(out.stdout)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--hidden", type=int, default=2048)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--heads", type=int, default=16)
    ap.add_argument("--kv-heads", type=int, default=8)
    ap.add_argument("--ffn", type=int, default=6144)
    ap.add_argument("--targets", type=int, default=5, help="number of target layers the draft reads")
    ap.add_argument("--keep", type=Path, default=None, help="build in (and keep) this folder")
    ap.add_argument("--json", type=Path, default=None, help="also write the numbers here")
    ap.add_argument("--measure", nargs=2, metavar=("SOURCE", "REF"), help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.measure:
        print(json.dumps(measure(*args.measure)))
        return 0

    from gguf2ov.tools.gguf_writer import write_dflash_gguf

    work = args.keep or Path(tempfile.mkdtemp(prefix="bench-check-"))
    ref, gguf, converted = work / "ref", work / "draft-Q4_K_M.gguf", work / "converted"
    other = work / "other-model"
    shape = (args.hidden, args.layers, args.heads, args.kv_heads, args.ffn, args.targets)
    times = {}
    if not (ref / "model.safetensors").is_file():
        t = time.perf_counter()
        build_reference(ref, *shape)
        times["build_reference_s"] = round(time.perf_counter() - t, 1)
    if not gguf.is_file():
        t = time.perf_counter()
        write_dflash_gguf(ref, gguf, mix="Q4_K_M")
        times["write_gguf_s"] = round(time.perf_counter() - t, 1)
    if not converted.is_dir():
        t = time.perf_counter()
        Job.of(gguf, None, Options(progress=False)).convert(converted)
        times["convert_s"] = round(time.perf_counter() - t, 1)
    if not (other / "model.safetensors").is_file():
        build_reference(other, *shape, seed=1)
    from safetensors import safe_open

    with safe_open(str(ref / "model.safetensors"), "pt") as f:
        shapes = [f.get_slice(k).get_shape() for k in f.keys()]
    sizes = [math.prod(s) for s in shapes]
    report = {
        "model": {"hidden": args.hidden, "layers": args.layers, "heads": args.heads, "kv_heads": args.kv_heads,
                  "ffn": args.ffn, "targets": args.targets, "parameters": sum(sizes), "largest_tensor": max(sizes),
                  "largest_tensor_f32_mib": round(max(sizes) * 4 / 2**20), "gguf_mib": round(gguf.stat().st_size / 2**20),
                  "reference_bf16_mib": round((ref / "model.safetensors").stat().st_size / 2**20)},
        "setup": times,
        "check_gguf": _in_child(gguf, ref),
        "check_folder": _in_child(converted, ref),
        "check_other_model": _in_child(gguf, other),
    }
    text = json.dumps(report, indent=2)
    print(text)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
