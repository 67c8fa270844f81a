#!/usr/bin/env python3
"""Model benchmarks of the remote vGPU (issue 3, item 8), run the same way natively and through
the client stub (`tfusion run --remote ...`) so that the times can be divided.

Parts, in the order they run (the most important first):
  resnet50_b64_eager, gpt2_fwd_b1_s128, gpt2_fwd_b8_s512, resnet50_b1_eager, resnet50_b16_eager,
  gpt2_generate32_b1, resnet50_b1_compile, resnet50_b16_compile, resnet50_b64_compile
ResNet-50: torchvision resnet50(weights=None), fp16, channels_last, eval, inference_mode;
compiled parts use torch.compile(default mode, dynamic=False), so each batch size compiles once.
GPT-2 small: transformers GPT2LMHeadModel(GPT2Config()) with random weights, fp16, eval; forward
passes without the KV cache, and model.generate of exactly 32 new tokens (greedy, KV cache) after
a 32-token prompt.

Timing: warm-up calls, then --reps repetitions of a loop sized to about --rep-s seconds, each
bracketed by torch.cuda.synchronize() (wall time, what a user waits for) and by CUDA events
(gpu_ms); the median repetition is reported. One line per part:
  RESULT name=PART ms=MEDIAN_WALL_MS gpu_ms=... ms_min=... ms_max=... reps=R iters=N [extra=...]
or, when the part failed, ran out of its --part-budget-s or did not fit --total-budget-s:
  RESULT name=PART error=TEXT
Every part is independent: a failure is reported and the next part runs. Exit status 0 when every
selected part produced a number.
"""
import argparse
import os
import signal
import statistics
import sys
import time
import traceback

PARTS = ["resnet50_b64_eager", "gpt2_fwd_b1_s128", "gpt2_fwd_b8_s512", "resnet50_b1_eager",
         "resnet50_b16_eager", "gpt2_generate32_b1", "resnet50_b1_compile", "resnet50_b16_compile",
         "resnet50_b64_compile", "resnet50_b32_train"]
# The parts remote_compare.sh runs first (the GPU-bound targets of the issue), and the rest.
GROUPS = {"key": PARTS[:3], "rest": PARTS[3:], "all": PARTS}


class PartTimeout(Exception):
    pass


def on_alarm(signum, frame):
    raise PartTimeout("part budget exceeded")


def one_line(text):
    return " ".join(str(text).split())[:300]


