#!/usr/bin/env python3
"""A tenant for the VRAM-tiering GPU tier (tests/gpu/tiering.py), run under
`tfusion run --tiering`. It freezes itself with the CLI (`tfusion freeze $TFUSION_VGPU`, a host-only
wait while its tier thread swaps it out), then resumes by using the GPU, and prints one JSON line.

  checks     tensors, ResNet-50 and GPT-2 weights, a CUDA graph and an allocation made while
             swapped: identical after --cycles freeze cycles (wake by use, or by `tfusion thaw`)
  pool       tensors of PyTorch's stream-ordered allocator (cudaMallocAsync: stays resident) and a
             raw cuMemAlloc buffer (moves): both intact after a freeze
  pools      stream-ordered pools move (PyTorch under PYTORCH_CUDA_ALLOC_CONF=backend:cudaMallocAsync):
             tensors of 1 MiB, 256 MiB and 1 GiB, some freed and allocated again, beside a raw
             cuMemAllocAsync buffer and a cuMemCreate buffer the tenant maps itself; --cycles freezes
             (every other one ended by `tfusion thaw`), each with checksums, the freeze's movable /
             in-host / fixed figures and the pool's reserved and used bytes before and after
  expandable PyTorch under PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True (its blocks live in
             cuMemCreate handles it maps itself): about 2 GiB of tensors, one freed and its room
             reused; --cycles freezes (every other one ended by `tfusion thaw`), each with checksums,
             the process's VRAM (nvidia-smi) before and while swapped, the freeze's figures and a matmul
  graphmem   graph memory nodes (PyTorch under PYTORCH_CUDA_ALLOC_CONF=backend:cudaMallocAsync, so a
             captured graph's allocations are graph memory nodes): 1 GiB of movable tensors and a
             CUDA graph whose capture allocates 256 MiB temporaries (freed inside the graph) and a
             256 MiB output (a live graph allocation after each replay); replayed, frozen (graph
             memory the driver keeps unused is trimmed), thawed, replayed: the driver's graph memory
             figures and the process's VRAM before, while swapped and after, the freeze's fixed
             figure, the output and the tensors' checksums
  train      GPT-2 small from config, --steps AdamW steps on fixed random tokens; --freeze-at K
             freezes and resumes before step K; prints the loss of every step
  swap       --gib GiB in one tensor: --cycles freeze + first-call timings and a checksum
             (--idle-wait S: no freeze, idle for S seconds while the idle timeout swaps it out)
  gen        GPT-2 generation: time to the first token cold (from process start) and after a freeze
  alloc      cuMemAlloc/cuMemFree latency by size (ctypes on libcuda.so.1: the limiter when run
             under tfusion)
  steady     --model r50|gpt2 throughput for --seconds (nothing swapped)
  idlezero   --gib GiB --idle-wait S: idle until its zero keeper checkpoints it (the idle policy),
             then the first call brings it back (VRAM while checkpointed, checksum); remotely
             (TF_REMOTE_VGPU=find) its worker session is the process checked
  zero       --gib GiB: freeze, then freeze --zero twice (the driver's checkpoint after our swap),
             each resumed by the first call: CLI time, VRAM the driver reports for the process
             after each level and after the resume, first-call time, checksum
  firstfreeze --gib GiB in one tensor, busy with matmuls for --busy seconds (never idle), then the
             process's first explicit freeze and first call: their timings, matmuls per second
             while busy (pinning ahead runs meanwhile unless TFUSION_TIER_PIN_AHEAD=off), checksum
  ipcfix     --gib GiB in two tensors; one passed to a torch.multiprocessing (spawn) child (legacy
             CUDA IPC) that reads it and writes into it; a freeze; checksums in both processes
  hold       --gib GiB, print a checksum, wait for --go, check it again (the checkpoint-API tenant)
  rhold      a remote session's preemption (tiering.py's phase rhold): --gib GiB, then --ready; at
             --go a checksum (a GPU call that waits while the session is held), then READY.checked;
             at --go2 (the allocation deleted, its session ended) one more GPU call, which must fail
             with a CUDA error rather than hang; one JSON line with both
  fault      tiering.py's phase faults: --gib GiB in 1 GiB tensors with checksums, then READY.0 (a
             JSON line); for k = 1, 2, ... it waits for GO.k, runs one step (an in-place op on a small
             tensor, then every checksum: GPU calls that resume it when swapped), prints one JSON
             line (intact, or the CUDA error PyTorch raised: the process goes on) and writes it to
             READY.k; GO.end ends it
  hog        tiering.py's phase faults, natively: takes the GPU's free memory but --leave-mib
             (torch.cuda.mem_get_info), writes one JSON line to --ready, exits at --go
  serve      an image-generation-style service: GPT-2 fp16 plus a --gib GiB working set; after --go,
             bursts of --burst requests separated by idle gaps for --seconds; every request runs a
             forward pass and reads the whole working set, and checks both against references
"""
import argparse
import ctypes
import json
import os
import subprocess
import sys
import time

T0 = time.monotonic()
import torch  # noqa: E402

TFUSION = os.environ.get("TF_TFUSION", "tfusion")


def cli_env():
    """The CLI's environment: without the remote client's library path when this tenant runs remotely."""
    e = dict(os.environ)
    if "TFUSION_REMOTE" in e:
        for k in ("LD_LIBRARY_PATH", "TFUSION_REMOTE", "TFUSION_TOKEN", "TRITON_LIBCUDA_PATH"):
            e.pop(k, None)
    return e


