"""What a PyTorch workload asks the remote stub per step: run under `tfusion run --remote` with
TFUSION_CLIENT_TRACE=calls, it prints MARK lines on stderr around a steady-state window so that the
calls in between can be counted (tests/gpu/remote_calls.sh). Parts: resnet (ResNet-50 fp16 b64
eager, 10 steps), graphs (the torch_checks CUDA-graph capture), gpt2 (GPT-2 small fp16 forward 1x128,
10 steps; gpt2b8: 8x512), and generate (GPT-2 small greedy 32-token generation, once)."""
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


def gpt2_model():
    from transformers import GPT2Config, GPT2LMHeadModel
    torch.manual_seed(0)
    return GPT2LMHeadModel(GPT2Config()).cuda().half().eval()


def gpt2(batch=1, seq=128):
    m = gpt2_model()
    ids = torch.randint(0, m.config.vocab_size, (batch, seq), device="cuda")
    with torch.inference_mode():
        for _ in range(3):
            m(input_ids=ids, use_cache=False)
        torch.cuda.synchronize()
        mark("begin gpt2 10")
        for _ in range(10):
            m(input_ids=ids, use_cache=False)
        torch.cuda.synchronize()
        mark("end gpt2")


def generate():
    m = gpt2_model()
    ids = torch.randint(0, m.config.vocab_size, (1, 32), device="cuda")
    mask = torch.ones_like(ids)

    def once():
        return m.generate(input_ids=ids, attention_mask=mask, max_new_tokens=32, min_new_tokens=32,
                          do_sample=False, use_cache=True, pad_token_id=m.config.eos_token_id)
    with torch.inference_mode():
        once()
        torch.cuda.synchronize()
        mark("begin generate 1")
        once()
        torch.cuda.synchronize()
        mark("end generate")


if __name__ == "__main__":
    {"resnet": resnet, "graphs": graphs, "gpt2": gpt2, "gpt2b8": lambda: gpt2(8, 512),
     "generate": generate}[sys.argv[1]]()
