"""Time and peak RSS of gguf2ov's commands on real-size DFlash drafts, and how they grow with size.

For each geometry (benchmarks/scale_gguf.py builds the Q4_K_M GGUF from random valid blocks in
seconds and caches it under results/cache/), each command runs in a fresh process under
`/usr/bin/time -f "%e %M"` (elapsed s, peak RSS KiB; written with -o to its own file):

    inspect      gguf2ov inspect FILE
    convert      gguf2ov convert FILE -o OUT --dtype bf16      (kept as the reference of `check`)
    check        gguf2ov check FILE --reference CONVERTED_BF16
    export-gguf  gguf2ov export FILE -o OUT --weight-format gguf
    export-int4  gguf2ov export FILE -o OUT --weight-format int4 --group-size 16
    export-fp32  gguf2ov export FILE -o OUT --weight-format fp32
    export-ckpt-int4  gguf2ov export CONVERTED_BF16 -o OUT --weight-format int4 --group-size 16
    drift        gguf2ov drift FILE -o OUT                     (default variants, no target)

Recorded per size x command: seconds, peak RSS, exit code, output bytes (the output folder, then
deleted), GGUF bytes, parameters, out/GGUF and peak-RSS/out ratios, the last error line of a
failing command. Written to results/scale.json (with machine info and package versions),
results/scale.md and results/scale.png (time and peak RSS against parameters, one line per
command); the table is printed too. Outputs go to results/scale-work/, logs to results/scale-logs/.

Memory guard (`--max-rss-gb`, default 75% of RAM): a command is skipped before it starts when
  - `--skip CMD@SIZE` names it (fnmatch patterns; CMD may be the short form: fp32, int4, gguf),
  - the previous results file recorded it over the limit at that size, or
  - its peak RSS extrapolated (a line in parameters through the two largest smaller sizes
    measured in this run) exceeds the limit;
and a running command whose process tree passes the limit is killed (recorded as `killed`).

    python -m benchmarks.bench_scale --sizes tiny                        # smoke run, ~3 min
    python -m benchmarks.bench_scale --sizes tiny,small
    python -m benchmarks.bench_scale --sizes qwen3-8b-dflash,guide-1.3b --commands inspect,convert
    python -m benchmarks.bench_scale --skip 'fp32@qwen3-8b-dflash,drift@guide-1.3b' --max-rss-gb 16
    python -m benchmarks.bench_scale --plot-only                         # redraw from scale.json
"""

import argparse
import fnmatch
import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from dataclasses import asdict
from datetime import datetime, timezone
from pathlib import Path

from benchmarks.common import REPO, RESULTS, folder_bytes, machine_info, meminfo_kib, package_versions
from benchmarks.scale_gguf import CACHE, GEOMETRIES, check_values, ensure_gguf

GGUF2OV = Path(sys.executable).with_name("gguf2ov")
TIME = "/usr/bin/time"

# name -> (argv after `gguf2ov` with {gguf} {out} {ref} placeholders, writes an output folder, needs)
COMMANDS = {
    "inspect": (["inspect", "{gguf}"], False, None),
    "convert": (["convert", "{gguf}", "-o", "{out}", "--dtype", "bf16", "--overwrite"], True, None),
    "check": (["check", "{gguf}", "--reference", "{ref}"], False, "convert"),
    "export-gguf": (["export", "{gguf}", "-o", "{out}", "--weight-format", "gguf", "--overwrite"], True, None),
    "export-int4": (["export", "{gguf}", "-o", "{out}", "--weight-format", "int4", "--group-size", "16",
                     "--overwrite"], True, None),
    "export-fp32": (["export", "{gguf}", "-o", "{out}", "--weight-format", "fp32", "--overwrite"], True, None),
    # a checkpoint folder as the source (the bf16 checkpoint `convert` wrote), read through safetensors' mmap
    "export-ckpt-int4": (["export", "{ref}", "-o", "{out}", "--weight-format", "int4", "--group-size", "16",
                          "--overwrite"], True, "convert"),
    "drift": (["drift", "{gguf}", "-o", "{out}", "--overwrite"], True, None),
}
GIB = 2**30


# -- machine ---------------------------------------------------------------------------------------

