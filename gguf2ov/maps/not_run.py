"""Kinds of file a map recognises and refuses: what llama.cpp writes under an architecture that OpenVINO GenAI
has no path to run (a map's `not_run:` section).

Each entry names a kind (`what`: a DSpark draft of Gemma 4), what it carries (`carries`), what GenAI lacks
(`genai`) and what to do instead (`instead`); `when` says which files of the map's architecture it is:
`tensors` that must all be present, `metadata` keys that must hold the values given (none: every file of
the architecture). Entries are tried in order, the first that applies names the file. `map_for` refuses
a file one names, so every command that reads a file through its map refuses it in the same one line;
`inspect` shows the kind instead of the map's fit.
"""

from dataclasses import dataclass, field

from ..errors import Gguf2ovError

ENTRY_KEYS = {"what", "carries", "genai", "instead", "when"}
WHEN_KEYS = {"tensors", "metadata"}


@dataclass(frozen=True)
class NotRun:
    what: str
    carries: str
    genai: str
    instead: str
    tensors: tuple = ()
    metadata: dict = field(default_factory=dict)

    @property
    def every_file(self) -> bool:
        """Whether the entry names every file of its architecture (a map that converts none)."""
        return not self.tensors and not self.metadata

    def applies(self, gguf) -> bool:
        return all(name in gguf.tensors for name in self.tensors) and \
            all(_same(gguf.get(key), value) for key, value in self.metadata.items())

    def describe(self) -> str:
        """What the file is and why gguf2ov does not convert it, for `inspect` and the refusal."""
        return f"{self.what} ({self.carries}): {self.genai}, so gguf2ov neither converts nor runs it"

    def error(self, path) -> Gguf2ovError:
        # one line: what to do instead is part of it
        return NotRunError(f"{path}: {self.describe()}; {self.instead}", kind=self)


def _same(stated, wanted) -> bool:
    """Whether a file states `wanted`: a value of its type, equal (a file's value may be an array, whose == with
    a text is an array of answers, not one)."""
    return type(stated) is type(wanted) and stated == wanted


class NotRunError(Gguf2ovError):
    """A file of a kind that GenAI does not run (`kind`), refused by `map_for`."""

    def __init__(self, message: str, kind: NotRun):
        super().__init__(message)
        self.kind = kind


def not_run_entries(section, bad) -> tuple[NotRun, ...]:
    """The `not_run:` section of a map, validated."""
    if section is None:
        return ()
    if not isinstance(section, list):
        raise bad("not_run must list the kinds of file the map refuses")
    entries = []
    for entry in section:
        when = (entry.get("when") or {}) if isinstance(entry, dict) else None
        if not isinstance(entry, dict) or set(entry) - ENTRY_KEYS or \
                not all(isinstance(entry.get(k), str) and entry[k] for k in ("what", "carries", "genai", "instead")):
            raise bad("each not_run entry holds `what`, `carries`, `genai` and `instead` (texts) and optionally `when`")
        if not isinstance(when, dict) or set(when) - WHEN_KEYS \
                or not isinstance(when.get("tensors") or [], list) \
                or not all(isinstance(t, str) for t in when.get("tensors") or []) \
                or not isinstance(when.get("metadata") or {}, dict):
            raise bad(f"not_run {entry['what']}: when holds `tensors` (names) and `metadata` (key: value)")
        entries.append(NotRun(entry["what"], entry["carries"], entry["genai"], entry["instead"],
                              tuple(when.get("tensors") or ()), dict(when.get("metadata") or {})))
    return tuple(entries)


def kind_of(entries, gguf) -> NotRun | None:
    """The first entry that names the file, None if none does."""
    return next((entry for entry in entries if entry.applies(gguf)), None)
