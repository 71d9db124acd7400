"""Per-architecture maps between llama.cpp GGUF files and Hugging Face checkpoints: finding a map,
loading it once, and opening a GGUF through it.

The architecture knowledge lives in `tensor_maps/<arch>.yaml` (shipped as `gguf2ov.tensor_maps`); the
map language, section by section, is docs/maps.md. A map file is read and validated by `schema.py`
into an `arch_map.ArchMap`, which has one object per job: it builds the HF config from GGUF metadata
(`metadata.py`), matches tensor names strictly (`tensors.py`), states shapes (`shapes.py`), writes
GGUF back (`writer.py`). The rules a map names (value types and bounds, shape expressions, and the
ops that undo what llama.cpp did to a tensor, each with its reverse so a map can also write GGUF)
live in `rules.py`.

Maps are found in the shipped `tensor_maps/` and in the folders named by GGUF2OV_MAPS (paths
separated like PATH) or passed as `maps_dir`: adding an architecture is one YAML file there.
"""

import os
from dataclasses import dataclass
from pathlib import Path

from ..errors import Gguf2ovError
from ..gguf.read import GgufFile, open_gguf
from ..work import count
from .arch_map import ArchMap
from .messages import short
from .not_run import kind_of
from .schema import build_map, read_map, shipped_dir
from .tensors import PlanEntry

# Extra folders of maps, separated like PATH (os.pathsep).
MAPS_ENV = "GGUF2OV_MAPS"


# --- finding and loading ---------------------------------------------------------------------------

def map_dirs(maps_dir=None) -> list:
    """Where maps are found, in order: the shipped folder, then `maps_dir` (a folder or a list of
    them), then the folders in GGUF2OV_MAPS. A shipped map is never replaced by a user's one of the
    same name (pass --map for that)."""
    extra = [] if maps_dir is None else [maps_dir] if isinstance(maps_dir, (str, os.PathLike)) else list(maps_dir)
    extra += [d for d in os.environ.get(MAPS_ENV, "").split(os.pathsep) if d]
    return [shipped_dir(), *(Path(d) for d in extra)]


def _arch_files(maps_dir=None) -> dict:
    """arch -> (its YAML file, the name messages give it), over every map folder (the first folder
    holding a name wins)."""
    found = {}
    for i, folder in enumerate(map_dirs(maps_dir)):
        if not folder.is_dir():
            continue
        for p in sorted(folder.iterdir(), key=lambda p: p.name):
            if p.name.endswith(".yaml") and not p.name.startswith("_"):
                found.setdefault(p.name[:-5], (p, f"tensor_maps/{p.name}" if i == 0 else str(p)))
    return found


def supported_arches(maps_dir=None) -> list[str]:
    """The architectures a map converts (not those whose map only names and refuses them)."""
    return [arch for arch in known_arches(maps_dir) if not load_map(arch, maps_dir=maps_dir).refuses_every_file]


def known_arches(maps_dir=None) -> list[str]:
    """Every architecture a map names, converted or refused."""
    return sorted(_arch_files(maps_dir))


def load_map(arch: str | None = None, path=None, maps_dir=None) -> ArchMap:
    """The map of `arch` (or the file at `path`), read and validated once per process and file
    version: every stage of a job asks for it, and reading one means reading and merging its
    skeleton too. Callers do not change the map they are given."""
    if path is not None:
        return _cached_build(Path(path), str(path))
    files = _arch_files(maps_dir)
    if arch is None:
        raise Gguf2ovError("the file names no architecture (general.architecture is missing)",
                           hint=f"pass --map; known maps: {', '.join(supported_arches(maps_dir))}")
    # general.architecture comes from an untrusted file: it only selects a map by its file name in
    # a map folder (never a path)
    if not isinstance(arch, str) or arch not in files:
        raise Gguf2ovError(f"no map for architecture {short(arch)}; supported: {', '.join(supported_arches(maps_dir))}",
                           hint=f"write a tensor map YAML for it and pass --map, or put it in a folder named by "
                                f"{MAPS_ENV}")
    resource, name = files[arch]
    return _cached_build(resource, name)


def _cached_build(resource, name: str) -> ArchMap:
    # keyed by the file's identity and version, so a map edited on disk is read again
    try:
        st = Path(str(resource)).stat()
        version = (st.st_mtime_ns, st.st_size)
    except OSError:
        version = None  # a packaged resource that is not a file: it does not change
    key = (str(resource), name, version)
    if key not in _LOADED:
        count("map loads")
        _LOADED[key] = build_map(read_map(resource), name)
    return _LOADED[key]