def source_state() -> dict:
    """The commit measured, and whether the package differed from it (others edit concurrently)."""
    def git(*args):
        r = subprocess.run(["git", "-C", str(REPO), *args], capture_output=True, text=True)
        return r.stdout.strip() if r.returncode == 0 else None

    r = subprocess.run(["git", "-C", str(REPO), "status", "--porcelain", "--", "gguf2ov", "tensor_maps",
                        "pyproject.toml"], capture_output=True, text=True)
    dirty = r.stdout.rstrip() if r.returncode == 0 else ""
    return {"commit": git("rev-parse", "HEAD"), "package_modified": sorted(dirty.splitlines()) if dirty else [],
            "package_sha256": package_hash()}


def package_hash() -> str:
    """Hash of the package's sources and maps right now: rows measured on different code differ."""
    h = hashlib.sha256()
    for f in sorted([*(REPO / "gguf2ov").glob("*.py"), *(REPO / "tensor_maps").glob("*.yaml")]):
        h.update(f.name.encode())
        h.update(f.read_bytes())
    return h.hexdigest()[:12]


# -- one measured command --------------------------------------------------------------------------

def _descendants(pid: int) -> list[int]:
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        try:
            for task in os.listdir(f"/proc/{p}/task"):
                kids = Path(f"/proc/{p}/task/{task}/children").read_text().split()
                todo.extend(int(k) for k in kids)
                out.extend(int(k) for k in kids)
        except OSError:
            pass
    return out


def _pss_kib(pid: int) -> int:
    """Proportional set size: pages shared by forked processes are split between them, not counted
    once per process as VmRSS would (falls back to VmRSS without smaps_rollup)."""
    for path, field in ((f"/proc/{pid}/smaps_rollup", "Pss:"), (f"/proc/{pid}/status", "VmRSS:")):
        try:
            for line in Path(path).read_text().splitlines():
                if line.startswith(field):
                    return int(line.split()[1])
        except OSError:
            continue
    return 0


class Watchdog:
    """Samples the memory of the measured command's process tree (sum of PSS); kills the tree (not
    `time`) past a limit or a timeout, so that /usr/bin/time still reports the time and the peak.

    A value counts only when two consecutive samples reach it: a library that starts a helper
    program (vfork + exec) briefly shows a child sharing the parent's whole address space, which
    would count the parent twice.
    """

    def __init__(self, proc: subprocess.Popen, limit_kib: int | None, timeout: float | None, period: float = 0.5):
        self.proc, self.limit, self.timeout, self.period = proc, limit_kib, timeout, period
        self.peak_kib, self.killed = 0, None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._start = time.monotonic()

    def _kill(self, why: str) -> None:
        self.killed = why
        for pid in _descendants(self.proc.pid):  # the command (and its children), started by us
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass

    def _run(self) -> None:
        previous = 0
        while not self._stop.wait(self.period):
            sample = sum(_pss_kib(p) for p in _descendants(self.proc.pid))
            rss, previous = min(sample, previous), sample
            self.peak_kib = max(self.peak_kib, rss)
            if self.killed:
                continue
            if self.limit and rss > self.limit:
                self._kill(f"process tree memory (PSS) {rss / 2**20:.1f} GiB passed --max-rss-gb {self.limit / 2**20:.1f}")
            elif self.timeout and time.monotonic() - self._start > self.timeout:
                self._kill(f"timeout after {self.timeout:.0f} s")

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()


def _last_error_line(text: str) -> str | None:
    lines = [seg.strip() for line in text.splitlines() for seg in line.split("\r") if seg.strip()]
    errors = [ln for ln in lines if ln.startswith("error:")]
    return (errors[-1] if errors else lines[-1] if lines else None)


def _rel(path) -> str:
    path = Path(path)
    return str(path.relative_to(REPO)) if path.is_relative_to(REPO) else str(path)


