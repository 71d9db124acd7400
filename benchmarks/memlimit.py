"""The memory a command needs: the smallest cgroup memory limit under which it completes.

Peak RSS overstates what a command needs when it maps big files (every mapped page it touched
counts, though the kernel can drop and re-read clean ones) and understates it when the page cache
it fills matters. A cgroup v1 memory limit counts anonymous memory and page cache alike and
reclaims cache before it kills, so the smallest limit under which the command still completes is
what a machine must have. Each try runs in a fresh process:

- a child group of this process's own memory cgroup (`/sys/fs/cgroup/memory/...`, root only),
  with `memory.limit_in_bytes` and, if present, `memory.memsw.limit_in_bytes` set to the limit;
  the command is moved in before it execs (`/bin/sh -c 'echo $$ > cgroup.procs; exec ...'`);
- a time limit: under memory pressure a process can re-read file pages for minutes instead of
  being killed, so a timeout counts as a failure (default: 3x the unlimited run, at least 60 s);
- dirty pages are written back (sync) and the page cache of the inputs (`evict`) is dropped
  (posix_fadvise DONTNEED) first: a try does not pay for an earlier write, and pages already
  cached are charged to whichever group read them first, so without this a try that reads a
  cached checkpoint would not be charged for it;
- recorded: exit code, seconds, `memory.max_usage_in_bytes`, `memory.failcnt`, the OOM kills of
  `memory.oom_control`, the load average before and after, and anonymous memory (`total_rss`) and mapped file pages sampled from
  `memory.stat` each second (a time series), and stderr with each line stamped in seconds.

`smallest_limit` first runs the command without a limit under `/usr/bin/time -f "%e %M"` (wall
seconds and peak RSS), then tries the limits in `probes` (goals to check), then bisects between
the largest failing and the smallest completing limit until they are `resolution` GiB apart.

    python -m benchmarks.memlimit --name tiny-target --output out/t --probe 2 -- \\
        gguf2ov target fixtures/tiny-dflash/target-hf -o out/t --weight-format int4

writes results/memlimit-NAME.json and .md. Limits are in GiB (2**30 bytes).
"""

import argparse
import json
import math
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from datetime import datetime, timezone
from pathlib import Path

from benchmarks.common import RESULTS, folder_bytes, load_average

MEMORY_CGROUPS = Path("/sys/fs/cgroup/memory")
TIME = "/usr/bin/time"
GIB = 2**30
_groups = 0


def own_cgroup() -> Path:
    """This process's memory cgroup folder (cgroup v1)."""
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        if "memory" in controllers.split(","):
            return MEMORY_CGROUPS / path.lstrip("/")
    raise RuntimeError("no cgroup v1 memory controller for this process (see /proc/self/cgroup)")


def _read_stat(group: Path) -> dict[str, int]:
    try:
        pairs = (line.split() for line in (group / "memory.stat").read_text().splitlines())
        return {k: int(v) for k, v in pairs}
    except (OSError, ValueError):
        return {}


def _read_int(path: Path) -> int | None:
    try:
        return int(path.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def _oom_kills(group: Path) -> int | None:
    try:
        for line in (group / "memory.oom_control").read_text().splitlines():
            if line.startswith("oom_kill "):
                return int(line.split()[1])
    except OSError:
        pass
    return None


def _pids(group: Path) -> list[int]:
    try:
        return [int(p) for p in (group / "cgroup.procs").read_text().split()]
    except OSError:
        return []


def _kill_group(group: Path) -> None:
    """SIGKILL every process in the group (all started by this try), until it is empty."""
    for _ in range(100):
        pids = _pids(group)
        if not pids:
            return
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        time.sleep(0.1)


def evict(paths) -> None:
    """Drop the clean page-cache pages of these files (folders: every file below)."""
    for path in map(Path, paths):
        files = [path] if path.is_file() else [p for p in path.rglob("*") if p.is_file()] if path.is_dir() else []
        for f in files:
            try:
                fd = os.open(f, os.O_RDONLY)
            except OSError:
                continue
            try:
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)


