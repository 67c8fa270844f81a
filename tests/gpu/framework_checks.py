#!/usr/bin/env python3
"""JAX and CuPy workloads whose results must not depend on where the GPU is: run natively, under
the limiter and through a remote worker, each saving its outputs into --out; run with --compare
A B to compare two such folders.

JAX parts:  matmul (jit), conv (lax.conv_general_dilated), scan (lax.scan), grad (MLP), random,
            memory (what XLA sees as the device's memory)
CuPy parts: blas (matmul), fft (1D, 2D, plan reuse), solver (cholesky, solve, eigh), sparse
            (CSR matvec), random (cuRAND), rawkernel (NVRTC), memory (mem_get_info and pool)
Prints `RESULT framework=F part=P status=ok|error:...` per part; exit 0 when every part ran.

--vram-mib N (the VRAM cap the run was given, `tfusion run --vram`) makes the memory parts assert
that the framework sees that cap: CuPy's cudaMemGetInfo total is N MiB, a pool limit set as a
fraction of the device is that fraction of N MiB and binds, and an allocation above N MiB is
refused; JAX's allocator limit (memory_stats bytes_limit, XLA's memory fraction of the total) lies
within [N/2, N] MiB and an array above it is refused. Without it (native) the same values are
printed and the refusal of an allocation above the device's total is checked. What the memory parts
save for --compare does not depend on the cap (it is the same natively and under one).
"""
import argparse
import os
import sys
import time
import traceback

MIB = 1 << 20


def total_verdict(total_bytes, cap_mib):
    """'' when the device total a framework reports is the cap (or there is no cap), else why not."""
    if cap_mib and total_bytes != cap_mib * MIB:
        return f"total {total_bytes / MIB:.0f} MiB is not the cap {cap_mib} MiB"
    return ""


def limit_verdict(bytes_limit, cap_mib):
    """'' when XLA's allocator limit lies within [cap/2, cap] (its memory fraction of the cap; 0.75
    by default, up to 1 under JAX's growth policy), else why not. Without a cap: only present."""
    if bytes_limit <= 0:
        return "no bytes_limit in the device's memory_stats"
    if cap_mib and bytes_limit > cap_mib * MIB:
        return f"bytes_limit {bytes_limit / MIB:.0f} MiB is above the cap {cap_mib} MiB"
    if cap_mib and bytes_limit < cap_mib * MIB // 2:
        return f"bytes_limit {bytes_limit / MIB:.0f} MiB is below half the cap {cap_mib} MiB"
    return ""


