#!/usr/bin/env python3
"""Compute sharing as users see it: several inference tenants at once, natively and under the
limiter, in the same run (docs/compute-sharing.md, docs/benchmarks.md).

Phases (--phases, comma-separated):
  coloc   N = 1, 2, 4, 8 tenants of one model started together, natively and under the limiter at
          100/N percent each (native and limiter alternate per N); aggregate items/s and the ratio.
          Models: --models (default r50:1,gpt2:1,r50:64 = model:batch).
  noisy   one ResNet-50 batch-1 tenant (request 25%, limit 100%) beside three saturating
          ResNet-50 batch-64 tenants: solo natively, co-located natively, and under the limiter
          with the big ones hard at 25% ("hard") and at request 25% / limit 100% ("burst").
  burst   spin-kernel tenants (compute_tenant): A with request 25% / limit 100% alone for 3 s, then
          three hard 25% tenants arrive. A's GPU share alone vs native, how long until A is back at
          its request, and each tenant's share afterwards (per %globaltimer kernel segments).
  remote  coloc at N = --remote-ns (default 4) and noisy again, and burst with --remote-burst, with
          every limiter tenant through a `tfusion worker` on a unix socket (shared memory), beside
          native in the same run.
  solo    one tenant of each --solo-models (default gpt2:1,r50:1) alone at 100%, native and under
          the limiter alternating, --solo-rounds rounds; the median ratio.
  ab      limiter variants beside native, interleaved: for each --models and --ns a native group,
          then one group per --ab-variants entry (NAME=PERCENT[:VAR=VALUE,...], e.g.
          "p25=25;ungoverned=100;tick1ms=25:TFUSION_SHARE_TICK_US=1000"; PERCENT "even" is
          100/N), --rounds rounds.
          With --warm the groups start once and each round is a timed window of the same
          tenants (the other groups' tenants stopped meanwhile): the rounds cost no start-up.
  mps     (added by --mps DIR) noisy, and coloc of ResNet-50 b1 at N = 4, with every tenant,
          native and limiter, under a private MPS daemon: the harness starts
          `nvidia-cuda-mps-control -d` with CUDA_MPS_PIPE_DIRECTORY=DIR/pipe and
          CUDA_MPS_LOG_DIRECTORY=DIR/log (DIR relative: under --out), native tenants get the pipe
          directory, limiter tenants `tfusion run --mps-pipe-dir` (their active thread percentage
          follows their limit), and the daemon is stopped (`echo quit | nvidia-cuda-mps-control`)
          at the end of the phase, also on an error or a signal. Without the binary the phase says
          so and is skipped. It runs after the other phases, so their groups are the baseline
          without MPS in the same run.

Every limiter group also saves a `tfusion smi` taken mid-run (request, limit, use, throttled).
Output: OUT/colocation.md (tables), OUT/colocation.json, logs under OUT/logs.
"""
import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import tier_common as tc  # noqa: E402
from compute_share import busy_in as busy, load_segments  # noqa: E402


class Ctx:
    def __init__(self, args):
        self.args = args
        self.tfusion = os.path.join(args.build, "src/cli/tfusion")
        self.tenant = os.path.join(args.build, "tests/gpu/compute_tenant")
        self.work = os.path.join(args.out, "work")
        self.logs = os.path.join(args.out, "logs")
        os.makedirs(self.work, exist_ok=True)
        os.makedirs(self.logs, exist_ok=True)
        self.deadline = time.monotonic() + args.budget_s
        self.seq = 0
        self.remote = None  # "unix:PATH" while the remote phase runs
        self.mps_pipe = None  # the MPS daemon's pipe directory while the mps phase runs
        self.live = []  # the tenants of the group that runs now (killed if the run is interrupted)
        self.results = {}
        self.last_cpu = None  # the host's CPU busy fraction during the last group's timed part

    def left(self):
        return self.deadline - time.monotonic()


def limiter_prefix(ctx, percent, limit=None, vram="8GiB"):
    if ctx.remote:
        cmd = [ctx.tfusion, "run", "--remote", ctx.remote, "--token", "coloc", "--vram", vram,
               "--percent", f"{percent:g}"]
    else:
        cmd = [ctx.tfusion, "run", "--vram", vram, "--percent", f"{percent:g}"]
        if ctx.mps_pipe:
            cmd += ["--mps-pipe-dir", ctx.mps_pipe]
    if limit is not None:
        cmd += ["--percent-limit", f"{limit:g}"]
    return cmd + ["--"]


def tenant_env(ctx):
    """The environment of a group's tenants: under the mps phase, every tenant (native ones too)
    finds the daemon; tfusion run adds the limits. None: inherited as it is."""
    if not ctx.mps_pipe:
        return None
    return dict(os.environ, CUDA_MPS_PIPE_DIRECTORY=ctx.mps_pipe)