def run_measured(argv: list[str], log_stem: Path, limit_kib: int | None, timeout: float | None, env: dict) -> dict:
    log_stem.parent.mkdir(parents=True, exist_ok=True)
    time_file = log_stem.with_suffix(".time")
    time_file.unlink(missing_ok=True)
    out_path, err_path = log_stem.with_suffix(".stdout"), log_stem.with_suffix(".stderr")
    cmd = [TIME, "-f", "%e %M", "-o", str(time_file), *argv]
    wall = time.perf_counter()
    with open(out_path, "w") as out, open(err_path, "w") as err:
        proc = subprocess.Popen(cmd, stdout=out, stderr=err, stdin=subprocess.DEVNULL, env=env, cwd=REPO)
        with Watchdog(proc, limit_kib, timeout) as dog:
            code = proc.wait()
    wall = time.perf_counter() - wall
    seconds = peak_kib = None
    time_text = time_file.read_text() if time_file.is_file() else ""
    for line in reversed(time_text.strip().splitlines()):  # "Command exited with non-zero status 1" first
        parts = line.split()
        if len(parts) == 2:
            try:
                seconds, peak_kib = float(parts[0]), int(parts[1])
                break
            except ValueError:
                continue
    stderr = err_path.read_text(errors="replace")
    return {"exit_code": code, "seconds": seconds if seconds is not None else round(wall, 2),
            "peak_rss_kib": peak_kib, "sampled_peak_tree_pss_kib": dog.peak_kib or None, "killed": dog.killed,
            "error": _last_error_line(stderr) if code else None,
            "time_output": time_text.strip(), "logs": _rel(log_stem) + ".{stdout,stderr,time}"}


# -- the guard -------------------------------------------------------------------------------------

def _matches(pattern: str, command: str, size: str) -> bool:
    cmd_pat, _, size_pat = pattern.partition("@")
    size_pat = size_pat or "*"
    short = command.removeprefix("export-")
    return (fnmatch.fnmatch(command, cmd_pat) or fnmatch.fnmatch(short, cmd_pat)) and fnmatch.fnmatch(size, size_pat)


def predicted_rss_kib(command: str, params: int, rows: list[dict]) -> tuple[float | None, str]:
    """Peak RSS at `params` extrapolated from this run's two largest smaller sizes (a line in
    parameters: import baseline plus a per-parameter cost); None with fewer than two."""
    pts = sorted((r["parameters"], r["peak_rss_kib"]) for r in rows
                 if r["command"] == command and r["status"] == "ok" and r["peak_rss_kib"]
                 and r["parameters"] < params)
    if len(pts) < 2:  # one point cannot separate the import baseline from the per-parameter cost
        return None, ""
    (p0, m0), (p1, m1) = pts[-2], pts[-1]
    slope = max(0.0, (m1 - m0) / (p1 - p0))
    return m1 + slope * (params - p1), f"line through {p0 / 1e9:.3f} B and {p1 / 1e9:.3f} B"


def skip_reason(command: str, size: str, params: int, args, rows: list[dict], known: list[dict],
                limit_kib: int | None) -> tuple[str | None, int | None]:
    """(why to skip, the known peak it is based on), or (None, None) to run it."""
    for pattern in args.skip:
        if _matches(pattern, command, size):
            return f"--skip {pattern}", None
    if not limit_kib:
        return None, None
    for r in known:
        if r.get("command") == command and r.get("size") == size and r.get("geometry_key") == GEOMETRIES[size].key():
            peak = r.get("peak_rss_kib") or r.get("known_peak_rss_kib") or 0
            if peak > limit_kib or (r.get("killed") or "").startswith("process tree memory"):
                return (f"known too big: {args.known.name} records {peak / 2**20:.1f} GiB "
                        f"({r.get('status')}) > --max-rss-gb {limit_kib / 2**20:.1f}"), peak
    guess, how = predicted_rss_kib(command, params, rows)
    if guess is not None and guess > limit_kib:
        return f"predicted {guess / 2**20:.1f} GiB > --max-rss-gb {limit_kib / 2**20:.1f} ({how})", None
    return None, None


# -- the run ---------------------------------------------------------------------------------------

