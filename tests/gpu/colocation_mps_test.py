#!/usr/bin/env python3
"""CI test (no GPU, no MPS) of colocation.py's mps phase: the harness starts its private MPS
daemon, runs every tenant of its groups as a client of it (native tenants with the pipe directory,
limiter tenants through `tfusion run --mps-pipe-dir`, whose limits become the MPS variables), and
stops the daemon at the end, also when it is interrupted; without the binary the phase says so.

Stand-ins: `nvidia-cuda-mps-control` is a script that makes the control FIFO on -d and records
what it is told; the tenant interpreter (--python) is a script that reports its MPS environment
instead of running PyTorch. `tfusion run` is the real one, in front of the fake driver and NVML.
usage: colocation_mps_test.py BUILD_DIR FAKECUDA FAKENVML"""
import os
import signal
import stat
import subprocess
import sys
import tempfile
import time
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "common"))
from tf_process import remove_fake_driver_shm  # noqa: E402
BUILD, FAKECUDA, FAKENVML = sys.argv[1:4] if len(sys.argv) >= 4 else ("", "", "")

MPS_CONTROL = """#!/bin/sh
log="$CUDA_MPS_LOG_DIRECTORY/control.log"
if [ "$1" = "-d" ]; then
  mkfifo "$CUDA_MPS_PIPE_DIRECTORY/control" && echo "started $CUDA_MPS_PIPE_DIRECTORY" >> "$log"
  exit $?
fi
read -r cmd
echo "$cmd" >> "$log"
[ "$cmd" = quit ] && rm -f "$CUDA_MPS_PIPE_DIRECTORY/control"
exit 0
"""

TENANT = """#!/usr/bin/env python3
import os, sys, time
args = sys.argv[2:]
ready, go = args[args.index("--ready") + 1], args[args.index("--go") + 1]
for k in sorted(os.environ):
    if k.startswith("CUDA_MPS_"):
        print(f"{k}={os.environ[k]}", flush=True)
open(ready, "w").close()
while not os.path.exists(go):
    time.sleep(0.01)
time.sleep(float(os.environ.get("STANDIN_TENANT_SECONDS", "0.1")))
print("items_per_s=100.00 iters=10 seconds=0.1")
"""


def write_exe(path, text):
    with open(path, "w") as f:
        f.write(text)
    os.chmod(path, os.stat(path).st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)


class MpsPhase(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory(prefix="tf-coloc-mps-")
        self.shm = f"/tf-coloc-mps-{os.getpid()}"  # the fake driver's shared memory
        d = self.tmp.name
        self.out = os.path.join(d, "out")
        self.bin = os.path.join(d, "bin")
        os.makedirs(self.bin)
        write_exe(os.path.join(self.bin, "nvidia-cuda-mps-control"), MPS_CONTROL)
        self.tenant = os.path.join(d, "tenant")
        write_exe(self.tenant, TENANT)
        self.env = dict(os.environ, TFUSION_SHM_DIR=os.path.join(d, "shm"), TFUSION_REAL_LIBCUDA=FAKECUDA,
                        TFUSION_REAL_LIBNVML=FAKENVML, FAKECUDA_SHM_NAME=self.shm)
        self.env.pop("CUDA_MPS_PIPE_DIRECTORY", None)

    def tearDown(self):
        self.tmp.cleanup()
        remove_fake_driver_shm(self.shm)

    def start(self, with_daemon=True, extra_env=None):
        env = dict(self.env, **(extra_env or {}))
        env["PATH"] = (self.bin + ":" if with_daemon else "") + "/usr/bin:/bin"
        cmd = [sys.executable, os.path.join(HERE, "colocation.py"), "--build", BUILD, "--out", self.out,
               "--phases", "mps", "--mps", "mps", "--seconds", "0.3", "--budget-s", "200", "--python", self.tenant]
        return subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)

    def control_log(self):
        try:
            with open(os.path.join(self.out, "mps", "log", "control.log")) as f:
                return f.read()
        except FileNotFoundError:
            return ""

    def tenant_logs(self):
        logs = {}
        folder = os.path.join(self.out, "logs")
        for name in sorted(os.listdir(folder)):
            if name.endswith(".log") and "mps-" in name:
                with open(os.path.join(folder, name)) as f:
                    logs[name] = f.read()
        return logs

    def test_every_tenant_runs_under_the_daemon_and_the_daemon_is_stopped(self):
        p = self.start()
        text, _ = p.communicate(timeout=240)
        self.assertEqual(p.returncode, 0, text)
        pipe = os.path.join(self.out, "mps", "pipe")
        self.assertEqual(self.control_log(), f"started {pipe}\nquit\n", text)
        self.assertFalse(os.path.exists(os.path.join(pipe, "control")))
        with open(os.path.join(self.out, "colocation.md")) as f:
            md = f.read()
        for table in ("### mps-noisy:", "### mps-coloc:"):
            self.assertIn(table, md)
        self.assertNotIn("| - |", md.split("### mps-coloc:")[1], "every tenant reported a result\n" + md)
        logs = self.tenant_logs()
        tfusion_run = os.path.join(BUILD, "src/cli/tfusion") + " run "
        limiter = [t for t in logs.values() if t.startswith("$ " + tfusion_run)]
        native = [t for t in logs.values() if not t.startswith("$ " + tfusion_run)]
        self.assertTrue(native and limiter, logs)
        for t in native:
            self.assertIn(f"CUDA_MPS_PIPE_DIRECTORY={pipe}\n", t)
            self.assertNotIn("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE", t)
        for t in limiter:
            self.assertIn(f"--mps-pipe-dir {pipe}", t.splitlines()[0])
            self.assertIn(f"CUDA_MPS_PIPE_DIRECTORY={pipe}\n", t)
            # The active thread percentage is the tenant's limit: 100 with --percent-limit 100.
            want = "100" if "--percent-limit 100" in t.splitlines()[0] else "25"
            self.assertIn(f"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE={want}\n", t, t)
            self.assertIn("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=8192M\n", t)

    def test_without_the_binary_the_phase_says_so_and_is_skipped(self):
        p = self.start(with_daemon=False)
        text, _ = p.communicate(timeout=120)
        self.assertEqual(p.returncode, 0, text)
        with open(os.path.join(self.out, "colocation.md")) as f:
            self.assertIn("(phase mps skipped: nvidia-cuda-mps-control is not on PATH)", f.read())
        self.assertFalse(os.path.exists(os.path.join(self.out, "logs")) and self.tenant_logs())

    def test_a_signal_still_stops_the_daemon(self):
        p = self.start(extra_env={"STANDIN_TENANT_SECONDS": "60"})
        work = os.path.join(self.out, "work")
        deadline = time.monotonic() + 60
        # Until the first group's tenants have been told to go (they then run for a minute).
        while time.monotonic() < deadline and not (os.path.isdir(work) and
                                                   any(f.endswith(".go") for f in os.listdir(work))):
            time.sleep(0.05)
        p.send_signal(signal.SIGTERM)
        text, _ = p.communicate(timeout=120)
        self.assertEqual(p.returncode, 143, text)
        self.assertTrue(self.control_log().endswith("quit\n"), self.control_log() + text)


if __name__ == "__main__":
    if not (BUILD and FAKECUDA and FAKENVML):
        sys.exit(__doc__)
    unittest.main(argv=sys.argv[:1])
