#!/usr/bin/env python3
"""Where a GPT-2 forward step's time goes, natively or through the remote stub (run it under
`tfusion run --remote ...` for the remote modes; same arguments in every mode).

Prints one JSON object on stdout:
  step_ms / host_ms / gpu_ms   one synchronize-bracketed step at a time (medians): wall time, the
                               time until model() returned (launching, plus any synchronous wait
                               inside the step), and the GPU span between events around the step
  loop_ms                      steps back to back, synchronized once per repetition (medians)
  nosync_loop_ms               the same with position ids passed in (no synchronous call inside
                               the step when the model allows; syncs_per_step_pos says)
  graph_ms                     the step captured once in a CUDA graph and replayed: GPU time alone
  launch_us / sync_us / item_us  a small kernel's launch cost on the host, a synchronize of an
                               idle GPU, a one-element copy to the host (medians of batches)
  syncs_per_step_plain / _pos, sync_where  synchronizing operations per step and where (torch's
                               sync debug mode; its one-time "prototype feature" notice not counted)
"""
import argparse
import json
import os
import statistics
import sys
import time
import traceback
import warnings


def med(xs):
    return round(statistics.median(xs), 4) if xs else None


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq", type=int, default=512)
    ap.add_argument("--steps", type=int, default=25, help="single synchronized steps")
    ap.add_argument("--loops", type=int, default=7, help="back-to-back repetitions")
    ap.add_argument("--loop-iters", type=int, default=20, help="steps per back-to-back repetition")
    args = ap.parse_args()
    if min(args.batch, args.seq, args.steps, args.loops, args.loop_iters) <= 0:
        ap.error("every count must be positive")

    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    out = {"mode": "remote" if os.environ.get("TFUSION_REMOTE") else "native"}
    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config()).cuda().half().eval()
    gen = torch.Generator(device="cuda").manual_seed(1)
    ids = torch.randint(0, model.config.vocab_size, (args.batch, args.seq), device="cuda", generator=gen)
    pos = torch.arange(args.seq, device="cuda").unsqueeze(0).expand(args.batch, -1)

    def plain():
        return model(input_ids=ids, use_cache=False)

    def with_pos():
        return model(input_ids=ids, position_ids=pos, use_cache=False)

    with torch.inference_mode():
        for _ in range(10):
            plain()
            with_pos()
        torch.cuda.synchronize()

        # Where the step synchronizes (natively; the remote stub has no torch-side difference).
        for name, fn in (("plain", plain), ("pos", with_pos)):
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                torch.cuda.set_sync_debug_mode("warn")
                fn()
                torch.cuda.set_sync_debug_mode("default")
            torch.cuda.synchronize()
            syncs = [str(w.message) for w in caught if "prototype feature" not in str(w.message)]
            out["syncs_per_step_" + name] = len(syncs)
            if syncs and name == "plain":
                out["sync_where"] = [m[:160] for m in syncs][:4]

        ev0 = torch.cuda.Event(enable_timing=True)
        ev1 = torch.cuda.Event(enable_timing=True)
        step, host, gpu = [], [], []
        for _ in range(args.steps):
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            ev0.record()
            plain()
            t1 = time.perf_counter()
            ev1.record()
            torch.cuda.synchronize()
            t2 = time.perf_counter()
            step.append((t2 - t0) * 1e3)
            host.append((t1 - t0) * 1e3)
            gpu.append(ev0.elapsed_time(ev1))
        out.update(step_ms=med(step), host_ms=med(host), gpu_ms=med(gpu))

        for key, fn in (("loop_ms", plain), ("nosync_loop_ms", with_pos)):
            reps = []
            for _ in range(args.loops):
                torch.cuda.synchronize()
                t0 = time.perf_counter()
                for _ in range(args.loop_iters):
                    fn()
                torch.cuda.synchronize()
                reps.append((time.perf_counter() - t0) * 1e3 / args.loop_iters)
            out[key] = med(reps)
            out[key + "_min"] = round(min(reps), 4)

        try:
            s = torch.cuda.Stream()
            s.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(s):
                for _ in range(3):
                    with_pos()
            torch.cuda.current_stream().wait_stream(s)
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g):
                with_pos()
            g.replay()
            torch.cuda.synchronize()
            reps = []
            for _ in range(args.loops):
                ev0.record()
                for _ in range(args.loop_iters):
                    g.replay()
                ev1.record()
                torch.cuda.synchronize()
                reps.append(ev0.elapsed_time(ev1) / args.loop_iters)
            out["graph_ms"] = med(reps)
            out["graph_ms_min"] = round(min(reps), 4)
            del g
        except Exception as e:  # noqa: BLE001 - report, keep the other numbers
            out["graph_error"] = f"{type(e).__name__}: {e}"[:200]

        x = torch.zeros(16, device="cuda")
        one = torch.ones(1, device="cuda")
        launch, sync, item = [], [], []
        for _ in range(7):
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            for _ in range(2000):
                x.add_(1.0)
            launch.append((time.perf_counter() - t0) * 1e6 / 2000)
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            for _ in range(200):
                torch.cuda.synchronize()
            sync.append((time.perf_counter() - t0) * 1e6 / 200)
            t0 = time.perf_counter()
            for _ in range(200):
                one.item()
            item.append((time.perf_counter() - t0) * 1e6 / 200)
        out.update(launch_us=med(launch), sync_us=med(sync), item_us=med(item))
    print(json.dumps(out), flush=True)


if __name__ == "__main__":
    try:
        main()
    except SystemExit:
        raise
    except Exception:
        traceback.print_exc()
        sys.exit(1)