def bench_size(size: str, commands: list[str], args, rows: list[dict], known: list[dict], limit_kib, env) -> dict:
    geom = GEOMETRIES[size]
    print(f"\n== {size}: {geom.parameters / 1e9:.3f} B parameters", flush=True)
    build = ensure_gguf(geom, args.cache_dir, rebuild=args.rebuild)
    gguf = Path(build["path"])
    print(f"   GGUF {gguf.name}: {build['bytes'] / 2**20:.1f} MiB, "
          f"{'cached (built in' if build['cached'] else 'built in'} {build['build_seconds']} s"
          f"{')' if build['cached'] else ''}", flush=True)
    build["values"] = check_values(gguf)
    work = args.work / size
    work.mkdir(parents=True, exist_ok=True)
    ref = work / "convert"
    for command in commands:
        template, writes, needs = COMMANDS[command]
        out = work / command
        row = {"size": size, "geometry_key": geom.key(), "command": command, "parameters": geom.parameters,
               "gguf_bytes": build["bytes"], "status": None, "exit_code": None, "seconds": None,
               "peak_rss_kib": None, "peak_rss_mib": None, "sampled_peak_tree_pss_kib": None, "out_bytes": None,
               "out_over_gguf": None, "rss_over_out": None, "error": None, "killed": None, "skip_reason": None}
        argv = [str(GGUF2OV), *(a.format(gguf=gguf, out=out, ref=ref) for a in template)]
        row["argv"] = " ".join(_rel(a) if a.startswith(str(REPO)) else a for a in argv)
        reason, known_peak = skip_reason(command, size, geom.parameters, args, rows, known, limit_kib)
        if reason is None and needs and not (ref / "config.json").is_file():
            reason = f"needs the output of {needs}, which is absent"
        if reason:
            row |= {"status": "skipped", "skip_reason": reason}
            if known_peak:
                row["known_peak_rss_kib"] = known_peak  # kept, so the next run still knows
            print(f"   {command:12} skipped: {reason}", flush=True)
            rows.append(row)
            continue
        row["package_sha256"] = package_hash()
        print(f"   {command:12} ...", end="", flush=True)
        r = run_measured(argv, args.logs / size / command, limit_kib, args.timeout, env)
        row |= {k: r[k] for k in ("exit_code", "seconds", "peak_rss_kib", "sampled_peak_tree_pss_kib", "error",
                                  "killed", "logs")}
        row["status"] = "killed" if r["killed"] else "ok" if r["exit_code"] == 0 else "failed"
        if row["peak_rss_kib"]:
            row["peak_rss_mib"] = round(row["peak_rss_kib"] / 1024, 1)
        if writes and out.exists():
            row["out_bytes"] = folder_bytes(out)
            if row["out_bytes"]:
                row["out_over_gguf"] = round(row["out_bytes"] / build["bytes"], 3)
                if row["peak_rss_kib"]:
                    row["rss_over_out"] = round(row["peak_rss_kib"] * 1024 / row["out_bytes"], 3)
            if not args.keep_outputs and command != "convert":
                shutil.rmtree(out, ignore_errors=True)
        rows.append(row)
        print(f" {row['status']} {row['seconds']} s, {row['peak_rss_mib']} MiB"
              + (f", out {row['out_bytes'] / 2**20:.1f} MiB" if row["out_bytes"] else "")
              + (f"  [{row['killed'] or row['error']}]" if row["status"] != "ok" else ""), flush=True)
    if not args.keep_outputs:
        shutil.rmtree(work, ignore_errors=True)
    return build


# -- reporting -------------------------------------------------------------------------------------

def _fmt_bytes(n) -> str:
    if n is None:
        return ""
    for unit, div in (("GiB", GIB), ("MiB", 2**20), ("KiB", 1024)):
        if n >= div:
            return f"{n / div:.2f} {unit}" if unit == "GiB" else f"{n / div:.1f} {unit}"
    return f"{n} B"


HEADERS = ["size", "params (B)", "GGUF", "command", "status", "time (s)", "peak RSS (MiB)", "output",
           "out/GGUF", "RSS/out", "note"]