def my_vgpu():
    """TFUSION_VGPU locally; remotely (TF_REMOTE_VGPU=find, the worker on this host and one session
    at a time) the session's vGPU remote-PID as `tfusion smi` lists it."""
    if os.environ.get("TF_REMOTE_VGPU") != "find":
        return os.environ["TFUSION_VGPU"]
    import re
    out = subprocess.run([TFUSION, "smi"], capture_output=True, text=True, timeout=60, env=cli_env()).stdout
    m = re.findall(r"remote-[0-9]+(?:@a-[0-9a-z]+)?", out)  # "@a-...": bound to a pool allocation
    if not m:
        raise SystemExit(f"no remote session vGPU in tfusion smi: {out}")
    return m[-1]


def freeze(thaw=False):
    """Freezes this process's vGPU through the CLI; returns (CLI wall ms, its output)."""
    vgpu = my_vgpu()
    t = time.monotonic()
    p = subprocess.run([TFUSION, "thaw" if thaw else "freeze", vgpu], capture_output=True, text=True, timeout=300,
                       env=cli_env())
    ms = (time.monotonic() - t) * 1000
    if p.returncode != 0:
        raise SystemExit(f"tfusion {'thaw' if thaw else 'freeze'} failed ({p.returncode}): {p.stdout} {p.stderr}")
    return ms, p.stdout.strip()


def first_call_ms(small):
    """Wall time of the first GPU call after a freeze (it restores the tenant), synchronized."""
    t = time.monotonic()
    small.add_(0)
    torch.cuda.synchronize()
    return (time.monotonic() - t) * 1000


def checksum(t):
    """Exact: integer addition wraps identically in any order."""
    flat = t.detach().contiguous().view(-1).view(torch.uint8)
    pad = (-flat.numel()) % 8
    if pad:
        flat = torch.cat([flat, torch.zeros(pad, dtype=torch.uint8, device=flat.device)])
    return int(flat.view(torch.int64).sum().item())


def state_sums(model):
    return [checksum(v) for v in model.state_dict().values()]


def run_checks(a):
    import torchvision
    from transformers import GPT2Config, GPT2LMHeadModel
    torch.manual_seed(0)
    tensors = [torch.randn(n, device="cuda") for n in (1 << 18, 25 << 20, 256 << 20)]  # 1 MiB, 100 MiB, 1 GiB
    r50 = torchvision.models.resnet50().cuda().eval()
    gpt = GPT2LMHeadModel(GPT2Config()).cuda().eval()
    x = torch.randn(8, 3, 224, 224, device="cuda")
    with torch.no_grad():
        ref_logits = r50(x).clone()
    ref = [checksum(t) for t in tensors]
    ref_r50, ref_gpt = state_sums(r50), state_sums(gpt)
    # A CUDA graph captured before any freeze, replayed after each.
    static_in = torch.randn(1 << 20, device="cuda")
    static_out = torch.empty_like(static_in)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        static_out.copy_(static_in * 2 + 1)
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        static_out.copy_(static_in * 2 + 1)
    want_graph = checksum(static_in * 2 + 1)
    small = torch.zeros(16, device="cuda")
    torch.cuda.synchronize()
    res = {"cycles": [], "ok": True}
    late = None
    for k in range(a.cycles):
        by_thaw = k % 2 == 1
        out_ms, out_text = freeze()
        cyc = {"cycle": k, "freeze_cli_ms": round(out_ms, 1), "freeze": out_text.splitlines()[-1] if out_text else ""}
        if k == 0:
            # An allocation while swapped (bigger than anything cached: a new cuMemAlloc), then used.
            late = torch.empty(128 << 20, device="cuda")  # 512 MiB
        if by_thaw:
            cyc["thaw_cli_ms"] = round(freeze(thaw=True)[0], 1)
        cyc["first_call_ms"] = round(first_call_ms(small), 2)
        if k == 0:
            late.fill_(7.0)
        g.replay()
        torch.cuda.synchronize()
        with torch.no_grad():
            logits_same = bool(torch.equal(r50(x), ref_logits))
        cyc.update({
            "tensors": [checksum(t) for t in tensors] == ref,
            "resnet50_weights": state_sums(r50) == ref_r50,
            "gpt2_weights": state_sums(gpt) == ref_gpt,
            "resnet50_output": logits_same,
            "graph_replay": checksum(static_out) == want_graph,
            "late_allocation": bool((late == 7.0).all().item()),
            "resumed_by": "thaw" if by_thaw else "first call",
        })
        res["ok"] = res["ok"] and all(cyc[f] for f in ("tensors", "resnet50_weights", "gpt2_weights",
                                                         "resnet50_output", "graph_replay", "late_allocation"))
        res["cycles"].append(cyc)
    print(json.dumps(res))


def cuda_lib():
    lib = ctypes.CDLL("libcuda.so.1")
    return lib


def run_pool(a):
    torch.manual_seed(1)
    pooled = [torch.randn(n, device="cuda") for n in (1 << 20, 64 << 20)]
    ref = [checksum(t) for t in pooled]
    lib = cuda_lib()
    ptr = ctypes.c_uint64(0)
    n = 64 << 20  # 256 MiB of uint32
    assert lib.cuMemAlloc_v2(ctypes.byref(ptr), ctypes.c_size_t(n * 4)) == 0
    assert lib.cuMemsetD32_v2(ctypes.c_uint64(ptr.value), ctypes.c_uint(0xABCD1234), ctypes.c_size_t(n)) == 0
    torch.cuda.synchronize()
    small = torch.zeros(16, device="cuda")
    out_ms, text = freeze()
    first = first_call_ms(small)
    host = (ctypes.c_uint32 * n)()
    assert lib.cuMemcpyDtoH_v2(host, ctypes.c_uint64(ptr.value), ctypes.c_size_t(n * 4)) == 0
    raw_ok = all(host[i] == 0xABCD1234 for i in range(0, n, 4099))
    extra = torch.randn(1 << 20, device="cuda")  # the pool still allocates after the resume
    res = {"allocator": os.environ.get("PYTORCH_CUDA_ALLOC_CONF", ""), "freeze": text.splitlines()[-1:],
           "freeze_cli_ms": round(out_ms, 1), "first_call_ms": round(first, 2),
           "pool_tensors": [checksum(t) for t in pooled] == ref, "raw_cumemalloc": raw_ok,
           "pool_allocates_after": bool(torch.isfinite(extra).all().item())}
    res["ok"] = res["pool_tensors"] and res["raw_cumemalloc"] and res["pool_allocates_after"]
    print(json.dumps(res))


