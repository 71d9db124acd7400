"""Hub names `org/repo[:QUANT]` resolved as llama.cpp's `-hf` resolves them, through huggingface_hub's cache.

No network: the cache is written by hand in huggingface_hub's layout (`hubcache.populate`), and the
online path talks to `hubcache.FakeHub` on 127.0.0.1. The fixture draft is the content of every name.
"""

import json
import os
import socket
import subprocess
import sys

import numpy as np
import pytest
from gguf import GGUFWriter
from hubcache import COMMIT, FakeHub, populate
from huggingface_hub import constants

from gguf2ov.cli import main
from gguf2ov.errors import Gguf2ovError
from gguf2ov.gguf.hub import HubFile, choose_gguf, parse_spec, resolve_gguf, split_info, split_parts
from gguf2ov.provenance import provenance, sha256_file

REPO = "org/draft-GGUF"


@pytest.fixture
def cache(tmp_path, monkeypatch):
    cache = tmp_path / "hub-cache"
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    # huggingface_hub reads its environment once, at import, and this process imported it already
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(cache))
    return cache


@pytest.fixture
def draft(fixtures_dir):
    return fixtures_dir / "draft-Q4_K_M.gguf"


def one_error(argv, capsys) -> tuple[str, str]:
    """Run the CLI; it must fail with exactly one error line (and its hint), no traceback."""
    assert main([str(a) for a in argv]) == 1
    err = capsys.readouterr().err
    errors = [line for line in err.splitlines() if line.startswith("error: ")]
    hints = [line for line in err.splitlines() if line.startswith("hint: ")]
    assert len(errors) == 1 and len(hints) == 1 and "Traceback" not in err, err
    return errors[0], hints[0]


# --- which file: llama.cpp's rules, on file lists ----------------------------------------------------

def test_the_tag_matches_case_insensitively_when_a_dot_or_a_dash_follows():
    assert choose_gguf(["Draft-q4_k_m.gguf"], "Q4_K_M") == "Draft-q4_k_m.gguf"
    assert choose_gguf(["draft-Q4_K_M-v2.gguf"], "q4_k_m") == "draft-Q4_K_M-v2.gguf"
    assert choose_gguf(["draft-Q4_K_MX.gguf", "draft-Q4_K_M_L.gguf"], "Q4_K_M") is None
    assert choose_gguf(["draft-Q4_K_M.gguf"], "Q4_K") is None  # the tag is a whole quant name, not a prefix
    assert choose_gguf(["README.md", "Q4_K_M.txt"], "Q4_K_M") is None  # only .gguf files
    assert choose_gguf(["Q4_K_M/draft.gguf"], "Q4_K_M") is None  # "/" is neither "." nor "-"
    assert choose_gguf(["Q4_K_M-dir/draft.gguf"], "Q4_K_M") == "Q4_K_M-dir/draft.gguf"  # the path, not the name


def test_the_first_fitting_file_in_sorted_order():
    assert choose_gguf(["b-Q8_0.gguf", "a-Q8_0.gguf", "a-Q8_0.gguf.sha256"], "Q8_0") == "a-Q8_0.gguf"


def test_no_tag_takes_q4_k_m_then_q8_0_then_the_first_model_file():
    files = ["m-BF16.gguf", "m-F16.gguf", "m-Q8_0.gguf", "m-Q4_K_M.gguf"]
    assert choose_gguf(files, None) == "m-Q4_K_M.gguf"
    assert choose_gguf(files[:3], None) == "m-Q8_0.gguf"
    assert choose_gguf(files[:2], None) == "m-BF16.gguf"
    assert choose_gguf(["mmproj-m-Q4_K_M.gguf", "m-F16.gguf"], None) == "m-F16.gguf"
    assert choose_gguf(["config.json"], None) is None


