"""Hugging Face checkpoint folders as gguf2ov reads them: config.json and safetensors files.

One reading of a folder for every stage, so that `check`, `export` and the GGUF writer cannot
disagree about which weights a folder holds. Only safetensors are read: nothing is unpickled.
"""

import json
from pathlib import Path

from .errors import Gguf2ovError

INDEX = "model.safetensors.index.json"
SINGLE = "model.safetensors"


def read_json_object(path, required: bool = True) -> dict | None:
    """A JSON file that must hold an object (config.json, an index); None when absent and optional."""
    path = Path(path)
    if not path.is_file():
        if required:
            raise Gguf2ovError(f"{path} does not exist")
        return None
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError) as e:
        raise Gguf2ovError(f"{path} is not valid JSON: {e}") from e
    if not isinstance(data, dict):
        raise Gguf2ovError(f"{path} holds a JSON {type(data).__name__}, not an object")
    return data


def safetensors_files(folder) -> list[Path]:
    """The weight files of a checkpoint: the shards its index names, else model.safetensors.

    The index wins when both exist, as in transformers.
    """
    folder = Path(folder)
    if not folder.is_dir():
        raise Gguf2ovError(f"{folder} is not a checkpoint folder",
                           hint="pass a folder with config.json and model.safetensors (or a sharded index)")
    index = read_json_object(folder / INDEX, required=False)
    if index is not None:
        weight_map = index.get("weight_map")
        if not isinstance(weight_map, dict) or not weight_map:
            raise Gguf2ovError(f"{folder / INDEX} has no weight_map: not a safetensors index")
        files = [folder / name for name in sorted(set(map(str, weight_map.values())))]
        missing = [f.name for f in files if not f.is_file()]
        if missing:
            raise Gguf2ovError(f"{folder / INDEX} names shards that are not there: {', '.join(missing[:4])}")
        return files
    if (folder / SINGLE).is_file():
        return [folder / SINGLE]
    raise Gguf2ovError(f"no {SINGLE} in {folder}", hint="only safetensors checkpoints are read (never pickles)")
