#!/usr/bin/env python3
"""PyTorch checks of the remote vGPU (issue 3, item 7): run once natively and once per transport
through the client stub (`tfusion run --remote ...`), each saving its outputs into --out; then
`--compare NATIVE_DIR OTHER_DIR` says, check by check, whether the outputs are equal.

Checks, in the order they run (each independent and bounded by --check-budget-s):
  eager_ops            element-wise ops, reductions, softmax, layer norm, sort/topk, cumsum,
                       gather, Philox random numbers, integer ops
  matmul_fp32          cuBLAS SGEMM (TF32 off), batched GEMM, Linear with bias; checked against fp64
  matmul_fp16          cuBLAS/cuBLASLt HGEMM, Linear with bias; checked against fp32
  conv_cudnn           cuDNN conv2d forward fp32/fp16 and backward fp32 (deterministic algorithms);
                       checked against the CPU
  train_step           10 SGD steps of a small CNN (torch_checks.py's)
  sdpa                 scaled_dot_product_attention fp16 causal and not, forward and backward;
                       checked against the math reference
  event_timing         torch.cuda.Event elapsed times: positive, additive, below wall time
  cuda_graphs          torch.cuda.graph capture and replay (torch_checks.py's), equal to eager
  dataloader_pinned    DataLoader(num_workers=2 forked workers, pin_memory=True), batches moved
                       with .cuda(non_blocking=True), reduced on the GPU; checked against the CPU
  expandable_segments  a subprocess with PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
                       (the driver's VMM calls): 1 GiB in 128 MiB tensors, written, read, freed
  multiprocessing_ipc  torch.multiprocessing (spawn) hands a CUDA tensor to a child process (CUDA
                       IPC: remotely a second client of the same worker), which adds 1 in place;
                       the parent sees the change
  compile_default      torch.compile of a small function (torch_checks.py's)
  compile_max_autotune torch.compile(mode="max-autotune") of a small matmul + bias + relu
Outputs: OUT/CHECK.pt (a dict of tensors). Keys starting with "approx:" hold results whose bits
may legitimately change between runs (autotuned kernels, atomics) and are compared with a
tolerance; every other tensor must be bit-identical to native.
Prints `RESULT check=NAME status=PASS|FAIL seconds=S [error=...]` per check (error last, to the
end of the line) and `RESULT checks_passed=N checks_failed=M`; exit 0 when every check passed.
--compare prints `RESULT compare=NAME status=EQUAL|DIFF|MISSING note=...` and exits 0 when all
are EQUAL.
"""
import argparse
import os
import signal
import subprocess
import sys
import time
import traceback

# Deterministic cuBLAS needs its workspace configured before the first cuBLAS call.
os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

CHECKS = ["eager_ops", "matmul_fp32", "matmul_fp16", "conv_cudnn", "train_step", "sdpa", "event_timing",
          "cuda_graphs", "dataloader_pinned", "expandable_segments", "multiprocessing_ipc", "compile_default",
          "compile_max_autotune"]
APPROX = "approx:"


class CheckTimeout(Exception):
    pass


def on_alarm(signum, frame):
    raise CheckTimeout("check budget exceeded")


def one_line(text):
    return " ".join(str(text).split())[:300]


def seeded(torch, seed):
    torch.manual_seed(seed)
    torch.cuda.manual_seed_all(seed)


def expect_close(name, got, ref, rtol, atol):
    """Raises AssertionError when got (any dtype) differs from ref beyond the tolerance."""
    got = got.double().cpu()
    ref = ref.double().cpu()
    if got.shape != ref.shape:
        raise AssertionError(f"{name}: shape {tuple(got.shape)} != {tuple(ref.shape)}")
    if not bool(got.isfinite().all()):
        raise AssertionError(f"{name}: non-finite values")
    err = (got - ref).abs()
    bound = atol + rtol * ref.abs()
    if bool((err > bound).any()):
        raise AssertionError(f"{name}: max |diff| {err.max().item():.3g} beyond rtol={rtol} atol={atol}")


# --- the checks: each returns a dict of tensors (saved), raising on a wrong result -------------