def test_split_files_are_taken_from_part_one():
    files = [f"m-Q8_0-{i:05d}-of-00003.gguf" for i in (3, 2, 1)]
    assert choose_gguf(files[:2], "Q8_0") is None  # a later part never stands in for the model
    assert choose_gguf(files, "Q8_0") == "m-Q8_0-00001-of-00003.gguf"
    assert choose_gguf(files, None) == "m-Q8_0-00001-of-00003.gguf"
    assert split_parts("m-Q8_0-00001-of-00003.gguf") == tuple(reversed(files))
    assert split_parts("m-Q8_0.gguf") == ()
    assert split_info("dir/M-Q8_0-00002-OF-00003.GGUF") == ("dir/M-Q8_0", 2, 3)
    assert split_parts("dir/M-Q8_0-00001-OF-00002.GGUF") == ("dir/M-Q8_0-00001-OF-00002.GGUF",
                                                             "dir/M-Q8_0-00002-OF-00002.GGUF")


def test_projectors_imatrix_and_sidecars_are_never_the_model():
    files = ["mmproj-m-Q4_K_M.gguf", "m-MMPROJ-Q4_K_M.gguf", "m.imatrix-Q4_K_M.gguf", "eagle3-m-Q4_K_M.gguf",
             "mtp-m-Q4_K_M.gguf", "dspark-m-Q4_K_M.gguf", "z-m-Q4_K_M.gguf"]
    assert choose_gguf(files, "Q4_K_M") == "z-m-Q4_K_M.gguf"
    assert choose_gguf(files[:6], "Q4_K_M") is None
    # sidecar prefixes are matched as written: a model named after DFlash is a model
    assert choose_gguf(["Qwen3.8-27B-DFlash2-Q4_K_M.gguf"], "Q4_K_M") == "Qwen3.8-27B-DFlash2-Q4_K_M.gguf"


def test_dflash_sidecars_are_tried_after_the_model_files():
    target_pack = ["Qwen3-8B-Q4_K_M.gguf", "dflash-Qwen3-8B-Q4_K_M.gguf", "mmproj-Qwen3-8B-F16.gguf"]
    assert choose_gguf(target_pack, "Q4_K_M") == "Qwen3-8B-Q4_K_M.gguf"  # what llama.cpp's -hf loads
    assert choose_gguf(target_pack, "dflash") == "dflash-Qwen3-8B-Q4_K_M.gguf"  # the sidecar, by its prefix
    draft_repo = ["dflash-Qwen3-8B-Q8_0.gguf", "dflash-Qwen3-8B-Q4_K_M.gguf", "eagle3-Qwen3-8B-Q4_K_M.gguf"]
    assert choose_gguf(draft_repo, "Q4_K_M") == "dflash-Qwen3-8B-Q4_K_M.gguf"
    assert choose_gguf(draft_repo, None) == "dflash-Qwen3-8B-Q4_K_M.gguf"
    assert choose_gguf(["eagle3-Qwen3-8B-Q4_K_M.gguf", "mmproj-dflash-Qwen3-8B-Q4_K_M.gguf"], "Q4_K_M") is None


def test_hub_names_and_their_syntax():
    assert parse_spec("org/repo:Q4_K_M") == ("org/repo", "Q4_K_M")
    assert parse_spec("incoai/Qwen3.8-27B-DFlash2-GGUF") == ("incoai/Qwen3.8-27B-DFlash2-GGUF", None)
    for bad, why in [("org/repo:", "the quant tag '' is empty"), ("org/repo:Q4:K", "the quant tag 'Q4:K'"),
                     ("repo:Q4_K_M", "'repo' is not org/repo"), ("a/b/c:Q8_0", "'a/b/c' is not org/repo"),
                     ("org/re po:Q8_0", "Repo id must use alphanumeric chars"), ("org/a--b:Q8_0", "Cannot have --")]:
        with pytest.raises(Gguf2ovError) as e:
            parse_spec(bad)
        assert e.value.message.startswith(f"{bad} is neither a local file nor a hub name: ") and why in e.value.message
        assert "org/repo:QUANT" in e.value.hint


# --- the cache, offline -----------------------------------------------------------------------------

