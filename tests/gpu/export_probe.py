"""cuBLAS, cuBLASLt and cuDNN through PyTorch, small and deterministic: what the export-table
probe (tests/gpu/export_probe.sh) runs under each diagnostic setting. Prints RESULT lines."""
import sys

import torch


def main():
    ok = True
    dev = torch.device("cuda")
    a = torch.arange(64 * 64, dtype=torch.float32, device=dev).reshape(64, 64) / 4096
    try:
        c = a @ a
        print(f"RESULT matmul_fp32 sum={c.sum().item():.6f}")
        h = (a.half() @ a.half()).float()
        print(f"RESULT matmul_fp16 sum={h.sum().item():.3f}")
        lin = torch.nn.functional.linear(a, a, a[0])
        print(f"RESULT linear sum={lin.sum().item():.6f}")
    except Exception as e:  # noqa: BLE001 - report and go on
        ok = False
        print(f"RESULT cublas error={type(e).__name__}: {e}".replace("\n", " "))
    try:
        x = a.reshape(1, 1, 64, 64)
        w = torch.ones(4, 1, 3, 3, device=dev)
        y = torch.nn.functional.conv2d(x, w)
        print(f"RESULT conv2d sum={y.sum().item():.4f}")
    except Exception as e:  # noqa: BLE001
        ok = False
        print(f"RESULT cudnn error={type(e).__name__}: {e}".replace("\n", " "))
    torch.cuda.synchronize()
    print("RESULT status=" + ("PASS" if ok else "FAIL"))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
