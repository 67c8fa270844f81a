#!/usr/bin/env python3
"""Compute isolation: tenants of given shares saturate one GPU at once; each tenant's share of
GPU time is measured from its own kernels' %globaltimer intervals (one clock for the whole GPU).

Per scenario, all tenants start together (ready/go files), run --seconds, and log the running
segments of every kernel. Share of a tenant in a window = length of the union of its segments
in the window / window length. Windows are 1 s over the common active window of all tenants,
with the first second dropped. A limited split passes when every tenant's mean is within
--tolerance percentage points of its target; the limiter at 100% passes when its kernels/s is
within 1% of native.

--ab NAME=VAR=VALUE[,VAR=VALUE] runs every limited scenario a second time, interleaved (A, then B,
per scenario), with those variables in the tenants' environment, and reports both; for instance
--ab "fixed turns=TFUSION_SHARE_TURN_PERIOD_MS=0" against the default planned turns.
"""
import argparse
import json
import os
import statistics
import time

import tier_common as tc

WINDOW_NS = 1_000_000_000
# 100 ms bins in which a saturating group kept the GPU less than 85% busy (a stall of the host).
IDLE_BIN_NS = 100_000_000
IDLE_UNDER_PCT = 85.0

# name, mode, targets (None: native, no limiter)[, launch path per tenant]
SCENARIOS = [
    ("native-1x100", "native", [None]),
    ("limiter-1x100", "limiter", [100]),
    ("10/90", "limiter", [10, 90]),
    ("30/70", "limiter", [30, 70]),
    ("50/50", "limiter", [50, 50]),
    ("25/75", "limiter", [25, 75]),
    ("4x25", "limiter", [25, 25, 25, 25]),
    ("native-2x", "native", [None, None]),
    # Every other submission path is governed too: extended, cooperative and graph launches.
    ("50/50 ex+graph", "limiter", [50, 50], ["ex", "graph"]),
    ("30/70 coop+kernel", "limiter", [30, 70], ["coop", "kernel"]),
    # Each path alone in a pair (which one a miss of the mixed pair comes from).
    ("50/50 ex", "limiter", [50, 50], ["ex", "ex"]),
    ("50/50 graph", "limiter", [50, 50], ["graph", "graph"]),
]


def load_segments(path):
    segs = []
    for line in tc.read(path).splitlines():
        if line.startswith("#") or not line.strip():
            continue
        a, b = line.split()
        segs.append((int(a), int(b)))
    return merge(segs)


def busy_in(merged, lo, hi):
    total = 0
    for a, b in merged:
        if b <= lo:
            continue
        if a >= hi:
            break
        total += min(b, hi) - max(a, lo)
    return total


def measured_span(all_segments):
    """[start, end) measured: the tenants' common active window less its first second."""
    return max(s[0][0] for s in all_segments) + WINDOW_NS, min(s[-1][1] for s in all_segments)


def merge(segments):
    """One sorted list of (start, end) with overlaps joined."""
    merged = []
    for a, b in sorted(segments):
        if merged and a <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], b))
        else:
            merged.append((a, b))
    return merged


def bins(all_segments, start, end, bin_ns):
    """[(bin start ns, [each tenant's %], % of the bin a kernel of any tenant ran)] for the whole
    bins of bin_ns in [start, end)."""
    any_kernel = merge([seg for s in all_segments for seg in s])
    out = []
    t = start
    while t + bin_ns <= end:
        shares = [100.0 * busy_in(s, t, t + bin_ns) / bin_ns for s in all_segments]
        out.append((t, shares, 100.0 * busy_in(any_kernel, t, t + bin_ns) / bin_ns))
        t += bin_ns
    return out


def idle_bins(all_segments, bin_ns=IDLE_BIN_NS, under_pct=IDLE_UNDER_PCT):
    """(bins, all bins) of the measured span, in bins of bin_ns, in which a kernel of any tenant
    ran less than under_pct % of the time (the GPU idle the rest). A group of saturating tenants
    leaves the GPU idle only when no tenant submits: a stall of the host (the VM, a descheduled
    thread), or the limiter holding every tenant; not a division of time between them."""
    if any(not s for s in all_segments):
        return 0, 0
    rows = bins(all_segments, *measured_span(all_segments), bin_ns)
    return sum(busy < under_pct for _, _, busy in rows), len(rows)