def test_a_hub_name_resolves_to_the_cached_file(cache, draft):
    snapshot = populate(cache, REPO, {"draft-Q8_0.gguf": draft, "draft-Q4_K_M.gguf": draft, "README.md": draft})
    assert (cache / "models--org--draft-GGUF" / "refs" / "main").read_bytes() == COMMIT.encode()
    found = resolve_gguf(f"{REPO}:q4_k_m")
    assert found == HubFile(repo_id=REPO, revision=COMMIT, filename="draft-Q4_K_M.gguf",
                            path=snapshot / "draft-Q4_K_M.gguf", tag="q4_k_m")
    assert open(found, "rb").read() == draft.read_bytes()  # a path-like: the reader opens it as it is
    assert resolve_gguf(REPO).filename == "draft-Q4_K_M.gguf"  # no tag: Q4_K_M first
    assert resolve_gguf(f"{REPO}:Q8_0").filename == "draft-Q8_0.gguf"
    record = provenance(sources={"draft": found})["sources"]["draft"]
    assert record == {"path": str(snapshot / "draft-Q4_K_M.gguf"), "sha256": sha256_file(draft),
                      "hub": {"repo": REPO, "revision": COMMIT, "file": "draft-Q4_K_M.gguf"}}


def test_provenance_records_each_kind_of_source_by_its_type(cache, draft):
    """A file taken from the hub keeps its repository, revision and file name whether it is recorded
    as it was found, opened or read through its map; a path is hashed; anything else is refused, not
    recorded by whatever `.path` it has."""
    import types

    from gguf2ov.draft.source import open_draft_gguf
    from gguf2ov.gguf.read import open_gguf
    from gguf2ov.provenance import source_record

    populate(cache, REPO, {"draft-Q4_K_M.gguf": draft})
    found = resolve_gguf(f"{REPO}:Q4_K_M")
    hub = {"path": str(found.path), "sha256": sha256_file(draft),
           "hub": {"repo": REPO, "revision": COMMIT, "file": "draft-Q4_K_M.gguf"}}
    assert source_record(found) == source_record(open_gguf(found)) == source_record(open_draft_gguf(open_gguf(found))) == hub
    local = {"path": str(draft), "sha256": sha256_file(draft)}
    assert source_record(draft) == source_record(str(draft)) == source_record(open_gguf(draft)) == local
    assert source_record(local) is local  # recorded already
    with pytest.raises(TypeError, match="records no SimpleNamespace"):
        source_record(types.SimpleNamespace(path=draft))


def test_a_local_path_wins_and_path_like_names_stay_paths(cache, draft, tmp_path, monkeypatch):
    populate(cache, REPO, {"draft-Q4_K_M.gguf": draft})
    monkeypatch.chdir(tmp_path)
    (tmp_path / "org").mkdir()
    (tmp_path / "org" / "draft-GGUF:Q4_K_M").write_bytes(b"local")
    assert resolve_gguf(f"{REPO}:Q4_K_M") == tmp_path.joinpath("org", "draft-GGUF:Q4_K_M").relative_to(tmp_path)
    assert isinstance(resolve_gguf(REPO), HubFile)
    for path in ("out/draft.gguf", "./org/draft-GGUF", "/no/such/dir", "a/b/c", "draft.gguf"):
        assert resolve_gguf(path) == type(tmp_path)(path)


def test_a_split_file_gives_part_one_with_every_part_found(cache, draft):
    names = [f"sub/draft-Q8_0-{i:05d}-of-00003.gguf" for i in (1, 2, 3)]
    snapshot = populate(cache, REPO, {name: draft for name in names})
    found = resolve_gguf(f"{REPO}:Q8_0")
    assert found.filename == names[0] and found.path == snapshot / names[0] and found.parts == tuple(names)
    assert found.hub_record()["parts"] == names
    assert "part 1 of 3" in found.describe()