def check_eager_ops(torch, args):
    seeded(torch, 11)
    x = torch.randn(1000, 1000, device="cuda")
    y = torch.rand(1000, 1000, device="cuda")
    i = torch.randint(0, 1000, (1000, 50), device="cuda")
    n = torch.arange(1 << 16, device="cuda", dtype=torch.int64)
    out = {
        "randn": x, "rand": y,
        "elementwise": torch.sin(x) * torch.exp(-y) + torch.sqrt(y) - x.clamp(-1, 1) ** 3,
        "sum_dim0": x.sum(0), "mean_dim1": x.mean(1), "max_dim1": x.max(1).values, "argmin": x.argmin(1),
        "norm": torch.linalg.vector_norm(x, dim=1),
        "softmax": torch.softmax(x, dim=-1), "log_softmax": torch.log_softmax(x, dim=0),
        "layer_norm": torch.nn.functional.layer_norm(x, (1000,)),
        "sort": torch.sort(x[:64], dim=1).values, "topk": torch.topk(x, 8, dim=1).indices,
        "cumsum": torch.cumsum(y, dim=1), "gather": torch.gather(x, 1, i),
        "where": torch.where(x > 0, x, y), "half": x.half() * 3, "bf16": x.bfloat16() + 1,
        "int_ops": (n * 2654435761) % 1000003 ^ (n >> 3), "nonzero": torch.nonzero(x[:100] > 2.0),
    }
    ref = torch.sin(x.cpu()) * torch.exp(-y.cpu()) + torch.sqrt(y.cpu()) - x.cpu().clamp(-1, 1) ** 3
    expect_close("elementwise vs CPU", out["elementwise"], ref, 1e-5, 1e-5)
    expect_close("sum vs CPU", out["sum_dim0"], x.cpu().double().sum(0), 1e-4, 1e-3)
    torch.cuda.synchronize()
    return {k: v.cpu() for k, v in out.items()}


def check_matmul_fp32(torch, args):
    seeded(torch, 12)
    a = torch.randn(1024, 1024, device="cuda")
    b = torch.randn(1024, 1024, device="cuda")
    ba = torch.randn(16, 128, 256, device="cuda")
    bb = torch.randn(16, 256, 64, device="cuda")
    lin = torch.nn.Linear(1024, 512).cuda()
    out = {"mm": a @ b, "bmm": torch.bmm(ba, bb), "linear": lin(a), "mm_t": a.t() @ b}
    expect_close("mm vs fp64", out["mm"], a.double() @ b.double(), 1e-4, 1e-3)
    expect_close("bmm vs fp64", out["bmm"], torch.bmm(ba.double(), bb.double()), 1e-4, 1e-3)
    torch.cuda.synchronize()
    return {k: v.detach().cpu() for k, v in out.items()}


def check_matmul_fp16(torch, args):
    seeded(torch, 13)
    a = torch.randn(2048, 2048, device="cuda", dtype=torch.float16)
    b = torch.randn(2048, 2048, device="cuda", dtype=torch.float16)
    lin = torch.nn.Linear(2048, 1024).cuda().half()
    c = a[:4, :64].reshape(4, 8, 8)
    out = {"mm": a @ b, "linear": lin(a),
           "baddbmm": torch.baddbmm(c, a[:4, :512].reshape(4, 8, 64), b[:4, :512].reshape(4, 64, 8))}
    expect_close("fp16 mm vs fp32", out["mm"], a.float() @ b.float(), 2e-2, 1.0)
    torch.cuda.synchronize()
    return {k: v.detach().cpu() for k, v in out.items()}


def check_conv_cudnn(torch, args):
    seeded(torch, 14)
    F = torch.nn.functional
    x = torch.randn(8, 32, 28, 28, device="cuda")
    w = torch.randn(64, 32, 3, 3, device="cuda", requires_grad=True)
    y = F.conv2d(x, w, padding=1, stride=1)
    y.square().mean().backward()
    xh = torch.randn(16, 64, 56, 56, device="cuda", dtype=torch.float16)
    wh = torch.randn(128, 64, 3, 3, device="cuda", dtype=torch.float16)
    yh = F.conv2d(xh, wh, padding=1)
    yd = F.conv2d(x, torch.randn(32, 1, 5, 5, device="cuda"), groups=32, padding=2)  # depthwise
    expect_close("conv fp32 vs CPU", y, F.conv2d(x.cpu(), w.detach().cpu(), padding=1), 1e-4, 1e-3)
    torch.cuda.synchronize()
    return {"conv_fp32": y.detach().cpu(), "wgrad_fp32": w.grad.cpu(), "conv_fp16": yh.cpu(),
            "depthwise": yd.cpu()}