def cpu_busy(seconds: float = 3.0) -> float:
    """Share of all cores busy over the next `seconds` (from /proc/stat)."""
    def sample():
        values = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
        return sum(values), values[3] + values[4]  # idle + iowait

    (t0, i0), _ = sample(), time.sleep(seconds)
    t1, i1 = sample()
    return 1 - (i1 - i0) / max(1, t1 - t0)


def wait_for_idle(max_wait: float, busy: float = 0.15, say=None) -> dict:
    """Wait (up to `max_wait` s) until the cores are idle (under `busy`): other work skews the times."""
    start = time.monotonic()
    while (load := cpu_busy()) > busy and time.monotonic() - start < max_wait:
        if say:
            say(f"[memlimit] cores {load:.0%} busy with other work; waiting")
        time.sleep(30)
    return {"cpu_busy_before": round(load, 3), "waited_s": round(time.monotonic() - start, 1)}


def _stamp_lines(pipe, out, start: float) -> None:
    """Copy `pipe` to `out`, each line or carriage-return update prefixed with [seconds]."""
    pending = b""
    for chunk in iter(lambda: pipe.read1(65536), b""):
        pending += chunk
        *lines, pending = pending.replace(b"\r", b"\n").split(b"\n")
        stamp = f"[{time.monotonic() - start:7.1f}] "
        out.writelines(stamp + line.decode(errors="replace") + "\n" for line in lines if line.strip())
        out.flush()
    if pending.strip():
        out.write(f"[{time.monotonic() - start:7.1f}] {pending.decode(errors='replace')}\n")


def _parse_time(text: str) -> tuple[float | None, int | None]:
    for line in reversed(text.strip().splitlines()):  # "Command terminated by signal 9" comes first
        parts = line.split()
        if len(parts) == 2:
            try:
                return float(parts[0]), int(parts[1])
            except ValueError:
                continue
    return None, None


def remove_partials(output: Path) -> int:
    """Delete the `.NAME.partial-*` folders a killed `gguf2ov` left beside `output` (it writes into one and
    renames it when done); returns the bytes they held."""
    output = Path(output)
    removed = 0
    for partial in output.parent.glob(f".{output.name}.partial-*"):
        removed += folder_bytes(partial)
        shutil.rmtree(partial, ignore_errors=True)
    return removed


