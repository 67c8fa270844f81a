#!/usr/bin/env python3
"""How fine-grained and how accurate is NVML's per-process utilization on this GPU?

Polls nvmlDeviceGetProcessUtilization every --poll-ms for --seconds and prints, per pid, the
number of distinct samples, the spacing of their timestamps and the mean smUtil, plus the device
utilization. Run it while tenants run (it does not start them).
"""
import argparse
import ctypes
import statistics
import time


class Sample(ctypes.Structure):
    _fields_ = [("pid", ctypes.c_uint), ("timeStamp", ctypes.c_ulonglong), ("smUtil", ctypes.c_uint),
                ("memUtil", ctypes.c_uint), ("encUtil", ctypes.c_uint), ("decUtil", ctypes.c_uint)]


class Util(ctypes.Structure):
    _fields_ = [("gpu", ctypes.c_uint), ("memory", ctypes.c_uint)]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=8)
    ap.add_argument("--poll-ms", type=float, default=20)
    args = ap.parse_args()
    nvml = ctypes.CDLL("libnvidia-ml.so.1")
    assert nvml.nvmlInit_v2() == 0
    dev = ctypes.c_void_p()
    assert nvml.nvmlDeviceGetHandleByIndex_v2(0, ctypes.byref(dev)) == 0
    seen = {}
    last = ctypes.c_ulonglong(0)
    dev_util = []
    calls, call_us = 0, []
    t_end = time.time() + args.seconds
    while time.time() < t_end:
        buf = (Sample * 256)()
        n = ctypes.c_uint(256)
        t0 = time.perf_counter()
        rc = nvml.nvmlDeviceGetProcessUtilization(dev, buf, ctypes.byref(n), last)
        call_us.append((time.perf_counter() - t0) * 1e6)
        calls += 1
        if rc == 0:
            for i in range(n.value):
                s = buf[i]
                seen.setdefault(s.pid, {})[s.timeStamp] = s.smUtil
                if s.timeStamp > last.value:
                    last.value = s.timeStamp
        u = Util()
        if nvml.nvmlDeviceGetUtilizationRates(dev, ctypes.byref(u)) == 0:
            dev_util.append(u.gpu)
        time.sleep(args.poll_ms / 1000)
    print(f"calls={calls} call_us_median={statistics.median(call_us):.1f}")
    print(f"device_util_mean={statistics.mean(dev_util) if dev_util else -1:.1f}")
    for pid, samples in sorted(seen.items()):
        ts = sorted(samples)
        gaps = [(b - a) / 1000 for a, b in zip(ts, ts[1:])]
        print(f"pid={pid} samples={len(ts)} gap_ms_median={statistics.median(gaps) if gaps else -1:.1f} "
              f"sm_mean={statistics.mean(samples.values()):.1f} sm_values={sorted(set(samples.values()))[:12]}")


if __name__ == "__main__":
    main()