def freeze_figures(text):
    """The movable, in-host and fixed figures of `tfusion freeze`'s process line, as printed."""
    import re
    m = re.search(r"(\S+ \S+) movable \((\S+ \S+) in host memory\), (\S+ \S+) fixed", text)
    return {"movable": m.group(1), "in_host": m.group(2), "fixed": m.group(3)} if m else {"line": text[-200:]}


def vmm_buffer(lib, nbytes):
    """A cuMemCreate chunk mapped by the tenant itself into its own reservation; returns its address."""
    class Prop(ctypes.Structure):  # CUmemAllocationProp
        _fields_ = [("type", ctypes.c_int), ("requestedHandleTypes", ctypes.c_int), ("loc_type", ctypes.c_int),
                    ("loc_id", ctypes.c_int), ("win32", ctypes.c_void_p), ("compressionType", ctypes.c_ubyte),
                    ("gpuDirectRDMACapable", ctypes.c_ubyte), ("usage", ctypes.c_ushort), ("reserved", ctypes.c_ubyte * 4)]

    class Access(ctypes.Structure):  # CUmemAccessDesc
        _fields_ = [("loc_type", ctypes.c_int), ("loc_id", ctypes.c_int), ("flags", ctypes.c_int)]
    prop = Prop(type=1, loc_type=1, loc_id=torch.cuda.current_device())
    gran = ctypes.c_size_t(0)
    assert lib.cuMemGetAllocationGranularity(ctypes.byref(gran), ctypes.byref(prop), 0) == 0
    size = (nbytes + gran.value - 1) // gran.value * gran.value
    handle, base = ctypes.c_uint64(0), ctypes.c_uint64(0)
    assert lib.cuMemCreate(ctypes.byref(handle), ctypes.c_size_t(size), ctypes.byref(prop), ctypes.c_ulonglong(0)) == 0
    assert lib.cuMemAddressReserve(ctypes.byref(base), ctypes.c_size_t(size), ctypes.c_size_t(0), ctypes.c_uint64(0),
                                   ctypes.c_ulonglong(0)) == 0
    assert lib.cuMemMap(base, ctypes.c_size_t(size), ctypes.c_size_t(0), handle, ctypes.c_ulonglong(0)) == 0
    acc = Access(loc_type=1, loc_id=torch.cuda.current_device(), flags=3)
    assert lib.cuMemSetAccess(base, ctypes.c_size_t(size), ctypes.byref(acc), ctypes.c_size_t(1)) == 0
    return base.value


def run_pools(a):
    torch.manual_seed(2)
    assert "cudaMallocAsync" in os.environ.get("PYTORCH_CUDA_ALLOC_CONF", ""), "run with backend:cudaMallocAsync"
    tensors = [torch.randn(n, device="cuda") for n in (1 << 18, 64 << 20, 256 << 20)]  # 1 MiB, 256 MiB, 1 GiB
    scratch = [torch.randn(32 << 20, device="cuda") for _ in range(4)]
    del scratch[1], scratch[2]  # freed into the pool: reused below
    scratch.append(torch.randn(32 << 20, device="cuda"))
    refs = [checksum(t) for t in tensors + scratch]
    lib = cuda_lib()
    n = 16 << 20  # 64 MiB of uint32 in each raw buffer
    raw = ctypes.c_uint64(0)
    assert lib.cuMemAllocAsync(ctypes.byref(raw), ctypes.c_size_t(n * 4), ctypes.c_void_p(0)) == 0
    assert lib.cuMemsetD32_v2(raw, ctypes.c_uint(0x5EED5EED), ctypes.c_size_t(n)) == 0
    vmm = vmm_buffer(lib, n * 4)
    assert lib.cuMemsetD32_v2(ctypes.c_uint64(vmm), ctypes.c_uint(0xC0DEC0DE), ctypes.c_size_t(n)) == 0
    torch.cuda.synchronize()
    small = torch.zeros(16, device="cuda")

    def raw_ok(ptr, word):
        host = (ctypes.c_uint32 * n)()
        assert lib.cuMemcpyDtoH_v2(host, ctypes.c_uint64(ptr), ctypes.c_size_t(n * 4)) == 0
        return all(host[i] == word for i in range(0, n, 4099))

    def pool_mib():
        return [torch.cuda.memory_reserved() >> 20, torch.cuda.memory_allocated() >> 20]
    res = {"allocator": os.environ.get("PYTORCH_CUDA_ALLOC_CONF", ""), "cycles": []}
    for c in range(a.cycles):
        before = pool_mib()
        out_ms, text = freeze()
        cyc = {"freeze_cli_ms": round(out_ms, 1), **freeze_figures(text)}
        if c % 2 == 1:
            cyc["thaw_cli_ms"] = round(freeze(thaw=True)[0], 1)
        cyc["first_call_ms"] = round(first_call_ms(small), 2)
        cyc["tensors"] = [checksum(t) for t in tensors + scratch] == refs
        cyc["raw_async"] = raw_ok(raw.value, 0x5EED5EED)
        cyc["own_vmm"] = raw_ok(vmm, 0xC0DEC0DE)
        cyc["pool_reserved_used_mib"] = [before, pool_mib()]
        extra = torch.randn(8 << 20, device="cuda")  # the pool allocates and frees after the resume
        cyc["allocates_after"] = bool(torch.isfinite(extra).all().item())
        del extra
        res["cycles"].append(cyc)
    res["ok"] = all(c["tensors"] and c["raw_async"] and c["own_vmm"] and c["allocates_after"] and
                    c["pool_reserved_used_mib"][0] == c["pool_reserved_used_mib"][1] for c in res["cycles"])
    print(json.dumps(res))


