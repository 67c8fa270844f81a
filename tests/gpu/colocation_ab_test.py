#!/usr/bin/env python3
"""CI test (no GPU) of colocation.py's ab phase with --pin: every tenant of a group, native or under
`tfusion run`, runs on its own CPUs (the same ones for native and limited groups), the report gives
each variant's mean ratio over the rounds, and a bad --pin is refused before anything is made.

The tenant interpreter (--python) is a stand-in that reports the CPUs it may run on and a rate
instead of running PyTorch; `tfusion run` is the real one, in front of the fake driver and NVML.
usage: colocation_ab_test.py BUILD_DIR FAKECUDA FAKENVML"""
import os
import re
import stat
import subprocess
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
BUILD, FAKECUDA, FAKENVML = sys.argv[1:4] if len(sys.argv) >= 4 else ("", "", "")

# Native tenants report 100 items/s, tenants under `tfusion run` (TFUSION_VGPU set) 90: ratios 0.900.
TENANT = """#!/usr/bin/env python3
import os, sys, time
args = sys.argv[2:]
ready, go = args[args.index("--ready") + 1], args[args.index("--go") + 1]
print("cpus=" + ",".join(map(str, sorted(os.sched_getaffinity(0)))), flush=True)
open(ready, "w").close()
while not os.path.exists(go):
    time.sleep(0.01)
rate = 90 if os.environ.get("TFUSION_VGPU") else 100
print(f"items_per_s={rate}.00 iters=10 seconds=0.1")
print("items_each_second=")
"""


class AbPhase(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory(prefix="tf-coloc-ab-")
        d = self.tmp.name
        self.out = os.path.join(d, "out")
        self.tenant = os.path.join(d, "tenant")
        with open(self.tenant, "w") as f:
            f.write(TENANT)
        os.chmod(self.tenant, os.stat(self.tenant).st_mode | stat.S_IXUSR)
        self.env = dict(os.environ, TFUSION_SHM_DIR=os.path.join(d, "shm"), TFUSION_REAL_LIBCUDA=FAKECUDA,
                        TFUSION_REAL_LIBNVML=FAKENVML, FAKECUDA_SHM_NAME=f"/tf-coloc-ab-{os.getpid()}")

    def tearDown(self):
        self.tmp.cleanup()

    def run_ab(self, pin):
        cmd = [sys.executable, os.path.join(HERE, "colocation.py"), "--build", BUILD, "--out", self.out,
               "--phases", "ab", "--models", "r50:1", "--ns", "2", "--rounds", "2", "--seconds", "0.2",
               "--ab-variants", "p50=50", "--budget-s", "200", "--python", self.tenant, "--pin", str(pin)]
        return subprocess.run(cmd, env=self.env, capture_output=True, text=True, timeout=240)

    def test_each_tenant_runs_on_its_own_cpus_natively_and_limited(self):
        allowed = sorted(os.sched_getaffinity(0))
        r = self.run_ab(1)
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        logs = os.path.join(self.out, "logs")
        seen = {}
        for name in sorted(os.listdir(logs)):
            m = re.match(r"\d+-ab-r501-n2-(native|p50)\.(\d)\.log$", name)
            if not m:
                continue
            with open(os.path.join(logs, name)) as f:
                text = f.read()
            cpus = re.search(r"^cpus=(.*)$", text, re.M)
            self.assertIsNotNone(cpus, text)
            seen.setdefault(m.group(1), set()).add((int(m.group(2)), cpus.group(1)))
        want = {(i, str(allowed[i % len(allowed)])) for i in (0, 1)}
        self.assertEqual(seen, {"native": want, "p50": want})
        with open(os.path.join(self.out, "colocation.md")) as f:
            md = f.read()
        # Both rounds' rows, then the mean over them.
        self.assertEqual(md.count("| 200.0 | 180.0 (0.900) |"), 2, md)
        self.assertIn("| r50 | 1 | 2 | 0.900 (0.900-0.900, 2) |", md)

    def test_auto_splits_the_cpus_among_a_groups_tenants(self):
        allowed = sorted(os.sched_getaffinity(0))
        r = self.run_ab("auto")
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        c = max(1, len(allowed) // 2)
        want = {",".join(map(str, sorted({allowed[(i * c + j) % len(allowed)] for j in range(c)}))) for i in (0, 1)}
        got = set()
        logs = os.path.join(self.out, "logs")
        for name in os.listdir(logs):
            if name.endswith(".log"):
                with open(os.path.join(logs, name)) as f:
                    got.add(re.search(r"^cpus=(.*)$", f.read(), re.M).group(1))
        self.assertEqual(got, want)

    def test_a_bad_pin_is_refused_and_nothing_is_made(self):
        for bad in ("-1", str(len(os.sched_getaffinity(0)) + 1), "two", "1.5"):
            r = self.run_ab(bad)
            self.assertNotEqual(r.returncode, 0)
            self.assertIn(f"--pin {bad}: must be auto, or 0 (off) to", r.stderr)
            self.assertFalse(os.path.exists(self.out))


if __name__ == "__main__":
    if not (BUILD and FAKECUDA and FAKENVML):
        sys.exit(__doc__)
    unittest.main(argv=sys.argv[:1])