def run_limited(argv: list[str], limit_gib: float | None, timeout: float | None = None, log_stem: Path | None = None,
                env: dict | None = None, cwd=None, evict_paths=(), output: Path | None = None,
                trace_period: float | None = None, period: float = 0.25, wait_idle: float | None = None) -> dict:
    """One try of `argv` in a fresh child cgroup limited to `limit_gib` (None: no limit).

    `wait_idle`: wait up to this many seconds for the cores to be idle first."""
    global _groups
    if output is not None:
        shutil.rmtree(output, ignore_errors=True)
        remove_partials(output)
    os.sync()  # dirty pages (a checkpoint just written, the last try's output) are neither dropped nor timed
    idle = (wait_for_idle(wait_idle, say=lambda m: print(m, file=sys.stderr, flush=True)) if wait_idle
            else {"cpu_busy_before": round(cpu_busy(1.0), 3)})
    idle["load_avg_before"] = load_average()  # other work on the cores skews the times
    evict(evict_paths)
    _groups += 1
    group = own_cgroup() / f"memlimit-{os.getpid()}-{_groups}"
    group.mkdir()
    log_stem = Path(log_stem) if log_stem else None
    time_file = Path(f"{log_stem}.time") if log_stem else Path(tempfile.gettempdir()) / f"memlimit-{os.getpid()}.time"
    if log_stem:
        log_stem.parent.mkdir(parents=True, exist_ok=True)
    time_file.unlink(missing_ok=True)
    try:
        if limit_gib is not None:
            limit = int(limit_gib * GIB)
            (group / "memory.limit_in_bytes").write_text(str(limit))
            if (group / "memory.memsw.limit_in_bytes").exists():  # no swap either (memsw >= limit)
                (group / "memory.memsw.limit_in_bytes").write_text(str(limit))
        cmd = ["/bin/sh", "-c", 'echo $$ > "$0" && exec "$@"', str(group / "cgroup.procs"),
               TIME, "-f", "%e %M", "-o", str(time_file), *map(str, argv)]
        out = open(Path(f"{log_stem}.stdout"), "w") if log_stem else subprocess.DEVNULL
        err = open(Path(f"{log_stem}.stderr"), "w") if log_stem else subprocess.DEVNULL
        peak = {"rss": 0, "rss_mapped": 0, "cache": 0}
        trace, timed_out, start = [], False, time.monotonic()
        next_trace = 0.0
        try:
            proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.PIPE if log_stem else err,
                                    stdin=subprocess.DEVNULL, env=env, cwd=cwd)
            if log_stem:  # stderr lines (and progress updates) stamped with seconds since the start
                stamper = threading.Thread(target=_stamp_lines, args=(proc.stderr, err, start), daemon=True)
                stamper.start()
            while proc.poll() is None:
                stat, now = _read_stat(group), time.monotonic() - start
                rss, mapped, cache = stat.get("total_rss", 0), stat.get("total_mapped_file", 0), stat.get("total_cache", 0)
                peak = {"rss": max(peak["rss"], rss), "rss_mapped": max(peak["rss_mapped"], rss + mapped),
                        "cache": max(peak["cache"], cache)}
                if trace_period and now >= next_trace:
                    trace.append([round(now, 1), rss >> 20, mapped >> 20, cache >> 20])
                    next_trace = now + trace_period
                if timeout and now > timeout:
                    timed_out = True
                    _kill_group(group)
                    break
                time.sleep(period)
            code = proc.wait()
            if log_stem:
                stamper.join(timeout=10)
        finally:
            for f in (out, err):
                if f is not subprocess.DEVNULL:
                    f.close()
        wall = time.monotonic() - start
        _kill_group(group)  # anything the command left running
        seconds, peak_rss_kib = _parse_time(time_file.read_text() if time_file.is_file() else "")
        record = {
            "limit_gib": limit_gib, "exit_code": code, "timed_out": timed_out,
            "oom_kills": _oom_kills(group), "failcnt": _read_int(group / "memory.failcnt"),
            "completed": code == 0 and not timed_out,
            "seconds": seconds if seconds is not None else round(wall, 2), "peak_rss_kib": peak_rss_kib,
            "max_usage_bytes": _read_int(group / "memory.max_usage_in_bytes"),
            "sampled_peak_anon_bytes": peak["rss"], "sampled_peak_anon_plus_mapped_bytes": peak["rss_mapped"],
            "sampled_peak_cache_bytes": peak["cache"], **idle,
            "load_avg_after": load_average(),
        }
        if output is not None:
            record["output_bytes"] = folder_bytes(output)
            if Path(output).is_dir():
                record["output_files"] = {f.name: f.stat().st_size for f in sorted(Path(output).iterdir()) if f.is_file()}
            if left := remove_partials(output):  # a killed command cannot remove the folder it was writing
                record["partial_bytes_removed"] = left
        if trace_period:
            record["trace_mib"] = {"columns": ["s", "anon", "mapped_file", "cache"], "rows": trace}
        if log_stem:
            record["logs"] = str(log_stem) + ".{stdout,stderr,time}"
        return record
    finally:
        if not log_stem:
            time_file.unlink(missing_ok=True)
        for _ in range(50):
            try:
                group.rmdir()
                break
            except OSError:
                _kill_group(group)
                time.sleep(0.2)