def check_train_step(torch, args):
    import torch_checks
    out = torch_checks.part_train()
    losses = out["losses"]
    if not bool(losses.isfinite().all()) or not losses.min() < losses[0]:
        raise AssertionError(f"losses did not fall: {losses.tolist()}")
    return out


def check_sdpa(torch, args):
    seeded(torch, 15)
    F = torch.nn.functional
    q, k, v = (torch.randn(4, 8, 256, 64, device="cuda", dtype=torch.float16, requires_grad=True) for _ in range(3))
    out = {}
    for causal in (False, True):
        o = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
        qd, kd, vd = (t.detach().float().requires_grad_() for t in (q, k, v))
        scores = (qd @ kd.transpose(-1, -2)) / 8.0
        if causal:
            mask = torch.ones(256, 256, device="cuda", dtype=torch.bool).tril()
            scores = scores.masked_fill(~mask, float("-inf"))
        ref = torch.softmax(scores, dim=-1) @ vd
        expect_close(f"sdpa causal={causal} vs math", o, ref, 2e-2, 2e-2)
        o.float().square().sum().backward()
        ref.square().sum().backward()
        expect_close(f"sdpa causal={causal} dq vs math", q.grad, qd.grad, 5e-2, 5e-2)
        out[f"out_causal{int(causal)}"] = o.detach().cpu()
        # Backward kernels may accumulate with atomics: compared with a tolerance only.
        out[f"{APPROX}dq_causal{int(causal)}"] = q.grad.cpu()
        for t in (q, k, v):
            t.grad = None
    torch.cuda.synchronize()
    return out


def check_event_timing(torch, args):
    seeded(torch, 16)
    a = torch.randn(4096, 4096, device="cuda", dtype=torch.float16)
    e = [torch.cuda.Event(enable_timing=True) for _ in range(3)]
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    e[0].record()
    for _ in range(20):
        a = torch.tanh(a @ a * 1e-3)
    e[1].record()
    for _ in range(20):
        a = torch.tanh(a @ a * 1e-3)
    e[2].record()
    e[2].synchronize()
    wall_ms = (time.perf_counter() - t0) * 1000
    if not all(ev.query() for ev in e):
        raise AssertionError("a synchronized event does not query as complete")
    t01, t12, t02 = e[0].elapsed_time(e[1]), e[1].elapsed_time(e[2]), e[0].elapsed_time(e[2])
    print(f"RESULT event_ms={t01:.3f},{t12:.3f},{t02:.3f} wall_ms={wall_ms:.3f}", flush=True)
    if not (t01 > 0 and t12 > 0):
        raise AssertionError(f"elapsed times not positive: {t01}, {t12}")
    if abs(t01 + t12 - t02) > 0.01 * t02 + 0.05:
        raise AssertionError(f"elapsed times not additive: {t01} + {t12} != {t02}")
    if t02 > wall_ms * 1.05 + 0.5:
        raise AssertionError(f"GPU time {t02:.3f} ms exceeds wall time {wall_ms:.3f} ms")
    return {"result": a.float().sum().reshape(1).cpu()}


def check_cuda_graphs(torch, args):
    import torch_checks
    return torch_checks.part_graphs()


def make_dataset(torch):
    class Rows(torch.utils.data.Dataset):
        """Row i is a deterministic function of i, made on the CPU in the worker process."""

        def __len__(self):
            return 512

        def __getitem__(self, i):
            g = torch.Generator().manual_seed(1000 + i)
            return torch.randn(4096, generator=g), i

    return Rows()


def check_dataloader_pinned(torch, args):
    loader = torch.utils.data.DataLoader(make_dataset(torch), batch_size=32, num_workers=2, pin_memory=True,
                                         multiprocessing_context="fork", timeout=60)
    sums, indices = [], []
    stream = torch.cuda.Stream()
    for x, idx in loader:
        if not x.is_pinned():
            raise AssertionError("a batch from the pin_memory DataLoader is not pinned")
        with torch.cuda.stream(stream):
            xd = x.cuda(non_blocking=True)
            sums.append((xd * 2 + 1).sum(dim=1))
        indices.append(idx)
    torch.cuda.current_stream().wait_stream(stream)
    got = torch.cat(sums).cpu()
    idx = torch.cat(indices)
    ds = make_dataset(torch)
    ref = torch.stack([(ds[int(i)][0] * 2 + 1).sum() for i in idx])
    expect_close("pinned batches vs CPU", got, ref, 1e-5, 1e-3)
    return {"sums": got, "indices": idx}