def run_expandable(a):
    import math
    assert "expandable_segments:True" in os.environ.get("PYTORCH_CUDA_ALLOC_CONF", ""), "run with expandable_segments:True"
    torch.manual_seed(3)
    # 1 MiB, 256 MiB, 1 GiB and 768 MiB of float32; the 256 MiB one is freed and its room reused.
    tensors = [torch.randn(n, device="cuda") for n in (1 << 18, 64 << 20, 256 << 20, 192 << 20)]
    del tensors[1]
    tensors.append(torch.randn(48 << 20, device="cuda"))
    refs = [checksum(t) for t in tensors]
    torch.cuda.synchronize()
    small = torch.zeros(16, device="cuda")
    res = {"allocator": os.environ.get("PYTORCH_CUDA_ALLOC_CONF", ""), "tensor_mib": sum(t.numel() * 4 for t in tensors) >> 20,
           "reserved_mib": torch.cuda.memory_reserved() >> 20, "cycles": []}
    for c in range(a.cycles):
        before = process_vram_mib()
        out_ms, text = freeze()
        cyc = {"freeze_cli_ms": round(out_ms, 1), **freeze_figures(text), "vram_mib_before": before,
               "vram_mib_swapped": process_vram_mib()}
        if c % 2 == 1:
            cyc["thaw_cli_ms"] = round(freeze(thaw=True)[0], 1)
        cyc["first_call_ms"] = round(first_call_ms(small), 2)
        cyc["checksums"] = [checksum(t) for t in tensors] == refs
        m = torch.randn(4096, 4096, device="cuda")
        cyc["matmul_ok"] = math.isfinite((m @ m).sum().item())
        del m
        cyc["vram_mib_after"] = process_vram_mib()
        res["cycles"].append(cyc)
    res["ok"] = all(c["checksums"] and c["matmul_ok"] and isinstance(c["vram_mib_swapped"], int) and
                    isinstance(c["vram_mib_before"], int) and c["vram_mib_swapped"] <= c["vram_mib_before"] - 1800
                    for c in res["cycles"])
    print(json.dumps(res))


def graph_memory_mib(lib):
    """The driver's graph memory of this process's device (cuDeviceGetGraphMemAttribute, a host-only
    call): [used by live graph allocations, reserved] in MiB."""
    out = []
    for attr in (0, 2):  # CU_GRAPH_MEM_ATTR_USED_MEM_CURRENT, CU_GRAPH_MEM_ATTR_RESERVED_MEM_CURRENT
        v = ctypes.c_uint64(0)
        rc = lib.cuDeviceGetGraphMemAttribute(ctypes.c_int(torch.cuda.current_device()), ctypes.c_int(attr),
                                              ctypes.byref(v))
        out.append(v.value >> 20 if rc == 0 else f"error {rc}")
    return out


def run_graphmem(a):
    assert "cudaMallocAsync" in os.environ.get("PYTORCH_CUDA_ALLOC_CONF", ""), "run with backend:cudaMallocAsync"
    torch.manual_seed(5)
    lib = cuda_lib()
    base = torch.randn(256 << 20, device="cuda")  # 1 GiB, movable
    base_ref = checksum(base)
    static_in = torch.randn(64 << 20, device="cuda")  # 256 MiB

    def f(x):
        t1 = x * 2  # temporaries: allocated and freed inside the captured graph
        t2 = t1.relu()
        return t2 + 1  # the output outlives the replay: a live graph allocation

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up before capture, as PyTorch asks
        for _ in range(2):
            f(static_in)
    torch.cuda.current_stream().wait_stream(side)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        static_out = f(static_in)
    g.replay()
    torch.cuda.synchronize()
    out_ref = checksum(static_out)
    res = {"allocator": os.environ.get("PYTORCH_CUDA_ALLOC_CONF", ""),
           "output_matches_eager": bool(torch.equal(static_out, f(static_in)))}
    torch.cuda.synchronize()
    small = torch.zeros(16, device="cuda")
    res["graph_used_reserved_mib_before"] = graph_memory_mib(lib)
    res["vram_mib_before"] = process_vram_mib()
    out_ms, text = freeze()
    res.update({"freeze_cli_ms": round(out_ms, 1), **freeze_figures(text)})
    res["graph_used_reserved_mib_swapped"] = graph_memory_mib(lib)
    res["vram_mib_swapped"] = process_vram_mib()
    res["thaw_cli_ms"] = round(freeze(thaw=True)[0], 1)
    res["first_call_ms"] = round(first_call_ms(small), 2)
    res["output_intact_after_thaw"] = checksum(static_out) == out_ref
    res["tensors_intact"] = checksum(base) == base_ref
    g.replay()
    torch.cuda.synchronize()
    res["replay_after_thaw"] = checksum(static_out) == out_ref
    res["graph_used_reserved_mib_after"] = graph_memory_mib(lib)
    res["vram_mib_after"] = process_vram_mib()
    before, swapped = res["graph_used_reserved_mib_before"], res["graph_used_reserved_mib_swapped"]
    numbers = all(isinstance(v, int) for v in before + swapped + [res["vram_mib_before"], res["vram_mib_swapped"]])
    res["ok"] = (res["output_matches_eager"] and res["output_intact_after_thaw"] and res["tensors_intact"] and
                 res["replay_after_thaw"] and numbers and swapped[1] <= before[1] and
                 res["vram_mib_swapped"] <= res["vram_mib_before"] - 900)
    print(json.dumps(res))


