#!/usr/bin/env python3
"""Would big tenants that keep at most one kernel in flight let a batch-1 tenant beside them keep
its solo rate, natively, and at what cost to them? The noisy-neighbour groups of colocation.py
(ResNet-50 b1 beside three ResNet-50 b64), natively, with the big tenants as they are and under
CUDA_LAUNCH_BLOCKING=1 (each launch returns once its kernel is done), plus each set of big tenants
alone and the b1 tenant alone: warm groups (colocation.py --warm), their windows interleaved,
--rounds rounds (BUILD only locates the harness: nothing runs under tfusion).
  python3 tests/gpu/noisy_blocking.py --build BUILD --out OUT --rounds 3 --seconds 6
"""
import argparse, os, signal, sys, json
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import colocation as co
import tier_common as tc

ap = argparse.ArgumentParser()
ap.add_argument("--build", required=True)
ap.add_argument("--out", required=True)
ap.add_argument("--rounds", type=int, default=3)
ap.add_argument("--seconds", type=float, default=6)
ap.add_argument("--budget-s", type=float, default=400)
ap.add_argument("--variants", default="native,blocking")
a = ap.parse_args()
if a.rounds < 1 or a.seconds <= 0 or any(v not in ("native", "blocking") for v in a.variants.split(",")):
    raise SystemExit("--rounds must be >= 1, --seconds > 0, --variants of native and blocking")
args = argparse.Namespace(build=a.build, out=a.out, budget_s=a.budget_s, pin="auto", python=sys.executable,
                          busy_meter=False, seconds=a.seconds, rounds=a.rounds)
os.makedirs(a.out, exist_ok=True)
ctx = co.Ctx(args)
small, big = ("r50", 1), ("r50", 64)
envs = {"native": [], "blocking": ["env", "CUDA_LAUNCH_BLOCKING=1"]}
groups = [("solo", [([],) + small])]
for v in a.variants.split(","):
    groups.append((v, [([],) + small] + [(envs[v],) + big] * 3))
    groups.append((v + "-bigs", [(envs[v],) + big] * 3))
warm = [co.WarmGroup(ctx, name, tenants, a.rounds) for name, tenants in groups]
ctx.live = [p for g in warm for p in g.procs]
res = {name: [] for name, _ in groups}
try:
    ok = tc.wait_files([r for g in warm for r in g.readies], 300, ctx.live)
    for g in warm:
        g.signal(signal.SIGSTOP)
    print("ready", ok, flush=True)
    for rnd in range(a.rounds):
        for (name, _), g in zip(groups, warm):
            res[name].append(g.window(rnd))
            print(rnd, name, res[name][-1], flush=True)
finally:
    for g in warm:
        g.finish(15)
json.dump(res, open(os.path.join(a.out, "nbx.json"), "w"), indent=1)
def mean(x): return sum(x) / len(x) if x else float("nan")
for rnd in range(a.rounds):
    solo = res["solo"][rnd][0]
    for v in a.variants.split(","):
        r = res[v][rnd]
        print(f"round {rnd} {v}: b1 {r[0]:.1f} ({r[0]/solo:.3f} of solo {solo:.1f}); bigs {sum(r[1:]):.1f}; bigs alone {sum(res[v+'-bigs'][rnd]):.1f}")
