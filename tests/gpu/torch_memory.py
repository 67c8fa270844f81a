#!/usr/bin/env python3
"""PyTorch memory behaviour, natively and under the limiter.

expandable: with PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True (set by the caller, before
  CUDA starts) allocate --gib GiB in 256 MiB tensors, write and check them, free, allocate again.
  The expandable segments use the driver's VMM calls (cuMemCreate / cuMemMap).
oom: torch.cuda.mem_get_info() must report total = --limit (0: native, no check); allocating
  --gib GiB must raise torch.OutOfMemoryError when it exceeds the limit (and succeed natively);
  after the error, 1 GiB must still be allocatable.
Prints RESULT lines and `RESULT verdict=PASS|FAIL`; exit 0 on PASS.
"""
import argparse
import os
import sys

import torch

GIB = 1 << 30
MIB = 1 << 20


def expandable(args):
    conf = os.environ.get("PYTORCH_CUDA_ALLOC_CONF", "")
    print(f"RESULT alloc_conf={conf}", flush=True)
    if "expandable_segments:True" not in conf:
        return "PYTORCH_CUDA_ALLOC_CONF lacks expandable_segments:True"
    chunk = 256 * MIB
    for round_ in range(2):
        tensors = []
        for i in range(int(args.gib * GIB // chunk)):
            t = torch.empty(chunk, dtype=torch.uint8, device="cuda")
            t.fill_(i % 251)
            tensors.append(t)
        torch.cuda.synchronize()
        print(f"RESULT round{round_}_reserved_mib={torch.cuda.memory_reserved() // MIB}", flush=True)
        for i, t in enumerate(tensors):
            if int(t[::4096].sum().item()) != (i % 251) * (chunk // 4096):
                return f"tensor {i} has wrong contents"
        del tensors
        torch.cuda.empty_cache()
    return None


def oom(args):
    free, total = torch.cuda.mem_get_info()
    print(f"RESULT total_mib={total // MIB}\nRESULT free_mib={free // MIB}", flush=True)
    if args.limit and total // MIB != args.limit // MIB:
        return f"mem_get_info total {total // MIB} MiB, expected {args.limit // MIB} MiB"
    want = int(args.gib * GIB)
    raised = False
    try:
        big = torch.empty(want, dtype=torch.uint8, device="cuda")
        big.fill_(1)
        torch.cuda.synchronize()
        del big
    except torch.OutOfMemoryError as e:
        raised = True
        print(f"RESULT oom_message={str(e).splitlines()[0][:160]}", flush=True)
    print(f"RESULT raised_oom={'yes' if raised else 'no'}", flush=True)
    torch.cuda.empty_cache()
    expect_oom = bool(args.limit) and want > args.limit
    if raised != expect_oom:
        return "expected torch.OutOfMemoryError" if expect_oom else "unexpected torch.OutOfMemoryError"
    after = torch.empty(GIB, dtype=torch.uint8, device="cuda")
    after.fill_(2)
    torch.cuda.synchronize()
    print("RESULT after_oom_1gib=ok", flush=True)
    return None


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("mode", choices=["expandable", "oom"])
    ap.add_argument("--gib", type=float, default=3.0)
    ap.add_argument("--limit", type=int, default=0, help="vGPU limit in bytes, 0 natively")
    args = ap.parse_args()
    try:
        why = expandable(args) if args.mode == "expandable" else oom(args)
    except Exception as e:
        why = f"{type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}"
    if why:
        print(f"RESULT reason={why}")
    print(f"RESULT verdict={'FAIL' if why else 'PASS'}", flush=True)
    return 1 if why else 0


if __name__ == "__main__":
    sys.exit(main())
