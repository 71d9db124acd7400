"""How every model this tool runs is compiled, and which arithmetic each use wants.

On CPUs with VNNI or AMX the CPU plugin quantizes the *activations* of a compressed-weight
FullyConnected (u4/u8/i8 codes) to int8 on the fly: `DYNAMIC_QUANTIZATION_GROUP_SIZE` is 32 by
default there (measured on AMD EPYC with avx512_vnni and on Intel Xeon with AMX), and
`INFERENCE_PRECISION_HINT=f32` does not turn it off. A Q8_0 weight then runs with 5e-3 relative
error instead of 3e-7, so any comparison of a compressed IR would depend on the CPU it ran on.
Its KV cache is u8 by default too (`KV_CACHE_PRECISION`, in a compiled stateful model and in
GenAI's paged cache alike): on the real Gemma 3 270M target it flips a greedy token where the top
two logits are 0.014 apart, which the IR in float32 gets right.
So each use says which arithmetic it wants:

- `compile_exact`: float32 everywhere, the KV cache too, and dynamic quantization off. For checks
  of exactness and for figures that must compare across machines: verify's behaviour checks (the
  IR against its source), the tap scan, drift's weight and output figures, reading weights back
  from an IR.
- `F32_HINT`: what a user's pipeline runs with (the f32 hint for byte-identical text, the plugin's
  dynamic quantization and KV cache left as they are). For acceptance runs in GenAI, which measure
  what users get; the report records what the compiled models run there
  (`runtime.arithmetic.measured_numerics`): which MatMuls take int8 activations, the KV cache and
  the inference precision, read from compiled models. Whether the plugin quantizes activations
  depends on the CPU and the weight's form, not only on `DYNAMIC_QUANTIZATION_GROUP_SIZE` (an AVX2-only
  CPU reports 32 and quantizes none), so no report infers it from the property.

One `core()` per process: compiled models share its plugin, and a test can request dynamic
quantization on it to show that the exact mode stays exact where the plugin applies it.
"""

from functools import cache

EXACT = {"INFERENCE_PRECISION_HINT": "f32", "DYNAMIC_QUANTIZATION_GROUP_SIZE": 0, "KV_CACHE_PRECISION": "f32"}
F32_HINT = {"INFERENCE_PRECISION_HINT": "f32"}
DQ_KEY = "DYNAMIC_QUANTIZATION_GROUP_SIZE"
KV_KEY = "KV_CACHE_PRECISION"
# With its runtime cache on, the CPU plugin keeps one thread (and memory: ~5 MB for the fixture
# target) alive for the rest of the process per LLM it compiles, compiled model released or not
# (openvino 2026.4.1: a decoder IR, gguf2ov's or optimum's; not a lone MatMul, SDPA or ReadValue):
# `verify --target` run again and again in one process grew by ~5 MB and 43 MB of address space a
# run. gguf2ov's own compiles run a few steps each and gain nothing from the cache; the arithmetic
# is the same without it. GenAI's pipelines keep theirs.
NO_RUNTIME_CACHE = {"CPU_RUNTIME_CACHE_CAPACITY": 0}


@cache
def core():
    """The process's one `ov.Core`."""
    import openvino as ov
    import openvino_tokenizers  # noqa: F401  a Core made after this import reads the tokenizers' ops

    return ov.Core()


def compile_exact(model, device: str = "CPU"):
    """An ov.Model or IR path compiled in float32 with dynamic quantization off: exact arithmetic
    on every CPU, whatever the plugin's default there."""
    return core().compile_model(model if not hasattr(model, "__fspath__") else str(model), device,
                                {**EXACT, **_released(device)})


def compile_plain(model, device: str = "CPU"):
    """A model whose arithmetic no setting changes (a tokenizer: string ops), compiled as it is."""
    return core().compile_model(model if not hasattr(model, "__fspath__") else str(model), device, _released(device))