def table_rows(rows: list[dict]) -> list[list[str]]:
    out = []
    for r in rows:
        note = r.get("skip_reason") or r.get("killed") or r.get("error") or ""
        if r.get("from_earlier_run"):  # --merge: measured by an earlier run
            note = f"[run {r['from_earlier_run'][:16].replace('T', ' ')}] {note}".rstrip()
        out.append([r["size"], f"{r['parameters'] / 1e9:.3f}", _fmt_bytes(r["gguf_bytes"]), r["command"], r["status"],
                    "" if r["seconds"] is None else f"{r['seconds']:.1f}",
                    "" if r["peak_rss_mib"] is None else f"{r['peak_rss_mib']:.0f}",
                    _fmt_bytes(r["out_bytes"]), "" if r["out_over_gguf"] is None else f"{r['out_over_gguf']:.2f}",
                    "" if r["rss_over_out"] is None else f"{r['rss_over_out']:.2f}", note.replace("|", "/")])
    return out


def text_table(rows: list[dict]) -> str:
    body = table_rows(rows)
    widths = [max(len(h), *(len(row[i]) for row in body)) if body else len(h) for i, h in enumerate(HEADERS)]
    widths[-1] = len(HEADERS[-1])  # the note is last: no padding
    line = lambda cells: "  ".join(c.ljust(w) for c, w in zip(cells, widths)).rstrip()  # noqa: E731
    return "\n".join([line(HEADERS), line(["-" * w for w in widths])] + [line(row) for row in body])


def markdown(report: dict) -> str:
    m, lines = report["machine"], []
    lines.append("# gguf2ov cost at scale\n")
    lines.append(f"{report['created']}, {m['cpu_model']}, {m['usable_cores']} cores, {m['ram_gib']} GiB RAM, "
                 f"load {m['load_average_at_start'][0]:.1f} at start; commit {report['source']['commit'] or '?'}"
                 + (" (package modified)" if report["source"]["package_modified"] else "") + ".")
    lines.append("Each command in a fresh process; time and peak RSS from `/usr/bin/time -f \"%e %M\"`. "
                 "`out/GGUF`: output folder bytes over GGUF bytes; `RSS/out`: peak RSS over output bytes.\n")
    lines.append("## GGUF files\n")
    lines.append("| size | params | hidden | layers | ffn | heads | targets | GGUF | types | build (s) |")
    lines.append("|---|---|---|---|---|---|---|---|---|---|")
    for size, b in report["builds"].items():
        g = b["geometry"]
        lines.append(f"| {size} | {b['parameters'] / 1e9:.3f} B | {g['hidden']} | {g['layers']} | {g['ffn']} | "
                     f"{g['heads']}/{g['kv_heads']}x{g['head_dim']} | {g['n_targets']} | {_fmt_bytes(b['bytes'])} | "
                     f"{', '.join(f'{k} {v}' for k, v in b['type_counts'].items())} | {b['build_seconds']}"
                     f"{' (cached)' if b.get('cached') else ''} |")
    lines.append("\n## Commands\n")
    lines.append("| " + " | ".join(HEADERS) + " |")
    lines.append("|" + "---|" * len(HEADERS))
    for row in table_rows(report["rows"]):
        lines.append("| " + " | ".join(row) + " |")
    lines.append("\nCommand lines (relative to the project root):\n")
    seen = set()
    for r in report["rows"]:
        if r["command"] not in seen:
            seen.add(r["command"])
            lines.append(f"- {r['command']}: `{r['argv']}`")
    return "\n".join(lines) + "\n"


