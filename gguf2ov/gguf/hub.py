"""GGUF files by their hub name, `org/repo[:QUANT]`, resolved as llama.cpp's `-hf` and `-hfd` resolve them.

llama.cpp users name a model `-hf org/repo:Q4_K_M` and a draft `-hfd org/draft-repo:Q4_K_M`.
`resolve_gguf(spec)` turns such a name into a file on disk through huggingface_hub's own cache
and environment (`HF_HUB_CACHE`, `HF_HOME`, `HF_HUB_OFFLINE`, `HF_TOKEN` or `hf auth login`), so a
file that llama.cpp or `hf download` already fetched is found where they put it:

- online, the repository's files are listed (`HfApi.list_repo_files`) and the chosen file, with
  every part of a split file, is fetched with `hf_hub_download`, which reuses what is cached;
- offline (`HF_HUB_OFFLINE=1`), the choice is made among the files of the cached snapshot that
  `models--org--repo/refs/main` names, and `hf_hub_download` hands them out of the cache.

Which file (`choose_gguf`), as llama.cpp's `common/download.cpp` picks it:
- the first `.gguf` whose path holds the tag followed by `.` or `-`, case-insensitively;
- `mmproj` and `imatrix` files are never the model, and neither are the speculative-decoding
  sidecars `dflash-`, `eagle3-`, `mtp-`, `dspark-` (but see `_dflash_sidecars`);
- of a split file (`-00001-of-0000N`), only part one is taken, and all N parts are fetched;
- with no tag, Q4_K_M, then Q8_0, then the first model file.
The files are taken in sorted order, online and offline alike, so both pick the same one.
"""

import contextlib
import re
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from ..errors import Gguf2ovError
from ..progress import step
from ..provenance import opened_record, sha256_file, source_record

# llama.cpp's order when no tag is given (then the first model file).
DEFAULT_TAGS = ("Q4_K_M", "Q8_0")
# Files that are never a model: projectors and importance matrices (matched in any case).
NOT_MODELS = ("mmproj", "imatrix")
# Speculative-decoding sidecars a target repository ships beside its model; llama.cpp skips them
# when it picks the model (matched case-sensitively in the file name: "...-DFlash2-Q4_K_M.gguf" is
# a model, "dflash-...-Q4_K_M.gguf" a sidecar).
SIDECARS = ("dflash-", "eagle3-", "mtp-", "dspark-")
DFLASH_SIDECAR = "dflash-"

_SPLIT = re.compile(r"^(?P<prefix>.+)-(?P<index>\d{5})(?P<of>-of-)(?P<count>\d{5})$", re.IGNORECASE)
_TAG = re.compile(r"[A-Za-z0-9_.-]+")
_EXAMPLE = "incoai/Qwen3.8-27B-DFlash2-GGUF:Q4_K_M"
_SHOWN = 12  # file names listed in an error


@dataclass(frozen=True)
class HubFile:
    """A GGUF taken from the Hugging Face Hub: which repository, commit and file, and where it is on disk.

    It is a path-like (`open(hub_file)`, `Path(hub_file)` give the cached file), and a source that
    `provenance.provenance()` records with its repository, revision and file name."""

    repo_id: str
    revision: str                 # the commit the file was taken from
    filename: str                 # its path in the repository (of a split file: part one)
    path: Path                    # the file in the hub cache
    tag: str | None = None        # the quant tag asked for (None: llama.cpp's default order chose)
    parts: tuple[str, ...] = ()   # every part of a split file, part one first (empty: one file)

    def __fspath__(self) -> str:
        return str(self.path)

    @property
    def spec(self) -> str:
        return f"{self.repo_id}:{self.tag}" if self.tag else self.repo_id

    def hub_record(self) -> dict:
        return {"repo": self.repo_id, "revision": self.revision, "file": self.filename,
                **({"parts": list(self.parts)} if self.parts else {})}

    def describe(self) -> str:
        split = f", part 1 of {len(self.parts)}" if self.parts else ""
        return f"{self.spec} -> {self.filename} (revision {self.revision[:12]}{split})"


@source_record.register
def _hub_file_record(source: HubFile) -> dict:
    return opened_record(source.path, sha256_file(source.path), source)