def _grid(x: float, step: float = 0.125) -> float:
    return round(x / step) * step


def smallest_limit(argv: list[str], *, name: str = "command", probes=(), lo_gib: float = 0.0,
                   hi_gib: float | None = None, resolution_gib: float = 0.5, timeout: float | None = None,
                   timeout_factor: float = 3.0, log_dir: Path | None = None, env=None, cwd=None, evict_paths=(),
                   output: Path | None = None, unlimited: dict | None = None, wait_idle: float | None = None,
                   say=print) -> dict:
    """Bisect the smallest memory limit (GiB) under which `argv` completes, to within `resolution_gib`.

    `unlimited`: a record of an unlimited run already made (else one is made first). `probes`:
    limits tried before bisecting (a goal to check). `lo_gib`: a limit assumed to fail.
    """
    log = (lambda tag: Path(log_dir) / f"{name}-{tag}") if log_dir else (lambda tag: None)
    common = dict(env=env, cwd=cwd, evict_paths=evict_paths, output=output, wait_idle=wait_idle)
    if unlimited is None:
        say(f"[memlimit] {name}: unlimited ...")
        unlimited = run_limited(argv, None, None, log("unlimited"), trace_period=1.0, **common)
        say(f"[memlimit] {name}: unlimited {_describe(unlimited)}")
    result = {"name": name, "argv": [str(a) for a in argv], "unlimited": unlimited, "tries": [],
              "resolution_gib": resolution_gib, "smallest_limit_gib": None, "largest_failing_gib": None}
    if not unlimited["completed"]:
        result["error"] = "the command does not complete without a limit"
        return result
    if timeout is None:
        timeout = max(60.0, timeout_factor * unlimited["seconds"])
    result["timeout_s"] = timeout
    total_gib = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / GIB
    ok, bad = math.inf, lo_gib

    def attempt(limit: float) -> bool:
        nonlocal ok, bad
        say(f"[memlimit] {name}: {limit:g} GiB ...")
        r = run_limited(argv, limit, timeout, log(f"{limit:g}GiB"), trace_period=1.0, **common)
        say(f"[memlimit] {name}: {limit:g} GiB {_describe(r)}")
        result["tries"].append(r)
        if r["completed"]:
            ok = min(ok, limit)
        else:
            bad = max(bad, limit)
        return r["completed"]

    for p in probes:
        attempt(float(p))
    hi = hi_gib or _grid(math.ceil((unlimited["peak_rss_kib"] or 0) / 2**20 * 2 + 1) / 2, 0.5)
    while ok == math.inf and hi <= total_gib:
        if hi > bad and attempt(hi):
            break
        hi = _grid(max(hi, bad) * 1.5, 0.5)
    while ok < math.inf and ok - bad > resolution_gib:
        mid = _grid((ok + bad) / 2)
        if not bad < mid < ok:
            break
        attempt(mid)
    result["smallest_limit_gib"] = None if ok == math.inf else ok
    result["largest_failing_gib"] = bad if bad > 0 else None
    if output is not None:
        shutil.rmtree(output, ignore_errors=True)
    return result


def _describe(r: dict) -> str:
    state = "completed" if r["completed"] else "timed out" if r["timed_out"] else f"failed (exit {r['exit_code']})"
    peak = f", peak RSS {r['peak_rss_kib'] / 2**20:.2f} GiB" if r.get("peak_rss_kib") else ""
    usage = f", max usage {r['max_usage_bytes'] / GIB:.2f} GiB" if r.get("max_usage_bytes") else ""
    anon = f", anon {r['sampled_peak_anon_bytes'] / GIB:.2f} GiB" if r.get("sampled_peak_anon_bytes") else ""
    oom = f", {r['oom_kills']} OOM kills" if r.get("oom_kills") else ""
    return f"{state} in {r['seconds']:.1f} s{peak}{usage}{anon}{oom}"


