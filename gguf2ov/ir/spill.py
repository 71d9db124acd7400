"""Big postponed constants made in a scratch file beside the IR instead of in memory.

OpenVINO's serializer asks a postponed constant for its whole value at once, as one tensor. For most
weights that is a few MB; a 31B Gemma 4's tied 262144 x 5376 Q6_K table, folded, is 1.31 GiB of u8
codes and 0.33 GiB of f32 scales, which was the whole build's memory peak (2 GiB limit: OOM).

A weight whose constants together pass `SPILL_BYTES` is decoded chunk by chunk into a scratch file in
the IR's folder and handed to the serializer mapped from that file: its pages are the file's, which
the kernel writes back and drops under a memory limit, where a buffer of the whole table would be
anonymous memory held until it is written. The IR written is the same byte for byte.

The scratch files take disk beside the IR: each is unlinked once mapped, but its blocks stay allocated
while the mapping is held, until the IR is written (`release`). So a save takes, besides the IR, the sum of
its spilled weights' files (`scratch_bytes`; the tied 262144 x 5376 Q6_K table of a 31B Gemma 4 alone makes
1.64 GiB), which the disk check adds (`ir.weights.WeightForms.scratch_bytes`).

The mapping is made by OpenVINO's own IR reader (a one-Const IR over the scratch file, read with
mmap), not by numpy: the serializer drops the tensor it is given without Python's GIL, and a tensor
over numpy memory then releases a Python object without it (a segfault, openvino 2026.4.1). A
Constant's tensor view does not own its memory, so the read model is kept until `release`; its
files are unlinked as soon as it is read (the mapping keeps the data until then).

GGUF2OV_SPILL_BYTES overrides the threshold (bytes; 0 spills every weight, as tests do on tiny models).
"""

import os
import tempfile
from pathlib import Path

import numpy as np

from ..errors import WriteError
from ..outputs import os_error_hint, write_out

SPILL_BYTES = 256 << 20
SPILL_ENV = "GGUF2OV_SPILL_BYTES"
# Scratch bytes written between two flushes: the kernel's own writeback of a file written fast is slow
# here (docs/real-size.md), and dirty pages count in a memory limit until they are written.
FLUSH_BYTES = 256 << 20


def spill_bytes() -> int:
    value = os.environ.get(SPILL_ENV)
    return int(value) if value else SPILL_BYTES


def scratch_bytes(kinds: dict) -> int:
    """The bytes of the scratch file `Spill.file` makes for constants {name: (type, dims)} (0: none, they stay
    under the threshold); what a disk check adds, since the file holds its blocks until the save ends."""
    sizes = [constant_bytes(kind, dims) for kind, dims in kinds.values()]
    return sum(_aligned(size) for size in sizes) if _spills(sizes) else 0


def _spills(sizes) -> bool:
    return sum(sizes) > spill_bytes()