def run_train(a):
    from transformers import GPT2Config, GPT2LMHeadModel
    torch.manual_seed(1234)
    torch.use_deterministic_algorithms(True, warn_only=True)
    model = GPT2LMHeadModel(GPT2Config()).cuda().train()
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4)
    gen = torch.Generator(device="cpu").manual_seed(99)
    batches = [torch.randint(0, 50257, (4, 128), generator=gen) for _ in range(a.steps)]
    losses, freeze_info = [], {}
    small = torch.zeros(16, device="cuda")
    for step in range(a.steps):
        if step == a.freeze_at:
            torch.cuda.synchronize()
            ms, text = freeze()
            freeze_info = {"freeze_cli_ms": round(ms, 1), "freeze": text.splitlines()[-1:],
                           "first_call_ms": round(first_call_ms(small), 2)}
        ids = batches[step].cuda()
        out = model(input_ids=ids, labels=ids)
        opt.zero_grad(set_to_none=True)
        out.loss.backward()
        opt.step()
        losses.append(out.loss.item())
    print(json.dumps({"losses": [repr(x) for x in losses], "freeze_at": a.freeze_at, **freeze_info}))


def run_swap(a):
    n = a.gib << 28  # float32 elements
    t = torch.empty(n, device="cuda")
    t.view(torch.int32).random_()
    small = torch.zeros(16, device="cuda")
    want = checksum(t)
    cycles = []
    for k in range(a.cycles):
        torch.cuda.synchronize()
        if a.idle_wait > 0:  # no request: the idle timeout swaps it out meanwhile
            ms, text = 0.0, ""
            time.sleep(a.idle_wait)
        else:
            ms, text = freeze()
        if a.sleep > 0:  # idle while swapped (the disk tier's timeout runs)
            time.sleep(a.sleep)
        first = first_call_ms(small)
        cycles.append({"freeze_cli_ms": round(ms, 1), "freeze": text.splitlines()[-1] if text else "",
                       "first_call_ms": round(first, 2)})
    print(json.dumps({"gib": a.gib, "cycles": cycles, "intact": checksum(t) == want}))


def ipc_child(inbox, outbox):
    """torch.multiprocessing (spawn) child of run_ipcfix: receives the shared CUDA tensor (opened
    from the parent's legacy IPC handle), reports its checksum, writes 7 into its first 1024 int32
    words, and at "check" (after the parent's freeze) reports its checksum again."""
    try:
        t = inbox.get(timeout=120)
        outbox.put(("seen", checksum(t)))
        t.view(torch.int32)[:1024].fill_(7)
        torch.cuda.synchronize()
        outbox.put(("written", 0))
        while True:
            cmd = inbox.get(timeout=300)
            if cmd == "check":
                outbox.put(("after_freeze", checksum(t)))
            elif cmd == "bye":
                break
        del t
    except Exception as ex:  # the parent reports it
        outbox.put(("error", repr(ex)[:300]))


def run_ipcfix(a):
    """Legacy CUDA IPC from a tiered tenant: one of two buffers is passed to a torch.multiprocessing
    (spawn) child the way PyTorch shares a CUDA tensor (cudaIpcGetMemHandle in the parent,
    cudaIpcOpenMemHandle in the child; both processes under the same `tfusion run --tiering`). The
    child reads it and writes into it; the parent sees the write; a freeze must leave the shared
    one resident (fixed) and move the other; both intact after, and the child still reads the
    shared one."""
    import torch.multiprocessing as mp
    n = a.gib << 28  # float32 elements
    kept = torch.empty(n, device="cuda")
    kept.view(torch.int32).random_()
    shared = torch.empty(n, device="cuda")
    shared.view(torch.int32).random_()
    expected = shared.clone()
    expected.view(torch.int32)[:1024].fill_(7)
    want = (checksum(kept), checksum(shared), checksum(expected))  # kept, shared before and after the child's write
    del expected
    torch.cuda.synchronize()
    res = {"gib": a.gib}
    child = None
    try:
        try:
            shared.untyped_storage()._share_cuda_()
            res["export"] = "ok"
        except Exception as ex:  # what the program would see
            res["export"] = repr(ex)[:300]
        ctx = mp.get_context("spawn")
        inbox, outbox = ctx.Queue(), ctx.Queue()
        child = ctx.Process(target=ipc_child, args=(inbox, outbox))
        child.start()
        inbox.put(shared)
        got = dict([outbox.get(timeout=180)])
        if "seen" in got:
            got.update([outbox.get(timeout=120)])
        res["child_error"] = got.get("error")
        res["child_read_ok"] = got.get("seen") == want[1]
        res["child_write_seen"] = "written" in got and checksum(shared) == want[2]
        ms, text = freeze()
        res["freeze_cli_ms"] = round(ms, 1)
        # `tfusion freeze` prints a line per process of the vGPU (the child is one too): ours.
        lines = text.splitlines() if text else []
        mine = [l for l in lines if f"process {os.getpid()}:" in l]
        res["freeze"] = mine[-1] if mine else (lines[-1] if lines else "")
        res.update(freeze_figures(res["freeze"]))
        res["intact"] = (checksum(kept), checksum(shared)) == (want[0], want[2])
        inbox.put("check")
        after = outbox.get(timeout=120)
        res["child_after_freeze_ok"] = after == ("after_freeze", want[2])
        inbox.put("bye")
        child.join(60)
        res["child_rc"] = child.exitcode
    except Exception as ex:  # keep what was measured
        res["error"] = repr(ex)[:300]
    finally:
        if child is not None and child.is_alive():
            child.kill()
    res["ok"] = bool(res.get("export") == "ok" and res.get("child_read_ok") and res.get("child_write_seen")
                     and res.get("intact") and res.get("child_after_freeze_ok") and res.get("child_rc") == 0)
    print(json.dumps(res))


