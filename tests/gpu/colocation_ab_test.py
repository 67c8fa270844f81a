#!/usr/bin/env python3
"""CI test (no GPU) of colocation.py's ab phase with --pin: every tenant of a group, native or under
`tfusion run`, runs on its own CPUs (the same ones for native and limited groups), the report gives
each variant's mean ratio over the rounds, a bad --pin is refused before anything is made, and with
--warm every round runs in the same tenants, the other groups' tenants stopped meanwhile.

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
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "common"))
from tf_process import remove_fake_driver_shm  # noqa: E402
BUILD, FAKECUDA, FAKENVML = sys.argv[1:4] if len(sys.argv) >= 4 else ("", "", "")

# Native tenants report 100 items/s, tenants under `tfusion run` (TFUSION_VGPU set) 90: ratios 0.900.
TENANT = """#!/usr/bin/env python3
import os, sys, time
args = sys.argv[2:]
ready, go = args[args.index("--ready") + 1], args[args.index("--go") + 1]
print("cpus=" + ",".join(map(str, sorted(os.sched_getaffinity(0)))), flush=True)
open(ready, "w").close()
rate = 90 if os.environ.get("TFUSION_VGPU") else 100
if "--windows" not in args:
    while not os.path.exists(go):
        time.sleep(0.01)
    print(f"items_per_s={rate}.00 iters=10 seconds=0.1")
    print("items_each_second=")
    sys.exit(0)
print(f"pid={os.getpid()}", flush=True)


def others():  # the states of the stand-in tenants of other groups (another --go), from /proc
    states = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/cmdline") as f:
                cmd = f.read().split("\\0")
            with open(f"/proc/{pid}/stat") as f:
                state = f.read().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if int(pid) != os.getpid() and sys.argv[0] in cmd and "--go" in cmd and cmd[cmd.index("--go") + 1] != go:
            states.append(state)
    return ",".join(sorted(states))


for k in range(int(args[args.index("--windows") + 1])):
    while not os.path.exists(f"{go}.{k}"):
        time.sleep(0.01)
    print(f"window={k} others={others()}")
    print(f"window={k} items_per_s={rate}.00 iters=10 seconds=0.1")
    print(f"window={k} items_each_second=", flush=True)
    open(f"{ready}.{k}", "w").close()
"""


class AbPhase(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory(prefix="tf-coloc-ab-")
        self.shm = f"/tf-coloc-ab-{os.getpid()}"  # the fake driver's shared memory
        d = self.tmp.name
        self.out = os.path.join(d, "out")
        self.tenant = os.path.join(d, "tenant")
        with open(self.tenant, "w") as f:
            f.write(TENANT)
        os.chmod(self.tenant, os.stat(self.tenant).st_mode | stat.S_IXUSR)
        self.env = dict(os.environ, TFUSION_SHM_DIR=os.path.join(d, "shm"), TFUSION_REAL_LIBCUDA=FAKECUDA,
                        TFUSION_REAL_LIBNVML=FAKENVML, FAKECUDA_SHM_NAME=self.shm)

    def tearDown(self):
        self.tmp.cleanup()
        remove_fake_driver_shm(self.shm)

    def run_ab(self, pin, more=(), rounds=2):
        cmd = [sys.executable, os.path.join(HERE, "colocation.py"), "--build", BUILD, "--out", self.out,
               "--phases", "ab", "--models", "r50:1", "--ns", "2", "--rounds", str(rounds), "--seconds", "0.2",
               "--ab-variants", "p50=50", "--budget-s", "200", "--python", self.tenant, "--pin", str(pin)] + list(more)
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

    def test_warm_groups_run_every_round_in_the_same_tenants_one_group_at_a_time(self):
        r = self.run_ab("auto", ["--warm"], rounds=3)
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        logs = os.path.join(self.out, "logs")
        tenant_logs = [n for n in sorted(os.listdir(logs)) if re.match(r"\d+-ab-r501-n2-(native|p50)\.\d\.log$", n)]
        self.assertEqual(len(tenant_logs), 4, sorted(os.listdir(logs)))  # two groups of two, started once
        for name in tenant_logs:
            with open(os.path.join(logs, name)) as f:
                text = f.read()
            self.assertEqual(len(re.findall(r"^pid=", text, re.M)), 1, text)
            for k in range(3):
                self.assertRegex(text, rf"(?m)^window={k} items_per_s=")
                # While a group's window runs, the other group's tenants (and their `tfusion run`) are
                # stopped; in the last round the group that ran first may have exited already.
                self.assertRegex(text, rf"(?m)^window={k} others=[tT](,[tT])+$" if k < 2 else
                                 rf"(?m)^window={k} others=([tT](,[tT])*)?$")
        with open(os.path.join(self.out, "colocation.md")) as f:
            md = f.read()
        self.assertEqual(md.count("| 200.0 | 180.0 (0.900) |"), 3, md)
        self.assertIn("| r50 | 1 | 2 | 0.900 (0.900-0.900, 3) |", md)
        # Nothing is left running (or stopped) after the phase.
        left = []
        for pid in filter(str.isdigit, os.listdir("/proc")):
            try:
                with open(f"/proc/{pid}/cmdline") as f:
                    if self.tenant in f.read().split("\0"):
                        left.append(pid)
            except OSError:
                pass
        self.assertEqual(left, [])

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