def _aligned(size: int) -> int:
    return -(-size // 64) * 64  # as OpenVINO aligns a mapped Constant


def constant_bytes(kind: str, dims) -> int:
    """The bytes of a constant of OpenVINO type `kind` ("u4", "f32", ...) and shape `dims`."""
    import openvino as ov

    return (int(np.prod(dims, dtype=np.int64)) * getattr(ov.Type, kind).bitwidth + 7) // 8


class Spill:
    """Where the big constants of one IR are made while it is written: the IR's folder, set by the
    writer (`save_ir`) for the time of the save; without it every constant is made in memory."""

    def __init__(self):
        self.directory: Path | None = None
        self._held: list = []  # the read models whose memory the serializer is given (see above)

    def file(self, kinds: dict):
        """A `SpillFile` for constants {name: (type, dims)} that pass the threshold, else None."""
        sizes = {name: constant_bytes(kind, dims) for name, (kind, dims) in kinds.items()}
        if self.directory is None or not _spills(sizes.values()):
            return None
        return SpillFile(self, kinds, sizes)

    def release(self) -> None:
        """Once the IR is written: the mappings dropped."""
        self._held.clear()


class SpillFile:
    """The constants of one weight written into one scratch file, each at its own offset, then read
    back as tensors mapped from it."""

    def __init__(self, spill: Spill, kinds: dict, sizes: dict):
        self._spill, self._kinds, self.sizes = spill, kinds, sizes  # sizes: {name: bytes}
        self._offsets, offset = {}, 0
        for name, size in sizes.items():
            self._offsets[name] = offset
            offset += _aligned(size)
        self._folder = Path(tempfile.mkdtemp(prefix=".spill-", dir=spill.directory))
        self._bin = self._folder / "spill.bin"
        self._fd = os.open(self._bin, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        self._unflushed = 0

    def write(self, name: str, offset: int, values: np.ndarray) -> None:
        """`values` (contiguous, in the constant's byte layout) at byte `offset` of constant `name`."""
        data = memoryview(np.ascontiguousarray(values)).cast("B")
        at = self._offsets[name] + offset
        try:
            while data:
                done = os.pwrite(self._fd, data, at)
                data, at = data[done:], at + done
            self._unflushed += values.nbytes
            if self._unflushed >= FLUSH_BYTES:
                self._flush()
        except OSError as e:  # a full disk: one error naming the file, as the IR's own write gives
            raise WriteError(f"cannot write the scratch file {self._bin}: {e.strerror}",
                             hint=os_error_hint(e.errno)) from e

    def _flush(self) -> None:
        write_out(self._fd)
        self._unflushed = 0

    def _close_fd(self) -> None:
        """The descriptor closed once: closed again, its number may be another file's by then (the .bin's
        flushing thread opens one while the IR is written)."""
        fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)

    def tensors(self) -> dict:
        """{name: ov.Tensor} mapped from the file (the file then unlinked, the mapping kept by the Spill)."""
        import openvino as ov

        try:
            self._flush()
            self._close_fd()
            xml = self._folder / "spill.xml"
            xml.write_text(_const_ir(self._kinds, self._offsets))
            model = ov.Core().read_model(str(xml), str(self._bin))
        finally:
            for path in (self._folder / "spill.xml", self._bin):
                path.unlink(missing_ok=True)
            self._folder.rmdir()
        self._spill._held.append(model)
        constants = {r.get_friendly_name(): r.input_value(0).get_node() for r in model.get_results()}
        return {name: constants[name].get_tensor_view() for name in self._kinds}

    def close(self) -> None:
        """Once mapped, or after a failure: the file closed and removed."""
        try:
            self._close_fd()
        except OSError:
            pass
        for path in (self._folder / "spill.xml", self._bin):
            path.unlink(missing_ok=True)
        if self._folder.exists():
            self._folder.rmdir()


# A port's precision in an IR, where it is not the type's name in capitals
_PRECISIONS = {"f32": "FP32", "f16": "FP16"}


def _const_ir(kinds: dict, offsets: dict) -> str:
    """An IR (v11) of one Const per constant over the scratch file, each feeding a Result named as it."""
    import openvino as ov

    layers, edges = [], []
    for i, (name, (kind, dims)) in enumerate(kinds.items()):
        shape = ",".join(str(int(d)) for d in dims)
        dims_xml = "".join(f"<dim>{int(d)}</dim>" for d in dims)
        size = constant_bytes(kind, dims)
        type_name = getattr(ov.Type, kind).get_type_name()
        port = f'<port id="0" precision="{_PRECISIONS.get(type_name, type_name.upper())}">{dims_xml}</port>'
        layers.append(f'<layer id="{2 * i}" name="c{i}" type="Const" version="opset1">'
                      f'<data element_type="{type_name}" shape="{shape}" offset="{offsets[name]}" size="{size}"/>'
                      f'<output>{port}</output></layer>')
        layers.append(f'<layer id="{2 * i + 1}" name="{name}" type="Result" version="opset1">'
                      f'<input>{port}</input></layer>')
        edges.append(f'<edge from-layer="{2 * i}" from-port="0" to-layer="{2 * i + 1}" to-port="0"/>')
    return ('<?xml version="1.0"?>\n<net name="spill" version="11"><layers>' + "".join(layers)
            + "</layers><edges>" + "".join(edges) + "</edges></net>\n")