def plot(report: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [r for r in report["rows"] if r["status"] == "ok" and r["seconds"] is not None]
    fig, (ax_t, ax_m) = plt.subplots(1, 2, figsize=(13, 5))
    for command in COMMANDS:
        pts = sorted((r["parameters"], r["seconds"], r["peak_rss_kib"]) for r in rows if r["command"] == command)
        if not pts:
            continue
        x = [p[0] / 1e9 for p in pts]
        ax_t.plot(x, [p[1] for p in pts], "o-", label=command)
        ax_m.plot(x, [p[2] / 2**20 for p in pts], "o-", label=command)
    killed = [r for r in report["rows"] if r["status"] == "killed" and r["peak_rss_kib"]]
    if killed:
        ax_m.plot([r["parameters"] / 1e9 for r in killed], [r["peak_rss_kib"] / 2**20 for r in killed], "kx",
                  ms=9, label="killed by the guard (lower bound)")
    ax_m.axhline(16, ls="--", color="grey", lw=1)
    ax_m.annotate("16 GiB", (0.5, 16), xycoords=("axes fraction", "data"), va="bottom", ha="center", color="grey")
    for ax, title, unit in ((ax_t, "time", "elapsed (s)"), (ax_m, "peak RSS", "peak RSS (GiB)")):
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("draft parameters (billions)")
        ax.set_ylabel(unit)
        ax.set_title(f"gguf2ov {title} per command (fresh process)")
        ax.grid(True, which="both", alpha=0.3)
    sizes = sorted({(r["parameters"], r["size"]) for r in report["rows"]})
    for ax in (ax_t, ax_m):
        for p, name in sizes:
            ax.axvline(p / 1e9, color="lightgrey", lw=0.8, zorder=0)
            ax.annotate(name, (p / 1e9, 1.0), xycoords=("data", "axes fraction"), xytext=(2, -4),
                        textcoords="offset points", rotation=90, va="top", fontsize=7, color="grey")
    handles, labels = ax_m.get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=len(labels), fontsize=8, frameon=False)
    m = report["machine"]
    fig.suptitle(f"{m['cpu_model']} ({m['usable_cores']} cores, {m['ram_gib']} GiB); sizes: "
                 + ", ".join(f"{n} {p / 1e9:.3g} B" for p, n in sizes), fontsize=9)
    fig.tight_layout(rect=(0, 0.05, 1, 1))
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write_outputs(report: dict, out_dir: Path) -> None:
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "scale.json").write_text(json.dumps(report, indent=2) + "\n")
    (out_dir / "scale.md").write_text(markdown(report))
    plot(report, out_dir / "scale.png")


# -- main ------------------------------------------------------------------------------------------

def merge_rows(previous: dict | None, rows: list[dict]) -> list[dict]:
    """This run's rows, plus the previous report's rows for pairs this run did not measure."""
    if not previous:
        return list(rows)
    new = {(r["size"], r["command"]): r for r in rows}
    out = {}
    for r in previous.get("rows", []):
        out[(r["size"], r["command"])] = r | {"from_earlier_run": r.get("from_earlier_run") or previous["created"]}
    for key, r in new.items():
        old = out.get(key)
        if old is None or r["status"] != "skipped" or old["status"] == "skipped":
            out[key] = r
    order = list(COMMANDS)
    return sorted(out.values(), key=lambda r: (r["parameters"], order.index(r["command"])
                                                if r["command"] in order else len(order)))


def merge_report(previous: dict | None, report: dict) -> dict:
    """Builds and geometries of both runs; the rows' `from_earlier_run` names the older ones."""
    if not previous:
        return report
    merged = dict(report)
    merged["builds"] = previous.get("builds", {}) | report["builds"]
    merged["geometries"] = previous.get("geometries", {}) | report["geometries"]
    merged["earlier_runs"] = [*previous.get("earlier_runs", []),
                              {k: previous.get(k) for k in ("created", "command_line", "source", "settings")}]
    return merged