EXPANDABLE_CHILD = """
import sys, torch
torch.manual_seed(17)
conf = __import__('os').environ.get('PYTORCH_CUDA_ALLOC_CONF', '')
assert 'expandable_segments:True' in conf, conf
chunk = 128 << 20
sums = []
for round_ in range(2):
    ts = []
    for i in range(8):
        t = torch.empty(chunk // 4, dtype=torch.float32, device='cuda')
        t.fill_(float(i + 1))
        ts.append(t)
    w = torch.randn(512, 512, device='cuda')
    sums.append(torch.stack([t[::65536].sum() for t in ts] + [(w @ w).sum()]).cpu())
    print('RESULT round%d_reserved_mib=%d' % (round_, torch.cuda.memory_reserved() >> 20), flush=True)
    del ts
    torch.cuda.empty_cache()
torch.save({'sums': torch.stack(sums)}, sys.argv[1])
"""


def check_expandable_segments(torch, args):
    env = dict(os.environ, PYTORCH_CUDA_ALLOC_CONF="expandable_segments:True")
    path = os.path.join(args.out, "expandable_segments.child.pt")
    if os.path.exists(path):
        os.remove(path)
    proc = subprocess.run([sys.executable, "-c", EXPANDABLE_CHILD, path], env=env, capture_output=True, text=True,
                          timeout=max(10, args.check_budget_s - 10))
    sys.stdout.write(proc.stdout)
    sys.stdout.write(proc.stderr[-3000:])
    if proc.returncode != 0:
        raise AssertionError(f"subprocess exit {proc.returncode}: {one_line(proc.stderr[-300:])}")
    out = torch.load(path)
    os.remove(path)
    # Each 128 MiB tensor holds 2^25 floats; every 65536th one is summed: 512 * value.
    want = torch.tensor([float((i + 1) * 512) for i in range(8)], dtype=torch.float64)
    for row in out["sums"]:
        if not torch.equal(row[:8].double(), want):
            raise AssertionError(f"tensor contents wrong: {row[:8].tolist()}")
    return out


IPC_SCRIPT = """
import sys, torch, torch.multiprocessing as mp

def consumer(q, back):
    t = q.get()  # opened from the producer's IPC handles (memory and event)
    t.add_(1)
    torch.cuda.synchronize()
    back.put(float(t[:4096].double().sum()))
    del t
    q.get()  # the producer keeps the memory until the consumer let go

if __name__ == '__main__':
    ctx = mp.get_context('spawn')
    q, back = ctx.Queue(), ctx.Queue()
    t = torch.arange(1 << 22, dtype=torch.float32, device='cuda') * 0.5
    p = ctx.Process(target=consumer, args=(q, back))
    p.start()
    q.put(t)
    seen = back.get(timeout=120)
    torch.cuda.synchronize()
    q.put(None)
    p.join(60)
    assert p.exitcode == 0, p.exitcode
    torch.save({'tensor': t.cpu(), 'consumer_sum': torch.tensor([seen], dtype=torch.float64)}, sys.argv[1])
"""


def check_multiprocessing_ipc(torch, args):
    script = os.path.join(args.out, "multiprocessing_ipc_child.py")
    path = os.path.join(args.out, "multiprocessing_ipc.child.pt")
    with open(script, "w") as f:
        f.write(IPC_SCRIPT)
    if os.path.exists(path):
        os.remove(path)
    proc = subprocess.run([sys.executable, script, path], capture_output=True, text=True,
                          timeout=max(10, args.check_budget_s - 10))
    sys.stdout.write(proc.stdout)
    sys.stdout.write(proc.stderr[-3000:])
    if proc.returncode != 0:
        raise AssertionError(f"subprocess exit {proc.returncode}: {one_line(proc.stderr[-300:])}")
    out = torch.load(path)
    os.remove(path)
    want = torch.arange(1 << 22, dtype=torch.float32) * 0.5 + 1
    if not torch.equal(out["tensor"], want):
        raise AssertionError("the producer does not see the consumer's in-place add")
    ref = float(want[:4096].double().sum())
    if float(out["consumer_sum"][0]) != ref:
        raise AssertionError(f"the consumer saw {float(out['consumer_sum'][0])}, expected {ref}")
    return out