def run_firstfreeze(a):
    n = a.gib << 28  # float32 elements
    t = torch.empty(n, device="cuda")
    t.view(torch.int32).random_()
    small = torch.zeros(16, device="cuda")
    x = torch.randn(2048, 2048, device="cuda")
    want = checksum(t)
    torch.cuda.synchronize()
    per_second = []
    end = time.monotonic() + a.busy
    while time.monotonic() < end:
        second, done = time.monotonic() + 1, 0
        while time.monotonic() < second:
            for _ in range(20):
                x = torch.tanh(x @ x)
            torch.cuda.synchronize()
            done += 20
        per_second.append(done)
    ms, text = freeze()  # its first swap-out: right after the busy period, never idle
    first = first_call_ms(small)
    print(json.dumps({"gib": a.gib, "pin_ahead": os.environ.get("TFUSION_TIER_PIN_AHEAD", "default"),
                      "freeze_cli_ms": round(ms, 1), "freeze": text.splitlines()[-1] if text else "",
                      "first_call_ms": round(first, 2), "matmuls_per_s": per_second,
                      "intact": checksum(t) == want}))


def gpu_pid():
    """The process that holds this tenant's context: this one locally; remotely
    (TF_REMOTE_VGPU=find) the worker's session process, remote-PID."""
    if os.environ.get("TF_REMOTE_VGPU") != "find":
        return os.getpid()
    return int(my_vgpu().split("-", 1)[1].split("@")[0])


def process_vram_mib():
    """VRAM the driver reports for this process (nvidia-smi, run without the limiter's library path
    so that it reads the real NVML); 0 when the process holds none (it is not listed). Remotely:
    the session process's."""
    env = {k: v for k, v in os.environ.items() if k != "LD_LIBRARY_PATH"}
    mine = str(gpu_pid())
    p = subprocess.run(["nvidia-smi", "--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits"],
                       capture_output=True, text=True, timeout=60, env=env)
    for line in p.stdout.splitlines():
        parts = [x.strip() for x in line.split(",")]
        if len(parts) == 2 and parts[0] == mine:
            return int(parts[1]) if parts[1].isdigit() else parts[1]
    return 0


def run_zero(a):
    """Both levels in one process: freeze (our swap-out), then freeze --zero (swap-out + the
    driver's checkpoint of the rest), each resumed by the first GPU call; VRAM after each."""
    n = a.gib << 28  # float32 elements
    t = torch.empty(n, device="cuda")
    t.view(torch.int32).random_()
    small = torch.zeros(16, device="cuda")
    want = checksum(t)
    torch.cuda.synchronize()
    res = {"gib": a.gib, "vram_resident_mib": process_vram_mib(), "levels": []}
    vgpu = os.environ["TFUSION_VGPU"]
    for level, extra in (("freeze", []), ("zero", ["--zero"]), ("zero", ["--zero"])):
        torch.cuda.synchronize()
        c = time.monotonic()
        p = subprocess.run([TFUSION, "freeze", vgpu] + extra, capture_output=True, text=True, timeout=300)
        cli_ms = (time.monotonic() - c) * 1000
        vram = process_vram_mib()
        first = first_call_ms(small)
        res["levels"].append({"level": level, "rc": p.returncode, "cli_ms": round(cli_ms, 1),
                              "cli": p.stdout.strip().splitlines()[-2:] + p.stderr.strip().splitlines()[-2:],
                              "vram_frozen_mib": vram, "first_call_ms": round(first, 2),
                              "vram_after_resume_mib": process_vram_mib(), "intact": checksum(t) == want})
    res["intact"] = all(x["intact"] for x in res["levels"])
    print(json.dumps(res))


def run_idlezero(a):
    """Scale to zero by the idle policy: holds --gib GiB and makes no GPU call until its zero keeper
    (`tfusion run` or the node agent) has checkpointed it (tfusion smi -p says so, at most
    --idle-wait s), then its first call brings it back; VRAM while checkpointed, times, checksum."""
    t = torch.empty(a.gib << 28, device="cuda")
    t.view(torch.int32).random_()
    small = torch.zeros(16, device="cuda")
    want = checksum(t)
    torch.cuda.synchronize()
    res = {"gib": a.gib, "vram_resident_mib": process_vram_mib()}
    if a.ready:
        open(a.ready, "w").close()
    t0 = time.monotonic()
    seen = None
    pid = str(gpu_pid())
    while time.monotonic() - t0 < a.idle_wait:
        smi = subprocess.run([TFUSION, "smi", "-p"], capture_output=True, text=True, timeout=60, env=cli_env()).stdout
        if any(pid in l and "checkpointed" in l for l in smi.splitlines()):
            seen = time.monotonic() - t0
            break
        time.sleep(0.2)
    res["checkpointed_after_idle_s"] = round(seen, 1) if seen is not None else None
    res["vram_checkpointed_mib"] = process_vram_mib()
    res["first_call_ms"] = round(first_call_ms(small), 2)
    res["vram_after_resume_mib"] = process_vram_mib()
    res["intact"] = checksum(t) == want
    print(json.dumps(res))


