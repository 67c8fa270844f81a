#!/usr/bin/env python3
"""The VRAM-tiering GPU tier and benchmarks (docs/benchmarks.md, "VRAM tiering"), from a staged
build: python3 tests/gpu/tiering.py --build BUILD --out OUT [--phases a,b,...]

Phases (tier_tenant.py does the work inside each tenant):
  checks  PyTorch tensors, ResNet-50/GPT-2 weights, a CUDA graph and an allocation made while
          swapped survive freeze cycles (resumed by the first call or by `tfusion thaw`)
  pool    PyTorch's stream-ordered allocator beside a raw cuMemAlloc buffer, one freeze
  pools   stream-ordered pools move: PyTorch under backend:cudaMallocAsync (1 MiB, 256 MiB and 1 GiB
          tensors, some freed and reallocated), a raw cuMemAllocAsync buffer and a cuMemCreate
          buffer the tenant maps itself, four freeze cycles (two ended by `tfusion thaw`) with
          checksums, movable / in-host / fixed MiB and the pool's reserved and used MiB
  expandable  the tenant's own VMM memory moves: PyTorch under expandable_segments:True with about
          2 GiB of tensors, two freeze cycles (the second ended by `tfusion thaw`): checksums, the
          process's VRAM (nvidia-smi) before and while swapped (ok: at least 1800 MiB less), a matmul
  graphmem  graph memory nodes: PyTorch under backend:cudaMallocAsync replays a CUDA graph whose
          capture allocates (temporaries freed inside the graph, a 256 MiB output that stays live)
          beside 1 GiB of tensors; one freeze (trims what the driver keeps unused) and a thaw: the
          driver's graph memory used/reserved and the process's VRAM before, while swapped and
          after, the fixed figure, the limiter's graph memory log line, the output after the thaw
          and after a replay (ok: intact, reserved not above before, VRAM at least 900 MiB lower
          while swapped); under 40 s
  train   GPT-2 training: two uninterrupted runs and one frozen and resumed mid-run, losses compared
  swap    swap-out/swap-in of 1, 4 and 16 GiB (three cycles each)
  idle    1, 4 and 16 GiB swapped out by the idle timeout (4 s; host copies pinned ahead from 2 s),
          two cycles each: the first swap-out of a process too only copies
  disk    1 and 4 GiB moved on to the disk tier (TF_DISK_DIR, default /tmp/tf-disk-tier) after 1 s
          swapped and idle, and read back by the first call
  firstfreeze  the first explicit `tfusion freeze` of a busy tenant (matmuls for 10 s, never idle)
          holding 1, 4 and 16 GiB: with its host copies pinned ahead (TFUSION_TIER_PIN_AHEAD=2, the
          default) and without (off), one process each, in the same run
  ckpt    the driver's checkpoint API (cuCheckpointProcess*) on a native tenant of 1, 4 and 16 GiB
  zero    scale to zero under `tfusion run --tiering`, 1 and 4 GiB (+ the PyTorch context): freeze,
          then freeze --zero twice, each resumed by the first call; VRAM of the process after each.
          Then the idle policy (`--idle-swap 2s --idle-zero 5s`, checkpointed by `tfusion run`), and
          the node agent as zero keeper: `tfusion up`, an allocation with idle_swap_ms 2000 and
          idle_zero_ms 5000, a 4 GiB tenant bound to its vGPU by hand (no `tfusion run`), which the
          agent checkpoints when idle and restores at its first call
  gen     GPT-2 time to first token: cold process vs after a freeze
  alloc   cuMemAlloc/cuMemFree latency: native, limiter, limiter with tiering
  ipcfix  legacy CUDA IPC from tiered tenants (the limiter's own handle): tests/gpu/ipc_pair natively
          and with producer and consumer under `tfusion run --tiering`; a PyTorch tenant passing a
          1 GiB CUDA tensor to a torch.multiprocessing (spawn) child that reads and modifies it, a
          freeze (the shared tensor stays fixed, the other moves), all checked
  steady  ResNet-50 b64 and GPT-2 b8 throughput, interleaved: native, limiter, limiter with tiering
  remote  the same checks, GPT-2 training frozen mid-run, and 1/4/16 GiB swaps for a remote session:
          a `tfusion worker --tiering --idle-swap 0` on this host, the tenant under
          `tfusion run --remote` over shared memory and over loopback TCP; it freezes its session's
          vGPU (remote-PID) with `tfusion freeze`
  rzero   scale to zero of a remote session: `tfusion worker --tiering --idle-swap 2s --idle-zero 5s`
          on a unix socket, a 1 GiB PyTorch tenant under `tfusion run --remote` idle until the
          worker's zero keeper checkpoints its session (VRAM of the session then: ok needs 0), then
          its first call restores it (checksum); under 60 s
  rpool   scale to zero of a remote session through its pool allocation: `tfusion controller`,
          `tfusion worker --tiering` (no --idle-zero of its own) and `tfusion hypervisor` naming
          the worker's loopback TCP address, all on this host; a 1 GiB PyTorch tenant under
          `tfusion run --controller --qos low --idle-swap 2s --idle-zero 5s` that finds no GPU of its
          own (no NVML), so it runs through the worker with its session bound to the allocation
          (remote-PID@a-...); idle until the worker's keeper checkpoints the session by the
          allocation's timeout (VRAM then: ok needs 0), then its first call restores it (checksum);
          under 60 s
  rplain  a remote session of a pool that does not oversell VRAM (the default): controller, worker and
          node agent on this host; a 1 GiB PyTorch tenant under `tfusion run --controller` without
          a GPU of its own runs bound to its allocation (remote-PID@a-...), `GET /v1/allocations`
          lists the session's pid under the allocation, its call completes intact, and deleting
          the allocation ends the session (its next call fails with a CUDA error); under 60 s
  rhold   QoS preemption of a remote session bound to a pool allocation: `tfusion controller`,
          `tfusion worker --tiering` and `tfusion hypervisor` naming the worker's loopback TCP
          address, all on this host; a 1 GiB PyTorch tenant under `tfusion run --controller --qos low`
          without a GPU of its own (no NVML) runs through the worker (remote-PID@a-...); a critical
          allocation on every GPU of the node suspends it: the session's VRAM (nvidia-smi) drops
          (ok: by at least 900 MiB), the tenant's next GPU call waits (still waiting after 3 s),
          the critical allocation is deleted and the call completes intact; then the tenant's own
          allocation is deleted: the node agent ends the session (its process and vGPU gone) and
          the tenant's next call fails with a CUDA error instead of hanging; under 60 s
  preempt QoS preemption through the control plane: `tfusion up` on this host, a pool that oversells
          VRAM, a low-QoS `tfusion run --controller` tenant holding 8 GiB, then a critical
          allocation that needs its compute: the tenant is suspended (swapped out, held), its
          GPU call waits, and after the critical allocation is deleted it goes on intact
  oversub four tenants of 30 GiB working sets (about 40% of the GPU each) serving bursts with idle
          gaps on one GPU with tiering, against one such tenant alone (running the four one after
          another serves requests at the rate of one alone)
  faults  docs/tiering.md "Faults" on the GPU, seven sub-cases, each with its own verdict (ok and the
          facts) and killing what it started; TF_FAULT_CASES=a,b runs some (names below); a
          tenant is tier_tenant.py fault (GiB of tensors with checksums, stepped through go files):
          swapin_without_room: a frozen 4 GiB tenant whose VRAM a native PyTorch process took (all
            but 1 GiB free): its next op fails with out of memory and it lives on, swapped in host
            memory; `tfusion thaw` exits 1; once the hog exits its next op resumes it intact
          disk_unwritable: a 1 GiB tenant under `ulimit -f` (64 MiB) with a disk tier: the move to
            disk fails (File too large), it stays swapped in host memory, the folder stays empty,
            resumes intact
          foreign_files: files in the disk tier's folder that it did not make keep names, sizes,
            mtimes and sha256 through a move to disk and a resume
          freeze_twice: `tfusion freeze --no-wait` of a 16 GiB tenant (host copies not pinned
            ahead), then `tfusion freeze` while it swaps out (exit 2; the facts say so if the
            swap-out was already done), then once swapped (exit 0, nothing changed); one swap-out
            and one swap-in
          killed_while_swapped: a 4 GiB tenant killed (SIGKILL) while swapped: the host tier back
            to 0 MiB (`tfusion smi`); a next tenant swaps and resumes
          agent_restart: `tfusion up`, a tenant of a pool allocation frozen through the
            controller, the agent killed (SIGKILL) and started again on its state folder and port:
            `tfusion ps` shows it swapped, a thaw through the controller resumes it intact
          node_budget: `tfusion up --host-tier-budget` of 6 GiB, two 4 GiB tenants of pool
            allocations: the first freeze succeeds, the second exits 1 and that tenant stays
            resident; both intact; the region's earlier budget is set back
          under about 4 minutes
Every phase appends its results to OUT/tiering.json (one JSON object per line) as it finishes.
"""
import argparse
import ctypes
import json
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
TENANT = os.path.join(HERE, "tier_tenant.py")


def log(msg):
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


class Runner:
    def __init__(self, build, out):
        self.tfusion = os.path.join(build, "src/cli/tfusion")
        self.build = build
        self.out = out
        self.logs = os.path.join(out, "logs")
        os.makedirs(self.logs, exist_ok=True)
        self.env = dict(os.environ, TF_TFUSION=self.tfusion)
        self.n = 0

    def record(self, phase, data):
        with open(os.path.join(self.out, "tiering.json"), "a") as f:
            f.write(json.dumps({"phase": phase, **data}) + "\n")
        log(f"{phase}: {json.dumps(data)[:600]}")

    def tenant(self, args, tfusion_flags=None, env=None, timeout=240):
        """Runs tier_tenant.py natively (tfusion_flags None) or under `tfusion run`; returns its
        last JSON line (or an error record) and keeps its output in logs/."""
        self.n += 1
        cmd = [sys.executable, TENANT] + args
        if tfusion_flags is not None:
            cmd = [self.tfusion, "run"] + tfusion_flags + ["--"] + cmd
        e = dict(self.env, **(env or {}))
        t = time.monotonic()
        try:
            p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=e)
            rc, out, err = p.returncode, p.stdout, p.stderr
        except subprocess.TimeoutExpired as ex:
            rc, out, err = -9, ex.stdout or "", (ex.stderr or "") + "\nTIMEOUT"
            out = out.decode() if isinstance(out, bytes) else out
            err = err.decode() if isinstance(err, bytes) else err
        wall = time.monotonic() - t
        name = f"{self.n:02d}-{args[0]}.log"
        with open(os.path.join(self.logs, name), "w") as f:
            f.write(" ".join(cmd) + f"\nrc={rc} wall={wall:.1f}s\n--- stdout\n{out}\n--- stderr\n{err}\n")
        # The limiter's own account of each swap (its log lines on stderr).
        swaps = [l.split("tfusion: ", 1)[-1] for l in err.splitlines()
                 if "swapped out" in l or "resumed" in l or "disk tier" in l or "kept host copies" in l
                 or "ahead of" in l or "graph memory" in l]
        for line in reversed(out.strip().splitlines()):
            if line.startswith("{"):
                d = json.loads(line)
                d.update({"rc": rc, "wall_s": round(wall, 1)})
                if swaps:
                    d["limiter_log"] = swaps[-12:]
                return d
        return {"rc": rc, "wall_s": round(wall, 1), "error": (err or out)[-800:]}


