#!/usr/bin/env python3
"""ResNet-50 inference throughput: torchvision resnet50(weights=None), fp16, batch --batch,
eval mode; --warmup iterations, then --iters timed with CUDA events. Prints RESULT lines
(images_per_s, ms_per_iter). run_all.sh runs it natively and under `tfusion run --percent 100`."""
import argparse

import torch
import torchvision


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--warmup", type=int, default=15)
    ap.add_argument("--iters", type=int, default=50)
    args = ap.parse_args()
    torch.manual_seed(0)
    torch.backends.cudnn.benchmark = True
    model = torchvision.models.resnet50(weights=None).cuda().half().eval()
    x = torch.randn(args.batch, 3, 224, 224, device="cuda", dtype=torch.float16)
    with torch.inference_mode():
        for _ in range(args.warmup):
            model(x)
        torch.cuda.synchronize()
        start = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(args.iters):
            model(x)
        end.record()
        end.synchronize()
    ms = start.elapsed_time(end) / args.iters
    print(f"RESULT device={torch.cuda.get_device_name(0)}")
    print(f"RESULT batch={args.batch}")
    print(f"RESULT iters={args.iters}")
    print(f"RESULT ms_per_iter={ms:.3f}")
    print(f"RESULT images_per_s={args.batch * 1000.0 / ms:.1f}")


if __name__ == "__main__":
    main()