def resolve_gguf(spec) -> "HubFile | Path":
    """A GGUF source as a user types it: an existing path, or a hub name `org/repo[:QUANT]`.

    A spec is a hub name only when no local path of that name exists; a spec that looks like a
    path (`./x`, `/x`, `a/b/c`, `x.gguf`) and does not exist stays a Path, for the reader to refuse."""
    if isinstance(spec, (Path, HubFile)):
        return spec
    spec = str(spec)
    if Path(spec).exists() or not _looks_like_hub_name(spec):
        return Path(spec)
    repo_id, tag = parse_spec(spec)
    return hub_file(repo_id, tag)


def _looks_like_hub_name(spec: str) -> bool:
    if ":" in spec:  # a path with a colon is rare; a tag is what the user meant, so bad syntax is an error
        return True
    return (spec.count("/") == 1 and not spec.startswith((".", "/", "~"))
            and not spec.lower().endswith(".gguf"))


def parse_spec(spec: str) -> tuple[str, str | None]:
    """(repo id, tag or None) of `org/repo[:QUANT]`; one error saying what is wrong otherwise."""
    from huggingface_hub.errors import HFValidationError
    from huggingface_hub.utils import validate_repo_id

    repo_id, colon, tag = spec.partition(":")
    if colon and not _TAG.fullmatch(tag):
        raise _bad_name(spec, f"the quant tag {tag!r} is empty or not made of letters, digits, '_', '.', '-'")
    if repo_id.count("/") != 1:
        raise _bad_name(spec, f"{repo_id!r} is not org/repo")
    try:
        validate_repo_id(repo_id)
    except HFValidationError as e:
        raise _bad_name(spec, str(e).rstrip(".")) from None
    return repo_id, tag or None


def _bad_name(spec: str, why: str) -> Gguf2ovError:
    return Gguf2ovError(f"{spec} is neither a local file nor a hub name: {why}",
                        hint=f"give a path, or a hub name org/repo or org/repo:QUANT as llama.cpp's -hf takes it "
                             f"(e.g. {_EXAMPLE})")


# --- which file: llama.cpp's rules --------------------------------------------------------------

def split_info(path: str) -> tuple[str, int, int] | None:
    """(prefix, part, parts) of a split GGUF's file name (`m-Q8_0-00002-of-00003.gguf` -> m-Q8_0, 2, 3)."""
    m = _SPLIT.match(_stem(path))
    return (m["prefix"], int(m["index"]), int(m["count"])) if m else None


def _stem(path: str) -> str:
    return path[:-len(".gguf")] if path.lower().endswith(".gguf") else path


def _is_first_part(path: str) -> bool:
    info = split_info(path)
    return info is None or info[1] == 1


def _not_a_model(path: str) -> bool:
    return any(word in PurePosixPath(path).name.lower() for word in NOT_MODELS)


def is_model_file(path: str) -> bool:
    """What llama.cpp takes as a model: neither a projector, an importance matrix nor a sidecar."""
    name = PurePosixPath(path).name
    return not _not_a_model(path) and not any(prefix in name for prefix in SIDECARS)


def _dflash_sidecars(ggufs: list[str]) -> list[str]:
    """The `dflash-` files, tried when no model file fits.

    llama.cpp skips them because in a target repository they sit beside the model it loads. gguf2ov
    converts DFlash drafts, and a draft repository may hold nothing but `dflash-` files: its own file
    must still be found. Trying them second keeps llama.cpp's choice wherever it has one (a target
    repository still gives its model; `org/repo:dflash` gives its sidecar). `eagle3-`, `mtp-` and
    `dspark-` files stay skipped: they are other kinds of draft, which no gguf2ov map converts."""
    return [f for f in ggufs if not _not_a_model(f) and DFLASH_SIDECAR in PurePosixPath(f).name]


def _matches_tag(path: str, tag: str) -> bool:
    # llama.cpp builds the regex from the tag as typed; a tag is matched literally here
    return re.search(re.escape(tag) + r"[.-]", path, re.IGNORECASE) is not None


def _first_tagged(candidates: list[str], tag: str | None) -> str | None:
    firsts = [f for f in candidates if _is_first_part(f)]
    for wanted in [tag] if tag else DEFAULT_TAGS:
        found = next((f for f in firsts if _matches_tag(f, wanted)), None)
        if found:
            return found
    return None if tag else next(iter(firsts), None)


