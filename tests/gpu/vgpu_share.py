#!/usr/bin/env python3
"""Several processes in one vGPU: the VRAM limit holds across processes, and a killed process's
share comes back.

concurrency N: N processes of one vGPU (--vram 2GiB) start allocating 32 MiB chunks at the same
  moment (ready/go files) until refused, and hold what they got until all are done. PASS when
  the sum of what they got <= limit + 2 MiB, every process was refused with
  CUDA_ERROR_OUT_OF_MEMORY, and at least one got memory.
kill: a lone process of a fresh vGPU first measures what it can allocate (B). Then a child holds
  1 GiB, a waiter process of the same vGPU starts and waits, the child is killed with SIGKILL,
  and the waiter must allocate B - 64 MiB within 2 s of the kill.
runkill: `tfusion run` (its own vGPU, run-PID) is killed with SIGKILL while its command holds
  512 MiB: the vGPU must stay while the command lives, and `tfusion smi` must no longer list it
  within 10 s of the command's end.
runkillnamed: the same with a vGPU the run shares by name (`--vgpu NAME`).
"""
import argparse
import os
import signal
import time

import tier_common as tc

LIMIT = 2 * tc.GIB
GRANULE = 2 * tc.MIB


def concurrency(args, n):
    name = f"vram concurrency {n} processes"
    work = os.path.join(args.work, f"conc{n}")
    os.makedirs(work, exist_ok=True)
    vgpu = f"conc{n}-{os.getpid()}-{int(time.time())}"
    go, release = os.path.join(work, "go"), os.path.join(work, "release")
    procs, inits, readies = [], [], []
    for i in range(n):
        init, ready = os.path.join(work, f"{i}.init"), os.path.join(work, f"{i}.ready")
        cmd = [args.drvtest, "hold", "--chunk", "32MiB", "--max", "3GiB", "--init-file", init,
               "--go-file", go, "--ready-file", ready, "--release-file", release,
               "--hold-seconds", "30", "--go-timeout", "40"]
        procs.append(tc.start(tc.limited(args.tfusion, "2GiB", 100, vgpu, cmd),
                              os.path.join(args.logs, f"conc{n}-p{i}.log")))
        inits.append(init)
        readies.append(ready)
    inited = tc.wait_files(inits, 40, procs)
    tc.touch(go)
    done = tc.wait_files(readies, 30, procs) if inited else False
    tc.run([args.tfusion, "smi"], os.path.join(args.logs, f"conc{n}-smi.log"), 15)
    tc.touch(release)
    statuses = [tc.finish(p, 20) for p in procs]
    if not inited or not done:
        tc.record(args.results, name, "FAIL",
                  f"processes not {'ready' if inited else 'initialized'} in time; exit {[s[0] for s in statuses]}")
        return
    got, errors = [], []
    for ready in readies:
        _pid, total, err = tc.read(ready).split()
        got.append(int(total))
        errors.append(int(err))
    total = sum(got)
    note = (f"sum {total / tc.MIB:.0f} MiB (limit {LIMIT // tc.MIB} + {GRANULE // tc.MIB} MiB); per process "
            f"{[g // tc.MIB for g in got]} MiB; errors {errors}")
    ok = total <= LIMIT + GRANULE and all(e == 2 for e in errors) and total > 0
    tc.record(args.results, name, "PASS" if ok else "FAIL", note)