_LOADED: dict[tuple, ArchMap] = {}


def map_data(arch: str | None, maps_dir=None, path=None) -> dict:
    """A map's YAML content (the map of `arch`, or the file at `path`) with `extends` resolved: one
    self-contained map (to write a variant of it, or to keep beside what it built)."""
    load_map(arch, path, maps_dir)  # the same checks and messages
    return read_map(Path(path) if path is not None else _arch_files(maps_dir)[arch][0])


def shipped_maps(maps_dir=None) -> list[ArchMap]:
    """Every map that a file's architecture can select (those that only refuse their architecture too)."""
    return [load_map(arch, maps_dir=maps_dir) for arch in known_arches(maps_dir)]


def config_default(arch: str, hf_key: str):
    """The default the `arch` map states for `hf_key` (e.g. dflash's block_size), None if none."""
    return load_map(arch).metadata.config_default(hf_key)


def flag_default(flag: str, maps_dir=None):
    """What a map adds where `flag` is not given (dflash: -1 to the target layers), when every map
    with that flag agrees; None otherwise. For a converted folder that did not record the value."""
    adds = {add for m in shipped_maps(maps_dir) if (add := m.metadata.flag_add(flag)) is not None}
    return adds.pop() if len(adds) == 1 else None


def compared_keys(extra: "ArchMap | None" = None) -> dict[str, dict]:
    """Config keys `check` compares, over every map (a key missing on both sides is skipped):
    {HF key: {"places": [where a config may hold it, first present wins], "default": value or None,
    "flag": the rule's flag or None}}, in map order."""
    out = {}
    for amap in [*shipped_maps(), *([extra] if extra is not None else [])]:
        for key, others in amap.compare.items():
            rule = amap.config.get(key, {})
            entry = out.setdefault(key, {"places": [key], "default": None, "flag": None})
            entry["places"] += [p for p in others if p not in entry["places"]]
            entry["default"] = entry["default"] if entry["default"] is not None else rule.get("default")
            entry["flag"] = entry["flag"] or rule.get("flag")
    return out


@dataclass(frozen=True)
class MappedGguf:
    """A GGUF file read through its map: the HF config it states and the plan for every tensor."""
    gguf: GgufFile
    amap: ArchMap
    config: dict
    plan: list[PlanEntry]
    target_layer_offset: int | None = None  # as given (None: the map's own)

    def tensors(self):
        """(hf_name, float32 array, gguf_name, qtype), tensor by tensor."""
        return self.amap.tensors.iter_tensors(self.gguf, self.plan, self.config)


def open_mapped(gguf_path, map_path=None, target_layer_offset=None, allow_ambiguous: bool = False,
                amap: ArchMap | None = None) -> MappedGguf:
    """Open a GGUF, choose its map (`amap` when the caller chose it already), build the HF config and the
    strict tensor plan.

    `allow_ambiguous` takes the map's default where the file cannot settle a value (target layer ids
    of an old-layout dflash file): for uses that do not write a checkpoint, or that name the shift.
    """
    gguf = gguf_path if isinstance(gguf_path, GgufFile) else open_gguf(gguf_path)  # or opened once by the caller
    amap = amap if amap is not None else map_for(gguf, map_path)
    if target_layer_offset is not None and amap.metadata.flag_rule("target_layer_offset") is None:
        raise Gguf2ovError(f"--target-layer-offset does not apply to {amap.arch}: its map ({amap.path}) has no "
                           "target layer ids")
    config = amap.metadata.hf_config(gguf, target_layer_offset=target_layer_offset, allow_ambiguous=allow_ambiguous)
    return MappedGguf(gguf, amap, config, amap.tensors.plan(gguf, config), target_layer_offset)


def map_for(gguf, path=None, maps_dir=None) -> ArchMap:
    """The map for a file: `path` if given (its arch must match), else the one its arch names. A file of
    a kind the map names as not run in GenAI (`not_run`) is refused here (not_run.NotRunError), once for
    every command."""
    amap = load_map(gguf.arch, path, maps_dir)
    if amap.arch != gguf.arch:
        raise Gguf2ovError(f"{gguf.path} is {short(gguf.arch)} but the map {amap.path} is for {amap.arch!r}")
    if (kind := kind_of(amap.not_run, gguf)) is not None:
        raise kind.error(gguf.path)
    return amap
