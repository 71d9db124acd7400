"""llama.cpp as a reference: fetch a pinned source, build its CPU tools once into a cache folder.

The source is the llama-cpp-python 0.3.36 sdist from PyPI, which vendors llama.cpp 0c1e570
(`vendor/llama.cpp`). It is fetched with pip, unpacked and built with cmake (CPU only, no curl,
no server) into `~/.cache/gguf2ov/llama.cpp-0c1e570/` (override with `GGUF2OV_LLAMACPP_DIR`):

    src/      llama.cpp's source tree (convert_hf_to_gguf.py, gguf-py, ...)
    build/    cmake build folder; the tools are in build/bin/
    sdist/    the downloaded sdist
    built.json  commit, sdist sha256, targets, build seconds (written last: its presence means done)

Nothing of llama.cpp is put in the repository. Other benchmarks import `tool(name)`, `source_dir()`,
`convert(hf, out, outtype)` (its convert_hf_to_gguf.py) and `quantize(src, out, mix)` (llama-quantize);
a second call finds the finished build and returns at once.

    python -m benchmarks.llamacpp.tools [--jobs 2]      # prints the tool folder

Measured on 2 shared cores: 267 s for the targets below (the sdist is 76 MB).
"""

import argparse
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

SDIST = "llama-cpp-python==0.3.36"
SDIST_DIR = "llama_cpp_python-0.3.36"
COMMIT = "0c1e57098bba43ac29e6e3b677cdceebdd22334f"
TARGETS = ("llama-tokenize", "llama-quantize", "llama-simple", "llama-completion", "llama-bench",
           "llama-speculative-simple")
# CPU only (llama.cpp's default, tuned for this machine: GGML_NATIVE), static tools, no HTTPS.
CMAKE_FLAGS = ("-DCMAKE_BUILD_TYPE=Release", "-DBUILD_SHARED_LIBS=OFF", "-DLLAMA_OPENSSL=OFF",
               "-DLLAMA_BUILD_SERVER=OFF", "-DLLAMA_BUILD_TESTS=OFF")


def cache_dir() -> Path:
    default = Path.home() / ".cache" / "gguf2ov" / f"llama.cpp-{COMMIT[:7]}"
    return Path(os.environ.get("GGUF2OV_LLAMACPP_DIR", default))


def source_dir() -> Path:
    return cache_dir() / "src"


def built() -> dict | None:
    """The build record, or None when the tools are not (fully) built."""
    record = cache_dir() / "built.json"
    return json.loads(record.read_text()) if record.exists() else None


def tool(name: str) -> Path:
    """The path of a built llama.cpp tool, building everything first if needed."""
    if built() is None:
        build()
    path = cache_dir() / "build" / "bin" / name
    if not path.exists():
        raise FileNotFoundError(f"{path}: not built (targets: {', '.join(TARGETS)})")
    return path


# The converter does not know the pre-tokenizer hash of the benchmarks' tokenizers (the fixture's, padded):
# it is told it is qwen2's, as for a real Qwen3 tokenizer.
CONVERT_SHIM = (
    "import runpy, sys\nsrc = sys.argv[1]; sys.path[:0] = [src, src + '/gguf-py']\n"
    "import conversion.base as base\nbase.TextModel.get_vocab_base_pre = lambda self, tokenizer: 'qwen2'\n"
    "sys.argv = [src + '/convert_hf_to_gguf.py', *sys.argv[2:]]\nrunpy.run_path(sys.argv[0], run_name='__main__')\n")


def convert(hf: Path, out: Path, outtype: str, *flags: str, shim: str = CONVERT_SHIM) -> Path:
    """llama.cpp's convert_hf_to_gguf.py on the checkpoint `hf` (`flags` such as --no-mtp), run by this
    Python with llama.cpp's own gguf-py through `shim` (one that patches the converter: gemma4_vlm.py's).
    Its sentencepiece import (made before it looks for tokenizer.model) is satisfied from a folder beside
    the build."""
    src = source_dir()
    pydeps = src.parent / "pydeps"
    if not (pydeps / "sentencepiece").is_dir():
        subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--target", str(pydeps), "sentencepiece"],
                       check=True)
    env = dict(os.environ, PYTHONPATH=str(pydeps))
    done = subprocess.run([sys.executable, "-c", shim, str(src), str(hf), "--outtype", outtype,
                           "--outfile", str(out), *flags], env=env, capture_output=True, text=True)
    if done.returncode:
        raise SystemExit(f"convert_hf_to_gguf.py failed:\n{done.stderr[-3000:]}")
    return Path(out)


def quantize(src: Path, out: Path, mix: str = "Q4_K_M", threads: int = 2) -> Path:
    """llama-quantize; to F32 it dequantizes a quantized file (--allow-requantize). The file is written beside
    `out` and renamed to it when whole, so that an interrupted run leaves no file a cache would take."""
    flags = ["--allow-requantize"] if mix == "F32" else []
    out = Path(out)
    partial = out.with_name(out.name + ".partial")
    subprocess.run([str(tool("llama-quantize")), *flags, str(src), str(partial), mix, str(threads)], check=True,
                   capture_output=True)
    return partial.replace(out)


def build(jobs: int = 2) -> dict:
    root = cache_dir()
    root.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    sdist = _download(root / "sdist")
    _unpack(sdist, root / "src")
    build_dir = root / "build"
    subprocess.run(["cmake", "-S", str(root / "src"), "-B", str(build_dir), *CMAKE_FLAGS], check=True)
    subprocess.run(["cmake", "--build", str(build_dir), "-j", str(jobs), "--target", *TARGETS], check=True)
    record = {"commit": COMMIT, "sdist": SDIST, "sdist_sha256": _sha256(sdist), "targets": list(TARGETS),
              "cmake_flags": list(CMAKE_FLAGS), "build_seconds": round(time.perf_counter() - start)}
    (root / "built.json").write_text(json.dumps(record, indent=1) + "\n")
    return record


def _download(folder: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    found = sorted(folder.glob(f"{SDIST_DIR}.tar.gz"))
    if not found:
        subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", "llama-cpp-python",
                        SDIST, "-d", str(folder)], check=True)
        found = sorted(folder.glob(f"{SDIST_DIR}.tar.gz"))
    return found[0]


def _unpack(sdist: Path, dest: Path) -> None:
    """Only `vendor/llama.cpp`, checked to be the pinned commit (the sdist keeps its git HEAD)."""
    if dest.exists():
        shutil.rmtree(dest)
    prefix = f"{SDIST_DIR}/vendor/llama.cpp/"
    head = f"{SDIST_DIR}/.git/modules/vendor/llama.cpp/HEAD"
    with tempfile.TemporaryDirectory(dir=dest.parent) as tmp, tarfile.open(sdist) as tar:
        members = [m for m in tar.getmembers() if m.name.startswith(prefix) or m.name == head]
        tar.extractall(tmp, members=members, filter="data")
        commit = (Path(tmp) / head).read_text().strip()
        if commit != COMMIT:
            raise RuntimeError(f"{sdist}: vendors llama.cpp {commit}, expected {COMMIT}")
        (Path(tmp) / prefix / ".git").unlink()  # points into the sdist's git folder, left behind
        (Path(tmp) / prefix).rename(dest)


def _sha256(path: Path) -> str:
    import hashlib

    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--rebuild", action="store_true", help="build again even if a finished build exists")
    args = parser.parse_args()
    record = built()
    if record is None or args.rebuild:
        record = build(args.jobs)
    print(json.dumps(record, indent=1))
    print(cache_dir() / "build" / "bin")


if __name__ == "__main__":
    main()
