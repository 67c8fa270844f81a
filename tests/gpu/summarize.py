#!/usr/bin/env python3
"""Writes summary.md for run_all.sh from its logs folder: PASS/FAIL per test (results.tsv) and
every benchmark table (allocation paths, memory views, compute isolation, launch overhead,
ResNet-50, start-up). Reads only; a missing log becomes a '-' cell."""
import argparse
import os
import statistics

import tier_common as tc

PATHS = ["mem_alloc", "pitch", "async", "pool_async", "vmm", "managed", "array2d", "array3d", "mipmap", "graph"]


def results_of(logs, name):
    return tc.parse_results(tc.read(os.path.join(logs, name)))


def num(value):
    try:
        return float(value)
    except (TypeError, ValueError):
        return None


def cell(value, digits=1):
    v = num(value)
    if v is None:
        return "-" if value in (None, "") else str(value)
    return f"{v:.{digits}f}"


def pct_change(new, base):
    n, b = num(new), num(base)
    if n is None or not b:
        return "-"
    return f"{100.0 * (n - b) / b:+.2f} %"


def tests_table(logs):
    rows = []
    for line in tc.read(os.path.join(logs, "results.tsv")).splitlines():
        parts = line.split("\t")
        if len(parts) >= 2:
            rows.append((parts[0], parts[1], parts[2] if len(parts) > 2 else ""))
    counts = {s: sum(1 for r in rows if r[1] == s) for s in ("PASS", "FAIL", "SKIP", "INFO")}
    out = [f"**{counts['PASS']} passed, {counts['FAIL']} failed, {counts['SKIP']} skipped, "
           f"{counts['INFO']} informational.**", "", "| test | result | note |", "| --- | --- | --- |"]
    out += [f"| {name} | {status} | {note.replace('|', '/')} |" for name, status, note in rows]
    return out