def check_compile_default(torch, args):
    import torch_checks
    return torch_checks.part_compile()


def check_compile_max_autotune(torch, args):
    def fn(x, w, b):
        return torch.relu(x @ w + b) * 2.0

    seeded(torch, 18)
    x = torch.randn(512, 512, device="cuda", dtype=torch.float16)
    w = torch.randn(512, 512, device="cuda", dtype=torch.float16)
    b = torch.randn(512, device="cuda", dtype=torch.float16)
    compiled = torch.compile(fn, mode="max-autotune")
    compiled(x, w, b)  # compiles and autotunes
    got = compiled(x, w, b).clone()  # second call: the replayed CUDA graph of max-autotune
    ref = fn(x.float(), w.float(), b.float())
    torch.cuda.synchronize()
    expect_close("max-autotune vs fp32 eager", got, ref, 2e-2, 0.5)
    # The chosen GEMM template depends on timings, so its bits may differ between runs.
    return {f"{APPROX}out": got.cpu()}


# --- running -----------------------------------------------------------------------------------

def run_checks(args):
    try:
        import torch
        if not torch.cuda.is_available():
            raise RuntimeError("torch.cuda.is_available() is False")
    except Exception as e:
        traceback.print_exc()
        for name in args.checks:
            print(f"RESULT check={name} status=FAIL seconds=0 error=setup:{type(e).__name__}:{one_line(e)}",
                  flush=True)
        print(f"RESULT checks_passed=0 checks_failed={len(args.checks)}", flush=True)
        return 1
    torch.backends.cudnn.deterministic = True
    torch.backends.cudnn.benchmark = False
    torch.use_deterministic_algorithms(True, warn_only=True)
    # Full fp32 in cuBLAS and cuDNN: the checks compare fp32 results with fp64 and CPU references.
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    print(f"RESULT torch={torch.__version__} device={torch.cuda.get_device_name(0).replace(' ', '_')}", flush=True)
    signal.signal(signal.SIGALRM, on_alarm)
    begin = time.monotonic()
    passed = failed = 0
    for name in args.checks:
        path = os.path.join(args.out, f"{name}.pt")
        if os.path.exists(path):
            os.remove(path)  # a stale output must not pass for this run's
        left = None if args.total_budget_s is None else args.total_budget_s - (time.monotonic() - begin)
        if left is not None and left < 15:
            print(f"RESULT check={name} status=FAIL seconds=0 error=skipped:total budget spent", flush=True)
            failed += 1
            continue
        budget = args.check_budget_s if left is None else min(args.check_budget_s, left - 5)
        t0 = time.monotonic()
        signal.setitimer(signal.ITIMER_REAL, budget)
        try:
            out = globals()[f"check_{name}"](torch, args)
            signal.setitimer(signal.ITIMER_REAL, 0)
            torch.save(out, path)
            passed += 1
            print(f"RESULT check={name} status=PASS seconds={time.monotonic() - t0:.1f}", flush=True)
        except BaseException as e:  # report and go on with the next check
            signal.setitimer(signal.ITIMER_REAL, 0)
            traceback.print_exc()
            failed += 1
            what = "timeout" if isinstance(e, CheckTimeout) else type(e).__name__
            print(f"RESULT check={name} status=FAIL seconds={time.monotonic() - t0:.1f} error={what}:{one_line(e)}",
                  flush=True)
            if isinstance(e, KeyboardInterrupt):
                break
    print(f"RESULT checks_passed={passed} checks_failed={failed}", flush=True)
    return 0 if failed == 0 else 1