def test_a_split_model_cannot_be_read_and_says_how_to_merge_it(cache, tmp_path, capsys):
    parts = tmp_path / "written"
    parts.mkdir()
    w = GGUFWriter(parts / "m-Q8_0.gguf", "dflash", split_max_tensors=1)
    w.add_tensor("a.weight", np.zeros(4, np.float32))
    w.add_tensor("b.weight", np.zeros(4, np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    populate(cache, REPO, {p.name: p for p in parts.iterdir()})
    error, hint = one_error(["inspect", f"{REPO}:Q8_0"], capsys)
    assert error.endswith("m-Q8_0-00001-of-00002.gguf: part 1 of 2 of a split GGUF; "
                          "gguf2ov reads a model from one file")
    assert "llama-gguf-split --merge PART1 merged.gguf" in hint and "-00001-of-00002" in hint
    error, _ = one_error(["inspect", parts / "m-Q8_0-00002-of-00002.gguf"], capsys)  # a local part too
    assert "part 2 of 2 of a split GGUF" in error


def test_inspect_by_hub_name(cache, draft, capsys):
    populate(cache, REPO, {"draft-Q4_K_M.gguf": draft})
    assert main(["inspect", f"{REPO}:Q4_K_M", "--json", "-"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["arch"] == "dflash" and data["map_fits"] is True
    assert data["hub"] == {"repo_id": REPO, "revision": COMMIT, "filename": "draft-Q4_K_M.gguf", "tag": "Q4_K_M",
                           "path": data["path"], "parts": []}
    assert main(["inspect", REPO]) == 0
    assert f"from the hub: {REPO} -> draft-Q4_K_M.gguf (revision {COMMIT[:12]})" in capsys.readouterr().out


def test_an_export_by_hub_name_records_the_repository_revision_and_file(cache, draft, tmp_path):
    populate(cache, REPO, {"draft-Q4_K_M.gguf": draft})
    out = tmp_path / "draft"
    assert main(["export", f"{REPO}:Q4_K_M", "-o", str(out), "--quiet"]) == 0
    record = json.loads((out / "gguf2ov.json").read_text())["sources"]["source"]
    assert record["hub"] == {"repo": REPO, "revision": COMMIT, "file": "draft-Q4_K_M.gguf"}
    assert record["sha256"] == sha256_file(draft)


@pytest.mark.parametrize("home", [False, True])
def test_the_command_reads_huggingface_hubs_environment(draft, tmp_path, home):
    """In a fresh process, as a user runs it: HF_HUB_CACHE, or HF_HOME/hub, and HF_HUB_OFFLINE=1."""
    cache = tmp_path / "home" / "hub" if home else tmp_path / "cache"
    populate(cache, REPO, {"draft-Q4_K_M.gguf": draft})
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "HUGGINGFACE_"))}
    env["HF_HUB_OFFLINE"] = "1"
    env.update({"HF_HOME": str(tmp_path / "home")} if home else {"HF_HUB_CACHE": str(cache)})
    out = subprocess.run([sys.executable, "-m", "gguf2ov", "inspect", f"{REPO}:Q4_K_M", "--json", "-"], env=env,
                         capture_output=True, text=True, check=True).stdout
    assert json.loads(out)["hub"]["path"] == str(cache / "models--org--draft-GGUF" / "snapshots" / COMMIT /
                                                 "draft-Q4_K_M.gguf")


def test_offline_errors_are_one_line(cache, draft, capsys):
    error, hint = one_error(["inspect", f"{REPO}:Q4_K_M"], capsys)
    assert error == f"error: {REPO} is not in the hub cache {cache} (no refs/main), and HF_HUB_OFFLINE is set"
    assert f"hf download {REPO} FILE" in hint and "LLAMA_CACHE" in hint

    populate(cache, REPO, {"draft-Q8_0.gguf": draft, "mmproj-draft-Q4_K_M.gguf": draft, "notes.txt": draft})
    error, hint = one_error(["inspect", f"{REPO}:Q4_K_M"], capsys)
    assert error == (f"error: {REPO}: no GGUF model file matches the tag Q4_K_M; the .gguf files cached for it "
                     "(HF_HUB_OFFLINE is set: only files fetched before are here): draft-Q8_0.gguf, "
                     "mmproj-draft-Q4_K_M.gguf")
    assert "give a tag that one of these names holds" in hint

    populate(cache, REPO, {"draft-Q4_K_M-00001-of-00003.gguf": draft, "draft-Q4_K_M-00003-of-00003.gguf": draft})
    error, _ = one_error(["inspect", f"{REPO}:Q4_K_M"], capsys)
    assert error == (f"error: {REPO}: draft-Q4_K_M-00001-of-00003.gguf is part 1 of 3, and "
                     "draft-Q4_K_M-00002-of-00003.gguf is not in the hub cache (HF_HUB_OFFLINE is set)")

    (cache / "models--org--draft-GGUF" / "refs" / "main").write_text("f" * 40)
    error, _ = one_error(["inspect", REPO], capsys)
    assert error == (f"error: {REPO}: the hub cache's refs/main names the snapshot '{'f' * 40}', which {cache} "
                     "does not hold, and HF_HUB_OFFLINE is set")

    (cache / "models--org--draft-GGUF" / "refs" / "main").write_text("v1.0")
    error, _ = one_error(["inspect", REPO], capsys)
    assert error == f"error: {REPO}: the hub cache's refs/main holds 'v1.0', not a commit hash"

    error, hint = one_error(["inspect", "org/repo:Q4:K"], capsys)
    assert error.startswith("error: org/repo:Q4:K is neither a local file nor a hub name: the quant tag 'Q4:K'")


def test_a_snapshot_link_without_its_blob_is_not_a_cached_file(cache, draft, capsys):
    snapshot = populate(cache, REPO, {"draft-Q4_K_M.gguf": draft, "draft-Q8_0.gguf": draft.parent / "fixture.json"})
    (snapshot / "draft-Q4_K_M.gguf").resolve().unlink()  # an interrupted download, a cleaned cache
    assert resolve_gguf(REPO).filename == "draft-Q8_0.gguf"
    error, _ = one_error(["inspect", f"{REPO}:Q4_K_M"], capsys)
    assert "no GGUF model file matches the tag Q4_K_M; the .gguf files cached for it" in error


# --- online, against a hub on 127.0.0.1 ----------------------------------------------------------------

@pytest.fixture
def online(monkeypatch, cache):
    """huggingface_hub online, with its endpoint set as HF_ENDPOINT would set it at import."""
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)

    def endpoint(url):
        monkeypatch.setattr(constants, "ENDPOINT", url)
        monkeypatch.setattr(constants, "HUGGINGFACE_CO_URL_TEMPLATE", url + "/{repo_id}/resolve/{revision}/{filename}")
    return endpoint