def window_shares(all_segments):
    """Per tenant list of % shares per 1 s window over the common active window."""
    if any(not s for s in all_segments):
        return None
    start, end = measured_span(all_segments)
    windows = []
    t = start
    while t + WINDOW_NS <= end:
        windows.append((t, t + WINDOW_NS))
        t += WINDOW_NS
    if not windows:
        return None
    return [[100.0 * busy_in(s, lo, hi) / WINDOW_NS for lo, hi in windows] for s in all_segments]


def parse_ab(spec):
    """'NAME=VAR=VALUE[,VAR=VALUE]' -> (NAME, {VAR: VALUE}); raises ValueError when malformed."""
    name, sep, rest = spec.partition("=")
    if not sep or not name.strip() or not rest:
        raise ValueError("--ab wants NAME=VAR=VALUE[,VAR=VALUE]")
    env = {}
    for item in rest.split(","):
        var, sep, value = item.partition("=")
        if not sep or not var.strip() or not var.replace("_", "").isalnum():
            raise ValueError(f"--ab: {item!r} is not VAR=VALUE")
        env[var.strip()] = value
    return name.strip(), env


def run_scenario(args, name, mode, targets, results_rows, throughput, launches=None, env=None):
    tag = name.replace("/", "-").replace(" ", "-").replace("+", "-").replace("[", "").replace("]", "")
    work = os.path.join(args.work, tag)
    os.makedirs(work, exist_ok=True)
    go = os.path.join(work, "go")
    procs, outs, readies = [], [], []
    stamp = f"{os.getpid()}-{int(time.time())}"
    for i, target in enumerate(targets):
        out = os.path.join(work, f"t{i}.seg")
        ready = os.path.join(work, f"t{i}.ready")
        cmd = [args.tenant, "--seconds", str(args.seconds), "--spin-us", str(args.spin_us),
               "--depth", str(args.depth), "--out", out, "--ready-file", ready, "--go-file", go]
        if launches:
            cmd += ["--launch", launches[i]]
        if mode == "limiter":
            cmd = tc.limited(args.tfusion, "4GiB", target, f"cs-{tag}-t{i}-{stamp}", cmd)
        procs.append(tc.start(cmd, os.path.join(args.logs, f"compute-{tag}-t{i}.log"),
                              env=dict(os.environ, **env) if env else None))
        outs.append(out)
        readies.append(ready)
    all_ready = tc.wait_files(readies, 45, procs)
    tc.touch(go)
    statuses = [tc.finish(p, args.seconds + 40) for p in procs]
    if not all_ready:
        return f"tenants not ready within 45 s (exit statuses {[s[0] for s in statuses]})"
    bad = [i for i, (rc, _) in enumerate(statuses) if rc != 0]
    if bad:
        return f"tenant(s) {bad} failed (exit statuses {[s[0] for s in statuses]})"
    segments = [load_segments(o) for o in outs]
    shares = window_shares(segments)
    if shares is None:
        return "no common 1 s window (tenants did not overlap long enough)"
    verdict_notes = []
    for i, (target, series) in enumerate(zip(targets, shares)):
        mean = statistics.mean(series)
        row = {"split": name, "tenant": i, "target": target, "mean": mean, "min": min(series),
               "max": max(series), "stdev": statistics.pstdev(series), "windows": len(series),
               "series": [round(v, 2) for v in series]}
        results_rows.append(row)
        if target is not None and abs(mean - target) > args.tolerance:
            verdict_notes.append(f"t{i} {mean:.1f}% vs {target}%")
    total = sum(statistics.mean(s) for s in shares)
    idle, bins = idle_bins(segments)
    results_rows.append({"split": name, "tenant": "sum", "target": None, "mean": total,
                         "min": None, "max": None, "stdev": None, "windows": len(shares[0]),
                         "idle_bins": idle, "bins": bins})
    if verdict_notes and idle:
        verdict_notes.append(f"the GPU under {IDLE_UNDER_PCT:g}% busy in {idle} of {bins} 100 ms bins "
                             "(a stall of the host, or every tenant held)")
    if len(targets) == 1:
        r = tc.parse_results(statuses[0][1])
        throughput[name] = {k: float(r[k]) for k in ("gpu_kernels_per_s", "host_kernels_per_s", "kernels")
                            if k in r}
    return verdict_notes


