"""The map of one architecture as an object: the sections of its YAML file (validated by `schema.py`),
and one object per job the map does (made from those sections when the map is), each with one reason to
change:
- `metadata` (`metadata.py`): GGUF metadata -> the HF config;
- `tensors` (`tensors.py`): which rule names each GGUF tensor, the checks that a file fits, the plan;
- `shapes` (`shapes.py`): the shapes the map states (a target's are its layer kinds');
- `writer` (`writer.py`): an HF checkpoint -> GGUF metadata and names, the map run backwards;
- `checkpoint` (below): how a checkpoint folder's tensor names become the map's.
"""

from dataclasses import dataclass, field

from ..errors import Gguf2ovError
from .metadata import MetadataReader
from .shapes import StatedShapes
from .tensors import TensorMatcher
from .writer import GgufWriter


@dataclass(frozen=True)
class CheckpointLayout:
    """How a checkpoint's tensor names become the map's (`checkpoint:`): prefixes renamed (transformers 5
    saves some decoders under `model.language_model.`), tensors of other parts of the folder's model
    ignored (a vision tower, an MTP block), the VLM model types whose config holds this model's
    as `text_config`, and the vocabulary llama.cpp's converter writes from its tokenizer (tokenizer.ggml.model:
    its own for this model, and for a DFlash draft of it, whose converter reuses the target's)."""

    rename: dict = field(default_factory=dict)
    ignore: tuple = ()
    text_config_of: tuple = ()
    vocabulary: str = "gpt2"

    def __bool__(self) -> bool:
        return bool(self.rename or self.ignore)

    def names(self, names, arch: str, where) -> dict[str, str]:
        """{the map's HF name: the checkpoint's} for a checkpoint's tensor names."""
        out = {}
        for name in names:
            if self.ignore and name.startswith(self.ignore):
                continue
            new = next((to + name[len(prefix):] for prefix, to in self.rename.items() if name.startswith(prefix)), name)
            if new in out:
                raise Gguf2ovError(f"{where}: {out[new]} and {name} are both {new} to the {arch} map",
                                   hint="the checkpoint holds the model twice; keep one copy")
            out[new] = name
        return out


@dataclass(eq=False)
class ArchMap:
    arch: str
    path: str                 # where the map came from, for messages
    hf: dict
    config: dict              # HF key -> config rule (`metadata.py`)
    rules: list               # tensors.TensorRule, in map order
    stated_shapes: dict       # HF template -> shape expressions (none in a target map)
    legacy: dict
    group_hf: dict = field(default_factory=dict)
    compare: dict = field(default_factory=dict)   # HF key -> [other places a config may hold it]
    target: dict | None = None                    # how gguf2ov target builds it (None: not a target)
    trailing: dict | None = None                  # blocks after the decoder's (`trailing_blocks`)
    checkpoint: CheckpointLayout = field(default_factory=CheckpointLayout)
    not_run: tuple = ()                           # not_run.NotRun: kinds of file GenAI does not run, refused
    mmproj: dict | None = None                    # a VLM's projector file (`mmproj:`, read by targets/vision.py)
    # the jobs, made from the sections above
    metadata: MetadataReader = field(init=False, repr=False)
    tensors: TensorMatcher = field(init=False, repr=False)
    shapes: StatedShapes = field(init=False, repr=False)
    writer: GgufWriter = field(init=False, repr=False)

    def __post_init__(self):
        # The metadata reader asks the tensor table which groups a file holds, the table checks shapes with the
        # stated ones, which name keys as the reader does: the table, made last, is asked through the map.
        self.metadata = MetadataReader(self.arch, self.path, self.hf, self.config, self.group_hf, self.trailing,
                                       lambda name: self.tensors.match(name))
        self.shapes = StatedShapes(self.stated_shapes, self.rules, lambda *a: self.tensors.applies(*a),
                                   self.metadata.key_text)
        self.tensors = TensorMatcher(self.arch, self.path, self.rules, self.trailing, self.metadata, self.shapes)
        self.writer = GgufWriter(self.arch, self.path, self.config, self.legacy, self.rules)

    @property
    def refuses_every_file(self) -> bool:
        """A map that only names its architecture and refuses it (`not_run` without `when`)."""
        return any(entry.every_file for entry in self.not_run)
