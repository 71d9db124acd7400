"""llama.cpp's own converter and quantizer on the fixture drafts, compared with the committed GGUFs.

For each fixture draft, llama.cpp 0c1e570's `convert_hf_to_gguf.py` (bf16, the target's tokenizer
from fixtures/tiny-dflash/target-hf) and then `llama-quantize ... Q4_K_M`, compared with the
committed `draft-Q4_K_M.gguf` that `gguf2ov.tools.gguf_writer` wrote; and `llama-quantize --pure ...
MXFP4_MOE` (every weight in MXFP4: a dense draft has no experts) compared with the writer's
`mix="MXFP4_MOE", pure=True`. The same for the MoE fixture target (fixtures/tiny-moe/target-hf, arch
qwen3moe) under MXFP4_MOE as llama-quantize applies it (experts MXFP4, other weights Q8_0), tensors only
(a target's metadata is the map's to match, not the writer's). Compared:
- tensors: each tensor's name, type, shape and data bytes;
- model metadata: every key outside `general.*`, its GGUF type and value (arrays item by item);
- listed, not counted as a mismatch: the order of the tensors and of the keys (gguf_writer writes
  the checkpoint's and the map's order, llama.cpp its converter's), and the `general.*` keys, which
  describe the conversion (name, size label, file type, ...). So the files are not byte-identical
  as a whole: their tensors and their model metadata are.
The fixture tokenizer's pre-tokenizer is unknown to llama.cpp's hash table; the converter is told it
is qwen2's, as `gguf_writer` writes it (and as bench_target_build does for the fixture target).

    python -m benchmarks.llamacpp.fixtures [--keep DIR]

Builds llama.cpp first if needed (benchmarks/llamacpp/tools.py). Prints one line per fixture, writes
benchmarks/results/llamacpp-fixtures.json, exits 1 when tensors or model metadata differ.
"""

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
from gguf import GGUFReader, GGUFValueType

from benchmarks.common import REPO, RESULTS
from benchmarks.llamacpp.tools import COMMIT, convert, quantize, tool
from gguf2ov.tools.gguf_writer import write_dflash_gguf

FIXTURES = {"tiny-dflash": REPO / "fixtures" / "tiny-dflash", "tiny-dflash2": REPO / "fixtures" / "tiny-dflash2"}
TARGET_HF = REPO / "fixtures" / "tiny-dflash" / "target-hf"
OUT = RESULTS / "llamacpp-fixtures.json"


def llama_cpp_gguf(draft_ref: Path, out: Path) -> dict[str, Path]:
    """llama.cpp's Q4_K_M and pure MXFP4 GGUFs of the draft checkpoint `draft_ref` (`out` names the Q4_K_M)."""
    bf16 = convert(draft_ref, out.with_suffix(".bf16.gguf"), "bf16", "--target-model-dir", str(TARGET_HF))
    made = {"Q4_K_M": out, "MXFP4": out.with_name(out.name.replace("Q4_K_M", "MXFP4"))}
    for mix, flags in (("Q4_K_M", []), ("MXFP4", ["--pure"])):
        subprocess.run([str(tool("llama-quantize")), *flags, str(bf16), str(made[mix]),
                        "MXFP4_MOE" if mix == "MXFP4" else mix], check=True, stdout=subprocess.DEVNULL,
                       stderr=subprocess.DEVNULL)
    bf16.unlink()
    return made


def moe_target_mxfp4(folder: Path) -> dict:
    """The MoE fixture target under MXFP4_MOE, by llama.cpp and by the writer: its tensors compared."""
    from gguf2ov.tools.gguf_writer import write_gguf

    hf = REPO / "fixtures" / "tiny-moe" / "target-hf"
    bf16 = convert(hf, folder / "moe-target.bf16.gguf", "bf16")
    theirs = quantize(bf16, folder / "moe-target-MXFP4_MOE.gguf", "MXFP4_MOE")
    bf16.unlink()
    ours = write_gguf(hf, folder / "moe-target-ours-MXFP4_MOE.gguf", "qwen3moe", mix="MXFP4_MOE",
                      extra_metadata={"qwen3moe.vocab_size": json.loads((hf / "config.json").read_text())["vocab_size"]})
    r = compare(Path(ours.path), theirs)
    r["types"] = ours.type_counts
    r["match"] = r["tensors_identical"] == r["tensors"] and not r["tensors_differing"]
    return r