class Bench:
    """Holds the models between parts (building them once) and the timing settings."""

    def __init__(self, args, torch):
        self.args = args
        self.torch = torch
        self.resnet_net = None
        self.resnet_compiled = None
        self.gpt2 = None

    def measure(self, step, deadline):
        """Warm-up, then args.reps timed loops of `step`; returns a dict of the numbers."""
        torch = self.torch
        for _ in range(self.args.warmup):
            step()
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        step()
        torch.cuda.synchronize()
        one = max(time.perf_counter() - t0, 1e-6)
        iters = max(1, min(self.args.max_iters, int(self.args.rep_s / one)))
        start = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        wall, gpu = [], []
        for rep in range(self.args.reps):
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            start.record()
            for _ in range(iters):
                step()
            end.record()
            torch.cuda.synchronize()
            wall.append((time.perf_counter() - t0) * 1000.0 / iters)
            gpu.append(start.elapsed_time(end) / iters)
            if rep >= 1 and time.monotonic() > deadline:
                break  # keep what was measured rather than lose the part
        r = {"ms": statistics.median(wall), "gpu_ms": statistics.median(gpu), "ms_min": min(wall),
             "ms_max": max(wall), "reps": len(wall), "iters": iters}
        if self.args.gpu_busy:
            r.update(self.gpu_busy(step))
        return r

    def gpu_busy(self, step, steps=5):
        """--gpu-busy: the time per step during which at least one kernel or copy ran, from the
        profiler's CUDA activity (CUPTI, so natively only), and how many ran per step. Where the
        step time exceeds gpu_busy_ms the GPU waited for work."""
        torch = self.torch
        if os.environ.get("TFUSION_REMOTE"):
            return {}  # CUPTI needs the real driver
        from torch.profiler import ProfilerActivity, profile
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(steps):
                step()
            torch.cuda.synchronize()
        spans = sorted((e.time_range.start, e.time_range.end) for e in prof.events()
                       if e.device_type == torch.autograd.DeviceType.CUDA)
        if not spans:
            return {}
        busy, cur_start, cur_end = 0.0, spans[0][0], spans[0][1]
        for start, end in spans[1:]:
            if start > cur_end:
                busy += cur_end - cur_start
                cur_start, cur_end = start, end
            else:
                cur_end = max(cur_end, end)
        busy += cur_end - cur_start
        return {"gpu_busy_ms": busy / 1000.0 / steps, "gpu_ops_per_step": len(spans) // steps}

    def resnet_model(self):
        if self.resnet_net is None:
            import torchvision
            torch = self.torch
            torch.manual_seed(0)
            model = torchvision.models.resnet50(weights=None)
            self.resnet_net = model.cuda().half().to(memory_format=torch.channels_last).eval()
        return self.resnet_net

    def resnet_part(self, batch, compiled, deadline):
        torch = self.torch
        model = self.resnet_model()
        extra = {}
        if compiled:
            if self.resnet_compiled is None:
                self.resnet_compiled = torch.compile(model, dynamic=False)
            model = self.resnet_compiled
        x = torch.randn(batch, 3, 224, 224, device="cuda", dtype=torch.float16)
        x = x.contiguous(memory_format=torch.channels_last)
        with torch.inference_mode():
            if compiled:
                t0 = time.perf_counter()
                model(x)
                torch.cuda.synchronize()
                extra["compile_s"] = time.perf_counter() - t0
            r = self.measure(lambda: model(x), deadline)
        r.update(extra)
        r["images_per_s"] = batch * 1000.0 / r["ms"]
        return r

    def resnet_train(self, batch, deadline):
        """One training step of ResNet-50 (fp16 autocast, SGD with momentum, channels-last):
        forward, loss, backward, optimizer step."""
        torch = self.torch
        import torchvision
        torch.manual_seed(0)
        model = torchvision.models.resnet50(weights=None).cuda().to(memory_format=torch.channels_last).train()
        opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
        gen = torch.Generator(device="cuda").manual_seed(3)
        x = torch.randn(batch, 3, 224, 224, device="cuda", generator=gen).contiguous(memory_format=torch.channels_last)
        y = torch.randint(0, 1000, (batch,), device="cuda", generator=gen)
        loss_fn = torch.nn.CrossEntropyLoss()

        def step():
            opt.zero_grad(set_to_none=True)
            with torch.autocast("cuda", dtype=torch.float16):
                loss = loss_fn(model(x), y)
            loss.backward()
            opt.step()

        r = self.measure(step, deadline)
        r["images_per_s"] = batch * 1000.0 / r["ms"]
        return r

    def gpt2_model(self):
        if self.gpt2 is None:
            from transformers import GPT2Config, GPT2LMHeadModel
            self.torch.manual_seed(0)
            self.gpt2 = GPT2LMHeadModel(GPT2Config()).cuda().half().eval()
        return self.gpt2

    def gpt2_forward(self, batch, seq, deadline):
        torch = self.torch
        model = self.gpt2_model()
        gen = torch.Generator(device="cuda").manual_seed(1)
        ids = torch.randint(0, model.config.vocab_size, (batch, seq), device="cuda", generator=gen)
        with torch.inference_mode():
            r = self.measure(lambda: model(input_ids=ids, use_cache=False), deadline)
        r["tokens_per_s"] = batch * seq * 1000.0 / r["ms"]
        return r

    def gpt2_generate(self, new_tokens, deadline):
        torch = self.torch
        model = self.gpt2_model()
        gen = torch.Generator(device="cuda").manual_seed(2)
        ids = torch.randint(0, model.config.vocab_size, (1, 32), device="cuda", generator=gen)
        mask = torch.ones_like(ids)

        def generate():
            out = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=new_tokens,
                                 min_new_tokens=new_tokens, do_sample=False, use_cache=True,
                                 pad_token_id=model.config.eos_token_id)
            if out.shape[1] != ids.shape[1] + new_tokens:
                raise AssertionError(f"generated {out.shape[1] - ids.shape[1]} tokens, not {new_tokens}")
            return out

        with torch.inference_mode():
            r = self.measure(generate, deadline)
        r["ms_per_token"] = r["ms"] / new_tokens
        return r

    def run(self, name, deadline):
        kind, rest = name.split("_", 1)
        if kind == "resnet50":
            batch, mode = rest.split("_")
            if mode == "train":
                return self.resnet_train(int(batch[1:]), deadline)
            return self.resnet_part(int(batch[1:]), mode == "compile", deadline)
        if rest.startswith("fwd_"):
            _, b, s = rest.split("_")
            return self.gpt2_forward(int(b[1:]), int(s[1:]), deadline)
        if rest.startswith("generate"):
            return self.gpt2_generate(int(rest[len("generate"):].split("_")[0]), deadline)
        raise ValueError(f"unknown part {name}")


