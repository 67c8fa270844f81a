#!/usr/bin/env python3
"""One inference tenant for the co-location benchmarks (tests/gpu/colocation.py).

Builds the model (random weights, fp16, nothing downloaded), warms it up, touches --ready, waits
for --go, then runs forward passes in a loop for --seconds, synchronizing after each, and prints
`items_per_s=X iters=N seconds=S` (items = images for ResNet-50, sequences for GPT-2), then
`items_each_second=A,B,...`: the items finished in each whole second of the run.
With --timeline FILE it also writes the end time (monotonic ns) of every iteration.
With --windows K it runs K timed windows instead of one, window k after GO.k exists (the harness
may stop the process between windows: colocation.py --warm), prints each window's two lines
prefixed by `window=k `, and touches READY.k when window k is done.

  --model r50   torchvision ResNet-50, channels-last, input batch x 3 x 224 x 224
  --model gpt2  GPT-2 small (transformers GPT2LMHeadModel, default config), batch x 128 tokens
"""
import argparse
import os
import sys
import time

import torch


def build(model, batch):
    if model == "r50":
        import torchvision
        m = torchvision.models.resnet50().half().cuda().eval().to(memory_format=torch.channels_last)
        x = torch.randn(batch, 3, 224, 224, device="cuda").half().to(memory_format=torch.channels_last)
        return lambda: m(x)
    if model == "gpt2":
        from transformers import GPT2Config, GPT2LMHeadModel
        m = GPT2LMHeadModel(GPT2Config()).half().cuda().eval()
        ids = torch.randint(0, 50257, (batch, 128), device="cuda")
        return lambda: m(input_ids=ids)
    raise SystemExit(f"unknown model {model!r} (r50, gpt2)")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True)
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--seconds", type=float, default=6)
    ap.add_argument("--ready", required=True)
    ap.add_argument("--go", required=True)
    ap.add_argument("--timeline", default="")
    ap.add_argument("--windows", type=int, default=0)
    args = ap.parse_args()
    if args.batch < 1 or args.seconds <= 0 or args.windows < 0:
        raise SystemExit("--batch must be >= 1, --seconds > 0 and --windows >= 0")
    step = build(args.model, args.batch)
    if args.timeline:
        open(args.timeline, "w").close()  # every window's end times are appended
    with torch.inference_mode():
        for _ in range(15):
            step()
        torch.cuda.synchronize()
        open(args.ready, "w").close()
        if not args.windows:
            report(step, args, args.go, "", 120)
            return
        for k in range(args.windows):
            # Between windows the harness may keep the process stopped for as long as the other
            # groups' windows take.
            report(step, args, f"{args.go}.{k}", f"window={k} ", 3600, warm_steps=3)
            open(f"{args.ready}.{k}", "w").close()


def report(step, args, go, prefix, wait_s, warm_steps=0):
    """Waits for `go`, runs `warm_steps` untimed forward passes (a process resumed after a stop:
    the GPU's clocks and caches back up), then forward passes for --seconds, and prints the
    window's rate lines."""
    deadline = time.monotonic() + wait_s
    while not os.path.exists(go):
        if time.monotonic() > deadline:
            raise SystemExit(f"no go signal within {wait_s} s")
        time.sleep(0.002)
    for _ in range(warm_steps):
        step()
    if warm_steps:
        torch.cuda.synchronize()
    ends = []
    n, t0, t0_ns = 0, time.monotonic(), time.monotonic_ns()
    while True:
        step()
        torch.cuda.synchronize()
        n += 1
        now = time.monotonic()
        ends.append(time.monotonic_ns())
        if now - t0 >= args.seconds:
            break
    secs = now - t0
    if args.timeline:
        with open(args.timeline, "a") as f:
            f.write("\n".join(map(str, ends)) + "\n")
    print(f"{prefix}items_per_s={n * args.batch / secs:.2f} iters={n} seconds={secs:.3f}")
    # Items in each whole second since the go signal: where in the run a tenant slowed down.
    per_second = [0] * int(secs)
    for e in ends:
        i = (e - t0_ns) // 1_000_000_000
        if i < len(per_second):
            per_second[i] += args.batch
    print(f"{prefix}items_each_second=" + ",".join(map(str, per_second)))
    sys.stdout.flush()

if __name__ == "__main__":
    main()