def test_online_lists_the_repository_and_fetches_every_part_into_the_cache(online, cache, draft, monkeypatch):
    parts = [f"draft-Q4_K_M-{i:05d}-of-00002.gguf" for i in (1, 2)]
    repo = {"draft-Q8_0.gguf": draft, "mmproj-Q4_K_M.gguf": draft, **{p: draft for p in parts}}
    monkeypatch.setenv("HF_TOKEN", "hf_test_token")
    with FakeHub({REPO: repo}) as hub:
        online(hub.url)
        found = resolve_gguf(REPO)
    assert found.filename == parts[0] and found.parts == tuple(parts) and found.revision == COMMIT
    snapshot = cache / "models--org--draft-GGUF" / "snapshots" / COMMIT
    assert found.path == snapshot / parts[0] and all((snapshot / p).read_bytes() == draft.read_bytes() for p in parts)
    assert not (snapshot / "draft-Q8_0.gguf").exists()  # only the chosen file is fetched
    assert (cache / "models--org--draft-GGUF" / "refs" / "main").read_text() == COMMIT
    assert {auth for _, _, auth in hub.requests} == {"Bearer hf_test_token"}  # the user's token
    assert ("GET", f"/api/models/{REPO}/tree/main") in {(m, p) for m, p, _ in hub.requests}
    # what was fetched is then found offline, as llama.cpp or `hf download` left it
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    assert resolve_gguf(REPO) == found


def test_online_errors_are_one_line(online, draft, capsys):
    with FakeHub({REPO: {"draft-Q8_0.gguf": draft, "README.md": draft}}) as hub:
        online(hub.url)
        error, hint = one_error(["inspect", "org/missing:Q4_K_M"], capsys)
        assert error == "error: org/missing: no such repository on the Hugging Face Hub (or it is private)"
        assert "hf auth login" in hint and "HF_TOKEN" in hint
        error, hint = one_error(["inspect", f"{REPO}:Q4_K_M"], capsys)
        assert error == (f"error: {REPO}: no GGUF model file matches the tag Q4_K_M; "
                         "the .gguf files in it: draft-Q8_0.gguf")
    with socket.socket() as s:  # a port nobody listens on: the connection is refused at once
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    online(f"http://127.0.0.1:{port}")
    error, hint = one_error(["inspect", f"{REPO}:Q4_K_M"], capsys)
    assert error.startswith(f"error: cannot reach the Hugging Face Hub for {REPO}: ")
    assert "HF_HUB_OFFLINE=1" in hint
