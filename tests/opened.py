"""The package's typed inputs opened from paths, as the command line opens them (`sources.py`, `job.Job`)."""

from gguf2ov.ir.variants import parse_variant
from gguf2ov.job import Job, Options
from gguf2ov.runtime.target import TargetIR
from gguf2ov.sources import TargetBuild, model_source


def open_draft(path, map_path=None, target_layer_offset=None):
    """A draft GGUF or checkpoint folder, opened (draft.source.DraftSource)."""
    options = Options(map_path=map_path, target_layer_offset=target_layer_offset, progress=False)
    return Job.of(path, options=options).draft


def open_target(path, map_path=None):
    """A target GGUF or checkpoint folder, opened to build from (target.source.TargetSource)."""
    build = TargetBuild(model_source(path, "target"), parse_variant("fp32"), map_path=map_path)
    return Job(target_spec=build).target_source


def build_target(source, out_dir, weight_format=None, group_size=None, sym=False, ratio=None, all_layers=False,
                 grid="split", tokenizer_dir=None, map_path=None, overwrite=False, progress=False):
    """`gguf2ov target SOURCE -o OUT_DIR` with its flags, as the command runs it (through the job)."""
    from gguf2ov.cli.args import target_build

    build = target_build(weight_format, group_size, sym, ratio, all_layers, grid, tokenizer_dir, map_path)
    job = Job(target_spec=build(model_source(source, "target")), options=Options(progress=progress))
    return job.build_target(out_dir, overwrite=overwrite)


def check(source, reference, min_corr: float = 0.99, map_path=None, target_layer_offset=None, progress=False):
    """`gguf2ov check SOURCE --reference REF` as the command runs it, through the job."""
    options = Options(map_path=map_path, target_layer_offset=target_layer_offset, progress=progress)
    return Job.of(source, options=options).check(reference, min_corr=min_corr)


__all__ = ["TargetIR", "build_target", "check", "open_draft", "open_target"]