def run_isolated(args):
    """Each check in its own interpreter, killed at its budget: a check that hangs in native code
    cannot take the others with it (costs one torch import per check)."""
    passed = failed = 0
    for name in args.checks:
        cmd = [sys.executable, os.path.abspath(__file__), "--out", args.out, "--checks", name,
               "--check-budget-s", str(args.check_budget_s)]
        t0 = time.monotonic()
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=args.check_budget_s + 30)
            sys.stdout.write(proc.stdout)
            sys.stdout.write(proc.stderr[-3000:])
            ok = f"RESULT check={name} status=PASS" in proc.stdout
            if not ok and f"RESULT check={name} status=" not in proc.stdout:
                print(f"RESULT check={name} status=FAIL seconds={time.monotonic() - t0:.1f} "
                      f"error=exit {proc.returncode} without a verdict", flush=True)
        except subprocess.TimeoutExpired:
            ok = False
            print(f"RESULT check={name} status=FAIL seconds={time.monotonic() - t0:.1f} error=timeout:killed",
                  flush=True)
        passed += ok
        failed += not ok
    print(f"RESULT checks_passed={passed} checks_failed={failed}", flush=True)
    return 0 if failed == 0 else 1


def compare_dirs(native_dir, other_dir, checks):
    import torch
    from torch_compare import flatten
    all_equal = True
    for name in checks:
        a_path, b_path = os.path.join(native_dir, f"{name}.pt"), os.path.join(other_dir, f"{name}.pt")
        missing = [label for label, p in (("native", a_path), ("other", b_path)) if not os.path.exists(p)]
        if missing:
            status, note = "MISSING", f"no {' and no '.join(missing)} output"
        else:
            try:
                a = dict(flatten("", torch.load(a_path)))
                b = dict(flatten("", torch.load(b_path)))
                status, note = compare_outputs(torch, a, b)
            except Exception as e:
                status, note = "DIFF", f"compare error: {type(e).__name__}: {one_line(e)}"
        all_equal = all_equal and status == "EQUAL"
        print(f"RESULT compare={name} status={status} note={note}", flush=True)
    return 0 if all_equal else 1


def compare_outputs(torch, a, b):
    if a.keys() != b.keys():
        return "DIFF", f"different outputs saved: {sorted(set(a) ^ set(b))[:4]}"
    diffs, exact, approx = [], 0, 0
    for key in sorted(a):
        x, y = a[key], b[key]
        if x.shape != y.shape or x.dtype != y.dtype:
            diffs.append(f"{key} shape/dtype {tuple(x.shape)}/{x.dtype} vs {tuple(y.shape)}/{y.dtype}")
        elif key.startswith(APPROX):
            approx += 1
            if not torch.allclose(x.double(), y.double(), rtol=2e-2, atol=2e-2):
                diffs.append(f"{key} max|diff|={(x.double() - y.double()).abs().max().item():.3g} beyond tolerance")
        else:
            exact += 1
            if not torch.equal(x, y):
                d = (x.double() - y.double()).abs().max().item() if x.numel() else 0.0
                diffs.append(f"{key} max|diff|={d:.3g}")
    if diffs:
        return "DIFF", "; ".join(diffs[:4])
    note = f"{exact} tensors bit-identical"
    return "EQUAL", note + (f", {approx} within tolerance" if approx else "")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", help="folder for the outputs (CHECK.pt)")
    ap.add_argument("--checks", default=",".join(CHECKS), help="comma-separated subset of the checks")
    ap.add_argument("--check-budget-s", type=float, default=120.0, help="a check still running after this fails")
    ap.add_argument("--total-budget-s", type=float, default=None, help="checks that do not fit are FAIL (skipped)")
    ap.add_argument("--isolate", action="store_true", help="each check in its own subprocess")
    ap.add_argument("--compare", nargs=2, metavar=("NATIVE_DIR", "OTHER_DIR"),
                    help="compare saved outputs instead of running")
    args = ap.parse_args()
    args.checks = [c.strip() for c in args.checks.split(",") if c.strip()]
    unknown = [c for c in args.checks if c not in CHECKS]
    if unknown:
        ap.error(f"unknown checks {unknown}; known: {', '.join(CHECKS)}")
    if args.check_budget_s <= 0 or (args.total_budget_s is not None and args.total_budget_s <= 0):
        ap.error("budgets must be > 0 seconds")
    if args.compare:
        return compare_dirs(args.compare[0], args.compare[1], args.checks)
    if not args.out:
        ap.error("--out is required (or --compare)")
    os.makedirs(args.out, exist_ok=True)
    return run_isolated(args) if args.isolate else run_checks(args)


if __name__ == "__main__":
    sys.exit(main())