def alloc_table(logs):
    out = ["### VRAM through each allocation path (64 MiB chunks; native capped at 4 GiB, limiter --vram 2GiB)", "",
           "| path | native MiB | native stop | limiter MiB | limiter error | failed call | realloc after free | verdict |",
           "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for p in PATHS:
        n = results_of(logs, f"alloc-{p}-native.log")
        m = results_of(logs, f"alloc-{p}-limiter.log")
        out.append(f"| {p} | {n.get('total_mib', '-')} | {n.get('status', '-')} | {m.get('total_mib', '-')} | "
                   f"{m.get('error', '-')} | {m.get('failed_call', '-')} | {m.get('realloc', '-')} | "
                   f"{m.get('verdict', '-')} |")
    for label, log in (("cudart (rt_oom)", "rt-oom"),):
        n = results_of(logs, f"{log}-native.log")
        m = results_of(logs, f"{log}-limiter.log")
        out.append(f"| {label} | {n.get('total_mib', '-')} | - | {m.get('total_mib', '-')} | {m.get('error', '-')} | "
                   f"- | {m.get('realloc', '-')} | {m.get('verdict', '-')} |")
    return out


def meminfo_table(logs):
    out = ["### Memory as reported after allocating 512 MiB (MiB)", "",
           "| run | cuMemGetInfo total | free | used | NVML total | free | used | NVML v2 total | free |",
           "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for mode in ("native", "limiter"):
        r = results_of(logs, f"meminfo-{mode}.log")
        out.append(f"| {mode} | {r.get('after_cuda_total_mib', '-')} | {r.get('after_cuda_free_mib', '-')} | "
                   f"{r.get('after_cuda_used_mib', '-')} | {r.get('after_nvml_total_mib', '-')} | "
                   f"{r.get('after_nvml_free_mib', '-')} | {r.get('after_nvml_used_mib', '-')} | "
                   f"{r.get('after_nvml2_total_mib', '-')} | {r.get('after_nvml2_free_mib', '-')} |")
    return out


def launch_table(logs):
    out = ["### Launch overhead: empty kernel, one stream, 1,000,000 launches (CPU ns per cuLaunchKernel)", "",
           "| run | launches | mean ns | p50 ns | p99 ns | added p50 vs native | launches/s incl. drain |",
           "| --- | --- | --- | --- | --- | --- | --- |"]
    base = results_of(logs, "launch-native.log")
    for label, log in (("native", "launch-native.log"), ("limiter 100%", "launch-limiter100.log"),
                       ("limiter 50%", "launch-limiter50.log")):
        r = results_of(logs, log)
        added = "-"
        if label != "native" and num(r.get("p50_ns")) is not None and num(base.get("p50_ns")) is not None:
            added = f"{num(r['p50_ns']) - num(base['p50_ns']):+.1f} ns"
        out.append(f"| {label} | {r.get('launches', '-')} | {cell(r.get('mean_ns'))} | {cell(r.get('p50_ns'))} | "
                   f"{cell(r.get('p99_ns'))} | {added} | {cell(r.get('launches_per_s'), 0)} |")
    return out


def resnet_table(logs):
    out = ["### ResNet-50 inference, fp16, batch 64, 50 timed iterations", "",
           "| run | ms / iteration | images/s | change vs native |", "| --- | --- | --- | --- |"]
    base = results_of(logs, "resnet-native.log")
    for label, log in (("native", "resnet-native.log"), ("limiter 100%", "resnet-limiter.log")):
        r = results_of(logs, log)
        change = "-" if label == "native" else pct_change(r.get("images_per_s"), base.get("images_per_s"))
        out.append(f"| {label} | {cell(r.get('ms_per_iter'), 2)} | {cell(r.get('images_per_s'))} | {change} |")
    return out


def startup_table(logs):
    out = ["### Start-up: 100 processes at once (cuInit + primary context + 1 MiB alloc)", "",
           "| run | wall ms for all 100 | succeeded | per-process init p50 ms | max ms | added wall ms |",
           "| --- | --- | --- | --- | --- | --- |"]
    walls = {}
    for mode in ("native", "limiter"):
        line = tc.read(os.path.join(logs, f"startup-{mode}.tsv")).strip().split("\t")
        inits = [float(x) for x in tc.read(os.path.join(logs, f"startup-{mode}-init-ms.txt")).split() if num(x) is not None]
        wall = line[1] if len(line) >= 3 else None
        walls[mode] = num(wall)
        added = "-"
        if mode == "limiter" and walls.get("native") is not None and walls["limiter"] is not None:
            added = f"{walls['limiter'] - walls['native']:+.0f}"
        out.append(f"| {mode} | {wall or '-'} | {line[2] if len(line) >= 3 else '-'} | "
                   f"{cell(statistics.median(inits)) if inits else '-'} | {cell(max(inits)) if inits else '-'} | {added} |")
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--logs", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--build", default="")
    ap.add_argument("--elapsed", default="?")
    args = ap.parse_args()
    pre = tc.read(os.path.join(args.logs, "preflight.log")).splitlines()
    header = next((i for i, l in enumerate(pre) if l.startswith("name,")), None)
    gpu = pre[header + 1] if header is not None and header + 1 < len(pre) else "unknown (see logs/preflight.log)"
    lines = ["# GPU tier results", "", f"- GPU (name, driver, memory, used, compute mode, persistence): {gpu}",
             f"- {pre[0] if pre else ''}", f"- wall time of run_all.sh: {args.elapsed} s", "", "## Tests", ""]
    lines += tests_table(args.logs)
    lines += ["", "## Tables", ""]
    for table in (alloc_table, meminfo_table, launch_table, resnet_table, startup_table):
        try:
            lines += table(args.logs)
        except Exception as e:  # a broken table must not lose the others
            lines += [f"({table.__name__} failed: {e!r})"]
        lines.append("")
    compute = tc.read(os.path.join(args.logs, "compute-share.md"))
    lines += compute.splitlines() if compute else ["### Compute isolation", "", "(no results)"]
    with open(args.out, "w") as f:
        f.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