def gguf_files(files) -> list[str]:
    return sorted(f for f in files if f.lower().endswith(".gguf"))


def choose_gguf(files, tag: str | None) -> str | None:
    """The file llama.cpp's `-hf org/repo[:tag]` takes among a repository's `files` (None: none fits)."""
    ggufs = gguf_files(files)
    for candidates in ([f for f in ggufs if is_model_file(f)], _dflash_sidecars(ggufs)):
        found = _first_tagged(candidates, tag)
        if found:
            return found
    return None


def split_parts(filename: str) -> tuple[str, ...]:
    """Every part of the split file whose part one is `filename`, part one first (empty: not split)."""
    m = _SPLIT.match(_stem(filename))
    if not m:
        return ()
    suffix = filename[len(_stem(filename)):]
    return tuple(f"{m['prefix']}-{i:05d}{m['of']}{m['count']}{suffix}" for i in range(1, int(m["count"]) + 1))


# --- where the file is: huggingface_hub -------------------------------------------------------------

def hub_file(repo_id: str, tag: str | None) -> HubFile:
    """Resolve `repo_id[:tag]` and fetch (online) or find (offline) the chosen file and its parts."""
    from huggingface_hub import constants

    offline = constants.HF_HUB_OFFLINE
    revision, files = _cached_snapshot(repo_id) if offline else ("main", _hub_listing(repo_id))
    filename = choose_gguf(files, tag)
    if filename is None:
        raise _no_match(repo_id, tag, files, offline)
    parts = split_parts(filename)
    missing = [p for p in parts if p not in files]
    if missing:
        where = "the hub cache (HF_HUB_OFFLINE is set)" if offline else "the repository"
        raise Gguf2ovError(f"{repo_id}: {filename} is part 1 of {len(parts)}, and {_some(missing)} "
                           f"{'is' if len(missing) == 1 else 'are'} not in {where}",
                           hint=_fetch_hint(repo_id) if offline else "the split file is incomplete on the hub")
    paths = [_download(repo_id, name, revision, offline, n, len(parts)) for n, name in enumerate(parts or [filename])]
    return HubFile(repo_id=repo_id, revision=_commit_of(paths[0], filename), filename=filename, path=paths[0],
                   tag=tag, parts=parts)


def _hub_listing(repo_id: str) -> list[str]:
    from huggingface_hub import HfApi

    with _hub_errors(repo_id, offline=False):
        return list(HfApi().list_repo_files(repo_id))


def _cached_snapshot(repo_id: str) -> tuple[str, list[str]]:
    """(commit, files) of the snapshot the cache's `refs/main` names, as `hf download` and llama.cpp leave it."""
    from huggingface_hub import constants
    from huggingface_hub.file_download import REGEX_COMMIT_HASH, repo_folder_name

    storage = Path(constants.HF_HUB_CACHE) / repo_folder_name(repo_id=repo_id, repo_type="model")
    try:
        # huggingface_hub reads refs/main as it is; a newline written by hand is forgiven here
        # because the commit is then passed on by name.
        commit = (storage / "refs" / "main").read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError):
        raise Gguf2ovError(f"{repo_id} is not in the hub cache {constants.HF_HUB_CACHE} (no refs/main), and "
                           "HF_HUB_OFFLINE is set", hint=_fetch_hint(repo_id)) from None
    if not REGEX_COMMIT_HASH.match(commit):
        raise Gguf2ovError(f"{repo_id}: the hub cache's refs/main holds {commit[:60]!r}, not a commit hash",
                           hint=f"remove {storage} and fetch it again, or fetch it online (unset HF_HUB_OFFLINE)")
    snapshot = storage / "snapshots" / commit
    if not snapshot.is_dir():
        raise Gguf2ovError(f"{repo_id}: the hub cache's refs/main names the snapshot {commit!r}, which "
                           f"{constants.HF_HUB_CACHE} does not hold, and HF_HUB_OFFLINE is set",
                           hint=_fetch_hint(repo_id))
    # is_file() follows links: a snapshot link whose blob is gone is not a cached file
    return commit, sorted(p.relative_to(snapshot).as_posix() for p in snapshot.rglob("*") if p.is_file())