def _released(device: str) -> dict:
    """The properties that let a compiled model go without leaving a thread behind (NO_RUNTIME_CACHE)."""
    return NO_RUNTIME_CACHE if device == "CPU" else {}


@cache
def plugin_default(device: str = "CPU") -> dict:
    """The device's name, its default dynamic-quantization group size (0: off) and KV cache
    precision, read from a fresh `ov.Core` so that nothing this process set on `core()` hides the
    default."""
    import openvino as ov

    probe = ov.Core()
    cpu = device.split(".")[0].upper() == "CPU"

    def read(key, convert):
        # a device this machine does not have, or one without the key: the pipeline reports that itself;
        # the two runtime keys are the CPU plugin's
        try:
            return convert(probe.get_property(device, key))
        except Exception:
            return None

    return {"device": device, "device_name": read("FULL_DEVICE_NAME", str),
            "dynamic_quantization_default": read(DQ_KEY, int) if cpu else None,
            "kv_cache_precision_default": read(KV_KEY, _type_name) if cpu else None}


def _type_name(value):
    """An element type as OpenVINO spells it in properties (`u8`, `f32`), from an `ov.Type` or a string."""
    return value.get_type_name() if hasattr(value, "get_type_name") else value


def model_runtime_options(xml_path) -> dict:
    """The plugin properties an IR carries in its rt_info (`runtime_options`), which OpenVINO applies when
    it compiles the model and nothing overrides them: {name: value as written}."""
    import re
    from pathlib import Path

    if not Path(xml_path).is_file():
        return {}
    text = Path(xml_path).read_text(encoding="utf-8", errors="replace")
    block = re.search(r"<runtime_options>(.*?)</runtime_options>", text[text.rfind("<rt_info>"):], re.S)
    if block is None:
        return {}
    options = dict(re.findall(r'<(\w+) value="([^"]*)"\s*/>', block.group(1)))
    if DQ_KEY in options:
        options[DQ_KEY] = int(options[DQ_KEY])
    return options


def rounds_unlike_exact(info: dict) -> bool:
    """Whether the arithmetic a run measured (`runtime.arithmetic.measured_numerics`) differs from `EXACT` in a
    way that can part greedy texts: a MatMul whose activations are quantized on the fly, or a KV cache
    narrower than f32. A device that reports neither (not the CPU) counts as not differing: `EXACT`'s keys
    are the CPU plugin's."""
    return bool(info.get("int8_matmuls")) or info.get("kv_cache_precision") not in (None, "f32")


def describe_activations(info: dict, roles=None) -> str:
    """"int8 activations in 13 of 29 target MatMuls and 0 of 15 draft MatMuls (dynamic quantization, groups of
    32)", or "float activations in every MatMul (29 target, 15 draft)": what the compiled models of `roles`
    (None: all) run, as measured."""
    models = {r: forms for r, forms in (info.get("models") or {}).items() if roles is None or r in roles}
    counts = {r: (sum(f["matmuls"] for f in forms if f["int8"]), sum(f["matmuls"] for f in forms))
              for r, forms in models.items()}
    if not any(n for n, _ in counts.values()):
        return "float activations in every MatMul (" + ", ".join(f"{t} {r}" for r, (_, t) in counts.items()) + ")"
    return ("int8 activations in " + " and ".join(f"{n} of {t} {r} MatMuls" for r, (n, t) in counts.items())
            + f" (dynamic quantization, groups of {info.get('dynamic_quantization_group_size')})")


def describe_numerics(info: dict, roles=None) -> str:
    """One phrase for a report: `AMD EPYC, f32 precision, int8 activations in 13 of 29 target MatMuls and 0 of
    15 draft MatMuls (dynamic quantization, groups of 32), KV cache u8` (`roles`: the models to name)."""
    kv = f", KV cache {info['kv_cache_precision']}" if info.get("kv_cache_precision") else ""
    return (f"{info.get('device_name') or info.get('device')}, {info.get('inference_precision')} precision, "
            f"{describe_activations(info, roles)}{kv}")