def _csv(text: str) -> list[str]:
    return [t.strip() for t in text.split(",") if t.strip()]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", type=_csv, default=list(GEOMETRIES),
                    help=f"comma-separated geometries (default all: {','.join(GEOMETRIES)}); run smallest first")
    ap.add_argument("--commands", type=_csv, default=list(COMMANDS),
                    help=f"comma-separated (default all: {','.join(COMMANDS)})")
    ap.add_argument("--skip", type=_csv, default=[], metavar="CMD@SIZE,...",
                    help="skip these (fnmatch patterns; CMD may be short: fp32, int4, gguf): e.g. "
                         "'fp32@qwen3-8b-dflash,export-*@guide-1.3b,drift@*'")
    ap.add_argument("--max-rss-gb", type=float, default=None,
                    help="skip commands known or predicted to peak above this many GiB, kill one that does "
                         "(default: 75%% of RAM; 0 disables)")
    ap.add_argument("--timeout", type=float, default=3600, help="kill a command after this many seconds")
    ap.add_argument("--known", type=Path, default=None,
                    help="results of an earlier run whose over-limit commands are skipped (default: the "
                         "scale.json this run replaces)")
    ap.add_argument("--out", type=Path, default=RESULTS, help="folder for scale.json/md/png")
    ap.add_argument("--work", type=Path, default=RESULTS / "scale-work", help="command outputs (deleted as measured)")
    ap.add_argument("--logs", type=Path, default=RESULTS / "scale-logs", help="stdout/stderr/time of each command")
    ap.add_argument("--cache-dir", type=Path, default=CACHE, help="built GGUFs, keyed by geometry")
    ap.add_argument("--rebuild", action="store_true", help="rebuild the GGUFs even when cached")
    ap.add_argument("--keep-outputs", action="store_true", help="keep every command's output folder")
    ap.add_argument("--threads", type=int, default=None,
                    help="cap the commands' threads (OMP_NUM_THREADS and friends); default: unset")
    ap.add_argument("--merge", action="store_true",
                    help="keep the previous scale.json's rows for the size x command pairs this run does not "
                         "measure (a new skipped row does not replace an earlier measurement)")
    ap.add_argument("--plot-only", action="store_true", help="redraw scale.md and scale.png from scale.json")
    args = ap.parse_args(argv)

    if args.plot_only:
        report = json.loads((args.out / "scale.json").read_text())
        write_outputs(report, args.out)
        print(text_table(report["rows"]))
        return 0
    for s in args.sizes:
        if s not in GEOMETRIES:
            ap.error(f"unknown size {s!r}; choose from {', '.join(GEOMETRIES)}")
    for c in args.commands:
        if c not in COMMANDS:
            ap.error(f"unknown command {c!r}; choose from {', '.join(COMMANDS)}")
    if not Path(TIME).is_file():
        ap.error(f"{TIME} is needed (GNU time: apt-get install time)")
    if not GGUF2OV.is_file():
        ap.error(f"{GGUF2OV} not found: run this with the project's venv python")
    total_kib = meminfo_kib("MemTotal")
    if args.max_rss_gb is None:
        limit_kib = int(0.75 * total_kib) if total_kib else None
    else:
        limit_kib = int(args.max_rss_gb * 2**20) or None
    args.known = args.known or args.out / "scale.json"
    known = json.loads(args.known.read_text()).get("rows", []) if args.known.is_file() else []
    previous = None
    if args.merge and (args.out / "scale.json").is_file():
        previous = json.loads((args.out / "scale.json").read_text())

    env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", PYTHONUNBUFFERED="1")
    if args.threads:
        for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
            env[var] = str(args.threads)
    sizes = sorted(args.sizes, key=lambda s: GEOMETRIES[s].parameters)
    commands = [c for c in COMMANDS if c in args.commands]  # fixed order: convert before check
    report = {"created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
              "command_line": " ".join([Path(sys.argv[0]).name, *sys.argv[1:]]),
              "machine": machine_info(), "packages": package_versions(), "source": source_state(),
              "settings": {"sizes": sizes, "commands": commands, "skip": args.skip,
                           "max_rss_gib": round(limit_kib / 2**20, 2) if limit_kib else None,
                           "timeout_s": args.timeout, "threads": args.threads},
              "geometries": {s: asdict(GEOMETRIES[s]) | {"parameters": GEOMETRIES[s].parameters,
                                                          "target_layer_ids": GEOMETRIES[s].target_layer_ids}
                             for s in sizes},
              "builds": {}, "rows": []}
    print(f"limit {report['settings']['max_rss_gib']} GiB; sizes {', '.join(sizes)}; commands {', '.join(commands)}")
    start = time.perf_counter()
    measured: list[dict] = []
    try:
        for size in sizes:
            report["builds"][size] = bench_size(size, commands, args, measured, known, limit_kib, env)
            report["rows"] = merge_rows(previous, measured)
            write_outputs(merge_report(previous, report), args.out)  # a partial table survives an interruption
    finally:
        report["machine"]["load_average_at_end"] = list(os.getloadavg())
        report["total_seconds"] = round(time.perf_counter() - start, 1)
        report["rows"] = merge_rows(previous, measured)
        report = merge_report(previous, report)
        write_outputs(report, args.out)
    print()
    print(text_table(report["rows"]))
    print(f"\nwrote {args.out / 'scale.json'}, scale.md, scale.png ({report['total_seconds']} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