LIMITED = ["--vram", "70GiB"]
TIERED = LIMITED + ["--tiering", "--idle-swap", "0"]


def phase_checks(r):
    d = r.tenant(["checks", "--cycles", "6"], TIERED + ["--vgpu", "tier-checks"], timeout=300)
    r.record("checks", d)


def phase_pool(r):
    d = r.tenant(["pool"], TIERED + ["--vgpu", "tier-pool"], env={"PYTORCH_CUDA_ALLOC_CONF": "backend:cudaMallocAsync"})
    r.record("pool", d)


def phase_pools(r):
    d = r.tenant(["pools", "--cycles", "4"], TIERED + ["--vgpu", "tier-pools"],
                 env={"PYTORCH_CUDA_ALLOC_CONF": "backend:cudaMallocAsync"}, timeout=300)
    r.record("pools", d)


def phase_expandable(r):
    d = r.tenant(["expandable", "--cycles", "2"], TIERED + ["--vgpu", "tier-expandable"],
                 env={"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"}, timeout=120)
    r.record("expandable", d)


def phase_graphmem(r):
    d = r.tenant(["graphmem"], TIERED + ["--vgpu", "tier-graphmem"],
                 env={"PYTORCH_CUDA_ALLOC_CONF": "backend:cudaMallocAsync"}, timeout=60)
    r.record("graphmem", d)


def phase_train(r):
    env = {"CUBLAS_WORKSPACE_CONFIG": ":4096:8"}
    runs = {}
    for name, extra in (("plain_a", []), ("frozen", ["--freeze-at", "15"]), ("plain_b", [])):
        runs[name] = r.tenant(["train", "--steps", "30"] + extra, TIERED + ["--vgpu", "tier-train-" + name], env=env)
    la, lb, lf = (runs[k].get("losses", []) for k in ("plain_a", "frozen", "plain_b"))
    res = {"steps": len(la), "frozen_equals_uninterrupted": bool(la) and la == lb,
           "uninterrupted_runs_equal": bool(la) and la == lf,
           "frozen_run": {k: v for k, v in runs["frozen"].items() if k != "losses"},
           "losses_a": la[:3] + ["..."] + la[-2:] if la else runs["plain_a"]}
    if la and lb and la != lb:
        fa, fb = [float(x) for x in la], [float(x) for x in lb]
        res["max_abs_diff_frozen"] = max(abs(x - y) for x, y in zip(fa, fb))
    if la and lf and la != lf:
        fa, ff = [float(x) for x in la], [float(x) for x in lf]
        res["max_abs_diff_uninterrupted"] = max(abs(x - y) for x, y in zip(fa, ff))
    r.record("train", res)


def phase_swap(r):
    for gib in (1, 4, 16):
        d = r.tenant(["swap", "--gib", str(gib), "--cycles", "3"], TIERED + ["--vgpu", f"tier-swap-{gib}"], timeout=300)
        r.record("swap", d)


def phase_idle(r):
    for gib in (1, 4, 16):
        d = r.tenant(["swap", "--gib", str(gib), "--cycles", "2", "--idle-wait", "7"],
                     LIMITED + ["--tiering", "--idle-swap", "4s", "--vgpu", f"tier-idle-{gib}"], timeout=300)
        r.record("idle", d)


def phase_firstfreeze(r):
    for gib in (1, 4, 16):
        for pin_ahead in ("2", "off"):
            d = r.tenant(["firstfreeze", "--gib", str(gib), "--busy", "10"],
                         TIERED + ["--vgpu", f"tier-first-{gib}-{pin_ahead}"], env={"TFUSION_TIER_PIN_AHEAD": pin_ahead},
                         timeout=300)
            r.record("firstfreeze", d)


def phase_disk(r):
    d_dir = os.environ.get("TF_DISK_DIR", "/tmp/tf-disk-tier")
    os.makedirs(d_dir, exist_ok=True)
    df = subprocess.run(["df", "-h", d_dir], capture_output=True, text=True).stdout.strip().splitlines()[-1:]
    for gib in (1, 4):
        d = r.tenant(["swap", "--gib", str(gib), "--cycles", "2", "--sleep", "4"],
                     TIERED + ["--vgpu", f"tier-disk-{gib}", "--disk-tier", d_dir, "--idle-disk", "1s"], timeout=300)
        d["disk_dir_df"] = df
        r.record("disk", d)


def checkpoint_api():
    lib = ctypes.CDLL(os.environ.get("TF_REAL_LIBCUDA", "libcuda.so.1"))
    assert lib.cuInit(0) == 0
    return lib


def phase_ckpt(r):
    lib = checkpoint_api()
    for name in ("cuCheckpointProcessLock", "cuCheckpointProcessCheckpoint", "cuCheckpointProcessRestore",
                 "cuCheckpointProcessUnlock"):
        if not hasattr(lib, name):
            r.record("ckpt", {"error": f"driver has no {name}"})
            return
    for gib in (1, 4, 16):
        ready = os.path.join(r.out, f"ckpt-ready-{gib}")
        go = os.path.join(r.out, f"ckpt-go-{gib}")
        cmd = [sys.executable, TENANT, "hold", "--gib", str(gib), "--ready", ready, "--go", go]
        p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=r.env)
        deadline = time.monotonic() + 120
        while not os.path.exists(ready) and time.monotonic() < deadline and p.poll() is None:
            time.sleep(0.05)
        res = {"gib": gib}
        args = ctypes.create_string_buffer(256)  # zeroed lock/checkpoint/restore/unlock arguments
        steps = []
        try:
            for step, fn in (("lock", lib.cuCheckpointProcessLock), ("checkpoint", lib.cuCheckpointProcessCheckpoint),
                             ("restore", lib.cuCheckpointProcessRestore), ("unlock", lib.cuCheckpointProcessUnlock)):
                t = time.monotonic()
                rc = fn(ctypes.c_int(p.pid), args)
                res[step + "_s"] = round(time.monotonic() - t, 3)
                steps.append(f"{step}={rc}")
                if rc != 0:
                    res["error"] = f"{step} returned {rc}"
                    break
        finally:
            open(go, "w").close()
            try:
                out, err = p.communicate(timeout=120)
            except subprocess.TimeoutExpired:
                p.kill()
                out, err = p.communicate()
        res["results"] = " ".join(steps)
        res["intact"] = '"intact": true' in out
        with open(os.path.join(r.logs, f"ckpt-{gib}.log"), "w") as f:
            f.write(out + "\n--- stderr\n" + err)
        r.record("ckpt", res)


def phase_zero(r):
    # Level 1 (freeze) and level 2 (freeze --zero: our swap-out, then the driver's checkpoint of the
    # context and fixed memory from the CLI's process; `tfusion run` restores at the first call).
    for gib in (1, 4):
        d = r.tenant(["zero", "--gib", str(gib)], TIERED + ["--vgpu", f"tier-zero-{gib}"], timeout=300)
        r.record("zero", d)
    # The idle policy, carried out by `tfusion run` (its zero keeper).
    d = r.tenant(["idlezero", "--gib", "4", "--idle-wait", "60"],
                 LIMITED + ["--tiering", "--idle-swap", "2s", "--idle-zero", "5s", "--vgpu", "tier-idlezero"], timeout=300)
    r.record("zero_idle_policy", d)
    r.record("zero_agent", agent_zero(r))


def find_driver_library(name):
    for d in ("/usr/lib/x86_64-linux-gnu", "/usr/lib64", "/usr/local/nvidia/lib64", "/usr/lib"):
        if os.path.exists(os.path.join(d, name)):
            return os.path.join(d, name)
    return name


def agent_zero(r, gib=4):
    """The node agent as zero keeper of a tenant that no `tfusion run` started: checkpointed after
    idle_zero_ms, restored at its first call."""
    import glob
    up = UpOnThisHost(r, "zero")
    up_log_path = up.log_path
    res = {}
    try:
        api = up.api
        if not up.url or not up.token:
            return {"error": "tfusion up did not start (logs/zero-up.log)"}
        api("PATCH", "/v1/pools/default", {"vram_expand_to_host_percent": 100})
        st, a = api("POST", "/v1/allocations", {"percent": 50, "vram_mib": (gib + 4) * 1024, "qos": "low",
                                                "idle_swap_ms": 2000, "idle_zero_ms": 5000})
        res["allocation_status"] = st
        vgpu, gpu = a["id"], a["vgpus"][0]["gpu"]
        region = None
        for _ in range(50):  # the agent makes the vGPU at its next sync
            for f in glob.glob(os.path.join(os.environ.get("TFUSION_SHM_DIR", "/dev/shm/tensorfusion"), "gpu-*.region")):
                if gpu in f:
                    region = f
            smi = subprocess.run([r.tfusion, "smi", "-p"], capture_output=True, text=True, env=r.env).stdout
            if region and vgpu in smi:
                break
            time.sleep(0.2)
        env = dict(r.env, LD_LIBRARY_PATH=os.path.join(os.path.dirname(r.tfusion), "..", "limiter", "inject"),
                   TFUSION_REAL_LIBCUDA=os.environ.get("TFUSION_REAL_LIBCUDA", find_driver_library("libcuda.so.1")),
                   TFUSION_REAL_LIBNVML=os.environ.get("TFUSION_REAL_LIBNVML", find_driver_library("libnvidia-ml.so.1")),
                   TFUSION_REGION=region or "", TFUSION_VGPU=vgpu, CUDA_VISIBLE_DEVICES=gpu)
        p = subprocess.run([sys.executable, TENANT, "idlezero", "--gib", str(gib), "--idle-wait", "60"],
                           capture_output=True, text=True, timeout=300, env=env)
        with open(os.path.join(r.logs, "zero-agent-tenant.log"), "w") as f:
            f.write(p.stdout + "\n--- stderr\n" + p.stderr)
        lines = [l for l in p.stdout.splitlines() if l.startswith("{")]
        res["tenant"] = json.loads(lines[-1]) if lines else {"rc": p.returncode, "error": p.stderr[-800:]}
        res["agent_log"] = [l for l in open(up_log_path).read().splitlines() if "checkpointed" in l or "restor" in l][-6:]
        api("DELETE", "/v1/allocations/" + vgpu)
    except Exception as ex:  # keep what was measured
        res["error"] = repr(ex)
    finally:
        up.stop()
    return res


def phase_gen(r):
    d = r.tenant(["gen", "--cycles", "3"], TIERED + ["--vgpu", "tier-gen"])
    d_native = r.tenant(["gen", "--cycles", "0"])
    r.record("gen", {"tiered": d, "native_cold": d_native})


def phase_alloc(r):
    res = {}
    for name, flags in (("native", None), ("limiter", LIMITED), ("tiering", TIERED)):
        res[name] = r.tenant(["alloc", "--reps", "30"], flags)
    r.record("alloc", res)