def jax_parts(cap_mib):
    import jax
    import numpy as np
    import jax.numpy as jnp
    from jax import lax

    def matmul():
        k = jax.random.PRNGKey(1)
        a = jax.random.normal(k, (1024, 1024), jnp.float32)
        b = jax.random.normal(jax.random.PRNGKey(2), (1024, 1024), jnp.float32)
        f = jax.jit(lambda x, y: jnp.tanh(x @ y) * 2.0)
        return {"mm": np.asarray(f(a, b))}

    def conv():
        x = jax.random.normal(jax.random.PRNGKey(3), (8, 16, 32, 32), jnp.float32)
        w = jax.random.normal(jax.random.PRNGKey(4), (32, 16, 3, 3), jnp.float32)
        f = jax.jit(lambda x, w: lax.conv_general_dilated(x, w, (1, 1), "SAME"))
        return {"conv": np.asarray(f(x, w))}

    def scan():
        def step(c, x):
            c = jnp.sin(c) + x
            return c, c.sum()
        xs = jnp.arange(2000, dtype=jnp.float32).reshape(200, 10) / 1000.0
        c, ys = jax.jit(lambda xs: lax.scan(step, jnp.zeros(10), xs))(xs)
        return {"carry": np.asarray(c), "ys": np.asarray(ys)}

    def grad():
        k1, k2 = jax.random.split(jax.random.PRNGKey(5))
        params = {"w1": jax.random.normal(k1, (64, 128)) * 0.1, "w2": jax.random.normal(k2, (128, 1)) * 0.1}
        x = jax.random.normal(jax.random.PRNGKey(6), (256, 64))
        y = jnp.sum(x[:, :4], axis=1, keepdims=True)

        def loss(p):
            h = jax.nn.relu(x @ p["w1"])
            return jnp.mean((h @ p["w2"] - y) ** 2)

        g = jax.jit(jax.grad(loss))
        for _ in range(20):
            gr = g(params)
            params = {n: params[n] - 0.05 * gr[n] for n in params}
        return {"w1": np.asarray(params["w1"]), "w2": np.asarray(params["w2"]),
                "loss": np.asarray(loss(params))}

    def random():
        k = jax.random.PRNGKey(7)
        return {"normal": np.asarray(jax.random.normal(k, (4096,))),
                "uniform": np.asarray(jax.random.uniform(jax.random.PRNGKey(8), (4096,)))}

    def memory():
        d = jax.devices()[0]
        stats = d.memory_stats() or {}
        limit = int(stats.get("bytes_limit", 0))
        print(f"INFO jax device={d.device_kind} bytes_limit={limit} cap_mib={cap_mib or 'none'} "
              f"preallocate={os.environ.get('XLA_PYTHON_CLIENT_PREALLOCATE', 'default')}", flush=True)
        why = limit_verdict(limit, cap_mib)
        if why:
            raise AssertionError(why)
        # Under a cap, an array larger than the cap is refused (RESOURCE_EXHAUSTED), not granted
        # beyond it, and the process goes on. Natively XLA may grow past its limit (JAX's 0.75+
        # policy), so there is nothing to refuse.
        if cap_mib:
            refused = False
            try:
                jnp.zeros((cap_mib * MIB + 256 * MIB,), jnp.uint8).block_until_ready()
            except Exception as e:  # noqa: BLE001 - jaxlib's error type moved between releases
                refused = "RESOURCE_EXHAUSTED" in str(e) or "out of memory" in str(e).lower()
                print(f"INFO jax over-cap array refused: {str(e).splitlines()[0][:160]}", flush=True)
            if not refused:
                raise AssertionError("an array of the cap + 256 MiB was not refused as out of memory")
        ok = jnp.ones((64 * MIB // 4,), jnp.float32)
        return {"cap_seen": np.asarray([1]), "after_refusal_sum": np.asarray(jnp.sum(ok))}

    return [("matmul", matmul), ("conv", conv), ("scan", scan), ("grad", grad), ("random", random),
            ("memory", memory)]


def cupy_parts(cap_mib):
    import cupy as cp
    import numpy as np

    def blas():
        rs = cp.random.RandomState(1)
        a = rs.standard_normal((1024, 1024), dtype=cp.float32)
        b = rs.standard_normal((1024, 1024), dtype=cp.float32)
        return {"mm": cp.asnumpy(a @ b)}

    def fft():
        rs = cp.random.RandomState(2)
        x = rs.standard_normal(4096).astype(cp.complex64)
        y = rs.standard_normal((256, 256)).astype(cp.complex64)
        import cupyx.scipy.fftpack as fp
        plan = fp.get_fft_plan(x)
        with plan:
            p1 = cp.fft.fft(x)
            p2 = cp.fft.fft(x * 2)
        return {"fft1": cp.asnumpy(cp.fft.fft(x)), "fft2": cp.asnumpy(cp.fft.fft2(y)),
                "ifft": cp.asnumpy(cp.fft.ifft(cp.fft.fft(x))), "plan1": cp.asnumpy(p1), "plan2": cp.asnumpy(p2),
                "rfft": cp.asnumpy(cp.fft.rfft(x.real))}

    def solver():
        rs = cp.random.RandomState(3)
        m = rs.standard_normal((256, 256), dtype=cp.float64)
        spd = m @ m.T + 256 * cp.eye(256)
        b = rs.standard_normal(256, dtype=cp.float64)
        w, _ = cp.linalg.eigh(spd)
        return {"chol": cp.asnumpy(cp.linalg.cholesky(spd)), "solve": cp.asnumpy(cp.linalg.solve(spd, b)),
                "eigvals": cp.asnumpy(w), "inv": cp.asnumpy(cp.linalg.inv(spd))}

    def sparse():
        import cupyx.scipy.sparse as sp
        a = sp.random(2000, 2000, density=0.01, format="csr", dtype=cp.float32, random_state=4)
        v = cp.arange(2000, dtype=cp.float32) / 2000
        return {"spmv": cp.asnumpy(a @ v), "spmm": cp.asnumpy((a @ a.T).toarray().sum(axis=0))}

    def random():
        g = cp.random.default_rng(5)
        return {"normal": cp.asnumpy(g.standard_normal(4096, dtype=cp.float32)),
                "legacy": cp.asnumpy(cp.random.RandomState(6).uniform(size=4096))}

    def rawkernel():
        k = cp.RawKernel(r'''
extern "C" __global__ void axpy(const float* x, float* y, float a, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) y[i] = a * x[i] + y[i];
}''', "axpy")
        x = cp.arange(100000, dtype=cp.float32)
        y = cp.ones(100000, dtype=cp.float32)
        k(((100000 + 255) // 256,), (256,), (x, y, cp.float32(3.0), cp.int32(100000)))
        ew = cp.ElementwiseKernel("float32 x", "float32 y", "y = x * x + 1", "sq1")
        return {"axpy": cp.asnumpy(y), "elementwise": cp.asnumpy(ew(x))}

    def memory():
        free, total = cp.cuda.runtime.memGetInfo()
        print(f"INFO cupy total_mib={total >> 20} free_mib={free >> 20} cap_mib={cap_mib or 'none'}", flush=True)
        why = total_verdict(total, cap_mib)
        if why:
            raise AssertionError(why)
        pool = cp.get_default_memory_pool()
        pool.free_all_blocks()
        before = pool.used_bytes()
        a = cp.zeros(64 * MIB, dtype=cp.uint8)
        used = pool.used_bytes() - before
        # A pool limit given as a fraction of the device is that fraction of what the device
        # reports (the cap), and an allocation beyond it is refused by the pool.
        pool.set_limit(fraction=0.25)
        limit = pool.get_limit()
        try:
            if abs(limit - total // 4) > MIB:
                raise AssertionError(f"pool limit {limit >> 20} MiB at fraction 0.25 of {total >> 20} MiB")
            try:
                cp.empty(limit, dtype=cp.uint8)
                raise AssertionError(f"an array of the pool limit ({limit >> 20} MiB) beside 64 MiB was granted")
            except cp.cuda.memory.OutOfMemoryError:
                pass
        finally:
            pool.set_limit(size=0)
        # Past the device's total (the cap) the driver refuses the allocation itself.
        try:
            cp.cuda.runtime.free(cp.cuda.runtime.malloc(total + 256 * MIB))
            raise AssertionError(f"cudaMalloc of total + 256 MiB ({(total >> 20) + 256} MiB) succeeded")
        except cp.cuda.runtime.CUDARuntimeError as e:
            print(f"INFO cupy over-total malloc refused: {e}", flush=True)
        del a
        return {"cap_seen": np.asarray([1]), "pool_used_mib": np.asarray([used >> 20])}

    return [("blas", blas), ("fft", fft), ("solver", solver), ("sparse", sparse), ("random", random),
            ("rawkernel", rawkernel), ("memory", memory)]


def run(args):
    import numpy as np
    os.makedirs(args.out, exist_ok=True)
    parts = jax_parts(args.vram_mib) if args.framework == "jax" else cupy_parts(args.vram_mib)
    wanted = set(args.parts.split(",")) if args.parts else None
    unknown = sorted((wanted or set()) - {name for name, _ in parts})
    if unknown:
        print(f"unknown {args.framework} parts: {','.join(unknown)} (known: {','.join(n for n, _ in parts)})",
              file=sys.stderr)
        return 2
    failed = 0
    for name, fn in parts:
        if wanted and name not in wanted:
            continue
        t0 = time.time()
        try:
            arrays = fn()
            np.savez(os.path.join(args.out, f"{args.framework}-{name}.npz"), **arrays)
            print(f"RESULT framework={args.framework} part={name} status=ok seconds={time.time() - t0:.2f}",
                  flush=True)
        except Exception as e:  # noqa: BLE001 - every part reports its own failure
            failed += 1
            traceback.print_exc()
            msg = str(e).splitlines()[0][:160] if str(e) else type(e).__name__
            print(f"RESULT framework={args.framework} part={name} status=error:{msg.replace(' ', '_')}", flush=True)
    return 1 if failed else 0


def compare(a, b, rtol):
    """Compares the .npz files of two runs; prints one line per part and returns 1 on a difference."""
    import numpy as np
    bad = 0
    for f in sorted(os.listdir(a)):
        if not f.endswith(".npz"):
            continue
        part = f[:-4]
        if not os.path.exists(os.path.join(b, f)):
            print(f"COMPARE part={part} status=missing")
            bad = 1
            continue
        x, y = np.load(os.path.join(a, f)), np.load(os.path.join(b, f))
        worst, exact = 0.0, True
        for k in x.files:
            u, v = x[k], y[k]
            if u.shape != v.shape:
                worst, exact = float("inf"), False
                continue
            if not np.array_equal(u, v):
                exact = False
                scale = np.maximum(np.abs(u), 1e-6)
                worst = max(worst, float(np.max(np.abs(u - v) / scale)))
        ok = exact or worst <= rtol
        bad |= 0 if ok else 1
        print(f"COMPARE part={part} status={'equal' if exact else ('close' if ok else 'DIFFERENT')} "
              f"max_rel_diff={worst:.3g}")
    return bad


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--framework", choices=["jax", "cupy"])
    ap.add_argument("--parts", default="")
    ap.add_argument("--out")
    ap.add_argument("--compare", nargs=2, metavar=("A", "B"))
    ap.add_argument("--rtol", type=float, default=1e-4)
    ap.add_argument("--vram-mib", type=int, default=0,
                    help="the VRAM cap of this run in MiB (tfusion run --vram): the memory parts assert it")
    args = ap.parse_args()
    if args.vram_mib < 0:
        ap.error("--vram-mib must be 0 (no cap) or a positive number of MiB")
    if args.compare:
        return compare(args.compare[0], args.compare[1], args.rtol)
    if not args.framework or not args.out:
        ap.error("--framework and --out are required unless --compare is given")
    return run(args)


if __name__ == "__main__":
    sys.exit(main())