def run_gen(a):
    from transformers import GPT2Config, GPT2LMHeadModel
    torch.manual_seed(5)
    model = GPT2LMHeadModel(GPT2Config()).half().cuda().eval()
    ids = torch.randint(0, 50257, (1, 32), device="cuda")
    with torch.no_grad():
        model.generate(ids, max_new_tokens=1, do_sample=False, pad_token_id=0)
        torch.cuda.synchronize()
        cold_first = time.monotonic() - T0
        warm = []
        for _ in range(3):
            t = time.monotonic()
            model.generate(ids, max_new_tokens=1, do_sample=False, pad_token_id=0)
            torch.cuda.synchronize()
            warm.append((time.monotonic() - t) * 1000)
        after = []
        for _ in range(a.cycles):
            freeze()
            t = time.monotonic()
            model.generate(ids, max_new_tokens=1, do_sample=False, pad_token_id=0)
            torch.cuda.synchronize()
            after.append((time.monotonic() - t) * 1000)
    print(json.dumps({"first_token_from_process_start_s": round(cold_first, 3),
                      "first_token_warm_ms": [round(x, 2) for x in warm],
                      "first_token_after_freeze_ms": [round(x, 2) for x in after]}))


def run_alloc(a):
    torch.zeros(1, device="cuda")  # a current context
    lib = cuda_lib()
    out = {}
    for mib in (2, 64, 1024):
        times = []
        for _ in range(a.reps):
            p = ctypes.c_uint64(0)
            t = time.perf_counter()
            r = lib.cuMemAlloc_v2(ctypes.byref(p), ctypes.c_size_t(mib << 20))
            t1 = time.perf_counter()
            assert r == 0, r
            lib.cuMemFree_v2(ctypes.c_uint64(p.value))
            t2 = time.perf_counter()
            times.append(((t1 - t) * 1e6, (t2 - t1) * 1e6))
        times.sort()
        med = times[len(times) // 2]
        out[f"{mib}MiB"] = {"alloc_us": round(sorted(x[0] for x in times)[len(times) // 2], 1),
                            "free_us": round(sorted(x[1] for x in times)[len(times) // 2], 1)}
    print(json.dumps(out))


def run_steady(a):
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from infer_tenant import build
    step = build(a.model, a.batch)
    with torch.inference_mode():
        for _ in range(15):
            step()
        torch.cuda.synchronize()
        n, t0 = 0, time.monotonic()
        while time.monotonic() - t0 < a.seconds:
            step()
            torch.cuda.synchronize()
            n += 1
        secs = time.monotonic() - t0
        out = {"model": a.model, "batch": a.batch, "items_per_s": round(n * a.batch / secs, 2)}
        # The GPU's work alone, without the host: the step captured once in a CUDA graph and
        # replayed, timed with events (median of 7 blocks of 20 replays).
        try:
            g = torch.cuda.CUDAGraph()
            s = torch.cuda.Stream()
            s.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(s):
                step()
                torch.cuda.synchronize()
                with torch.cuda.graph(g, stream=s):
                    step()
            torch.cuda.synchronize()
            blocks = []
            for _ in range(7):
                e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                e0.record()
                for _ in range(20):
                    g.replay()
                e1.record()
                e1.synchronize()
                blocks.append(e0.elapsed_time(e1) / 20)
            out["graph_ms"] = round(sorted(blocks)[3], 4)
        except Exception as ex:  # the eager number stands; say why there is no graph number
            out["graph_error"] = repr(ex)[:200]
    print(json.dumps(out))


def run_hold(a):
    t = torch.empty(a.gib << 28, device="cuda")
    t.view(torch.int32).random_()
    want = checksum(t)
    torch.cuda.synchronize()
    print(json.dumps({"pid": os.getpid(), "ready": True}), flush=True)
    open(a.ready, "w").close()
    deadline = time.monotonic() + 300
    while not os.path.exists(a.go) and time.monotonic() < deadline:
        time.sleep(0.01)
    t0 = time.monotonic()
    same = checksum(t) == want  # a GPU call: waits while the vGPU is held (preemption)
    print(json.dumps({"intact": same, "check_ms": round((time.monotonic() - t0) * 1000, 1)}))


def run_rhold(a):
    t = torch.empty(a.gib << 28, device="cuda")
    t.view(torch.int32).random_()
    want = checksum(t)
    torch.cuda.synchronize()
    open(a.ready, "w").close()

    def wait_for(path):
        deadline = time.monotonic() + 300
        while not os.path.exists(path) and time.monotonic() < deadline:
            time.sleep(0.01)

    wait_for(a.go)
    t0 = time.monotonic()
    res = {"intact": checksum(t) == want}  # waits while the session is held
    res["check_ms"] = round((time.monotonic() - t0) * 1000, 1)
    open(a.ready + ".checked", "w").close()
    wait_for(a.go + "2")
    t1 = time.monotonic()
    try:
        checksum(t)
        torch.cuda.synchronize()
        res["after_delete"] = "returned"
    except RuntimeError as ex:  # what PyTorch raises for a CUDA error
        res["after_delete"] = "error: " + str(ex).strip().splitlines()[0][:200]
    res["after_delete_ms"] = round((time.monotonic() - t1) * 1000, 1)
    print(json.dumps(res), flush=True)
    os._exit(0)  # no teardown through a connection that is gone


def wait_for_file(*paths, seconds=300):
    """The first of `paths` to exist within `seconds`, else None."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        for p in paths:
            if os.path.exists(p):
                return p
        time.sleep(0.01)
    return None


def write_line(path, d):
    """One JSON line on stdout and in `path` (written whole, then renamed: the coordinator never
    reads half of it)."""
    line = json.dumps(d)
    print(line, flush=True)
    with open(path + ".tmp", "w") as f:
        f.write(line + "\n")
    os.rename(path + ".tmp", path)


def run_fault(a):
    """Holds --gib GiB and answers the coordinator step by step (tiering.py, phase faults)."""
    tensors = []
    for _ in range(a.gib):
        t = torch.empty(1 << 28, device="cuda")  # 1 GiB of float32
        t.view(torch.int32).random_()
        tensors.append(t)
    small = torch.zeros(16, device="cuda")
    want = [checksum(t) for t in tensors]
    torch.cuda.synchronize()
    write_line(a.ready + ".0", {"step": 0, "pid": os.getpid(), "gib": a.gib,
                                "vgpu": os.environ.get("TFUSION_VGPU", "")})
    k = 0
    while True:
        k += 1
        if wait_for_file(f"{a.go}.{k}", a.go + ".end") != f"{a.go}.{k}":
            return
        t0 = time.monotonic()
        res = {"step": k}
        try:
            small.add_(1)  # needs the GPU: resumes a swapped tenant, or fails with its CUDA error
            torch.cuda.synchronize()
            sums = [checksum(t) for t in tensors]
            res["intact"] = sums == want
            res["tensors_changed"] = sum(x != y for x, y in zip(sums, want))
        except RuntimeError as ex:  # what PyTorch raises for a CUDA error; the process goes on
            text = str(ex).strip()
            res["error"] = text.splitlines()[0][:200] if text else repr(ex)[:200]
            res["out_of_memory"] = "out of memory" in text.lower()
        res["ms"] = round((time.monotonic() - t0) * 1000, 1)
        write_line(f"{a.ready}.{k}", res)


def run_hog(a):
    """Natively (not under tiering): takes the GPU's free memory but --leave-mib."""
    torch.zeros(1, device="cuda")  # the context first: its memory is not free memory
    free, total = torch.cuda.mem_get_info()
    take = max(0, free - (a.leave_mib << 20))
    held = torch.empty(take, dtype=torch.uint8, device="cuda") if take else None
    torch.cuda.synchronize()
    after, _ = torch.cuda.mem_get_info()
    write_line(a.ready, {"free_before_mib": free >> 20, "held_mib": take >> 20, "free_after_mib": after >> 20,
                         "total_mib": total >> 20})
    wait_for_file(a.go)
    del held


def run_serve(a):
    import random
    from transformers import GPT2Config, GPT2LMHeadModel
    torch.manual_seed(a.seed)
    model = GPT2LMHeadModel(GPT2Config()).half().cuda().eval()
    ids = torch.randint(0, 50257, (8, 128), device="cuda")
    big = torch.empty(a.gib << 28, device="cuda")
    big.view(torch.int32).random_()
    with torch.no_grad():
        ref_logits = model(input_ids=ids).logits.clone()
    ref_sum = checksum(big)
    torch.cuda.synchronize()
    open(a.ready, "w").close()
    deadline = time.monotonic() + 600
    while not os.path.exists(a.go) and time.monotonic() < deadline:
        time.sleep(0.01)
    rng = random.Random(a.seed)
    first, rest, failures, ok, wrong, n = [], [], [], 0, 0, 0
    t_start = time.monotonic()
    while time.monotonic() - t_start < a.seconds:
        for r in range(a.burst):
            t = time.monotonic()
            try:
                with torch.no_grad():
                    good = bool(torch.equal(model(input_ids=ids).logits, ref_logits)) and checksum(big) == ref_sum
                torch.cuda.synchronize()
            except RuntimeError as ex:
                failures.append(str(ex)[:200])
                good = None
            ms = (time.monotonic() - t) * 1000
            n += 1
            ok += good is True
            wrong += good is False
            (first if r == 0 else rest).append(round(ms, 2))
        time.sleep(rng.uniform(a.gap_min, a.gap_max))
    print(json.dumps({"requests": n, "correct": ok, "wrong": wrong, "errors": len(failures), "failures": failures[:3], "first_of_burst_ms": first,
                      "other_ms": rest, "seconds": round(time.monotonic() - t_start, 1)}))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("mode", choices=("checks", "pool", "pools", "expandable", "graphmem", "train", "swap", "gen", "alloc", "steady", "hold", "serve",
                                     "rhold", "zero", "firstfreeze", "idlezero", "ipcfix", "fault", "hog"))
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--burst", type=int, default=5)
    ap.add_argument("--gap-min", type=float, default=3)
    ap.add_argument("--gap-max", type=float, default=6)
    ap.add_argument("--cycles", type=int, default=4)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--freeze-at", type=int, default=-1)
    ap.add_argument("--sleep", type=float, default=0.0)
    ap.add_argument("--idle-wait", type=float, default=0.0)
    ap.add_argument("--busy", type=float, default=10.0)
    ap.add_argument("--gib", type=int, default=1)
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--model", default="r50")
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--seconds", type=float, default=6)
    ap.add_argument("--ready", default="")
    ap.add_argument("--go", default="")
    ap.add_argument("--leave-mib", type=int, default=1024)
    a = ap.parse_args()
    {"checks": run_checks, "pool": run_pool, "pools": run_pools, "expandable": run_expandable, "graphmem": run_graphmem, "train": run_train, "swap": run_swap, "gen": run_gen,
     "alloc": run_alloc, "steady": run_steady, "hold": run_hold, "serve": run_serve, "rhold": run_rhold,
     "zero": run_zero, "firstfreeze": run_firstfreeze, "idlezero": run_idlezero, "ipcfix": run_ipcfix,
     "fault": run_fault, "hog": run_hog}[a.mode](a)


if __name__ == "__main__":
    main()