def _value(field):
    kind = GGUFValueType(int(field.types[0]))
    if kind == GGUFValueType.ARRAY:
        return [kind.name, GGUFValueType(int(field.types[-1])).name], list(field.contents())
    return [kind.name], field.contents()


def metadata(reader: GGUFReader) -> dict:
    return {k: _value(f) for k, f in reader.fields.items() if not k.startswith("GGUF.")}


def compare(ours: Path, theirs: Path) -> dict:
    a, b = GGUFReader(ours), GGUFReader(theirs)
    ma, mb = metadata(a), metadata(b)
    model_a = [k for k in ma if not k.startswith("general.")]
    model_b = [k for k in mb if not k.startswith("general.")]
    differ = [k for k in model_a if k in mb and ma[k] != mb[k]]
    common = [k for k in model_a if k in mb]
    general = {k: [ma.get(k, [None, None])[1], mb.get(k, [None, None])[1]]
               for k in dict.fromkeys([*ma, *mb]) if k.startswith("general.") and ma.get(k) != mb.get(k)}
    ta, tb = {t.name: t for t in a.tensors}, {t.name: t for t in b.tensors}
    same = [n for n, t in ta.items() if n in tb and t.tensor_type == tb[n].tensor_type
            and list(t.shape) == list(tb[n].shape) and np.asarray(t.data).tobytes() == np.asarray(tb[n].data).tobytes()]
    result = {
        "tensors": len(ta), "tensors_identical": len(same), "tensor_order_same": list(ta) == list(tb),
        "tensors_differing": [n for n in ta if n not in same] + [n for n in tb if n not in ta],
        "model_keys": len(model_a), "model_keys_only_ours": [k for k in model_a if k not in mb],
        "model_keys_only_llama_cpp": [k for k in model_b if k not in ma], "model_values_differing": differ,
        "model_key_order_same": common == [k for k in model_b if k in ma], "general_differing": general,
    }
    result["match"] = (result["tensors_identical"] == len(ta) == len(tb)
                       and not (result["model_keys_only_ours"] or result["model_keys_only_llama_cpp"] or differ))
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--keep", type=Path, help="keep llama.cpp's GGUFs in this folder")
    args = parser.parse_args()
    report = {"llama_cpp": COMMIT, "fixtures": {}}
    with tempfile.TemporaryDirectory() as tmp:
        folder = args.keep or Path(tmp)
        folder.mkdir(parents=True, exist_ok=True)
        for name, fixture in FIXTURES.items():
            theirs = llama_cpp_gguf(fixture / "draft-ref", folder / f"{name}-Q4_K_M.gguf")
            ours_mxfp4 = folder / f"{name}-ours-MXFP4.gguf"
            write_dflash_gguf(fixture / "draft-ref", ours_mxfp4, TARGET_HF, mix="MXFP4_MOE", pure=True)
            for mix, ours in (("Q4_K_M", fixture / "draft-Q4_K_M.gguf"), ("MXFP4", ours_mxfp4)):
                r = compare(ours, theirs[mix])
                report["fixtures"][f"{name} {mix}"] = r
                print(f"{name} {mix}: {'MATCH' if r['match'] else 'DIFFER'}: tensors {r['tensors_identical']}/"
                      f"{r['tensors']} byte-identical (same order: {r['tensor_order_same']}); model metadata: "
                      f"{r['model_keys']} keys, only ours {r['model_keys_only_ours']}, only llama.cpp's "
                      f"{r['model_keys_only_llama_cpp']}, values differing {r['model_values_differing']} (same order: "
                      f"{r['model_key_order_same']}); general.* differing: {sorted(r['general_differing'])}")
        r = report["fixtures"]["tiny-moe target MXFP4_MOE"] = moe_target_mxfp4(folder)
        print(f"tiny-moe target MXFP4_MOE: {'MATCH' if r['match'] else 'DIFFER'}: tensors {r['tensors_identical']}/"
              f"{r['tensors']} byte-identical ({r['types']}); differing: {r['tensors_differing']}")
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps(report, indent=1, default=str) + "\n")
    return 0 if all(r["match"] for r in report["fixtures"].values()) else 1


if __name__ == "__main__":
    sys.exit(main())
