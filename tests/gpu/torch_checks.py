#!/usr/bin/env python3
"""PyTorch workloads whose results must not depend on the limiter: run once natively and once
under `tfusion run`, each saving its outputs into --out; torch_compare.py then compares them.

Parts (each independent; one failing does not stop the others):
  eager   fp16 matmul (cuBLAS) and fp16 conv2d (cuDNN, deterministic)
  train   a few SGD steps of a small CNN (losses and final weights)
  compile torch.compile of a small function (Inductor -> Triton), checked against eager
  graphs  torch.cuda.CUDAGraph capture and replay, checked against eager
Prints `RESULT part=NAME status=ok|error:...`; exit 0 when every part ran.
"""
import argparse
import os
import sys
import traceback

# Deterministic cuBLAS needs its workspace configured before the first cuBLAS call.
os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")

import torch  # noqa: E402


def seeded(seed):
    torch.manual_seed(seed)
    torch.cuda.manual_seed_all(seed)


def part_eager():
    seeded(1)
    a = torch.randn(2048, 2048, device="cuda", dtype=torch.float16)
    b = torch.randn(2048, 2048, device="cuda", dtype=torch.float16)
    mm = a @ b
    x = torch.randn(16, 64, 56, 56, device="cuda", dtype=torch.float16)
    w = torch.randn(128, 64, 3, 3, device="cuda", dtype=torch.float16)
    conv = torch.nn.functional.conv2d(x, w, padding=1)
    torch.cuda.synchronize()
    return {"matmul": mm.cpu(), "conv2d": conv.cpu()}


def part_train():
    seeded(2)
    # Only layers with deterministic CUDA backward passes (no pooling, no NLL loss).
    model = torch.nn.Sequential(
        torch.nn.Conv2d(3, 16, 3, padding=1), torch.nn.ReLU(),
        torch.nn.Conv2d(16, 32, 3, stride=2, padding=1), torch.nn.ReLU(),
        torch.nn.Flatten(), torch.nn.Linear(32 * 16 * 16, 10)).cuda()
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    data = torch.randn(64, 3, 32, 32, device="cuda")
    targets = torch.randn(64, 10, device="cuda")
    losses = []
    for _ in range(10):
        opt.zero_grad(set_to_none=True)
        loss = torch.nn.functional.mse_loss(model(data), targets)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return {"losses": torch.tensor(losses, dtype=torch.float64),
            "weights": {k: v.detach().cpu() for k, v in model.state_dict().items()}}


def part_compile():
    def fn(x, y):
        return torch.sin(x) * y + torch.cos(y) * x.relu()

    seeded(3)
    x = torch.randn(1 << 20, device="cuda")
    y = torch.randn(1 << 20, device="cuda")
    compiled = torch.compile(fn)
    out = compiled(x, y)
    ref = fn(x, y)
    torch.cuda.synchronize()
    if not torch.allclose(out, ref, rtol=1e-5, atol=1e-5):
        raise AssertionError(f"compiled differs from eager by {(out - ref).abs().max().item()}")
    return {"out": out.cpu()}


def part_graphs():
    seeded(4)
    w = torch.randn(1024, 1024, device="cuda", dtype=torch.float16)
    static_in = torch.randn(256, 1024, device="cuda", dtype=torch.float16)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            torch.relu(static_in @ w)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static_out = torch.relu(static_in @ w) * 0.5
    outs = []
    for step in range(5):
        seeded(100 + step)
        static_in.copy_(torch.randn(256, 1024, device="cuda", dtype=torch.float16))
        graph.replay()
        eager = torch.relu(static_in @ w) * 0.5
        torch.cuda.synchronize()
        if not torch.equal(static_out, eager):
            raise AssertionError(f"replay {step} differs from eager")
        outs.append(static_out.cpu().clone())
    return {"replays": torch.stack(outs)}


PARTS = {"eager": part_eager, "train": part_train, "compile": part_compile, "graphs": part_graphs}


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--out", required=True)
    ap.add_argument("--parts", default=",".join(PARTS))
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    torch.backends.cudnn.deterministic = True
    torch.backends.cudnn.benchmark = False
    torch.use_deterministic_algorithms(True, warn_only=True)
    print(f"RESULT torch={torch.__version__} device={torch.cuda.get_device_name(0)}", flush=True)
    ok = True
    for name in args.parts.split(","):
        try:
            torch.save(PARTS[name](), os.path.join(args.out, f"{name}.pt"))
            print(f"RESULT part={name} status=ok", flush=True)
        except Exception as e:  # report and go on with the next part
            traceback.print_exc()
            print(f"RESULT part={name} status=error:{type(e).__name__}", flush=True)
            ok = False
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
