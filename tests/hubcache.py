"""Hugging Face Hub repositories for tests, without a network.

- `populate()` writes files into huggingface_hub's cache layout as `hf download` (and llama.cpp's
  `-hf`) leave it: `models--org--repo/blobs/<sha256>`, `snapshots/<commit>/<file>` linking to the
  blob, and `refs/main` holding the commit with no trailing newline (huggingface_hub reads it as it is).
- `FakeHub` serves a few repositories on 127.0.0.1 with the two endpoints huggingface_hub calls for
  `list_repo_files` and `hf_hub_download` (the tree listing; HEAD and GET of `resolve/main/<file>`).
"""

import hashlib
import json
import os
import shutil
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import unquote, urlsplit

COMMIT = "0123456789abcdef0123456789abcdef01234567"


def populate(cache: Path, repo_id: str, files: dict[str, Path], commit: str = COMMIT) -> Path:
    """Put `files` (name in the repository -> content file) into `cache`; returns the snapshot folder."""
    storage = cache / ("models--" + repo_id.replace("/", "--"))
    snapshot = storage / "snapshots" / commit
    for name, source in files.items():
        data = Path(source).read_bytes()
        blob = storage / "blobs" / hashlib.sha256(data).hexdigest()
        if not blob.exists():
            blob.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(source, blob)
        link = snapshot / name
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(os.path.relpath(blob, link.parent))
    (storage / "refs").mkdir(parents=True, exist_ok=True)
    (storage / "refs" / "main").write_text(commit)
    return snapshot


class FakeHub:
    """`repos`: repo id -> {name in the repository: content file}. `requests` records (method, path,
    Authorization header). A repository not in `repos` answers 404 RepoNotFound, as the hub does."""

    def __init__(self, repos: dict[str, dict[str, Path]], commit: str = COMMIT):
        self.repos, self.commit, self.requests = repos, commit, []
        hub = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_GET(self):
                hub.answer(self, body=True)

            def do_HEAD(self):
                hub.answer(self, body=False)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.server.shutdown()
        self.server.server_close()

    def answer(self, handler, body: bool) -> None:
        path = unquote(urlsplit(handler.path).path)
        self.requests.append((handler.command, path, handler.headers.get("Authorization")))
        if path.startswith("/api/models/"):
            repo_id = path[len("/api/models/"):].split("/tree/")[0]
            if repo_id in self.repos:
                listing = [{"type": "file", "path": name, "size": Path(f).stat().st_size, "oid": _sha1(f)}
                           for name, f in self.repos[repo_id].items()]
                return self._send(handler, 200, json.dumps(listing).encode(), "application/json", body)
            return self._send(handler, 404, b"{}", "application/json", body, {"X-Error-Code": "RepoNotFound"})
        repo_id, _, rest = path.lstrip("/").partition("/resolve/main/")
        source = self.repos.get(repo_id, {}).get(rest)
        if source is None:
            code = "EntryNotFound" if repo_id in self.repos else "RepoNotFound"
            return self._send(handler, 404, b"", "text/plain", body, {"X-Error-Code": code})
        data = Path(source).read_bytes()
        headers = {"X-Repo-Commit": self.commit, "ETag": f'"{hashlib.sha256(data).hexdigest()}"'}
        self._send(handler, 200, data, "application/octet-stream", body, headers)

    @staticmethod
    def _send(handler, status, data, content_type, body, headers=None):
        handler.send_response(status)
        handler.send_header("Content-Type", content_type)
        handler.send_header("Content-Length", str(len(data)))
        for key, value in (headers or {}).items():
            handler.send_header(key, value)
        handler.end_headers()
        if body:
            handler.wfile.write(data)


def _sha1(path) -> str:
    return hashlib.sha1(Path(path).read_bytes()).hexdigest()
