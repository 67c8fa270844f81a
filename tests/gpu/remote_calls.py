"""What a PyTorch workload asks the remote stub per step: run under `tfusion run --remote` with
TFUSION_CLIENT_TRACE=calls, it prints MARK lines on stderr around a steady-state window so that the
calls in between can be counted (tests/gpu/remote_calls.sh). Parts: resnet (ResNet-50 fp16 b64
eager, 10 steps) and graphs (the torch_checks CUDA-graph capture)."""
import os
import sys

import torch


def mark(text):
    os.write(2, f"MARK {text}\n".encode())


def resnet():
    import torchvision
    m = torchvision.models.resnet50(weights=None).cuda().half().eval().to(memory_format=torch.channels_last)
    x = torch.randn(64, 3, 224, 224, device="cuda", dtype=torch.float16).to(memory_format=torch.channels_last)
    with torch.no_grad():
        for _ in range(3):
            m(x)
        torch.cuda.synchronize()
        mark("begin resnet 10")
        for _ in range(10):
            m(x)
        torch.cuda.synchronize()
        mark("end resnet")


def graphs():
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import torch_checks
    mark("begin graphs 1")
    try:
        torch_checks.part_graphs()
        print("RESULT graphs=ok")
    except Exception as e:  # noqa: BLE001
        print(f"RESULT graphs=error {type(e).__name__}")
    mark("end graphs")


if __name__ == "__main__":
    {"resnet": resnet, "graphs": graphs}[sys.argv[1]]()