def cpu_ticks():
    """(busy, total) jiffies of all of the host's cores, from /proc/stat."""
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:]]
    idle = v[3] + (v[4] if len(v) > 4 else 0)
    return sum(v) - idle, sum(v)


class BusyMeter:
    """NVML's GPU utilization (nvidia-smi every 100 ms, the number HAMi's and TensorFusion's limiters
    read) over a window of a group's timed part."""

    def __init__(self):
        self.samples = []
        self.proc = subprocess.Popen(["nvidia-smi", "--query-gpu=utilization.gpu", "--format=csv,noheader,nounits",
                                      "-lms", "100"], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()
        self.window = None

    def _read(self):
        for line in self.proc.stdout:
            try:
                self.samples.append((time.monotonic(), float(line.split(",")[0])))
            except ValueError:
                pass

    def mark(self):
        return time.monotonic()

    def result(self, a, b):
        self.proc.terminate()
        self.proc.wait(5)
        util = [u for t, u in self.samples if a <= t <= b]
        return sum(util) / len(util) if util else None


def pin_prefix(ctx, i, n):
    """With --pin C: tenant i of a group runs on its own C of the CPUs this harness may use (the
    i*C-th to the i*C+C-1-th, wrapping); with --pin auto, C is those CPUs / the group's n tenants
    (at least 1). The same for native and limited groups, so that where the host's scheduler
    places launch-bound tenants does not change from group to group."""
    if not ctx.args.pin:
        return []
    allowed = sorted(os.sched_getaffinity(0))
    c = max(1, len(allowed) // n) if ctx.args.pin == "auto" else int(ctx.args.pin)
    cpus = sorted({allowed[(i * c + j) % len(allowed)] for j in range(c)})
    return ["taskset", "-c", ",".join(map(str, cpus))]


def start_group(ctx, tag, tenants, seconds, windows=0):
    """Starts a group's tenants (list of (prefix argv, model, batch)); with windows > 0 each runs that
    many timed windows (infer_tenant.py --windows). Returns (procs, ready files, go file)."""
    go = os.path.join(ctx.work, tag + ".go")
    procs, readies = [], []
    for i, (prefix, model, batch) in enumerate(tenants):
        ready = os.path.join(ctx.work, f"{tag}.{i}.ready")
        cmd = pin_prefix(ctx, i, len(tenants)) + list(prefix) + [
            ctx.args.python, os.path.join(HERE, "infer_tenant.py"), "--model", model, "--batch", str(batch),
            "--seconds", str(seconds), "--ready", ready, "--go", go]
        if windows:
            cmd += ["--windows", str(windows)]
        procs.append(tc.start(cmd, os.path.join(ctx.logs, f"{tag}.{i}.log"), tenant_env(ctx)))
        readies.append(ready)
    return procs, readies, go


def timed_part(ctx, tag, limited, seconds, collect):
    """A group's timed part, from its go signal: collect() waits for the tenants and returns their
    items/s. Meanwhile the host's CPU busy fraction over its middle (from 10% to 90% of it) goes to
    ctx.last_cpu (a launch-bound group may be capped by the host's cores rather than by the GPU),
    NVML's utilization with --busy-meter to ctx.last_busy, and a limited group's `tfusion smi`,
    taken halfway, to the logs."""
    cpu = []
    meter = BusyMeter() if ctx.args.busy_meter else None
    marks = []
    sampler = threading.Thread(target=lambda: (time.sleep(seconds * 0.1), cpu.append(cpu_ticks()),
                                               meter and marks.append(meter.mark()),
                                               time.sleep(seconds * 0.8), cpu.append(cpu_ticks()),
                                               meter and marks.append(meter.mark())), daemon=True)
    sampler.start()
    smi = None
    if limited:
        time.sleep(seconds / 2)
        smi = subprocess.run([ctx.tfusion, "smi"], capture_output=True, text=True, timeout=20).stdout
    out = collect()
    if smi:
        with open(os.path.join(ctx.logs, f"{tag}.smi.txt"), "w") as f:
            f.write(smi)
    sampler.join(5)
    ctx.last_busy = None
    if meter:
        ctx.last_busy = meter.result(*marks) if len(marks) == 2 else meter.result(0, 0)
        print(f"  {tag}: NVML utilization {fmt(ctx.last_busy)}% (mean over the middle 80%)", flush=True)
    ctx.last_cpu = None
    if len(cpu) == 2 and cpu[1][1] > cpu[0][1]:
        ctx.last_cpu = (cpu[1][0] - cpu[0][0]) / (cpu[1][1] - cpu[0][1])
    shown = " ".join("-" if v is None else f"{v:.1f}" for v in out)
    busy_txt = "" if ctx.last_cpu is None else f" (host CPU {100 * ctx.last_cpu:.0f}% busy)"
    return out, shown + busy_txt


def rate_in(text, prefix=""):
    """The items/s a tenant's log reports (after `prefix`, e.g. "window=3 "), None if none."""
    r = None
    for line in text.splitlines():
        if line.startswith(prefix + "items_per_s="):
            r = float(line[len(prefix):].split()[0].split("=")[1])
    return r


def run_group(ctx, name, tenants, seconds):
    """tenants: list of (prefix argv, model, batch). Returns per-tenant items/s (None = failed)."""
    ctx.seq += 1
    tag = f"{ctx.seq:03d}-{name}"
    procs, readies, go = start_group(ctx, tag, tenants, seconds)
    ctx.live = procs
    ok = tc.wait_files(readies, 150, procs)
    tc.touch(go)

    def collect():
        out = []
        for p in procs:
            rc, text = tc.finish(p, seconds + 60)
            out.append(rate_in(text) if rc == 0 else None)
        return out

    out, shown = timed_part(ctx, tag, ok and any(p[0] for p in tenants), seconds, collect)
    print(f"  {tag}: {shown}" + ("" if ok else " (not all ready)"), flush=True)
    return out


class WarmGroup:
    """A group whose tenants live through every round (--warm): started once with --windows, stopped
    (SIGSTOP to each tenant's process group) except during its own windows, so that the groups of
    a round run one at a time as fresh groups do, without paying the tenants' start-up each round."""

    def __init__(self, ctx, name, tenants, windows):
        ctx.seq += 1
        self.ctx, self.tenants, self.limited = ctx, tenants, any(p[0] for p in tenants)
        self.tag = f"{ctx.seq:03d}-{name}"
        self.procs, self.readies, self.go = start_group(ctx, self.tag, tenants, ctx.args.seconds, windows)

    def signal(self, sig):
        # Every tenant's process group, also one whose leader exited (its children may not have).
        for p in self.procs:
            try:
                os.killpg(p.pid, sig)
            except (ProcessLookupError, PermissionError):
                pass

    def window(self, k):
        """Runs window k (the group resumed, timed, stopped again); per-tenant items/s."""
        ctx, seconds = self.ctx, self.ctx.args.seconds
        self.signal(signal.SIGCONT)
        time.sleep(0.2)  # every tenant back on its CPUs before the go signal
        tc.touch(f"{self.go}.{k}")
        done = [f"{r}.{k}" for r in self.readies]

        def collect():
            # A tenant exits after its last window, possibly while the others' still run: wait
            # for every tenant's window, giving up only on tenants that exited without one.
            deadline = time.monotonic() + seconds + 60
            while time.monotonic() < deadline:
                waiting = [(p, d) for p, d in zip(self.procs, done) if not os.path.exists(d) and p.poll() is None]
                if not waiting:
                    break
                tc.wait_files([d for _, d in waiting], deadline - time.monotonic(), [p for p, _ in waiting])
            return [rate_in(tc.read(p.log_path), f"window={k} ") if os.path.exists(d) else None
                    for p, d in zip(self.procs, done)]

        out, shown = timed_part(ctx, f"{self.tag}.w{k}", self.limited, seconds, collect)
        self.signal(signal.SIGSTOP)
        print(f"  {self.tag} window {k}: {shown}", flush=True)
        return out

    def finish(self, wait_s):
        """Resumes the tenants and gives them wait_s to exit (they do after their last window). Those
        still waiting for a window (rounds cut short) get SIGTERM, which `tfusion run` forwards
        before it removes its vGPU, and another wait_s; the rest are killed."""
        self.signal(signal.SIGCONT)
        deadline = time.monotonic() + wait_s
        for p in self.procs:
            try:
                p.wait(timeout=max(deadline - time.monotonic(), 0.1))
            except subprocess.TimeoutExpired:
                pass
        if any(p.poll() is None for p in self.procs):
            self.signal(signal.SIGTERM)
        deadline = time.monotonic() + wait_s
        for p in self.procs:
            tc.finish(p, deadline - time.monotonic())


def total(values):
    return None if any(v is None for v in values) else sum(values)


def ratio(a, b):
    return None if a is None or not b else a / b


def fmt(v, d=1):
    return "-" if v is None else f"{v:.{d}f}"


def phase_coloc(ctx, md, ns=None, label="coloc"):
    ns = ns or [int(n) for n in ctx.args.ns.split(",")]
    rows = []
    for spec in ctx.args.models.split(","):
        model, batch = spec.split(":")
        batch = int(batch)
        for n in ns:
            if ctx.left() < 60:
                md.append(f"(skipped {model} b{batch} N={n}: time budget spent)")
                continue
            pct = 100.0 / n
            for rnd in range(ctx.args.rounds):
                nat = run_group(ctx, f"{label}-{model}{batch}-n{n}-native", [([], model, batch)] * n, ctx.args.seconds)
                nat_cpu = ctx.last_cpu
                lim = run_group(ctx, f"{label}-{model}{batch}-n{n}-limiter",
                                [(limiter_prefix(ctx, pct), model, batch)] * n, ctx.args.seconds)
                rows.append({"model": model, "batch": batch, "n": n, "round": rnd, "percent": pct,
                             "native": nat, "limiter": lim, "native_total": total(nat),
                             "limiter_total": total(lim), "ratio": ratio(total(lim), total(nat)),
                             "cpu_native": nat_cpu, "cpu_limiter": ctx.last_cpu})
    ctx.results[label] = rows
    md += [f"### {label}: aggregate throughput, N tenants at 100/N % each vs native ({ctx.args.seconds:g} s)", "",
           "| model | batch | N | share each | native items/s (sum) | limiter items/s (sum) | limiter / native | per tenant, limiter | host CPU busy, native / limiter |",
           "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    pct_of = lambda v: "-" if v is None else f"{100 * v:.0f}%"  # noqa: E731
    for r in rows:
        md.append(f"| {r['model']} | {r['batch']} | {r['n']} | {r['percent']:.1f}% | {fmt(r['native_total'])} | "
                  f"{fmt(r['limiter_total'])} | {fmt(r['ratio'], 3)} | "
                  f"{' '.join(fmt(v, 0) for v in r['limiter'])} | {pct_of(r['cpu_native'])} / {pct_of(r['cpu_limiter'])} |")
    md.append("")


def phase_noisy(ctx, md, label="noisy"):
    s = ctx.args.seconds
    small, big = ("r50", 1), ("r50", 64)
    solo = run_group(ctx, f"{label}-solo-native", [([],) + small], s)[0]
    nat = run_group(ctx, f"{label}-native", [([],) + small] + [([],) + big] * 3, s)
    variants = {"hard": limiter_prefix(ctx, 25), "burst": limiter_prefix(ctx, 25, 100)}
    rows = [{"variant": "native", "small": nat[0], "bigs": total(nat[1:])}]
    for vname, big_prefix in variants.items():
        small_prefix = limiter_prefix(ctx, 25, 100)
        lim = run_group(ctx, f"{label}-{vname}", [(small_prefix,) + small] + [(big_prefix,) + big] * 3, s)
        rows.append({"variant": vname, "small": lim[0], "bigs": total(lim[1:])})
    for r in rows:
        r["small_vs_solo"] = ratio(r["small"], solo)
        r["bigs_vs_native"] = ratio(r["bigs"], rows[0]["bigs"])
    ctx.results[label] = {"solo": solo, "rows": rows}
    md += [f"### {label}: ResNet-50 b1 (request 25%, limit 100%) beside three ResNet-50 b64 tenants", "",
           f"Solo b1, native: {fmt(solo)} images/s.", "",
           "| run | big tenants | b1 images/s | b1 / solo | b64 images/s (sum of 3) | b64 / native co-located |",
           "| --- | --- | --- | --- | --- | --- |"]
    desc = {"native": "native", "hard": "25% each (request = limit)", "burst": "request 25%, limit 100%"}
    for r in rows:
        md.append(f"| {r['variant']} | {desc[r['variant']]} | {fmt(r['small'])} | {fmt(r['small_vs_solo'], 3)} | "
                  f"{fmt(r['bigs'])} | {fmt(r['bigs_vs_native'], 3)} |")
    md.append("")


def spin_group(ctx, name, specs, solo_s, arrive_s, rest_s):
    """specs: list of (prefix, first?) -- first tenants start at go, the others at go + arrive_s."""
    ctx.seq += 1
    tag = f"{ctx.seq:03d}-{name}"
    go1, go2 = os.path.join(ctx.work, tag + ".go1"), os.path.join(ctx.work, tag + ".go2")
    procs, readies, outs = [], [], []
    for i, (prefix, first) in enumerate(specs):
        out = os.path.join(ctx.work, f"{tag}.{i}.seg")
        ready = os.path.join(ctx.work, f"{tag}.{i}.ready")
        secs = solo_s if first else rest_s
        cmd = list(prefix) + [ctx.tenant, "--seconds", str(secs), "--spin-us", "300", "--depth", "8",
                              "--out", out, "--ready-file", ready, "--go-file", go1 if first else go2]
        procs.append(tc.start(cmd, os.path.join(ctx.logs, f"{tag}.{i}.log"), tenant_env(ctx)))
        readies.append(ready)
        outs.append(out)
    ctx.live = procs
    tc.wait_files(readies, 60, procs)
    tc.touch(go1)
    time.sleep(arrive_s)
    tc.touch(go2)
    for p in procs:
        tc.finish(p, solo_s + 60)
    return [load_segments(o) for o in outs]


def phase_burst(ctx, md, label="burst"):
    arrive, solo_s, rest_s = 3.0, 7.0, 4.5
    nat = spin_group(ctx, f"{label}-native", [([], True)], 3.0, 0.0, 0.0)[0]
    segs = spin_group(ctx, f"{label}-limiter", [(limiter_prefix(ctx, 25, 100, "4GiB"), True)] +
                      [(limiter_prefix(ctx, 25, None, "4GiB"), False)] * 3, solo_s, arrive, rest_s)
    res = {}
    if nat and all(segs):
        w = 100_000_000
        n0 = nat[0][0]
        nat_share = busy(nat, n0 + 500_000_000, n0 + 2_500_000_000) / 2e9 * 100
        a = segs[0]
        a0 = a[0][0]
        arrival = min(s[0][0] for s in segs[1:])
        alone = busy(a, a0 + 500_000_000, arrival - 200_000_000) / (arrival - 200_000_000 - a0 - 500_000_000) * 100
        # A's share in 100 ms windows after the arrival; back at request when a 300 ms mean is <= 27%.
        end = min(s[-1][1] for s in segs)
        series = []
        t = arrival
        while t + w <= end:
            series.append(busy(a, t, t + w) / w * 100)
            t += w
        settle = None
        for i in range(len(series) - 2):
            if statistics.mean(series[i:i + 3]) <= 27.0:
                settle = (i + 3) * 0.1
                break
        lo, hi = arrival + 1_000_000_000, end
        steady = [busy(s, lo, hi) / (hi - lo) * 100 for s in segs] if hi > lo else []
        res = {"native_share": nat_share, "alone_share": alone, "alone_vs_native": alone / nat_share,
               "settle_s": settle, "steady": steady, "series": series}
    ctx.results[label] = res
    md += [f"### {label}: A (request 25%, limit 100%) alone, then three 25% tenants arrive (300 µs spin kernels)", ""]
    if not res:
        md += ["(failed: a tenant produced no kernel segments; see logs)", ""]
        return
    md += [f"- A alone: {res['alone_share']:.1f}% of GPU time vs {res['native_share']:.1f}% natively "
           f"(ratio {res['alone_vs_native']:.3f}).",
           f"- A back at its request (300 ms mean <= 27%) {fmt(res['settle_s'])} s after the arrival.",
           f"- Shares from 1 s after the arrival: " + ", ".join(
               f"{n} {v:.1f}%" for n, v in zip(["A", "B", "C", "D"], res["steady"])) +
           f" (sum {sum(res['steady']):.1f}%).",
           "- A's share per 100 ms after the arrival: " + " ".join(f"{v:.0f}" for v in res["series"][:20]), ""]


def phase_solo(ctx, md):
    """One tenant alone at 100%: native and under the limiter, interleaved, --solo-rounds rounds."""
    rows = []
    for spec in ctx.args.solo_models.split(","):
        model, batch = spec.split(":")
        batch = int(batch)
        nat, lim = [], []
        for rnd in range(ctx.args.solo_rounds):
            if ctx.left() < 40:
                break
            nat += run_group(ctx, f"solo-{model}{batch}-native", [([], model, batch)], ctx.args.seconds)
            lim += run_group(ctx, f"solo-{model}{batch}-limiter", [(limiter_prefix(ctx, 100), model, batch)],
                             ctx.args.seconds)
        ok_n = [v for v in nat if v is not None]
        ok_l = [v for v in lim if v is not None]
        med_n = statistics.median(ok_n) if ok_n else None
        med_l = statistics.median(ok_l) if ok_l else None
        rows.append({"model": model, "batch": batch, "native": nat, "limiter": lim, "native_median": med_n,
                     "limiter_median": med_l, "ratio": ratio(med_l, med_n)})
    ctx.results["solo"] = rows
    md += [f"### solo: one tenant at 100%, native and limiter interleaved ({ctx.args.seconds:g} s each)", "",
           "| model | batch | native items/s per round | limiter items/s per round | median limiter / native |",
           "| --- | --- | --- | --- | --- |"]
    for r in rows:
        md.append(f"| {r['model']} | {r['batch']} | {' '.join(fmt(v) for v in r['native'])} | "
                  f"{' '.join(fmt(v) for v in r['limiter'])} | {fmt(r['ratio'], 3)} |")
    md.append("")


def phase_ab(ctx, md):
    """Variants of the limiter beside native, interleaved: for each --models and --ns, a native
    group, then one group per --ab-variants entry (NAME=PERCENT[:VAR=VALUE,...]: every tenant under
    `tfusion run --percent PERCENT` with those variables; PERCENT `even` is 100/N), --rounds rounds."""
    variants = []
    for spec in ctx.args.ab_variants.split(";"):
        name, rest = spec.split("=", 1)
        pct, _, env = rest.partition(":")
        # "even": 100/N % each, whatever the group's N.
        variants.append((name, pct if pct == "even" else float(pct), [e for e in env.split(",") if e]))
    rows = []
    for spec in ctx.args.models.split(","):
        model, batch = spec.split(":")
        batch = int(batch)
        for n in [int(x) for x in ctx.args.ns.split(",")]:
            groups = [("native", [])] + [(name, (["env"] + env if env else []) +
                                          limiter_prefix(ctx, 100.0 / n if pct == "even" else pct))
                                         for name, pct, env in variants]
            if ctx.args.warm:
                rows += ab_rounds_warm(ctx, md, model, batch, n, groups)
                continue
            for rnd in range(ctx.args.rounds):
                if ctx.left() < 60:
                    md.append(f"(skipped {model} b{batch} N={n} round {rnd + 1}: time budget spent)")
                    continue
                row = {"model": model, "batch": batch, "n": n, "round": rnd}
                for name, prefix in groups:
                    row[name] = total(run_group(ctx, f"ab-{model}{batch}-n{n}-{name}", [(prefix, model, batch)] * n,
                                                ctx.args.seconds))
                rows.append(row)
    ctx.results["ab"] = rows
    names = [v[0] for v in variants]
    md += [f"### ab: limiter variants beside native ({ctx.args.seconds:g} s; items/s summed, ratio to native)", "",
           "| model | batch | N | round | native | " + " | ".join(names) + " |",
           "| --- | --- | --- | --- | --- | " + " | ".join("---" for _ in names) + " |"]
    for r in rows:
        cells = [f"{fmt(r[n])} ({fmt(ratio(r[n], r['native']), 3)})" for n in names]
        md.append(f"| {r['model']} | {r['batch']} | {r['n']} | {r['round'] + 1} | {fmt(r['native'])} | " + " | ".join(cells) + " |")
    md.append("")
    # Single groups on a shared host move by 0.1-0.3: the mean over rounds is what a claim rests on.
    md += ["| model | batch | N | " + " | ".join(f"{n}: mean ratio (min-max, rounds)" for n in names) + " |",
           "| --- | --- | --- | " + " | ".join("---" for _ in names) + " |"]
    for key in dict.fromkeys((r["model"], r["batch"], r["n"]) for r in rows):
        group = [r for r in rows if (r["model"], r["batch"], r["n"]) == key]
        cells = []
        for n in names:
            rs = [x for x in (ratio(r[n], r["native"]) for r in group) if x is not None]
            cells.append(f"{fmt(statistics.mean(rs), 3)} ({fmt(min(rs), 3)}-{fmt(max(rs), 3)}, {len(rs)})" if rs else "-")
        md.append(f"| {key[0]} | {key[1]} | {key[2]} | " + " | ".join(cells) + " |")
    md.append("")


def ab_rounds_warm(ctx, md, model, batch, n, groups):
    """The ab phase's rounds with --warm: every group (native and each variant, n tenants each)
    starts once and runs one window per round, the groups of a round one after another."""
    if ctx.left() < 90:
        md.append(f"(skipped {model} b{batch} N={n}: time budget spent)")
        return []
    warm = [WarmGroup(ctx, f"ab-{model}{batch}-n{n}-{name}", [(prefix, model, batch)] * n, ctx.args.rounds)
            for name, prefix in groups]
    ctx.live = [p for g in warm for p in g.procs]
    rows = []
    try:
        ready = tc.wait_files([r for g in warm for r in g.readies], 300, ctx.live)
        for g in warm:
            g.signal(signal.SIGSTOP)
        if not ready:
            md.append(f"(skipped {model} b{batch} N={n}: not every tenant started)")
            return []
        for rnd in range(ctx.args.rounds):
            if ctx.left() < len(warm) * (ctx.args.seconds + 5):
                md.append(f"(skipped {model} b{batch} N={n} round {rnd + 1}: time budget spent)")
                break
            row = {"model": model, "batch": batch, "n": n, "round": rnd}
            for (name, _), g in zip(groups, warm):
                row[name] = total(g.window(rnd))
            rows.append(row)
    finally:
        for g in warm:
            g.finish(15)
    return rows


def phase_probe(ctx, md):
    """Diagnosis: four ResNet-50 b1 tenants at several shares and tick periods."""
    rows = []
    for pct, tick in ((25, None), (25, 1000), (30, None), (40, None)):
        env = ["env", f"TFUSION_SHARE_TICK_US={tick}"] if tick else []
        r = run_group(ctx, f"probe-p{pct}-t{tick or 500}", [(env + limiter_prefix(ctx, pct), "r50", 1)] * 4,
                      ctx.args.seconds)
        rows.append((pct, tick or 500, r))
    md += ["### probe: four ResNet-50 b1 tenants under the limiter", "", "| share each | tick us | images/s |",
           "| --- | --- | --- |"]
    md += [f"| {p} | {t} | {' '.join(fmt(v, 0) for v in r)} (sum {fmt(total(r))}) |" for p, t, r in rows]
    md.append("")


def phase_remote(ctx, md):
    # --remote-spins: one worker per value of its --spin-us (how long a session waits awake for the
    # next call), the co-location groups under each; the noisy and burst phases run under the first.
    spins = [v for v in ctx.args.remote_spins.split(",") if v] or [None]
    for i, spin in enumerate(spins):
        sock = os.path.join(ctx.work, f"coloc-worker{i}.sock")
        argv = [ctx.tfusion, "worker", "--listen", "unix:" + sock, "--token", "coloc"]
        if spin is not None:
            argv += ["--spin-us", spin]
        worker = tc.start(argv, os.path.join(ctx.logs, f"worker{i}.log"))
        for _ in range(100):
            if os.path.exists(sock):
                break
            time.sleep(0.1)
        ctx.remote = "unix:" + sock
        try:
            saved = ctx.args.models
            ctx.args.models = ctx.args.remote_models
            label = "remote-coloc" if spin is None else f"remote-coloc (worker --spin-us {spin})"
            if ctx.args.remote_ab:
                # The ab variants through the worker (--percent 100: a session the worker does not govern).
                saved_ns = ctx.args.ns
                ctx.args.ns = ctx.args.remote_ns
                md += [f"#### {label}: ab", ""]
                phase_ab(ctx, md)
                ctx.args.ns = saved_ns
            else:
                phase_coloc(ctx, md, ns=[int(n) for n in ctx.args.remote_ns.split(",")], label=label)
            ctx.args.models = saved
            if i == 0 and not ctx.args.skip_remote_noisy:
                phase_noisy(ctx, md, label="remote-noisy")
                if ctx.args.remote_burst:
                    phase_burst(ctx, md, label="remote-burst")
        finally:
            ctx.remote = None
            # Stopped as an operator stops it (SIGTERM): it ends its sessions and removes their
            # vGPUs; a vGPU named remote-* still listed afterwards is reported.
            try:
                worker.send_signal(signal.SIGTERM)
            except ProcessLookupError:
                pass
            rc, _ = tc.finish(worker, 20)
            left = []
            try:
                smi = subprocess.run([ctx.tfusion, "smi"], capture_output=True, text=True, timeout=20).stdout
                left = sorted({w for w in smi.split() if w.startswith("remote-")})
            except (OSError, subprocess.SubprocessError):
                smi = None
            verdict = "none" if smi is not None and not left else ("unknown (smi failed)" if smi is None else ", ".join(left))
            md += ["", f"Worker {i} stopped with SIGTERM: exit {rc if rc is not None else 'killed after 20 s'}; "
                   f"remote vGPUs left afterwards: {verdict}.", ""]
            print(f"worker {i} stop: rc={rc} left={verdict}", flush=True)


class MpsDaemon:
    """A private MPS control daemon for the mps phase: started with `nvidia-cuda-mps-control -d`
    under its own pipe and log directories, stopped with `echo quit | nvidia-cuda-mps-control`."""

    def __init__(self, root):
        self.pipe = os.path.join(root, "pipe")
        self.log = os.path.join(root, "log")
        self.binary = shutil.which("nvidia-cuda-mps-control")
        self.env = dict(os.environ, CUDA_MPS_PIPE_DIRECTORY=self.pipe, CUDA_MPS_LOG_DIRECTORY=self.log)
        self.started = False

    def start(self):
        """None when the daemon is up, else why not."""
        if not self.binary:
            return "nvidia-cuda-mps-control is not on PATH"
        if len(self.pipe) > 90:
            return f"the pipe directory {self.pipe} is too long for the daemon's sockets: give a shorter --mps DIR"
        os.makedirs(self.pipe, exist_ok=True)
        os.makedirs(self.log, exist_ok=True)
        control = os.path.join(self.pipe, "control")
        if os.path.exists(control):
            return f"{control} exists already: another daemon uses {self.pipe}"
        r = subprocess.run([self.binary, "-d"], env=self.env, capture_output=True, text=True, timeout=30)
        self.started = True  # whatever it said, try to stop it at the end
        if r.returncode != 0:
            return f"nvidia-cuda-mps-control -d exited with {r.returncode}: {(r.stdout + r.stderr).strip()}"
        for _ in range(100):
            if os.path.exists(control):
                return None
            time.sleep(0.1)
        return f"no {control} 10 s after nvidia-cuda-mps-control -d (its log: {self.log})"

    def stop(self):
        """Stops the daemon (it waits for its clients, so the tenants must be gone)."""
        if not self.started:
            return
        self.started = False
        try:
            r = subprocess.run([self.binary], input="quit\n", env=self.env, capture_output=True, text=True,
                               timeout=60)
            print(f"  MPS daemon stopped (quit: rc {r.returncode})", flush=True)
        except subprocess.TimeoutExpired:
            print(f"  MPS daemon did not answer quit within 60 s (pipe {self.pipe})", flush=True)


def phase_mps(ctx, md):
    root = ctx.args.mps if os.path.isabs(ctx.args.mps) else os.path.join(ctx.args.out, ctx.args.mps)
    daemon = MpsDaemon(root)
    try:
        why = daemon.start()
        if why:
            md += [f"(phase mps skipped: {why})", ""]
            print(f"  skipped: {why}", flush=True)
            return
        ctx.mps_pipe = daemon.pipe
        md += [f"Under MPS: a private daemon (pipe directory {daemon.pipe}); native tenants run as MPS "
               "clients, limiter tenants with `tfusion run --mps-pipe-dir` (active thread percentage = their "
               "limit).", ""]
        phase_noisy(ctx, md, label="mps-noisy")
        plain = ctx.results.get("noisy")
        mps_rows = ctx.results["mps-noisy"]["rows"]
        if plain and plain.get("solo"):
            md += [f"Against the solo b1 without MPS in this run ({fmt(plain['solo'])} images/s): " + ", ".join(
                f"{r['variant']} {fmt(ratio(r['small'], plain['solo']), 3)}" for r in mps_rows) + ".", ""]
        saved_models = ctx.args.models
        ctx.args.models = "r50:1"
        try:
            phase_coloc(ctx, md, ns=(4,), label="mps-coloc")
        finally:
            ctx.args.models = saved_models
    finally:
        for p in ctx.live:
            if p.poll() is None:
                tc.kill_group(p)
                p.wait()
        ctx.mps_pipe = None
        daemon.stop()


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--phases", default="coloc,noisy,burst")
    ap.add_argument("--models", default="r50:1,gpt2:1,r50:64")
    ap.add_argument("--remote-models", default="r50:1,gpt2:1")
    ap.add_argument("--ns", default="1,2,4,8", help="tenant counts of the coloc phase")
    ap.add_argument("--remote-ns", default="4", help="tenant counts of the remote phase's coloc")
    ap.add_argument("--remote-burst", action="store_true", help="the remote phase runs burst too")
    ap.add_argument("--remote-spins", default="",
                    help="worker --spin-us values, comma-separated: the remote co-location groups under each")
    ap.add_argument("--skip-remote-noisy", action="store_true", help="the remote phase runs no noisy neighbour")
    ap.add_argument("--remote-ab", action="store_true",
                    help="the remote phase runs the ab variants (--ab-variants, --rounds) instead of coloc")
    ap.add_argument("--solo-models", default="gpt2:1,r50:1")
    ap.add_argument("--solo-rounds", type=int, default=3)
    ap.add_argument("--seconds", type=float, default=5)
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--ab-variants", default="limiter=25",
                    help="the ab phase's variants: NAME=PERCENT[:VAR=VALUE,...] separated by ';'")
    ap.add_argument("--busy-meter", action="store_true",
                    help="log each group's mean NVML utilization (nvidia-smi every 100 ms)")
    ap.add_argument("--budget-s", type=float, default=540)
    ap.add_argument("--warm", action="store_true",
                    help="the ab phase starts each group once and runs its rounds as timed windows of the "
                         "same tenants, stopped between their windows")
    ap.add_argument("--pin", default="", metavar="C|auto",
                    help="run tenant i of each group on its own C host CPUs (taskset; auto: the CPUs / the "
                         "group's tenants), natively and limited alike")
    ap.add_argument("--python", default=sys.executable)
    ap.add_argument("--mps", metavar="DIR",
                    help="also run the mps phase (last) under a private MPS daemon whose pipe and log "
                         "directories are made in DIR (relative: under --out)")
    args = ap.parse_args()
    phases = args.phases.split(",")
    if args.mps and "mps" not in phases:
        phases.append("mps")
    if "mps" in phases and not args.mps:
        raise SystemExit("phase mps needs --mps DIR")
    usable = len(os.sched_getaffinity(0))
    if args.pin not in ("", "auto") and not (args.pin.isdigit() and int(args.pin) <= usable):
        raise SystemExit(f"--pin {args.pin}: must be auto, or 0 (off) to {usable} (the CPUs this process may "
                         "use) per tenant")
    if args.pin == "0":
        args.pin = ""
    # A signal (timeout's SIGTERM, Ctrl-C) unwinds through the phases' cleanup: the mps phase stops
    # its daemon.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    ctx = Ctx(args)
    md = []
    for phase in phases:
        fn = {"coloc": phase_coloc, "noisy": phase_noisy, "burst": phase_burst, "remote": phase_remote,
              "probe": phase_probe, "mps": phase_mps, "solo": phase_solo,
              "ab": phase_ab}.get(phase)
        if fn is None:
            raise SystemExit(f"unknown phase {phase!r}")
        if ctx.left() < 45:
            md += [f"(phase {phase} skipped: time budget spent)", ""]
            continue
        print(f"== {phase} ({time.strftime('%T')})", flush=True)
        fn(ctx, md)
        with open(os.path.join(args.out, "colocation.md"), "w") as f:
            f.write("\n".join(md) + "\n")
        with open(os.path.join(args.out, "colocation.json"), "w") as f:
            json.dump(ctx.results, f, indent=1)
    print("\n".join(md))


if __name__ == "__main__":
    main()