def _download(repo_id: str, filename: str, revision: str, offline: bool, n: int, count: int) -> Path:
    from huggingface_hub import hf_hub_download

    part = f", part {n + 1} of {count}" if count > 1 else ""
    step(f"hub: {repo_id} {filename}{part}{' (offline: from the hub cache)' if offline else ''}")
    with _hub_errors(repo_id, offline, filename):
        return Path(hf_hub_download(repo_id, filename, revision=revision))


def _commit_of(path: Path, filename: str) -> str:
    """The commit a cached file belongs to: `snapshots/<commit>/<filename>` is where huggingface_hub puts it."""
    return path.parts[-len(PurePosixPath(filename).parts) - 1]


@contextlib.contextmanager
def _hub_errors(repo_id: str, offline: bool, filename: str | None = None):
    """huggingface_hub's and httpx's failures as one line that says which and what to do."""
    import httpx
    from huggingface_hub.errors import (GatedRepoError, HfHubHTTPError, LocalEntryNotFoundError,
                                        RepositoryNotFoundError, RevisionNotFoundError)

    try:
        yield
    except GatedRepoError:
        raise Gguf2ovError(f"{repo_id} is a gated repository: its files need an accepted licence and a token",
                           hint=f"accept its conditions on https://huggingface.co/{repo_id}, then log in with "
                                "`hf auth login` or set HF_TOKEN") from None
    except RepositoryNotFoundError:
        raise Gguf2ovError(f"{repo_id}: no such repository on the Hugging Face Hub (or it is private)",
                           hint="check the name; for a private repository log in with `hf auth login` or set "
                                "HF_TOKEN") from None
    except RevisionNotFoundError:
        raise Gguf2ovError(f"{repo_id} has no main branch", hint="llama.cpp and gguf2ov take a hub name's files "
                                                                  "from main") from None
    except HfHubHTTPError as e:
        status = e.response.status_code if e.response is not None else "an error"
        hint = ("the token was refused: log in again with `hf auth login` or set another HF_TOKEN" if status == 401
                else "try again later; with the files already in the hub cache, set HF_HUB_OFFLINE=1")
        raise Gguf2ovError(f"the Hugging Face Hub answered {status} for {repo_id}"
                           f"{' ' + filename if filename else ''}", hint=hint) from None
    except LocalEntryNotFoundError:
        if offline:
            raise Gguf2ovError(f"{repo_id}: {filename} is not in the hub cache, and HF_HUB_OFFLINE is set",
                               hint=_fetch_hint(repo_id)) from None
        raise _network_error(repo_id, "the connection failed") from None
    except httpx.HTTPError as e:
        raise _network_error(repo_id, str(e).splitlines()[0] if str(e) else type(e).__name__) from None


def _network_error(repo_id: str, reason: str) -> Gguf2ovError:
    return Gguf2ovError(f"cannot reach the Hugging Face Hub for {repo_id}: {reason}",
                        hint="check the connection (and HTTPS_PROXY); to use only the files already in the hub "
                             "cache, set HF_HUB_OFFLINE=1")


def _fetch_hint(repo_id: str) -> str:
    return (f"fetch it online once (unset HF_HUB_OFFLINE), or with `hf download {repo_id} FILE`; llama.cpp's "
            "-hf fills the same cache unless LLAMA_CACHE points elsewhere (then set HF_HUB_CACHE to that folder)")


def _no_match(repo_id: str, tag: str | None, files: list[str], offline: bool) -> Gguf2ovError:
    ggufs = gguf_files(files)
    asked = f"the tag {tag}" if tag else f"the default order ({', '.join(DEFAULT_TAGS)}, then any model file)"
    among = "cached for it (HF_HUB_OFFLINE is set: only files fetched before are here)" if offline else "in it"
    found = f"the .gguf files {among}: {_some(ggufs, _SHOWN)}" if ggufs else f"there is no .gguf file {among}"
    hint = ("give a tag that one of these names holds, followed by '.' or '-' (mmproj, imatrix and eagle3-/mtp-/"
            "dspark- sidecar files are never the model)" if ggufs else
            _fetch_hint(repo_id) if offline else "a hub name must name a repository of GGUF files")
    return Gguf2ovError(f"{repo_id}: no GGUF model file matches {asked}; {found}", hint=hint)


def _some(names: list[str], n: int = 3) -> str:
    return ", ".join(names[:n]) + (f", ... {len(names) - n} more" if len(names) > n else "")
