"""Hugging Face checkpoint folders as gguf2ov reads them: config.json and safetensors files.

One reading of a folder for every stage, so that `check`, `export` and the GGUF writer cannot
disagree about which weights a folder holds. Only safetensors are read: nothing is unpickled.
"""

import json
from pathlib import Path

import numpy as np

from ..errors import Gguf2ovError
from ..names import CONFIG_FILE, PROVENANCE_FILE, SAFETENSORS_FILE, SAFETENSORS_INDEX


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
    index = read_json_object(folder / SAFETENSORS_INDEX, required=False)
    if index is not None:
        weight_map = index.get("weight_map")
        if not isinstance(weight_map, dict) or not weight_map:
            raise Gguf2ovError(f"{folder / SAFETENSORS_INDEX} has no weight_map: not a safetensors index")
        files = [folder / name for name in sorted(set(map(str, weight_map.values())))]
        missing = [f.name for f in files if not f.is_file()]
        if missing:
            raise Gguf2ovError(f"{folder / SAFETENSORS_INDEX} names shards that are not there: {', '.join(missing[:4])}")
        return files
    if (folder / SAFETENSORS_FILE).is_file():
        return [folder / SAFETENSORS_FILE]
    raise Gguf2ovError(f"no {SAFETENSORS_FILE} in {folder}", hint="only safetensors checkpoints are read (never pickles)")


class Checkpoint:
    """A Hugging Face checkpoint folder read lazily: shapes from the headers, one tensor at a time."""

    def __init__(self, path):
        from safetensors import safe_open

        self.path = Path(path)
        if not self.path.is_dir():
            raise Gguf2ovError(f"{self.path}: not a checkpoint folder",
                               hint="pass a folder with config.json and model.safetensors (or a sharded index)")
        files = safetensors_files(self.path)
        index = read_json_object(self.path / SAFETENSORS_INDEX, required=False)
        weight_map = index["weight_map"] if index else None
        self._files = {}
        self.shapes: dict[str, tuple[int, ...]] = {}
        self._where: dict[str, str] = {}
        for file in files:
            name = file.name
            try:
                handle = safe_open(str(file), framework="pt")
            except Exception as e:  # safetensors raises its own SafetensorError
                raise Gguf2ovError(f"{file}: not a readable safetensors file ({e})") from e
            self._files[name] = handle
            for key in handle.keys():
                if weight_map is None or weight_map.get(key) == name:
                    self.shapes[key] = tuple(handle.get_slice(key).get_shape())
                    self._where[key] = name
        self.config = read_json_object(self.path / CONFIG_FILE, required=False)

    def load(self, name: str) -> np.ndarray:
        # Through torch: numpy has no bfloat16, the usual dtype of a reference checkpoint.
        t = self._files[self._where[name]].get_tensor(name)
        return t.float().numpy() if t.is_floating_point() else t.numpy()

    def load_rows(self, name: str, start: int, stop: int) -> np.ndarray:
        """Rows start..stop (along the first axis) as float32: only those rows are read."""
        t = self._files[self._where[name]].get_slice(name)[start:stop]
        return t.float().numpy() if t.is_floating_point() else t.numpy()

    def provenance(self) -> dict:
        """What the converter recorded in gguf2ov.json (empty for a checkpoint it did not write)."""
        try:
            return read_json_object(self.path / PROVENANCE_FILE, required=False) or {}
        except Gguf2ovError:  # a damaged record only costs the quant-type column
            return {}

    def recorded_qtypes(self) -> dict[str, str]:
        """{hf_name: GGUF quant type}, when the converter recorded them (`qtypes`, at the top of
        gguf2ov.json or in its options)."""
        record = self.provenance()
        found = record.get("qtypes") or (record.get("options") or {}).get("qtypes")
        return {str(k): str(v) for k, v in found.items()} if isinstance(found, dict) else {}