def fmt(v, digits=1):
    return "-" if v is None else f"{v:.{digits}f}"


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--tfusion", required=True)
    ap.add_argument("--tenant", required=True)
    ap.add_argument("--work", required=True)
    ap.add_argument("--logs", required=True)
    ap.add_argument("--results", required=True)
    ap.add_argument("--md", required=True)
    ap.add_argument("--json", required=True)
    ap.add_argument("--seconds", type=float, default=6)
    ap.add_argument("--spin-us", type=float, default=300)
    ap.add_argument("--depth", type=int, default=8)
    ap.add_argument("--tolerance", type=float, default=5.0)
    ap.add_argument("--budget-s", type=float, default=150)
    ap.add_argument("--only", default="", help="comma-separated scenario names")
    ap.add_argument("--ab", default="", help="NAME=VAR=VALUE[,VAR=VALUE]: run each limited scenario "
                    "again with this environment, interleaved")
    args = ap.parse_args()
    ab = None
    if args.ab:
        try:
            ab = parse_ab(args.ab)
        except ValueError as e:
            ap.error(str(e))
    deadline = time.monotonic() + args.budget_s
    os.makedirs(args.work, exist_ok=True)
    os.makedirs(args.logs, exist_ok=True)
    wanted = set(filter(None, args.only.split(",")))
    rows, throughput = [], {}
    for scenario in SCENARIOS:
        name, mode, targets = scenario[:3]
        launches = scenario[3] if len(scenario) > 3 else None
        if wanted and name not in wanted:
            continue
        variants = [(name, None)]
        if ab and mode == "limiter":
            variants.append((f"{name} [{ab[0]}]", ab[1]))
        for label, env in variants:
            test = f"compute share {label}"
            if time.monotonic() + args.seconds + 15 > deadline:
                tc.record(args.results, test, "SKIP", "time budget spent")
                continue
            outcome = run_scenario(args, label, mode, targets, rows, throughput, launches, env)
            if isinstance(outcome, str):
                tc.record(args.results, test, "FAIL", outcome)
            elif mode == "native":
                tc.record(args.results, test, "INFO", "reference run, no target")
            elif env is not None:
                # The comparison run: reported, not judged.
                tc.record(args.results, test, "INFO",
                          "; ".join(outcome) or f"all tenants within ±{args.tolerance:g} points")
            else:
                tc.record(args.results, test, "FAIL" if outcome else "PASS",
                          "; ".join(outcome) or f"all tenants within ±{args.tolerance:g} points")

    native = throughput.get("native-1x100", {}).get("gpu_kernels_per_s")
    lim = throughput.get("limiter-1x100", {}).get("gpu_kernels_per_s")
    loss = None
    if native and lim:
        loss = 100.0 * (1.0 - lim / native)
        tc.record(args.results, "compute throughput limiter 100% vs native", "PASS" if loss <= 1.0 else "FAIL",
                  f"loss {loss:.2f}% (target <= 1%)")
    else:
        tc.record(args.results, "compute throughput limiter 100% vs native", "FAIL", "missing a run")

    lines = [f"### Compute isolation ({args.seconds:g} s runs, {args.spin_us:g} µs spin kernels, "
             f"{args.depth} queued per tenant, 1 s windows, first second dropped)", "",
             "| split | tenant | target % | measured mean % | min % | max % | stdev | windows | "
             f"100 ms bins under {IDLE_UNDER_PCT:g}% busy |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in rows:
        target = "native" if r["target"] is None and r["tenant"] != "sum" else fmt(r["target"], 0)
        idle = f"{r['idle_bins']} of {r['bins']}" if "idle_bins" in r else "-"
        lines.append(f"| {r['split']} | {r['tenant']} | {target} | {fmt(r['mean'])} | {fmt(r['min'])} | "
                     f"{fmt(r['max'])} | {fmt(r['stdev'], 2)} | {r['windows']} | {idle} |")
    lines += ["", "### Compute throughput, one tenant at 100%", "",
              "| run | kernels | kernels/s (GPU clock) | kernels/s (host) | loss vs native |",
              "| --- | --- | --- | --- | --- |"]
    for name in ("native-1x100", "limiter-1x100"):
        t = throughput.get(name, {})
        lines.append(f"| {name} | {fmt(t.get('kernels'), 0)} | {fmt(t.get('gpu_kernels_per_s'))} | "
                     f"{fmt(t.get('host_kernels_per_s'))} | "
                     f"{fmt(loss, 2) + ' %' if name != 'native-1x100' and loss is not None else '-'} |")
    with open(args.md, "w") as f:
        f.write("\n".join(lines) + "\n")
    with open(args.json, "w") as f:
        json.dump({"rows": rows, "throughput": throughput}, f, indent=1)
    print("\n".join(lines))


if __name__ == "__main__":
    main()