def markdown(result: dict) -> str:
    u = result["unlimited"]
    lines = [f"# Memory limit: {result['name']}", "", f"`{' '.join(result['argv'])}`", "",
             f"Smallest limit under which it completes: **{result['smallest_limit_gib']} GiB** "
             f"(largest failing: {result['largest_failing_gib']} GiB; resolution {result['resolution_gib']} GiB, "
             f"timeout per try {result.get('timeout_s', 0):.0f} s). "
             + (f"Without a limit: {_describe(u)}." if u else "No run without a limit.")]
    if u and u.get("output_bytes") is not None:
        lines[-1] += f" Output: {u['output_bytes'] / GIB:.3f} GiB."
    lines += ["", "| limit (GiB) | result | s | max usage (GiB) | anon peak (GiB) | anon+mapped (GiB) | OOM kills |",
              "|---|---|---|---|---|---|---|"]
    for r in [*([u] if u else []), *sorted(result["tries"], key=lambda r: r["limit_gib"])]:
        state = "completed" if r["completed"] else "timeout" if r["timed_out"] else f"exit {r['exit_code']}"
        lines.append(f"| {r['limit_gib'] if r['limit_gib'] is not None else 'none'} | {state} | {r['seconds']:.1f} | "
                     f"{(r['max_usage_bytes'] or 0) / GIB:.2f} | {r['sampled_peak_anon_bytes'] / GIB:.2f} | "
                     f"{r['sampled_peak_anon_plus_mapped_bytes'] / GIB:.2f} | {r['oom_kills']} |")
    return "\n".join(lines) + "\n"


def write_result(result: dict, stem: Path) -> None:
    stem.parent.mkdir(parents=True, exist_ok=True)
    result = {"created": datetime.now(timezone.utc).isoformat(timespec="seconds"), **result}
    Path(f"{stem}.json").write_text(json.dumps(result, indent=2) + "\n")
    Path(f"{stem}.md").write_text(markdown(result))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0], usage="%(prog)s [options] -- COMMAND ...")
    p.add_argument("--name", default="command", help="names the result files results/memlimit-NAME.{json,md}")
    p.add_argument("--probe", type=float, action="append", default=[], help="a limit (GiB) to try first; repeatable")
    p.add_argument("--lo", type=float, default=0.0, help="a limit (GiB) assumed to fail")
    p.add_argument("--hi", type=float, help="the first limit (GiB) expected to complete (default: peak RSS + 0.5)")
    p.add_argument("--resolution", type=float, default=0.5, help="GiB between failing and completing (default 0.5)")
    p.add_argument("--timeout", type=float, help="seconds per try (default 3x the unlimited run, at least 60)")
    p.add_argument("--evict", action="append", default=[], help="file or folder whose page cache is dropped first")
    p.add_argument("--output", type=Path, help="the command's output, removed before each try and at the end; its "
                                               "size is recorded")
    p.add_argument("--limit", type=float, help="only one run under this limit (GiB), no bisection")
    p.add_argument("command", nargs=argparse.REMAINDER)
    args = p.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        p.error("no command (put it after --)")
    stem = RESULTS / f"memlimit-{args.name}"
    if args.limit is not None:
        r = run_limited(command, args.limit, args.timeout, RESULTS / "memlimit-logs" / args.name,
                        evict_paths=args.evict, output=args.output)
        print(json.dumps(r, indent=2))
        return 0 if r["completed"] else 1
    result = smallest_limit(command, name=args.name, probes=args.probe, lo_gib=args.lo, hi_gib=args.hi,
                            resolution_gib=args.resolution, timeout=args.timeout, log_dir=RESULTS / "memlimit-logs",
                            evict_paths=args.evict, output=args.output)
    write_result(result, stem)
    print(markdown(result))
    return 0 if result["smallest_limit_gib"] is not None else 1


if __name__ == "__main__":
    sys.exit(main())