def phase_steady(r):
    res = {}
    models = os.environ.get("TF_STEADY_MODELS", "r50,gpt2").split(",")
    for model, batch in (("r50", 64), ("gpt2", 8)):
        if model not in models:
            continue
        for rnd in range(int(os.environ.get("TF_STEADY_ROUNDS", "2"))):
            for name, flags in (("native", None), ("limiter", LIMITED), ("tiering", TIERED)):
                d = r.tenant(["steady", "--model", model, "--batch", str(batch), "--seconds", os.environ.get("TF_STEADY_SECONDS", "6")], flags)
                res.setdefault(f"{model}_b{batch}", {}).setdefault(name, []).append(d.get("items_per_s", d))
                res[f"{model}_b{batch}"].setdefault(name + "_graph_ms", []).append(d.get("graph_ms", d.get("graph_error")))
    for key, v in res.items():
        try:
            # The GPU's own time for one step (graph replay): the host's noise left out.
            g = {n: sorted(v[n + "_graph_ms"])[len(v[n + "_graph_ms"]) // 2] for n in ("native", "limiter", "tiering")}
            v["graph_tiering_over_limiter"] = round(g["tiering"] / g["limiter"], 4)
            v["graph_tiering_over_native"] = round(g["tiering"] / g["native"], 4)
        except (TypeError, ZeroDivisionError, KeyError):
            pass
        try:
            per_round = [round(t / l, 4) for t, l in zip(v["tiering"], v["limiter"])]
            v["tiering_over_limiter_per_round"] = per_round
            v["tiering_over_limiter_median"] = sorted(per_round)[len(per_round) // 2]
            nat = sum(v["native"]) / len(v["native"])
            v["limiter_over_native"] = round(sum(v["limiter"]) / len(v["limiter"]) / nat, 4)
            v["tiering_over_native"] = round(sum(v["tiering"]) / len(v["tiering"]) / nat, 4)
            v["tiering_over_limiter"] = round(sum(v["tiering"]) / sum(v["limiter"]), 4)
        except (TypeError, ZeroDivisionError, KeyError):
            pass
    r.record("steady", res)


def phase_oversub(r, seconds=45, gib=30):
    import statistics
    serve = ["serve", "--gib", str(gib), "--seconds", str(seconds), "--burst", "5", "--gap-min", "3", "--gap-max", "6"]

    def start(k, flags, env):
        ready, go = os.path.join(r.out, f"serve-ready-{k}"), os.path.join(r.out, "serve-go")
        cmd = [r.tfusion, "run"] + flags + ["--", sys.executable, TENANT] + serve + ["--seed", str(k), "--ready", ready, "--go", go]
        log_path = os.path.join(r.logs, f"serve-{k}.log")
        f = open(log_path, "w")
        return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=f, text=True, env=dict(r.env, **env)), ready, log_path

    def run_group(tenants):
        go = os.path.join(r.out, "serve-go")
        if os.path.exists(go):
            os.unlink(go)
        procs = [start(*t) for t in tenants]
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline and not all(os.path.exists(p[1]) or p[0].poll() is not None for p in procs):
            time.sleep(0.1)
        t0 = time.monotonic()
        open(go, "w").close()
        outs = []
        for p, ready, log_path in procs:
            try:
                out, _ = p.communicate(timeout=seconds + 120)
            except subprocess.TimeoutExpired:
                p.kill()
                out, _ = p.communicate()
            lines = [l for l in out.splitlines() if l.startswith("{")]
            d = json.loads(lines[-1]) if lines else {"error": "no result", "rc": p.returncode}
            d["swaps_out"] = sum("swapped out" in l for l in open(log_path))
            d["evictions"] = sum("freezing vGPU" in l for l in open(log_path))
            outs.append(d)
        return outs, time.monotonic() - t0

    solo, _ = run_group([(0, ["--vram", "36GiB", "--vgpu", "serve-solo"], {})])
    env = {"TFUSION_HOST_TIER_BUDGET": "100GiB"}
    group, wall = run_group([(k, ["--vram", "36GiB", "--tiering", "--idle-swap", "2s", "--vgpu", f"serve-{k}"], env)
                             for k in range(4)])

    def extra(d):
        warm = statistics.median(d["other_ms"]) if d.get("other_ms") else 0
        return [x - warm for x in d.get("first_of_burst_ms", [])]
    ex = sorted(x for d in group for x in extra(d))
    pct = lambda q: round(ex[min(len(ex) - 1, int(q * len(ex)))], 1) if ex else None
    res = {"seconds": seconds, "gib_each": gib,
           "solo": {k: solo[0].get(k) for k in ("requests", "correct", "failures", "swaps_out")},
           "solo_requests_per_min": round(solo[0].get("requests", 0) * 60 / seconds, 1),
           "tiered_requests_per_min": round(sum(d.get("requests", 0) for d in group) * 60 / seconds, 1),
           "tiered": [{k: d.get(k) for k in ("requests", "correct", "wrong", "errors", "failures", "swaps_out",
                                               "evictions", "error")}
                      for d in group],
           "extra_latency_from_resume_ms_p50": pct(0.5), "extra_latency_from_resume_ms_p99": pct(0.99),
           "solo_first_of_burst_ms_median": statistics.median(solo[0]["first_of_burst_ms"]) if solo[0].get("first_of_burst_ms") else None,
           "group_wall_s": round(wall, 1)}
    r.record("oversub", res)


def phase_remote(r):
    import secrets
    import socket
    token = secrets.token_hex(16)
    work = os.path.join(r.out, "remote-work")
    os.makedirs(work, exist_ok=True)
    sock_path = os.path.join(work, "w.sock")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ready = os.path.join(work, "ready")
    wlog = open(os.path.join(r.logs, "remote-worker.log"), "w")
    worker = subprocess.Popen([r.tfusion, "worker", "--listen", "unix:" + sock_path, "--listen", f"127.0.0.1:{port}",
                               "--token", token, "--tiering", "--idle-swap", "0", "--ready-file", ready],
                              stdout=wlog, stderr=subprocess.STDOUT, env=r.env)
    try:
        deadline = time.monotonic() + 20
        while not os.path.exists(ready) and time.monotonic() < deadline and worker.poll() is None:
            time.sleep(0.05)
        if not os.path.exists(ready):
            r.record("remote", {"error": "worker not ready (see logs/remote-worker.log)"})
            return
        env = {"TF_REMOTE_VGPU": "find", "CUBLAS_WORKSPACE_CONFIG": ":4096:8"}
        # TF_REMOTE_TRANSPORTS: which transports, in that order (a transport may repeat);
        # TF_REMOTE_SWAP_ONLY=1: only the swap sizes (TF_REMOTE_SWAP_GIB), not the checks.
        addrs = {"shm": "unix:" + sock_path, "tcp": f"127.0.0.1:{port}"}
        vias = [v for v in os.environ.get("TF_REMOTE_TRANSPORTS", "shm,tcp").split(",") if v in addrs]
        swap_only = os.environ.get("TF_REMOTE_SWAP_ONLY") == "1"
        for via in vias:
            flags = ["--remote", addrs[via], "--token", token]
            res = {"transport": via}
            if swap_only:
                res["swap"] = [r.tenant(["swap", "--gib", g, "--cycles", "2"], flags, env=env, timeout=400)
                               for g in os.environ.get("TF_REMOTE_SWAP_GIB", "16").split(",") if g]
                r.record("remote", res)
                continue
            res["checks"] = r.tenant(["checks", "--cycles", "6"], flags, env=env, timeout=400)
            # A stream-ordered pool (PyTorch's cudaMallocAsync backend) swapped and resumed.
            res["pool"] = r.tenant(["pool"], flags, env=dict(env, PYTORCH_CUDA_ALLOC_CONF="backend:cudaMallocAsync"),
                                   timeout=300)
            runs = {name: r.tenant(["train", "--steps", "30"] + extra, flags, env=env, timeout=400)
                    for name, extra in (("plain", []), ("frozen", ["--freeze-at", "15"]))}
            la, lf = runs["plain"].get("losses", []), runs["frozen"].get("losses", [])
            res["train"] = {"steps": len(la), "frozen_equals_uninterrupted": bool(la) and la == lf,
                            "frozen_run": {k: v for k, v in runs["frozen"].items() if k != "losses"},
                            "plain_error": runs["plain"].get("error")}
            sizes = os.environ.get("TF_REMOTE_SWAP_GIB", "1,4,16")
            res["swap"] = [r.tenant(["swap", "--gib", g, "--cycles", "3"], flags, env=env, timeout=400)
                           for g in sizes.split(",") if g]
            r.record("remote", res)
    finally:
        worker.terminate()
        try:
            worker.wait(timeout=20)
        except subprocess.TimeoutExpired:
            worker.kill()
        # The session's swap log lines are in the worker's log.
        with open(os.path.join(r.logs, "remote-worker.log")) as f:
            lines = [l.strip() for l in f if "swapped out" in l or "resumed" in l]
        r.record("remote_worker_log", {"swap_lines": lines[-40:]})


def phase_rzero(r, gib=1):
    """Scale to zero of a remote session: a `tfusion worker --tiering --idle-swap 2s --idle-zero 5s`
    on a unix socket, a PyTorch tenant of 1 GiB under `tfusion run --remote` that stays idle until
    the worker's zero keeper has checkpointed its session, then its first call restores it."""
    import secrets
    token = secrets.token_hex(16)
    work = os.path.join(r.out, "rzero-work")
    os.makedirs(work, exist_ok=True)
    sock_path = os.path.join(work, "w.sock")
    ready = os.path.join(work, "ready")
    wlog = open(os.path.join(r.logs, "rzero-worker.log"), "w")
    worker = subprocess.Popen([r.tfusion, "worker", "--listen", "unix:" + sock_path, "--token", token, "--tiering",
                               "--idle-swap", "2s", "--idle-zero", "5s", "--ready-file", ready],
                              stdout=wlog, stderr=subprocess.STDOUT, env=r.env)
    try:
        deadline = time.monotonic() + 20
        while not os.path.exists(ready) and time.monotonic() < deadline and worker.poll() is None:
            time.sleep(0.05)
        if not os.path.exists(ready):
            r.record("rzero", {"error": "worker not ready (see logs/rzero-worker.log)"})
            return
        d = r.tenant(["idlezero", "--gib", str(gib), "--idle-wait", "30"], ["--remote", "unix:" + sock_path, "--token", token],
                     env={"TF_REMOTE_VGPU": "find"}, timeout=55)
        d["ok"] = bool(d.get("intact")) and d.get("checkpointed_after_idle_s") is not None and d.get("vram_checkpointed_mib") == 0
        r.record("rzero", d)
    finally:
        worker.terminate()
        try:
            worker.wait(timeout=20)
        except subprocess.TimeoutExpired:
            worker.kill()
        with open(os.path.join(r.logs, "rzero-worker.log")) as f:
            lines = [l.strip() for l in f if "checkpointed" in l or "zero keeper" in l or "restor" in l]
        r.record("rzero_worker_log", {"lines": lines[-20:]})


class LoggedProcs:
    """The tfusion processes of a phase (controller, worker, node agent), each logging to
    logs/PREFIX-NAME.log, stopped in reverse order at the end."""

    def __init__(self, r, prefix):
        self.r, self.prefix, self.procs = r, prefix, []

    def start(self, name, args):
        p = subprocess.Popen([self.r.tfusion] + args, stdout=open(self.log_path(name), "w"),
                             stderr=subprocess.STDOUT, env=self.r.env)
        self.procs.append(p)
        return p

    def log_path(self, name):
        return os.path.join(self.r.logs, f"{self.prefix}-{name}.log")

    def read_log(self, name):
        with open(self.log_path(name)) as f:
            return f.read()

    def stop(self):
        for p in reversed(self.procs):
            p.terminate()
        for p in reversed(self.procs):
            try:
                p.wait(timeout=20)
            except subprocess.TimeoutExpired:
                p.kill()


def wait_until(cond, seconds, step=0.1):
    """cond()'s first true value within `seconds`, else None."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        v = cond()
        if v:
            return v
        time.sleep(step)
    return None


def wait_soon(cond, seconds):
    """wait_until, looking every 50 ms."""
    return wait_until(cond, seconds, 0.05)


def last_json(out, rc):
    """The last JSON line a tenant printed, else {"rc": rc}."""
    lines = [l for l in out.splitlines() if l.startswith("{")]
    return json.loads(lines[-1]) if lines else {"rc": rc}

def remove_files(*paths):
    """Removes those of `paths` that exist (a tenant's signal files left by an earlier run)."""
    for f in paths:
        if os.path.exists(f):
            os.unlink(f)


def api_call(url, token, method, path, body=None, timeout=10):
    """One request to the controller's HTTP API: (status, JSON)."""
    import urllib.request
    req = urllib.request.Request(url + path, method=method, data=json.dumps(body).encode() if body else None,
                                 headers={"Authorization": "Bearer " + token, "Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as resp:
        return resp.status, json.loads(resp.read() or b"{}")


class PooledWorker:
    """A controller, a `tfusion worker --tiering` and a node agent on this host (loopback only),
    each logging to logs/PREFIX-NAME.log; the pool may expand VRAM into host memory. `error` says
    why when they did not come up; api(method, path, body) -> (status, JSON)."""

    def __init__(self, r, prefix, work, oversell=True):
        import re
        import secrets
        self.r, self.work, self.token = r, work, secrets.token_hex(16)
        self.procs = LoggedProcs(r, prefix)
        self.read_log = self.procs.read_log
        self.url = self.tcp = self.error = None
        self.gpus = []
        wready = os.path.join(work, "worker-ready")
        if os.path.exists(wready):
            os.unlink(wready)
        start = self.procs.start
        start("controller", ["controller", "--port", "0", "--token", self.token, "--store",
                             "sqlite:" + os.path.join(work, "state.db")])
        start("worker", ["worker", "--listen", "127.0.0.1:0", "--token", self.token, "--tiering", "--ready-file", wready])
        self.url = wait_until(lambda: (re.search(r"http://127\.0\.0\.1:[0-9]+", self.read_log("controller")) or [None])[0], 10)
        self.tcp = wait_until(lambda: os.path.exists(wready) and
                              (re.search(r"tcp (\S+)", open(wready).read()) or [None, None])[1], 10)
        if not self.url or not self.tcp:
            self.error = f"controller or worker not ready (see logs/{prefix}-*.log)"
            return
        start("agent", ["hypervisor", "--controller", self.url, "--token", self.token, "--node", prefix + "-node",
                        "--metrics-port", "-1", "--credential-file", os.path.join(work, "node.cred"),
                        "--worker-address", self.tcp])
        self.gpus = wait_until(lambda: self.api("GET", "/v1/gpus")[1].get("gpus"), 15) or []
        if not self.gpus:
            self.error = f"the node agent registered no GPU (see logs/{prefix}-agent.log)"
            return
        if oversell:
            self.api("PATCH", "/v1/pools/default", {"vram_expand_to_host_percent": 100})

    def api(self, method, path, body=None):
        return api_call(self.url, self.token, method, path, body, 10)

    def smi(self, *flags):
        """`tfusion smi` on this host (the worker's sessions and their vGPUs)."""
        return subprocess.run([self.r.tfusion, "smi", *flags], capture_output=True, text=True, env=self.r.env).stdout

    def bound_session(self):
        """(session pid, allocation id, vGPU name) of the session bound to an allocation that
        `tfusion smi` lists, once the node agent follows it; None when there is none."""
        import re
        m = re.search(r"remote-([0-9]+)@(a-[0-9a-z]+)", self.smi())
        if not m:
            return None
        allocation = m.group(2)
        wait_soon(lambda: f"follows allocation {allocation}" in self.read_log("agent"), 5)
        return int(m.group(1)), allocation, m.group(0)

    def start_rhold_tenant(self, name, gib, ready, go, extra=()):
        """The rhold tenant (tier_tenant.py) under `tfusion run` with run_flags() and `extra`, stderr
        in logs/NAME-tenant.log: (tenant, (session, allocation, vgpu), error). The error says why
        when it did not get ready or no session bound to its allocation shows in `tfusion smi`."""
        cmd = [self.r.tfusion, "run", *self.run_flags(), *extra, "--",
               sys.executable, TENANT, "rhold", "--gib", str(gib), "--ready", ready, "--go", go]
        tenant = subprocess.Popen(cmd, stdout=subprocess.PIPE,
                                  stderr=open(os.path.join(self.r.logs, name + "-tenant.log"), "w"),
                                  text=True, env=self.r.env)
        if not wait_soon(lambda: os.path.exists(ready) or tenant.poll() is not None, 60) or not os.path.exists(ready):
            return tenant, None, f"the tenant did not get ready (see logs/{name}-tenant.log)"
        bound = self.bound_session()
        if not bound:
            return tenant, None, "no bound session vGPU in tfusion smi: " + self.smi()[-400:]
        return tenant, bound, None

    def delete_and_finish(self, tenant, bound, go, res):
        """Deletes the tenant's allocation, waits for the node agent to end its session, lets the
        tenant make its next call (go + "2") and reads its JSON: fills res's delete_allocation_status,
        session_ended_s, tenant and tenant_rc."""
        session, allocation, vgpu = bound
        t0 = time.monotonic()
        res["delete_allocation_status"] = self.api("DELETE", "/v1/allocations/" + allocation)[0]
        ended = wait_soon(lambda: not alive(session) and vgpu not in self.smi(), 20)
        res["session_ended_s"] = round(time.monotonic() - t0, 2) if ended else None
        res["session_vram_mib_after_delete"] = session_vram_mib(session)
        open(go + "2", "w").close()
        out, _ = tenant.communicate(timeout=30)
        lines = [l for l in out.splitlines() if l.startswith("{")]
        res["tenant"] = json.loads(lines[-1]) if lines else None
        res["tenant_rc"] = tenant.returncode

    def run_flags(self):
        """`tfusion run` flags for a low-QoS allocation of this pool (8 GiB, 50%), bound remotely."""
        return ["--controller", self.url, "--token", self.token, "--nvml", "/nonexistent/libnvidia-ml.so.1",
                "--vram", "8GiB", "--percent", "50", "--qos", "low"]

    def stop(self):
        self.procs.stop()

    def log_lines(self, names, keep):
        """The lines of these logs that contain one of the strings in `keep`, prefixed by the name."""
        lines = []
        for name in names:
            path = self.procs.log_path(name)
            if os.path.exists(path):
                with open(path) as f:
                    lines += [f"{name}: {l.strip()}" for l in f if any(k in l for k in keep)]
        return lines


def session_vram_mib(pid):
    """nvidia-smi's VRAM of process `pid`; None when it is not listed (it holds none)."""
    env = {k: v for k, v in os.environ.items() if k != "LD_LIBRARY_PATH"}
    out = subprocess.run(["nvidia-smi", "--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits"],
                         capture_output=True, text=True, timeout=60, env=env).stdout
    for line in out.splitlines():
        parts = [x.strip() for x in line.split(",")]
        if len(parts) == 2 and parts[0] == str(pid):
            return int(parts[1]) if parts[1].isdigit() else parts[1]
    return None


def alive(pid):
    """Whether process `pid` runs (a zombie its parent has not reaped yet is gone)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def phase_rpool(r, gib=1):
    """Scale to zero of a remote session bound to a pool allocation: controller, node agent and
    worker on this host (loopback only), the allocation's idle_swap_ms 2000 and idle_zero_ms 5000
    reach the session (the worker has no --idle-zero), then the first call restores it."""
    import re
    work = os.path.join(r.out, "rpool-work")
    os.makedirs(work, exist_ok=True)
    pool = PooledWorker(r, "rpool", work)
    try:
        if pool.error:
            r.record("rpool", {"error": pool.error})
            return
        d = r.tenant(["idlezero", "--gib", str(gib), "--idle-wait", "25"],
                     pool.run_flags() + ["--idle-swap", "2s", "--idle-zero", "5s"],
                     env={"TF_REMOTE_VGPU": "find"}, timeout=45)
        wlog = pool.read_log("worker")
        bound = re.findall(r"vGPU (remote-[0-9]+@a-[0-9a-f]+): process [0-9]+ idle [0-9]+ s: checkpointed", wlog)
        d["bound_session_checkpointed"] = bound[-1] if bound else None
        d["ok"] = (bool(d.get("intact")) and d.get("checkpointed_after_idle_s") is not None
                   and d.get("vram_checkpointed_mib") == 0 and bool(bound))
        r.record("rpool", d)
    finally:
        pool.stop()
        r.record("rpool_logs", {"lines": pool.log_lines(("worker", "agent"), (
            "checkpointed", "zero", "restor", "follows allocation"))[-20:]})


def phase_rplain(r, gib=1):
    """A remote session of a pool that does not oversell VRAM (the default) is bound to its
    allocation all the same: the controller lists the session's process under the allocation, and
    the allocation taken back ends the session (the tenant's next call fails with a CUDA error)."""
    work = os.path.join(r.out, "rplain-work")
    os.makedirs(work, exist_ok=True)
    ready, go = os.path.join(work, "tenant-ready"), os.path.join(work, "tenant-go")
    remove_files(ready, ready + ".checked", go, go + "2")
    res = {"gib": gib}
    tenant = None
    pool = PooledWorker(r, "rplain", work, oversell=False)
    wait = wait_soon
    try:
        if pool.error:
            res["error"] = pool.error
            return
        api = pool.api
        tenant, bound, res["error"] = pool.start_rhold_tenant("rplain", gib, ready, go)
        if res["error"]:
            return
        del res["error"]
        session, allocation, vgpu = bound
        res["vgpu"] = vgpu
        res["pool_tiering"] = api("GET", "/v1/pools/default")[1].get("vram_expand_to_host_percent")

        def listed():
            for a in api("GET", "/v1/allocations")[1].get("allocations", []):
                if a.get("id") == allocation:
                    return [p.get("pid") for v in a.get("vgpus", []) for p in v.get("processes", []) or []]
            return []
        res["allocation_processes"] = wait(lambda: session in listed(), 15) and listed()
        open(go, "w").close()
        res["call_done"] = wait(lambda: os.path.exists(ready + ".checked") or tenant.poll() is not None, 30) and \
            os.path.exists(ready + ".checked")
        pool.delete_and_finish(tenant, bound, go, res)
        t = res["tenant"] or {}
        res["ok"] = (res["pool_tiering"] == 0 and bool(t.get("intact")) and res["call_done"]
                     and bool(res["allocation_processes"])
                     and res["session_ended_s"] is not None and str(t.get("after_delete", "")).startswith("error"))
    except Exception as ex:  # keep what was measured
        res["error"] = repr(ex)
    finally:
        if tenant is not None and tenant.poll() is None:
            tenant.kill()
        pool.stop()
        r.record("rplain", res)


def phase_rhold(r, gib=1):
    """A preemption's hold and an allocation taken back reach a remote session bound to the
    allocation: controller, node agent and worker on this host (loopback only)."""
    work = os.path.join(r.out, "rhold-work")
    os.makedirs(work, exist_ok=True)
    ready, go = os.path.join(work, "tenant-ready"), os.path.join(work, "tenant-go")
    remove_files(ready, ready + ".checked", go, go + "2")
    res = {"gib": gib}
    tenant = None
    t_phase = time.monotonic()
    pool = PooledWorker(r, "rhold", work)
    wait, smi = wait_soon, pool.smi

    try:
        if pool.error:
            res["error"] = pool.error
            return
        api, read_log = pool.api, pool.read_log
        tenant, bound, res["error"] = pool.start_rhold_tenant("rhold", gib, ready, go, ["--idle-swap", "0"])
        if res["error"]:
            return
        del res["error"]
        session, allocation, vgpu = bound
        res["vgpu"] = vgpu
        res["session_vram_mib_before"] = session_vram_mib(session)

        # A critical allocation on every GPU of the node: only the session's room makes it fit.
        t0 = time.monotonic()
        st, body = api("POST", "/v1/allocations", {"percent": 60, "vram_mib": 1024, "gpu_count": len(pool.gpus),
                                                   "qos": "critical"})
        res["critical_status"] = st
        res["preempted_suspended"] = body.get("preempted_suspended")
        winner = body.get("id")
        swapped = wait(lambda: any(vgpu in l and "swapped" in l for l in smi("-p").splitlines()), 15)
        res["suspended_and_swapped_s"] = round(time.monotonic() - t0, 2) if swapped else None
        res["session_vram_mib_suspended"] = session_vram_mib(session)
        res["agent_held_it"] = f"remote session vGPU {vgpu} suspended" in read_log("agent")
        open(go, "w").close()  # the tenant's GPU call must now wait
        time.sleep(3)
        res["call_still_waiting_after_3s"] = not os.path.exists(ready + ".checked") and tenant.poll() is None
        t1 = time.monotonic()
        res["delete_critical_status"] = api("DELETE", "/v1/allocations/" + winner)[0] if winner else None
        resumed = wait(lambda: os.path.exists(ready + ".checked") or tenant.poll() is not None, 30)
        res["resumed_call_done_s"] = round(time.monotonic() - t1, 2) if resumed and os.path.exists(ready + ".checked") else None
        res["session_vram_mib_resumed"] = session_vram_mib(session)

        # The tenant's own allocation taken back: the agent ends the session.
        pool.delete_and_finish(tenant, bound, go, res)
        t = res["tenant"] or {}
        before, held = res["session_vram_mib_before"], res["session_vram_mib_suspended"]
        res["ok"] = (bool(t.get("intact")) and res["call_still_waiting_after_3s"] and t.get("check_ms", 0) >= 3000
                     and isinstance(before, int) and isinstance(held, int) and before - held >= 900
                     and res["session_ended_s"] is not None and res["session_vram_mib_after_delete"] is None
                     and str(t.get("after_delete", "")).startswith("error"))
    except Exception as ex:  # keep what was measured
        res["error"] = repr(ex)
    finally:
        if tenant is not None and tenant.poll() is None:
            tenant.kill()
        pool.stop()
        res["phase_s"] = round(time.monotonic() - t_phase, 1)
        r.record("rhold", res)
        r.record("rhold_logs", {"lines": pool.log_lines(("worker", "agent"), (
            "suspended", "resumed", "stopping", "swapped out", "SIG", "follows allocation"))[-24:]})


def phase_rkill(r, gib=1):
    """An explicit scale to zero through the controller (`POST /v1/allocations/ID/freeze
    {"level": "zero"}`) reaches a remote session bound to the allocation; then its client is
    killed while the session is checkpointed. The session must end and give back its VRAM and host
    copies, and the worker must serve the next client with every byte intact."""
    import re
    work = os.path.join(r.out, "rkill-work")
    os.makedirs(work, exist_ok=True)
    res = {"gib": gib}
    tenants = []
    t_phase = time.monotonic()
    pool = PooledWorker(r, "rkill", work)
    wait, smi = wait_soon, pool.smi

    def host_tier():
        """The worker's host tier as `tfusion smi` shows it ("host tier N MiB of M GiB")."""
        return (re.search(r"host tier [0-9]+ MiB of [0-9.]+ [KMGT]iB", smi()) or [None])[0]

    def start_tenant(name):
        ready, go = os.path.join(work, name + "-ready"), os.path.join(work, name + "-go")
        remove_files(ready, ready + ".checked", go, go + "2")
        cmd = [r.tfusion, "run", *pool.run_flags(), "--idle-swap", "0", "--",
               sys.executable, TENANT, "rhold", "--gib", str(gib), "--ready", ready, "--go", go]
        p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=open(os.path.join(r.logs, f"rkill-{name}.log"), "w"),
                             text=True, env=r.env, start_new_session=True)
        tenants.append(p)
        ok = wait(lambda: os.path.exists(ready) or p.poll() is not None, 60) and os.path.exists(ready)
        return p, ready, go, ok

    try:
        if pool.error:
            res["error"] = pool.error
            return
        victim, _, _, ok = start_tenant("victim")
        if not ok:
            res["error"] = "the first tenant did not get ready (see logs/rkill-victim.log)"
            return
        bound = pool.bound_session()
        if not bound:
            res["error"] = "no bound session vGPU in tfusion smi"
            return
        session, allocation, vgpu = bound
        res["vgpu"] = vgpu
        res["session_vram_mib_before"] = session_vram_mib(session)
        t0 = time.monotonic()
        res["freeze_status"] = pool.api("POST", f"/v1/allocations/{allocation}/freeze", {"level": "zero"})[0]
        zero = wait(lambda: any(vgpu in l and "checkpointed" in l for l in smi("-p").splitlines()), 30)
        res["checkpointed_s"] = round(time.monotonic() - t0, 2) if zero else None
        res["session_vram_mib_checkpointed"] = session_vram_mib(session)
        res["host_tier_while_checkpointed"] = host_tier()

        # The client dies at the worst moment: its session is checkpointed.
        t1 = time.monotonic()
        os.killpg(victim.pid, 9)
        victim.wait(timeout=20)
        ended = wait(lambda: not alive(session) and vgpu not in smi(), 30)
        res["session_ended_s"] = round(time.monotonic() - t1, 2) if ended else None
        res["session_vram_mib_after_kill"] = session_vram_mib(session)
        res["host_tier_after_kill"] = host_tier()

        # The worker serves the next client.
        nxt, ready, go, ok = start_tenant("next")
        res["next_ready"] = bool(ok)
        if ok:
            open(go, "w").close()
            wait(lambda: os.path.exists(ready + ".checked") or nxt.poll() is not None, 60)
            open(go + "2", "w").close()
            out, _ = nxt.communicate(timeout=60)
            lines = [l for l in out.splitlines() if l.startswith("{")]
            res["next"] = json.loads(lines[-1]) if lines else {"rc": nxt.returncode}
        n = res.get("next") or {}
        before, frozen = res["session_vram_mib_before"], res["session_vram_mib_checkpointed"]
        res["ok"] = bool(res["freeze_status"] in (200, 202) and res["checkpointed_s"] is not None
                         and isinstance(before, int) and before >= 900 and (frozen is None or frozen < 100)
                         and res["session_ended_s"] is not None and res["session_vram_mib_after_kill"] is None
                         and n.get("intact") and n.get("after_delete") == "returned")
    except Exception as ex:  # keep what was measured
        res["error"] = repr(ex)
    finally:
        for p in tenants:
            if p.poll() is None:
                os.killpg(p.pid, 9)
        pool.stop()
        res["phase_s"] = round(time.monotonic() - t_phase, 1)
        r.record("rkill", res)
        r.record("rkill_logs", {"lines": pool.log_lines(("worker", "agent"), (
            "checkpoint", "zero", "restor", "session ended", "SIG", "follows allocation"))[-24:]})


class UpOnThisHost:
    """`tfusion up` (controller and node agent) in a fresh folder, its log in logs/NAME-up.log; url
    and token empty when it did not start; api(method, path, body) -> (status, JSON). `home` and
    `port`: start again on the state folder and port of an earlier one; `extra`: more flags."""

    def __init__(self, r, name, home=None, port=0, extra=()):
        import re
        import tempfile
        self.home = home = home or tempfile.mkdtemp(prefix=f"tf-{name}-")
        self.log_path = os.path.join(r.logs, f"{name}-up.log")
        self.proc = subprocess.Popen([r.tfusion, "up", "--port", str(port), "--metrics-port", "0", *extra], cwd=home,
                                     stdout=open(self.log_path, "w"), stderr=subprocess.STDOUT, env=r.env,
                                     start_new_session=True)
        self.url = self.token = ""
        for _ in range(300):
            m = re.search(r"http://127\.0\.0\.1:[0-9]+", open(self.log_path).read())
            if m:
                self.url = m.group(0)
                break
            time.sleep(0.1)
        token_file = os.path.join(home, ".tfusion", "token")
        self.token = open(token_file).read().strip() if self.url and os.path.exists(token_file) else ""
        if self.url and self.token:
            for _ in range(100):  # the node agent registers the GPU
                if self.api("GET", "/v1/gpus")[1].get("gpus"):
                    break
                time.sleep(0.2)

    def api(self, method, path, body=None):
        return api_call(self.url, self.token, method, path, body, 30)

    def stop(self):
        self.proc.terminate()
        try:
            self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.proc.kill()


def phase_preempt(r, gib=8):
    up = UpOnThisHost(r, "preempt")
    res = {}
    tenant = None
    try:
        url, token, api = up.url, up.token, up.api
        if not url or not token:
            r.record("preempt", {"error": "tfusion up did not start (logs/preempt-up.log)"})
            return
        api("PATCH", "/v1/pools/default", {"vram_expand_to_host_percent": 100})
        ready, go = os.path.join(r.out, "preempt-ready"), os.path.join(r.out, "preempt-go")
        for f in (ready, go):
            if os.path.exists(f):
                os.unlink(f)
        cmd = [r.tfusion, "run", "--controller", url, "--token", token, "--qos", "low", "--vram", "16GiB",
               "--percent", "60", "--", sys.executable, TENANT, "hold", "--gib", str(gib), "--ready", ready, "--go", go]
        tlog = open(os.path.join(r.logs, "preempt-tenant.log"), "w")
        tenant = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=tlog, text=True, env=r.env)
        deadline = time.monotonic() + 120
        while not os.path.exists(ready) and time.monotonic() < deadline and tenant.poll() is None:
            time.sleep(0.1)
        smi = lambda: subprocess.run([r.tfusion, "smi", "-p"], capture_output=True, text=True, env=r.env).stdout
        gpu_used = lambda: subprocess.run(["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits"],
                                          capture_output=True, text=True).stdout.strip()
        res["gpu_used_mib_before"] = gpu_used()
        t0 = time.monotonic()
        st, body = api("POST", "/v1/allocations", {"percent": 60, "vram_mib": 1024, "qos": "critical"})
        res["critical_status"] = st
        res["preempted_suspended"] = body.get("preempted_suspended")
        winner = body.get("id")
        swapped = False
        while time.monotonic() - t0 < 30 and not swapped:
            swapped = "swapped" in smi()
            time.sleep(0.1)
        res["suspended_and_swapped_s"] = round(time.monotonic() - t0, 2) if swapped else None
        res["gpu_used_mib_while_suspended"] = gpu_used()
        open(go, "w").close()  # its GPU call must now wait
        time.sleep(3)
        res["tenant_still_waiting_after_3s"] = tenant.poll() is None
        t1 = time.monotonic()
        res["delete_status"] = api("DELETE", "/v1/allocations/" + winner)[0] if winner else None
        out, _ = tenant.communicate(timeout=120)
        res["resumed_and_done_s"] = round(time.monotonic() - t1, 2)
        res["tenant"] = last_json(out, tenant.returncode)
        res["tenant_rc"] = tenant.returncode
    except Exception as ex:  # keep what was measured
        res["error"] = repr(ex)
    finally:
        if tenant is not None and tenant.poll() is None:
            tenant.kill()
        up.stop()
        r.record("preempt", res)


def phase_ipcfix(r):
    """Legacy CUDA IPC from a tiered tenant, through the limiter's own handle: tests/gpu/ipc_pair
    (producer and consumer processes, memory and interprocess events) natively and with both
    processes under `tfusion run --tiering`; then PyTorch: a tiered tenant passes a CUDA tensor to
    a torch.multiprocessing (spawn) child that reads and modifies it (tier_tenant.py ipcfix), the
    shared buffer stays resident (fixed) through a freeze, the other moves, all checked."""
    res = {}
    pair = os.path.join(r.build, "tests/gpu/ipc_pair")
    for mode, prefix in (("native", []), ("tiered", [r.tfusion, "run"] + TIERED + ["--vgpu", "tier-ipcpair", "--"])):
        try:
            p = subprocess.run(prefix + [pair, "--mib", "64"], capture_output=True, text=True, timeout=120, env=r.env)
            rc, out, err = p.returncode, p.stdout, p.stderr
        except subprocess.TimeoutExpired as ex:
            rc, out, err = -9, str(ex.stdout or ""), "TIMEOUT"
        with open(os.path.join(r.logs, f"ipcfix-ipc_pair-{mode}.log"), "w") as f:
            f.write(f"rc={rc}\n--- stdout\n{out}\n--- stderr\n{err}\n")
        results = [l[len("RESULT "):] for l in out.splitlines() if l.startswith("RESULT ")]
        verdict = [l.split("=", 1)[1] for l in results if l.startswith("verdict=")]
        res[f"ipc_pair_{mode}"] = {"rc": rc, "verdict": verdict[-1] if verdict else None, "results": results[:80]}
    res["torch"] = r.tenant(["ipcfix", "--gib", "1"], TIERED + ["--vgpu", "tier-ipcfix"], timeout=300)
    res["ok"] = (res["ipc_pair_native"]["verdict"] == "PASS" and res["ipc_pair_tiered"]["verdict"] == "PASS"
                 and bool(res["torch"].get("ok")) and not str(res["torch"].get("fixed", "0 ")).startswith("0 "))
    r.record("ipcfix", res)


def phase_patch(r, gib=1):
    """`tfusion patch` on a live allocation: a local tenant of a pool allocation that never swaps
    when idle (`--idle-swap 0`) holds GIB and waits; it must stay resident; then `tfusion patch ID
    --idle-swap 2s` must make its vGPU swap out by itself within seconds (the node agent writes the
    new timeout into the region at its next sync), and its next GPU call must find every byte."""
    up = UpOnThisHost(r, "patch")
    res = {"gib": gib}
    tenant = None
    try:
        if not up.url or not up.token:
            res["error"] = "tfusion up did not start (logs/patch-up.log)"
            return
        up.api("PATCH", "/v1/pools/default", {"vram_expand_to_host_percent": 100})  # tiering needs an overselling pool
        ready, go = os.path.join(r.out, "patch-ready"), os.path.join(r.out, "patch-go")
        remove_files(ready, go)
        run_client = ["--controller", up.url, "--token", up.token]
        cmd = [r.tfusion, "run", *run_client, "--qos", "low", "--vram", "8GiB", "--percent", "50", "--idle-swap", "0",
               "--", sys.executable, TENANT, "hold", "--gib", str(gib), "--ready", ready, "--go", go]
        tenant = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=open(os.path.join(r.logs, "patch-tenant.log"), "w"),
                                  text=True, env=r.env)
        if not wait_until(lambda: os.path.exists(ready) or tenant.poll() is not None, 120) or not os.path.exists(ready):
            res["error"] = "the tenant did not get ready (logs/patch-tenant.log)"
            return
        smi = lambda: subprocess.run([r.tfusion, "smi", "-p"], capture_output=True, text=True, env=r.env).stdout
        allocs = up.api("GET", "/v1/allocations")[1].get("allocations", [])
        ids = [a.get("id") for a in allocs if a.get("qos") == "low"]
        if len(ids) != 1:
            res["error"] = f"expected one low allocation, found {allocs!r}"[:400]
            return
        time.sleep(8)  # idle, but its allocation says never: it stays resident
        res["smi_before"] = smi().strip().splitlines()[-3:]
        res["swapped_before_patch"] = "swapped" in smi()
        t0 = time.monotonic()
        p = subprocess.run([r.tfusion, "patch", ids[0], "--idle-swap", "2s", "--url", up.url, "--token", up.token], capture_output=True, text=True,
                           env=r.env, timeout=30)
        res["patch_rc"], res["patch_out"] = p.returncode, (p.stdout + p.stderr).strip()[-400:]
        swapped = wait_until(lambda: "swapped" in smi(), 30)
        res["swapped_after_patch_s"] = round(time.monotonic() - t0, 2) if swapped else None
        res["smi_after"] = smi().strip().splitlines()[-3:]
        open(go, "w").close()
        out, _ = tenant.communicate(timeout=120)
        res["tenant"] = last_json(out, tenant.returncode)
        res["ok"] = (not res["swapped_before_patch"] and p.returncode == 0 and swapped is not None
                     and bool(res["tenant"].get("intact")))
    except Exception as ex:  # keep what was measured
        res["error"] = repr(ex)
    finally:
        if tenant is not None and tenant.poll() is None:
            tenant.kill()
        up.stop()
        # The node agent's log of swaps (docs/tiering.md): the idle swap-out and the resume by the
        # tenant's GPU call, each with its cause.
        try:
            lines = [l.strip() for l in open(up.log_path) if "(cause:" in l]
        except OSError:
            lines = []
        res["agent_swap_log"] = lines[-6:]
        res["agent_logged_idle_out"] = any("swapped out" in l and "cause: idle" in l for l in lines)
        res["agent_logged_call_in"] = any("swapped in" in l and "cause: GPU call" in l for l in lines)
        if "ok" in res:
            res["ok"] = res["ok"] and res["agent_logged_idle_out"] and res["agent_logged_call_in"]
        r.record("patch", res)


class FaultTenant:
    """A `tier_tenant.py fault` process (its own process group) holding GIB, stepped through go
    files in OUT/faults/NAME; its stdout in logs/faults-NAME.out, stderr (the limiter's log) in
    logs/faults-NAME.log. `cmd` is the command line before the tenant's own (`tfusion run ... --`,
    maybe behind a shell that sets a limit)."""

    def __init__(self, r, name, gib, cmd, env=None):
        import shutil
        self.dir = os.path.join(r.out, "faults", name)
        shutil.rmtree(self.dir, ignore_errors=True)
        os.makedirs(self.dir)
        self.ready, self.go = os.path.join(self.dir, "ready"), os.path.join(self.dir, "go")
        self.log_path = os.path.join(r.logs, f"faults-{name}.log")
        self.name, self.k, self.killed = name, 0, False
        full = list(cmd) + [sys.executable, TENANT, "fault", "--gib", str(gib), "--ready", self.ready, "--go", self.go]
        with open(os.path.join(r.logs, f"faults-{name}.out"), "w") as out, open(self.log_path, "w") as err:
            err.write("$ " + " ".join(full) + "\n")
            err.flush()
            self.proc = subprocess.Popen(full, stdout=out, stderr=err, env=dict(r.env, **(env or {})),
                                         start_new_session=True)

    def _answer(self, k, seconds):
        path = f"{self.ready}.{k}"
        if not wait_soon(lambda: os.path.exists(path) or self.proc.poll() is not None, seconds) or not os.path.exists(path):
            return {"step": k, "error": f"no answer within {seconds} s", "rc": self.proc.poll()}
        with open(path) as f:
            return json.loads(f.read())

    def wait_ready(self, seconds=90):
        """The tenant's first line once its tensors are filled, else an error record."""
        return self._answer(0, seconds)

    def step(self, seconds=60):
        """One step (a GPU op and the checksums): its JSON line, else an error record."""
        self.k += 1
        open(f"{self.go}.{self.k}", "w").close()
        return self._answer(self.k, seconds)

    def alive(self):
        return self.proc.poll() is None

    def log(self):
        with open(self.log_path) as f:
            return f.read()

    def finish(self, seconds=30):
        """Lets it exit; killed (its whole group) after `seconds`. Its exit status, None if killed."""
        open(self.go + ".end", "w").close()
        try:
            return self.proc.wait(timeout=seconds)
        except subprocess.TimeoutExpired:
            self.kill()
            return None

    def kill(self):
        self.killed = True
        try:
            os.killpg(self.proc.pid, 9)
        except (ProcessLookupError, PermissionError):
            pass
        try:
            self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            pass


class FaultCase:
    """One sub-case of phase faults: its facts (`res`), the processes it started (killed at the end
    whatever happened) and the tfusion CLI with a timeout."""

    def __init__(self, r, name):
        self.r, self.name, self.res, self.tenants, self.others = r, name, {"case": name}, [], []
        self.t0 = time.monotonic()

    def tenant(self, name, gib, cmd, env=None):
        t = FaultTenant(self.r, f"{self.name}-{name}", gib, cmd, env)
        self.tenants.append(t)
        return t

    def tf(self, *args, timeout=60):
        """(exit status or None on timeout, stdout and stderr together) of `tfusion ARGS`."""
        try:
            p = subprocess.run([self.r.tfusion, *args], capture_output=True, text=True, timeout=timeout, env=self.r.env)
            return p.returncode, (p.stdout + p.stderr).strip()
        except subprocess.TimeoutExpired:
            return None, "TIMEOUT"

    def smi(self):
        return self.tf("smi", "-p", timeout=30)[1]

    def smi_lines(self, vgpu):
        """The lines of `tfusion smi -p` naming the vGPU (its own line, then its processes')."""
        return [l.strip() for l in self.smi().splitlines() if vgpu in l.split()]

    def tier_state(self, vgpu):
        """The TIER column of the vGPU's line in `tfusion smi -p` ("resident", "swapping out", ...)."""
        lines = self.smi_lines(vgpu)
        if not lines:
            return None
        line = f" {' '.join(lines[0].split())} "
        for state in ("swapping out", "swapping in", "on disk", "checkpointed", "swapped", "resident", "mixed"):
            if f" {state} " in line:
                return state
        return None

    def host_tier(self):
        """("used", "budget") of the first GPU's host tier as `tfusion smi` shows them, else None."""
        import re
        m = re.search(r"host tier ([0-9.]+ [KMGT]iB) of ([0-9.]+ [KMGT]iB)", self.tf("smi", timeout=30)[1])
        return (m.group(1), m.group(2)) if m else None

    def close(self):
        for t in self.tenants:
            if t.alive():
                t.kill()
            elif not t.killed and t.proc.returncode != 0:  # how it ended, for the verdict's reader
                tail = [l for l in t.log().splitlines() if l.strip()][-2:]
                self.res.setdefault("tenant_exits", {})[t.name] = {"rc": t.proc.returncode, "log_tail": tail}
        for stop in reversed(self.others):
            try:
                stop()
            except Exception as ex:  # keep going: the next sub-case needs the GPU free
                self.res.setdefault("cleanup_errors", []).append(repr(ex)[:200])
        self.res["case_s"] = round(time.monotonic() - self.t0, 1)


def fault_swapin_without_room(c, gib=4):
    """A frozen tenant whose VRAM a process without tiering took: its next op fails with a CUDA
    error (out of memory), it stays swapped in host memory, `tfusion thaw` exits 1; once the hog has
    gone, its next op resumes it intact."""
    res, vgpu = c.res, "faults-noroom"
    res["note"] = ("the failing op is an in-place add on a small tensor (no new allocation), so the error is the "
                   "resume's, not PyTorch's caching allocator's; the hog runs natively, outside the limiter")
    t = c.tenant("tenant", gib, [c.r.tfusion, "run", *TIERED, "--vgpu", vgpu, "--"])
    res["ready"] = t.wait_ready()
    if "error" in res["ready"]:
        return
    res["freeze_rc"], res["freeze"] = c.tf("freeze", vgpu)
    hog_dir = os.path.join(c.r.out, "faults", "noroom-hog")
    os.makedirs(hog_dir, exist_ok=True)
    hog_ready, hog_go = os.path.join(hog_dir, "ready"), os.path.join(hog_dir, "go")
    remove_files(hog_ready, hog_go)
    hog = subprocess.Popen([sys.executable, TENANT, "hog", "--leave-mib", "1024", "--ready", hog_ready, "--go", hog_go],
                           stdout=subprocess.DEVNULL, stderr=open(os.path.join(c.r.logs, "faults-noroom-hog.log"), "w"),
                           env=c.r.env, start_new_session=True)

    def stop_hog():
        open(hog_go, "w").close()
        try:
            hog.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(hog.pid, 9)
            hog.wait(timeout=20)
    c.others.append(stop_hog)
    if not wait_soon(lambda: os.path.exists(hog_ready) or hog.poll() is not None, 60) or not os.path.exists(hog_ready):
        res["error"] = "the hog did not take the memory (logs/faults-noroom-hog.log)"
        return
    with open(hog_ready) as f:
        res["hog"] = json.loads(f.read())
    res["refused_step"] = t.step()
    res["alive_after_refusal"] = t.alive()
    log = t.log()
    res["logged_resume_failed"] = "resume failed (CUDA error 2); the swapped copy is kept" in log
    res["smi_while_refused"] = c.smi_lines(vgpu)
    res["tier_while_refused"] = c.tier_state(vgpu)
    res["host_tier_while_refused"] = c.host_tier()
    res["thaw_rc"], res["thaw"] = c.tf("thaw", vgpu)
    stop_hog()
    c.others.remove(stop_hog)
    res["resumed_step"] = t.step()
    res["tier_after"] = c.tier_state(vgpu)
    res["rc"] = t.finish()
    refused, resumed = res["refused_step"], res["resumed_step"]
    res["ok"] = bool(res["freeze_rc"] == 0 and "error" in refused and refused.get("out_of_memory")
                     and res["alive_after_refusal"] and res["logged_resume_failed"]
                     and res["tier_while_refused"] == "swapped"
                     and (res["host_tier_while_refused"] or ("0 MiB",))[0] != "0 MiB"
                     and res["thaw_rc"] == 1
                     and "thaw FAILED (CUDA error 2): it keeps running swapped; its next GPU call retries" in res["thaw"]
                     and resumed.get("intact") and res["tier_after"] == "resident" and res["rc"] == 0)


def disk_dir(name):
    import shutil
    d = os.path.join(os.environ.get("TF_DISK_DIR", "/tmp/tf-disk-tier"), name)
    shutil.rmtree(d, ignore_errors=True)
    os.makedirs(d)
    return d


def fault_disk_unwritable(c, gib=1, limit_mib=64):
    """A tenant under a file size limit (`ulimit -f`) smaller than its copy, with a disk tier: the
    move to disk fails (EFBIG), the copy stays in host memory, nothing is left in the folder, and
    the tenant resumes intact."""
    import re
    res, vgpu = c.res, "faults-fsize"
    d = disk_dir("faults-fsize")
    res["file_size_limit_mib"] = limit_mib
    shell = ["bash", "-c", f'ulimit -f {limit_mib * 1024}; exec "$@"', "bash"]
    t = c.tenant("tenant", gib, shell + [c.r.tfusion, "run", *TIERED, "--vgpu", vgpu, "--disk-tier", d,
                                         "--idle-disk", "1s", "--"])
    res["ready"] = t.wait_ready()
    if "error" in res["ready"]:
        return
    res["freeze_rc"], res["freeze"] = c.tf("freeze", vgpu)
    failed = re.compile(r"writing [0-9]+ MiB to the disk tier failed \(File too large\): it stays in host memory")
    res["logged_write_failed"] = bool(wait_until(lambda: failed.search(t.log()), 30))
    res["log_lines"] = [l.split("tfusion: ", 1)[-1] for l in t.log().splitlines() if "disk tier" in l][-4:]
    res["alive"] = t.alive()
    res["tier_while_swapped"] = c.tier_state(vgpu)
    res["smi_while_swapped"] = c.smi_lines(vgpu)
    res["folder_while_swapped"] = sorted(os.listdir(d))
    res["step"] = t.step()
    res["rc"] = t.finish()
    res["folder_after"] = sorted(os.listdir(d))
    res["ok"] = bool(res["freeze_rc"] == 0 and res["logged_write_failed"] and res["alive"]
                     and res["tier_while_swapped"] == "swapped" and res["folder_while_swapped"] == []
                     and res["step"].get("intact") and res["rc"] == 0 and res["folder_after"] == [])


def fingerprint(d):
    """Name, size, mtime (ns) and sha256 of every file of folder d."""
    import hashlib
    out = []
    for name in sorted(os.listdir(d)):
        p = os.path.join(d, name)
        st = os.stat(p)
        with open(p, "rb") as f:
            out.append([name, st.st_size, st.st_mtime_ns, hashlib.sha256(f.read()).hexdigest()])
    return out


def fault_foreign_files(c, gib=1):
    """Files in the disk tier's folder that the tiering did not make (another node's copy, a name
    like the fallback's private files, one with our header's magic) are never read, changed or
    removed through a move to disk and a resume."""
    res, vgpu = c.res, "faults-foreign"
    d = disk_dir("faults-foreign")
    with open(os.path.join(d, "node-b.swap"), "wb") as f:
        f.write(os.urandom(3 << 20))
    with open(os.path.join(d, ".tfusion-swap-AbC123"), "wb") as f:
        f.write(b"TFSWAP01" + os.urandom(8 << 20))
    with open(os.path.join(d, "tenant-4242.swap"), "wb") as f:
        f.write(bytes(4096))
    for name in os.listdir(d):
        os.utime(os.path.join(d, name), (1767225600, 1767225600))  # 2026-01-01 00:00 UTC
    before = fingerprint(d)
    res["foreign_files"] = [x[:2] for x in before]
    t = c.tenant("tenant", gib, [c.r.tfusion, "run", *TIERED, "--vgpu", vgpu, "--disk-tier", d, "--idle-disk", "1s", "--"])
    res["ready"] = t.wait_ready()
    if "error" in res["ready"]:
        return
    res["freeze_rc"], res["freeze"] = c.tf("freeze", vgpu)
    res["on_disk"] = bool(wait_until(lambda: c.tier_state(vgpu) == "on disk", 30, 0.2))
    res["unchanged_while_on_disk"] = fingerprint(d) == before
    res["step"] = t.step()
    res["rc"] = t.finish()
    log = t.log()
    res["logged_moved"] = "to the disk tier in" in log
    res["refused_in_log"] = "refused" in log
    res["unchanged_after"] = fingerprint(d) == before
    res["ok"] = bool(res["freeze_rc"] == 0 and res["on_disk"] and res["unchanged_while_on_disk"]
                     and res["step"].get("intact") and res["rc"] == 0 and res["logged_moved"]
                     and not res["refused_in_log"] and res["unchanged_after"])


def fault_freeze_twice(c, gib=16):
    """`tfusion freeze` of a vGPU still swapping out (16 GiB, host copies not pinned ahead, so the
    first swap-out faults fresh memory in and lasts about a second): exit 2; of one already swapped
    out: exit 0, nothing changed; the tenant resumes intact after one swap-out and one swap-in."""
    res, vgpu = c.res, "faults-twice"
    res["note"] = "TFUSION_TIER_PIN_AHEAD=off: the first swap-out faults in fresh host memory, a longer window"
    t = c.tenant("tenant", gib, [c.r.tfusion, "run", *TIERED, "--vgpu", vgpu, "--"], env={"TFUSION_TIER_PIN_AHEAD": "off"})
    res["ready"] = t.wait_ready(120)
    if "error" in res["ready"]:
        return
    res["no_wait_rc"], res["no_wait"] = c.tf("freeze", vgpu, "--no-wait")
    seen = wait_soon(lambda: (lambda state: state if state in ("swapping out", "swapped") else None)(c.tier_state(vgpu)), 10)
    res["state_before_second_freeze"] = seen
    res["second_rc"], res["second"] = c.tf("freeze", vgpu)
    busy = f"vGPU '{vgpu}' is already swapping out"
    nothing = f"vGPU '{vgpu}' is already swapped out: nothing changed"
    if res["second_rc"] == 2 and busy in res["second"]:
        res["second_saw"] = "swapping out"
    elif res["second_rc"] == 0 and nothing in res["second"]:
        res["second_saw"] = "already swapped: the swap-out was done before the second freeze"
    else:
        res["second_saw"] = None
    res["swapped"] = bool(wait_until(lambda: c.tier_state(vgpu) == "swapped", 30))
    res["third_rc"], res["third"] = c.tf("freeze", vgpu)
    res["step"] = t.step(120)
    res["rc"] = t.finish()
    log = t.log()
    res["swap_outs"] = log.count(f"vGPU '{vgpu}': swapped out")
    res["swap_ins"] = log.count(f"vGPU '{vgpu}': resumed")
    res["ok"] = bool(res["no_wait_rc"] == 0 and res["second_saw"] and res["swapped"] and res["third_rc"] == 0
                     and nothing in res["third"] and res["step"].get("intact") and res["rc"] == 0
                     and res["swap_outs"] == 1 and res["swap_ins"] == 1)


def fault_killed_while_swapped(c, gib=4):
    """A tenant killed (SIGKILL) while swapped: the host tier it held is back within seconds
    (`tfusion smi`); then a new tenant runs, swaps and resumes as usual."""
    res, vgpu = c.res, "faults-killed"
    res["host_tier_before"] = c.host_tier()
    t = c.tenant("victim", gib, [c.r.tfusion, "run", *TIERED, "--vgpu", vgpu, "--"])
    res["ready"] = t.wait_ready()
    if "error" in res["ready"]:
        return
    res["freeze_rc"], res["freeze"] = c.tf("freeze", vgpu)
    res["host_tier_while_swapped"] = c.host_tier()
    t0 = time.monotonic()
    t.kill()
    base = (res["host_tier_before"] or ("?",))[0]
    back = wait_until(lambda: (c.host_tier() or ("?",))[0] == base, 15, 0.2)
    res["host_tier_back_s"] = round(time.monotonic() - t0, 2) if back else None
    res["host_tier_after_kill"] = c.host_tier()
    res["swapped_left"] = [l for l in c.smi_lines(vgpu) if "swapped" in l]
    nxt = c.tenant("next", 1, [c.r.tfusion, "run", *TIERED, "--vgpu", vgpu + "-next", "--"])
    res["next_ready"] = nxt.wait_ready()
    if "error" in res["next_ready"]:
        return
    res["next_freeze_rc"], res["next_freeze"] = c.tf("freeze", vgpu + "-next")
    res["next_step"] = nxt.step()
    res["next_rc"] = nxt.finish()
    res["ok"] = bool(res["freeze_rc"] == 0 and base == "0 MiB" and res["host_tier_back_s"] is not None
                     and not res["swapped_left"] and res["next_freeze_rc"] == 0
                     and "in host memory" in res["next_freeze"] and res["next_step"].get("intact")
                     and res["next_rc"] == 0)


def pooled_tenant(c, up, name, gib, env=None):
    """A tenant of a pool allocation (`tfusion run --controller`, the pool expanding VRAM into host
    memory: tiering) that never swaps when idle; (tenant, its vGPU a-... or None)."""
    import re
    t = c.tenant(name, gib, [c.r.tfusion, "run", "--controller", up.url, "--token", up.token, "--qos", "low",
                             "--vram", f"{gib + 4}GiB", "--percent", "30", "--idle-swap", "0", "--"], env=env)
    ready = t.wait_ready(120)
    c.res[name + "_ready"] = ready
    m = re.search(r"allocation (a-[0-9a-f]+)", t.log())
    vgpu = ready.get("vgpu") or (m.group(1) if m else None)
    return t, (vgpu if "error" not in ready else None)


def fault_agent_restart(c, gib=4):
    """The node agent (`tfusion up`) killed with SIGKILL while its allocation's tenant is swapped;
    a new one on the same state folder and port reports it swapped, and a thaw through the
    controller resumes it intact."""
    res = c.res
    res["note"] = "TFUSION_TIER_PIN_AHEAD=off, as in the fake-driver test"
    up = UpOnThisHost(c.r, "faults-agent")
    c.others.append(lambda: up.stop() if up.proc.poll() is None else None)
    if not up.url or not up.token:
        res["error"] = "tfusion up did not start (logs/faults-agent-up.log)"
        return
    up.api("PATCH", "/v1/pools/default", {"vram_expand_to_host_percent": 100})
    t, vgpu = pooled_tenant(c, up, "tenant", gib, env={"TFUSION_TIER_PIN_AHEAD": "off"})
    res["vgpu"] = vgpu
    if not vgpu:
        return
    client = ["--url", up.url, "--token", up.token]
    res["freeze_rc"], res["freeze"] = c.tf("freeze", vgpu, "--controller", *client)
    res["swapped"] = bool(wait_until(lambda: c.tier_state(vgpu) == "swapped", 30))
    port = int(up.url.rsplit(":", 1)[1])
    os.killpg(up.proc.pid, 9)
    up.proc.wait(timeout=20)
    res["swapped_without_agent"] = c.tier_state(vgpu) == "swapped"
    up2 = UpOnThisHost(c.r, "faults-agent2", home=up.home, port=port)
    c.others.append(lambda: up2.stop() if up2.proc.poll() is None else None)
    if not up2.url:
        res["error"] = "the second tfusion up did not start (logs/faults-agent2-up.log)"
        return
    ps = lambda: c.tf("ps", *client, timeout=30)[1]
    res["ps_swapped"] = bool(wait_until(lambda: "running, swapped" in ps(), 20, 0.25))
    res["ps"] = [l for l in ps().splitlines() if vgpu in l][-2:]
    res["resumed_before_thaw"] = "resumed" in t.log()
    res["thaw_rc"], res["thaw"] = c.tf("thaw", vgpu, "--controller", *client)
    res["resumed_by_thaw"] = bool(wait_until(lambda: f"vGPU '{vgpu}': resumed" in t.log(), 30))
    res["ps_resident"] = bool(wait_until(lambda: "running, resident" in ps(), 20, 0.25))
    res["step"] = t.step()
    res["rc"] = t.finish()
    res["swap_ins"] = t.log().count(f"vGPU '{vgpu}': resumed")
    res["ok"] = bool(res["freeze_rc"] == 0 and res["swapped"] and res["swapped_without_agent"] and res["ps_swapped"]
                     and not res["resumed_before_thaw"] and res["thaw_rc"] == 0 and res["resumed_by_thaw"]
                     and res["ps_resident"] and res["step"].get("intact") and res["rc"] == 0 and res["swap_ins"] == 1)


def fault_node_budget(c, gib=4, budget_mib=6 * 1024):
    """The node agent's host tier budget (`tfusion up --host-tier-budget`) smaller than two
    tenants' copies: the first freeze swaps out, the second exits 1 and that tenant stays resident
    and running; both intact. The GPU region's earlier budget is set back at the end."""
    res = c.res
    res["note"] = ("TFUSION_TIER_PIN_AHEAD=off (no kept copies in the budget); the budget is the agent's flag, "
                   "tfusion run sets none")
    if c.host_tier() is None:  # no region yet: make it, with its default budget, to set back at the end
        subprocess.run([c.r.tfusion, "run", "--vram", "1GiB", "--vgpu", "faults-budget-restore", "--", "true"],
                       capture_output=True, timeout=60, env=c.r.env)
    before = c.host_tier()
    res["host_tier_before"] = before
    if before:
        # The region keeps a budget after its agent has gone: give the next phases theirs back.
        restore = dict(c.r.env, TFUSION_HOST_TIER_BUDGET=before[1].replace(" ", ""))
        c.others.insert(0, lambda: subprocess.run([c.r.tfusion, "run", "--vram", "1GiB", "--vgpu", "faults-budget-restore",
                                                   "--", "true"], capture_output=True, timeout=60, env=restore))
    up = UpOnThisHost(c.r, "faults-budget", extra=["--host-tier-budget", f"{budget_mib}MiB"])
    c.others.append(lambda: up.stop() if up.proc.poll() is None else None)
    if not up.url or not up.token:
        res["error"] = "tfusion up did not start (logs/faults-budget-up.log)"
        return
    up.api("PATCH", "/v1/pools/default", {"vram_expand_to_host_percent": 100})
    res["gpus_host_tier_budget_mib"] = [g.get("host_tier_budget_mib") for g in up.api("GET", "/v1/gpus")[1].get("gpus", [])]
    env = {"TFUSION_TIER_PIN_AHEAD": "off", "TFUSION_HOST_TIER_BUDGET": ""}  # the agent's budget, not one of run's
    a, va = pooled_tenant(c, up, "first", gib, env)
    b, vb = pooled_tenant(c, up, "second", gib, env)
    res["vgpus"] = [va, vb]
    if not va or not vb:
        return
    res["host_tier_of_agent"] = c.host_tier()
    res["first_freeze_rc"], res["first_freeze"] = c.tf("freeze", va)
    res["second_freeze_rc"], res["second_freeze"] = c.tf("freeze", vb)
    res["second_tier"] = c.tier_state(vb)
    res["host_tier_after"] = c.host_tier()
    res["second_logged_budget"] = "the host tier's budget is exhausted" in b.log()
    res["second_step"] = b.step()
    res["first_step"] = a.step()
    res["rcs"] = [a.finish(), b.finish()]
    res["ok"] = bool(res["gpus_host_tier_budget_mib"] and all(x == budget_mib for x in res["gpus_host_tier_budget_mib"])
                     and res["first_freeze_rc"] == 0 and res["second_freeze_rc"] == 1
                     and "freeze FAILED (CUDA error 2): it keeps running resident" in res["second_freeze"]
                     and res["second_tier"] == "resident" and res["second_logged_budget"]
                     and res["second_step"].get("intact") and res["first_step"].get("intact") and res["rcs"] == [0, 0])


FAULT_CASES = (("swapin_without_room", fault_swapin_without_room), ("disk_unwritable", fault_disk_unwritable),
               ("foreign_files", fault_foreign_files), ("freeze_twice", fault_freeze_twice),
               ("killed_while_swapped", fault_killed_while_swapped), ("agent_restart", fault_agent_restart),
               ("node_budget", fault_node_budget))


def phase_faults(r):
    """docs/tiering.md "Faults" on the GPU, one sub-case each (TF_FAULT_CASES=a,b picks some):
    every one kills what it started, whatever happened, and records its own verdict."""
    pick = [x for x in os.environ.get("TF_FAULT_CASES", "").split(",") if x]
    for name, case in FAULT_CASES:
        if pick and name not in pick:
            continue
        c = FaultCase(r, name)
        try:
            case(c)
        except Exception as ex:  # keep what was measured; the next case runs
            c.res["error"] = repr(ex)[:400]
        finally:
            c.close()
            c.res.setdefault("ok", False)
            r.record("faults", c.res)


PHASES = {"rplain": phase_rplain, "preempt": phase_preempt, "remote": phase_remote, "idle": phase_idle, "checks": phase_checks, "pool": phase_pool, "pools": phase_pools, "expandable": phase_expandable, "graphmem": phase_graphmem, "train": phase_train, "swap": phase_swap,
          "ckpt": phase_ckpt, "disk": phase_disk, "gen": phase_gen, "alloc": phase_alloc, "steady": phase_steady,
          "oversub": phase_oversub, "zero": phase_zero, "rzero": phase_rzero, "rpool": phase_rpool,
          "rhold": phase_rhold, "rkill": phase_rkill,
          "firstfreeze": phase_firstfreeze, "patch": phase_patch, "ipcfix": phase_ipcfix,
          "faults": phase_faults}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--phases", default="checks,pool,train,swap,ckpt")
    a = ap.parse_args()
    r = Runner(os.path.abspath(a.build), a.out)
    for ph in a.phases.split(","):
        if ph not in PHASES:
            raise SystemExit(f"unknown phase {ph!r} ({', '.join(PHASES)})")
    for ph in a.phases.split(","):
        log(f"== {ph}")
        try:
            PHASES[ph](r)
        except Exception as ex:  # one failed phase must not lose the others
            r.record(ph, {"error": repr(ex)})


if __name__ == "__main__":
    main()
