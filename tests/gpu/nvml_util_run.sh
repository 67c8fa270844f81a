#!/usr/bin/env bash
# NVML per-process utilization next to ResNet-50 tenants: bash tests/gpu/nvml_util_run.sh OUT_DIR
set -u
OUT=$1; B=.gpu/build
mkdir -p $OUT/w
cat > $OUT/w/r50.py <<'PY'
import sys, time, torch, torchvision
secs, bs = float(sys.argv[1]), int(sys.argv[2])
m = torchvision.models.resnet50().half().cuda().eval().to(memory_format=torch.channels_last)
x = torch.randn(bs, 3, 224, 224, device="cuda").half().to(memory_format=torch.channels_last)
with torch.inference_mode():
    for _ in range(10): m(x)
    torch.cuda.synchronize()
    n, t0 = 0, time.time()
    while time.time() - t0 < secs:
        m(x); torch.cuda.synchronize(); n += 1
print(f"bs={bs} ips={n * bs / (time.time() - t0):.1f}")
PY
probe() { # name then tenants "bs bs ..."
  name=$1; shift
  pids=()
  for bs in "$@"; do python3 $OUT/w/r50.py 14 $bs > $OUT/$name.$bs.$RANDOM.log 2>&1 & pids+=($!); done
  sleep 5
  echo "== $name: tenants $* pids ${pids[*]}"
  python3 tests/gpu/nvml_util_probe.py --seconds 7 --poll-ms 20
  wait
  cat $OUT/$name.*.log | grep ips
}
probe solo_b1 1
probe four_b1 1 1 1 1
probe one_b1_three_b64 1 64 64 64
probe solo_b64 64
