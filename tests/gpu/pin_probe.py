#!/usr/bin/env python3
"""How fast can host memory for a swapped tenant be made ready, and how fast do the copy engines
move it? Measures, for --gib GiB, on the real driver (ctypes): pinned allocation in one call, in
256 MiB pieces from one thread and from 8 threads, mmap + cuMemHostRegister, their frees; then
device-to-host and host-to-device copies over 1 and 4 streams. Prints one JSON line.
  python3 tests/gpu/pin_probe.py --gib 16
"""
import argparse
import ctypes
import json
import mmap
import threading
import time

PIECE = 256 << 20


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--gib", type=int, default=16)
    ap.add_argument("--lib", default="libcuda.so.1")
    a = ap.parse_args()
    size = a.gib << 30
    cu = ctypes.CDLL(a.lib)

    def ok(r, what):
        if r != 0:
            raise SystemExit(f"{what} failed: {r}")

    ok(cu.cuInit(0), "cuInit")
    dev = ctypes.c_int(0)
    ok(cu.cuDeviceGet(ctypes.byref(dev), 0), "cuDeviceGet")
    ctx = ctypes.c_void_p()
    ok(cu.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev), "retain")
    ok(cu.cuCtxSetCurrent(ctx), "setcurrent")
    res = {"gib": a.gib}

    def timed(name, fn):
        t = time.monotonic()
        out = fn()
        res[name] = round(time.monotonic() - t, 3)
        return out

    # 1. one pinned allocation
    p = ctypes.c_void_p()
    timed("hostalloc_one_s", lambda: ok(cu.cuMemHostAlloc(ctypes.byref(p), ctypes.c_size_t(size), 0), "hostalloc"))
    timed("freehost_one_s", lambda: ok(cu.cuMemFreeHost(p), "freehost"))

    # 2/3. pieces, one thread and eight
    def pieces(threads):
        n = size // PIECE
        ptrs = [ctypes.c_void_p() for _ in range(n)]

        def work(ix):
            cu.cuCtxSetCurrent(ctx)
            for i in ix:
                ok(cu.cuMemHostAlloc(ctypes.byref(ptrs[i]), ctypes.c_size_t(PIECE), 0), "hostalloc piece")
        ts = [threading.Thread(target=work, args=(range(k, n, threads),)) for k in range(threads)]
        [t.start() for t in ts]
        [t.join() for t in ts]
        return ptrs

    ptrs = timed("hostalloc_pieces_1thread_s", lambda: pieces(1))
    timed("freehost_pieces_s", lambda: [cu.cuMemFreeHost(x) for x in ptrs])
    ptrs = timed("hostalloc_pieces_8threads_s", lambda: pieces(8))

    # 4. mmap + register
    buf = mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    addr = ctypes.addressof(ctypes.c_char.from_buffer(buf))
    timed("register_s", lambda: ok(cu.cuMemHostRegister_v2(ctypes.c_void_p(addr), ctypes.c_size_t(size), 0), "register"))
    timed("unregister_s", lambda: ok(cu.cuMemHostUnregister(ctypes.c_void_p(addr)), "unregister"))

    # 5. mmap with transparent huge pages, touched once per 2 MiB, then registered.
    for name, advise in (("thp", True), ("plain_touched", False)):
        b2 = mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
        if advise and hasattr(mmap, "MADV_HUGEPAGE"):
            b2.madvise(mmap.MADV_HUGEPAGE)
        step = (2 << 20) if advise else 4096

        def touch():
            for off in range(0, size, step):
                b2[off] = 1
        timed(f"{name}_touch_s", touch)
        a2 = ctypes.addressof(ctypes.c_char.from_buffer(b2))
        timed(f"{name}_register_s",
              lambda: ok(cu.cuMemHostRegister_v2(ctypes.c_void_p(a2), ctypes.c_size_t(size), 0), "register2"))
        timed(f"{name}_unregister_s", lambda: ok(cu.cuMemHostUnregister(ctypes.c_void_p(a2)), "unregister2"))
        if not advise:
            break
    try:
        res["thp"] = open("/sys/kernel/mm/transparent_hugepage/enabled").read().strip()
    except OSError:
        pass

    # Copies, into the 8-thread pieces.
    d = ctypes.c_uint64()
    ok(cu.cuMemAlloc_v2(ctypes.byref(d), ctypes.c_size_t(size)), "memalloc")
    ok(cu.cuMemsetD32_v2(d, ctypes.c_uint(7), ctypes.c_size_t(size // 4)), "memset")
    ok(cu.cuCtxSynchronize(), "sync")
    for nstreams in (1, 4):
        streams = [ctypes.c_void_p() for _ in range(nstreams)]
        for s in streams:
            ok(cu.cuStreamCreate(ctypes.byref(s), 1), "stream")
        for direction in ("dtoh", "htod"):
            t = time.monotonic()
            for i, hp in enumerate(ptrs):
                s = streams[i % nstreams]
                off = ctypes.c_uint64(d.value + i * PIECE)
                if direction == "dtoh":
                    ok(cu.cuMemcpyDtoHAsync_v2(hp, off, ctypes.c_size_t(PIECE), s), "dtoh")
                else:
                    ok(cu.cuMemcpyHtoDAsync_v2(off, hp, ctypes.c_size_t(PIECE), s), "htod")
            for s in streams:
                ok(cu.cuStreamSynchronize(s), "ssync")
            dt = time.monotonic() - t
            res[f"{direction}_{nstreams}streams_gbps"] = round(size / dt / 1e9, 1)
    timed("freehost_pieces_8threads_alloc_s", lambda: [cu.cuMemFreeHost(x) for x in ptrs])
    print(json.dumps(res))


if __name__ == "__main__":
    main()