def parse_parts(text):
    names = []
    for item in text.split(","):
        item = item.strip()
        if item in GROUPS:
            names += GROUPS[item]
        elif item in PARTS:
            names.append(item)
        else:
            raise argparse.ArgumentTypeError(f"unknown part '{item}' (parts: {', '.join(PARTS)}; groups: "
                                             f"{', '.join(GROUPS)})")
    return [p for p in PARTS if p in names]


def positive(kind):
    def check(text):
        value = kind(text)
        if value <= 0:
            raise argparse.ArgumentTypeError(f"must be > 0, got {text}")
        return value
    return check


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--parts", type=parse_parts, default=PARTS, help="parts or groups (key, rest, all), comma-separated")
    ap.add_argument("--quick", action="store_true", help="fewer and shorter repetitions (a smoke run)")
    ap.add_argument("--reps", type=positive(int), default=None, help="timed repetitions per part (default 5, quick 3)")
    ap.add_argument("--rep-s", type=positive(float), default=None, help="seconds per repetition (default 0.3, quick 0.05)")
    ap.add_argument("--warmup", type=positive(int), default=None, help="warm-up calls (default 10, quick 3)")
    ap.add_argument("--max-iters", type=positive(int), default=200, help="most calls per repetition")
    ap.add_argument("--gpu-busy", action="store_true",
                    help="natively: also report the GPU's busy time per step (torch.profiler)")
    ap.add_argument("--part-budget-s", type=positive(float), default=150.0,
                    help="a part still running after this is abandoned with error=timeout")
    ap.add_argument("--total-budget-s", type=positive(float), default=None,
                    help="parts that would start later than this (minus 20 s) are skipped")
    args = ap.parse_args()
    args.reps = args.reps or (3 if args.quick else 5)
    args.rep_s = args.rep_s or (0.05 if args.quick else 0.3)
    args.warmup = args.warmup or (3 if args.quick else 10)
    begin = time.monotonic()

    try:
        import torch
        if not torch.cuda.is_available():
            raise RuntimeError("torch.cuda.is_available() is False")
        torch.backends.cudnn.benchmark = True
        device = torch.cuda.get_device_name(0).replace(" ", "_")
    except Exception as e:  # nothing can run: say so for every part
        traceback.print_exc()
        for name in args.parts:
            print(f"RESULT name={name} error=setup:{type(e).__name__}:{one_line(e)}", flush=True)
        return 1
    versions = [f"torch={torch.__version__}"]
    for mod in ("torchvision", "transformers"):
        try:
            versions.append(f"{mod}={__import__(mod).__version__}")
        except Exception as e:
            versions.append(f"{mod}=missing:{type(e).__name__}")
    print(f"RESULT name=env device={device} {' '.join(versions)}", flush=True)

    signal.signal(signal.SIGALRM, on_alarm)
    bench = Bench(args, torch)
    failed = 0
    for name in args.parts:
        now = time.monotonic()
        if args.total_budget_s is not None and now - begin > args.total_budget_s - 20:
            print(f"RESULT name={name} error=skipped:total budget spent", flush=True)
            failed += 1
            continue
        budget = args.part_budget_s
        if args.total_budget_s is not None:
            budget = min(budget, args.total_budget_s - (now - begin) - 5)
        deadline = now + budget * 0.6  # timed repetitions stop early past this point
        t0 = time.monotonic()
        signal.setitimer(signal.ITIMER_REAL, budget)
        try:
            r = bench.run(name, deadline)
            signal.setitimer(signal.ITIMER_REAL, 0)
            fields = " ".join(f"{k}={v:.4f}" if isinstance(v, float) else f"{k}={v}" for k, v in r.items())
            print(f"RESULT name={name} {fields} part_s={time.monotonic() - t0:.1f}", flush=True)
        except BaseException as e:  # report, clean up, go on (KeyboardInterrupt included)
            signal.setitimer(signal.ITIMER_REAL, 0)
            traceback.print_exc()
            failed += 1
            what = "timeout" if isinstance(e, PartTimeout) else type(e).__name__
            print(f"RESULT name={name} error={what}:{one_line(e)}", flush=True)
            if name.endswith("_compile"):
                bench.resnet_compiled = None
                try:
                    torch._dynamo.reset()
                except Exception:
                    pass
            if isinstance(e, KeyboardInterrupt):
                break
    print(f"RESULT name=total seconds={time.monotonic() - begin:.1f} failed={failed}", flush=True)
    return 0 if failed == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
