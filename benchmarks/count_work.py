"""How often one gguf2ov command repeats its work, counted from outside the package, so that any
checkout (one from before the job was opened once, say) is measured the same way.

The command runs in this process with the library instrumented where the work happens:

- GGUF tensors dequantized (`GgufFile.load`), and the passes over the file that makes;
- tensor maps built from YAML (the maps module's `_build`);
- `verify_draft` runs;
- reads of the target IR (`ov.Core.read_model` of the target's xml) and compiles of it by gguf2ov
  (`compile_model` of a model of that name; the target's embedding and head sub-models apart);
- GenAI pipelines made on the target (each compiles it), and generations with the target alone.

    python -m benchmarks.count_work -- run fixtures/tiny-dflash/draft-Q4_K_M.gguf --target ... -o out
    python -m benchmarks.count_work --package ../old-checkout -- run ...     # another checkout's package

Prints the counts as JSON (with the wall time) and writes them to --json FILE when given.
"""

import argparse
import importlib
import json
import sys
import time
from collections import Counter
from pathlib import Path

COUNTS: Counter = Counter()


def _module(*names):
    """The first of `names` that is a module of the gguf2ov package imported (the layout changed)."""
    import gguf2ov

    root = Path(gguf2ov.__file__).parent
    for name in names:
        if (root / Path(*name.split(".")[1:])).with_suffix(".py").is_file():
            return importlib.import_module(name)
    raise ImportError(f"none of {names} in {root}")


def _count_calls(module, name: str, key: str) -> None:
    """Counts the calls of `module.name` under `key`."""
    function = getattr(module, name)

    def counted(*args, **kwargs):
        COUNTS[key] += 1
        return function(*args, **kwargs)

    setattr(module, name, counted)


def instrument(target_xml: Path | None) -> None:
    import openvino as ov
    import openvino_genai as ov_genai

    read = _module("gguf2ov.gguf.read", "gguf2ov.read")
    load, tensors = read.GgufFile.load, {}

    def counted_load(self, name):
        COUNTS["GGUF tensors dequantized"] += 1
        tensors[str(self.path)] = len(self.tensors)
        return load(self, name)

    read.GgufFile.load = counted_load
    COUNTS.tensors_per_file = tensors

    _count_calls(_module("gguf2ov.maps.load", "gguf2ov.maps"), "build_map", "maps built")
    _count_calls(_module("gguf2ov.stages.verify", "gguf2ov.verify"), "verify_draft", "verify runs")

    target_names = set()
    read_model, compile_model = ov.Core.read_model, ov.Core.compile_model

    def counted_read(self, model, *args, **kwargs):
        result = read_model(self, model, *args, **kwargs)
        if target_xml is not None and isinstance(model, (str, Path)) and Path(model).resolve() == target_xml:
            COUNTS["target IR reads"] += 1
            target_names.add(result.get_friendly_name())
        return result

    def counted_compile(self, model, *args, **kwargs):
        if isinstance(model, ov.Model):
            if model.get_friendly_name() in target_names:
                COUNTS["target compiles (gguf2ov)"] += 1
            elif model.get_friendly_name() in ("target_embedding", "target_head"):
                COUNTS["target sub-model compiles (gguf2ov)"] += 1
        elif target_xml is not None and isinstance(model, (str, Path)) and Path(model).resolve() == target_xml:
            COUNTS["target compiles (gguf2ov)"] += 1
        return compile_model(self, model, *args, **kwargs)

    ov.Core.read_model, ov.Core.compile_model = counted_read, counted_compile

    for name in ("LLMPipeline", "VLMPipeline"):
        cls = getattr(ov_genai, name)

        def pipeline(*args, _cls=cls, **kwargs):
            drafted = "draft_model" in kwargs
            COUNTS["GenAI pipelines (each compiles the target)"] += 1
            return _Counted(_cls(*args, **kwargs), drafted)

        setattr(ov_genai, name, pipeline)


class _Counted:
    """A GenAI pipeline that counts its generations with the target alone."""

    def __init__(self, pipe, drafted: bool):
        self._pipe, self._drafted = pipe, drafted
        self.__class__ = type(f"Counted{type(pipe).__name__}", (_Counted,), {})  # type(pipe).__name__ checks

    def generate(self, *args, **kwargs):
        if not self._drafted:
            COUNTS["target-alone generations (GenAI, per prompt)"] += 1
        return self._pipe.generate(*args, **kwargs)

    def __getattr__(self, name):
        return getattr(self._pipe, name)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--package", type=Path, help="the checkout whose gguf2ov package to measure (default: installed)")
    p.add_argument("--json", type=Path, help="also write the counts here")
    p.add_argument("command", nargs=argparse.REMAINDER, help="-- then the gguf2ov command line")
    args = p.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if args.package:
        sys.path.insert(0, str(args.package.resolve()))
    target = command[command.index("--target") + 1] if "--target" in command else None
    target_xml = next((Path(target, n).resolve() for n in ("openvino_model.xml", "openvino_language_model.xml")
                       if target and Path(target, n).is_file()), None)
    instrument(target_xml)
    from gguf2ov import cli

    start = time.monotonic()
    code = cli.main(command)
    counts = dict(sorted(COUNTS.items()))
    files = COUNTS.tensors_per_file
    if files:
        n = max(files.values())
        counts["GGUF dequantization passes (loads / tensors)"] = round(COUNTS["GGUF tensors dequantized"] / n, 1)
    counts |= {"wall seconds": round(time.monotonic() - start, 1), "exit code": code}
    text = json.dumps(counts, indent=2)
    print(text)
    if args.json:
        args.json.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