def kill_reclaim(args):
    name = "vram reclaim after kill -9"
    work = os.path.join(args.work, "kill")
    os.makedirs(work, exist_ok=True)
    vgpu = f"kill-{os.getpid()}-{int(time.time())}"
    chunk = 64 * tc.MIB

    def lim(cmd):
        return tc.limited(args.tfusion, "2GiB", 100, vgpu, cmd)

    rc, text = tc.run(lim([args.drvtest, "hold", "--chunk", "64MiB", "--max", "3GiB", "--hold-seconds", "0"]),
                      os.path.join(args.logs, "kill-baseline.log"), 30)
    baseline = int(tc.parse_results(text).get("total_bytes", "0"))
    if rc != 0 or baseline < 2 * chunk:
        tc.record(args.results, name, "FAIL", f"baseline run failed (exit {rc}, got {baseline} bytes)")
        return
    target = baseline - chunk
    child_ready = os.path.join(work, "child.ready")
    child = tc.start(lim([args.drvtest, "hold", "--chunk", "64MiB", "--target", "1GiB",
                          "--ready-file", child_ready, "--hold-seconds", "60"]),
                     os.path.join(args.logs, "kill-child.log"))
    waiter_init, go = os.path.join(work, "waiter.init"), os.path.join(work, "go")
    waiter = tc.start(lim([args.drvtest, "reclaim", "--chunk", "64MiB", "--max", "3GiB",
                           "--target", str(target), "--init-file", waiter_init, "--go-file", go,
                           "--deadline-ms", "2000", "--give-up-ms", "10000"]),
                      os.path.join(args.logs, "kill-waiter.log"))
    if not tc.wait_files([child_ready, waiter_init], 40, [child, waiter]):
        for p in (child, waiter):
            tc.finish(p, 0)
        tc.record(args.results, name, "FAIL", "child or waiter did not start")
        return
    child_pid, child_total, _ = tc.read(child_ready).split()
    os.kill(int(child_pid), signal.SIGKILL)
    tc.touch(go)
    tc.finish(child, 10)
    wrc, wtext = tc.finish(waiter, 20)
    r = tc.parse_results(wtext)
    note = (f"baseline {baseline // tc.MIB} MiB, child held {int(child_total) // tc.MIB} MiB, "
            f"target {target // tc.MIB} MiB, reclaimed in {r.get('reclaim_ms', '?')} ms "
            f"(best {int(r.get('best_bytes', '0')) // tc.MIB} MiB, limit 2000 ms)")
    tc.record(args.results, name, "PASS" if wrc == 0 and r.get("verdict") == "PASS" else "FAIL", note)


def run_killed(args, named):
    name = "vgpu shared by name, its run killed outright" if named else "vgpu of a run killed outright"
    part = "runkillnamed" if named else "runkill"
    work = os.path.join(args.work, part)
    os.makedirs(work, exist_ok=True)
    ready = os.path.join(work, "child.ready")
    shared = f"named-{os.getpid()}-{int(time.time())}" if named else ""
    run = tc.start(tc.limited(args.tfusion, "2GiB", 100, shared, [
        args.drvtest, "hold", "--chunk", "64MiB", "--target", "512MiB", "--ready-file", ready, "--hold-seconds", "60"]),
        os.path.join(args.logs, f"{part}.log"))
    vgpu = shared or f"run-{run.pid}"

    def listed(tag):
        _rc, text = tc.run([args.tfusion, "smi"], os.path.join(args.logs, f"{part}-smi-{tag}.log"), 15)
        return any(line.split()[:1] == [vgpu] for line in text.splitlines())

    if not tc.wait_files([ready], 40, [run]):
        tc.finish(run, 0)
        tc.record(args.results, name, "FAIL", "the command did not start")
        return
    command_pid = int(tc.read(ready).split()[0])
    before = listed("before")
    os.kill(run.pid, signal.SIGKILL)
    tc.finish(run, 5)  # only tfusion run: its command is in the same group, but still running
    try:
        os.kill(command_pid, 0)
        command_lived = True
    except ProcessLookupError:
        command_lived = False
    during = listed("during")
    os.kill(command_pid, signal.SIGKILL)
    t0 = time.monotonic()
    gone_s = None
    while time.monotonic() - t0 < 10:
        if not listed("after"):
            gone_s = time.monotonic() - t0
            break
        time.sleep(0.2)
    note = (f"{vgpu}: listed before the kill {before}, while its command lived {during} "
            f"(command alive after the kill: {command_lived}); "
            + (f"gone {gone_s:.1f} s after the command was killed" if gone_s is not None else "still listed after 10 s"))
    tc.record(args.results, name, "PASS" if before and during and command_lived and gone_s is not None else "FAIL", note)


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--tfusion", required=True)
    ap.add_argument("--drvtest", required=True)
    ap.add_argument("--work", required=True)
    ap.add_argument("--logs", required=True)
    ap.add_argument("--results", required=True)
    ap.add_argument("--parts", default="conc2,conc4,kill,runkill,runkillnamed")
    args = ap.parse_args()
    os.makedirs(args.work, exist_ok=True)
    os.makedirs(args.logs, exist_ok=True)
    parts = {"conc2": ("vram concurrency 2 processes", lambda: concurrency(args, 2)),
             "conc4": ("vram concurrency 4 processes", lambda: concurrency(args, 4)),
             "kill": ("vram reclaim after kill -9", lambda: kill_reclaim(args)),
             "runkill": ("vgpu of a run killed outright", lambda: run_killed(args, False)),
             "runkillnamed": ("vgpu shared by name, its run killed outright", lambda: run_killed(args, True))}
    for part in args.parts.split(","):
        name, fn = parts[part]
        try:
            fn()
        except Exception as e:  # one broken part must not hide the others
            tc.record(args.results, name, "FAIL", f"harness error: {e!r}")


if __name__ == "__main__":
    main()
