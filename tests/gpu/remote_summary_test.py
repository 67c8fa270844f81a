#!/usr/bin/env python3
"""CI test (no GPU) of the remote comparison's reporting: remote_summary.py on small synthetic
logs (tables, ratios, targets, PASS/FAIL, equality, missing and cut-off logs), and
remote_compare.sh on a build folder without GPU programs (it must end within its budget and still
write the summary and the tarball)."""
import os
import py_compile
import re
import subprocess
import sys
import tarfile
import tempfile
import time
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import remote_summary  # noqa: E402

STEPS = [
    ("micro", "micro", "native", 0, 21000), ("micro", "micro", "shm", 0, 22000), ("micro", "micro", "tcp", 0, 23000),
    ("models-key", "models-key", "native", 0, 30000), ("models-key", "models-key", "shm", 1, 31000),
    ("models-key", "models-key", "tcp", 124, 240000),
    ("checks", "checks", "native", 0, 50000), ("checks", "checks", "shm", 0, 60000),
    ("checks", "compare-checks", "shm", 0, 3000), ("checks", "checks", "tcp", 1, 61000),
    ("checks", "compare-checks", "tcp", 1, 3000),
    ("driver", "alloc-mem_alloc", "native", 0, 900), ("driver", "alloc-mem_alloc", "shm", 0, 1000),
    ("driver", "alloc-mem_alloc", "tcp", 0, 1100),
    ("driver", "rt-smoke", "native", 0, 500), ("driver", "rt-smoke", "shm", -3, 0), ("driver", "rt-smoke", "tcp", -2, 0),
    ("driver", "launch", "native", 0, 4000), ("driver", "launch", "shm", 0, 4000), ("driver", "launch", "tcp", 124, 60000),
    ("driver", "tenant-kernel", "native", -1, 0), ("driver", "tenant-kernel", "shm", 127, 10),
    ("samples", "samples", "native", 0, 30000), ("samples", "samples", "shm", 1, 35000),
    ("samples", "samples", "tcp", 1, 36000),
]

SAMPLES_NATIVE = """$ samples
SAMPLE vecadd_driver PASS 1M floats
RESULT vecadd_driver 00000000000000aa
EXPECT_LINE device_printf samples printf block=0 thread=0 value=500
EXPECT_LINE device_printf samples printf block=1 thread=3 value=513
samples printf block=1 thread=3 value=513
samples printf block=0 thread=0 value=500
SAMPLE device_printf PASS 2 device lines on stdout
RESULT device_printf 0000000000000002
SAMPLE graph_update PASS capture + update
RESULT graph_update 00000000000000bb
SAMPLES ran=3 failed=0
"""

LOGS = {
    "micro-native.log": """$ remote_micro
RESULT device=NVIDIA H100 80GB HBM3
RESULT burst=256
RESULT launch_ns_mean=2000.000
RESULT record_ns_mean=1000.000
RESULT stream_sync_us_p50=5.000
RESULT stream_sync_us_mean=6.000
RESULT bw_sizes=4KiB,1GiB
RESULT htod_pinned_4KiB_gbps=2.000
RESULT htod_pinned_4KiB_us=2.048
RESULT htod_pinned_1GiB_gbps=50.000
RESULT dtoh_pinned_1GiB_gbps=40.000
RESULT htod_pageable_1GiB_gbps=20.000
RESULT copy_check=ok
RESULT status=ok
""",
    "micro-shm.log": """RESULT burst=256
RESULT launch_ns_mean=400.000
RESULT record_ns_mean=300.000
RESULT stream_sync_us_p50=8.000
RESULT stream_sync_us_mean=9.500
RESULT htod_pinned_4KiB_gbps=1.000
RESULT htod_pinned_1GiB_gbps=48.000
RESULT dtoh_pinned_1GiB_gbps=39.000
RESULT htod_pageable_1GiB_gbps=17.000
RESULT copy_check=ok
RESULT status=ok
""",
    # Cut off in the middle of a line: what a killed process leaves.
    "micro-tcp.log": """RESULT launch_ns_mean=800.000
RESULT stream_sync_us_p50=50.000
RESULT htod_pinned_1GiB_gbps=10.000
RESULT htod_pinned_4KiB_gb""",
    "models-key-native.log": """RESULT name=env device=NVIDIA_H100 torch=2.11.0
RESULT name=resnet50_b64_eager ms=20.0000 gpu_ms=19.9000 ms_min=19.8 ms_max=20.2 reps=5 iters=15 images_per_s=3200.0000 part_s=4.1
RESULT name=gpt2_fwd_b1_s128 ms=4.0000 gpu_ms=3.9000 reps=5 iters=75 tokens_per_s=32000.0000 part_s=2.0
RESULT name=total seconds=12.0 failed=0
""",
    "models-key-shm.log": """RESULT name=env device=NVIDIA_H100 torch=2.11.0
RESULT name=resnet50_b64_eager ms=20.4000 gpu_ms=20.1000 reps=5 iters=15 images_per_s=3137.2549 part_s=4.3
RESULT name=gpt2_fwd_b1_s128 error=RuntimeError: CUDA error: operation not supported | see log
RESULT name=total seconds=14.0 failed=1
""",
    "checks-native.log": """RESULT check=eager_ops status=PASS seconds=1.5
RESULT check=sdpa status=PASS seconds=0.7
RESULT checks_passed=2 checks_failed=0
""",
    "checks-shm.log": """RESULT check=eager_ops status=PASS seconds=2.5
RESULT check=sdpa status=PASS seconds=0.9
""",
    "compare-checks-shm.log": """RESULT compare=eager_ops status=EQUAL note=19 tensors bit-identical
RESULT compare=sdpa status=EQUAL note=2 tensors bit-identical, 2 within tolerance
""",
    "checks-tcp.log": """RESULT check=eager_ops status=PASS seconds=2.6
RESULT check=sdpa status=FAIL seconds=0.2 error=AssertionError: sdpa causal=True vs math: max |diff| 3 beyond
""",
    "compare-checks-tcp.log": """RESULT compare=eager_ops status=DIFF note=randn max|diff|=0.5
RESULT compare=sdpa status=MISSING note=no other output
""",
    "alloc-mem_alloc-native.log": "RESULT total_mib=2048\nRESULT status=max_reached\nRESULT realloc=ok\n",
    "alloc-mem_alloc-shm.log": "RESULT total_mib=2048\nRESULT status=max_reached\nRESULT realloc=ok\n",
    "alloc-mem_alloc-tcp.log": "RESULT total_mib=1024\nRESULT status=max_reached\nRESULT realloc=ok\n",
    "rt-smoke-native.log": "RESULT values_wrong=0\nRESULT total_mib=81000\nRESULT verdict=PASS\n",
    "rt-smoke-shm.log": "SKIPPED: time budget spent\n",
    "launch-native.log": "RESULT mean_ns=3800.000\nRESULT launches_per_s=261000.0\nRESULT launch_error=CUDA_SUCCESS\n",
    "launch-shm.log": "RESULT mean_ns=3000.000\nRESULT launches_per_s=250000.0\nRESULT launch_error=CUDA_SUCCESS\n",
    "tenant-kernel-native.log": "MISSING: compute_tenant not built\n",
    "samples-native.log": SAMPLES_NATIVE,
    # graph_update fails over shm (no result); everything else as natively.
    "samples-shm.log": SAMPLES_NATIVE.replace("SAMPLE graph_update PASS capture + update\nRESULT graph_update 00000000000000bb",
                                              "SAMPLE graph_update FAIL cudaGraphExecUpdate: cudaErrorNotSupported | x"),
    # Over TCP one device line never arrived (the program still said PASS) and a result differs.
    "samples-tcp.log": SAMPLES_NATIVE.replace("samples printf block=1 thread=3 value=513\nsamples printf block=0",
                                              "samples printf block=0").replace("00000000000000aa", "00000000000000ab"),
}


def write_logs(root):
    with open(os.path.join(root, "steps.tsv"), "w") as f:
        for phase, prog, mode, rc, ms in STEPS:
            f.write(f"{phase}\t{prog}\t{mode}\t{rc}\t{ms}\t{prog}-{mode}.log\n")
        f.write("garbage line without tabs\nmicro\tmicro\tnative\tnot-a-number\t1\tx.log\n")
    for name, text in LOGS.items():
        with open(os.path.join(root, name), "w") as f:
            f.write(text)


def row(text, first_cell):
    """The Markdown table row whose first cell is first_cell, as a list of cells."""
    for line in text.splitlines():
        cells = [c.strip().replace("\\|", "|") for c in re.split(r"(?<!\\)\|", line.strip().strip("|"))]
        if line.startswith("|") and cells[0] == first_cell:
            return cells
    raise AssertionError(f"no row '{first_cell}' in:\n{text}")


class SummaryTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.TemporaryDirectory()
        write_logs(cls.tmp.name)
        cls.text = remote_summary.write_summary(cls.tmp.name, elapsed=300, budget=540)

    @classmethod
    def tearDownClass(cls):
        cls.tmp.cleanup()

    def test_micro_numbers_have_remote_over_native_ratios(self):
        self.assertEqual(row(self.text, "launch_ns_mean")[1:], ["2,000", "400.0", "0.200", "800.0", "0.400"])
        self.assertEqual(row(self.text, "stream_sync_us_p50")[1:], ["5.00", "8.00", "1.600", "50.00", "10.000"])
        # Only in native and shm; the cut-off tcp log gives '-' cells, not a crash.
        self.assertEqual(row(self.text, "record_ns_mean")[1:], ["1,000", "300.0", "0.300", "-", "-"])

    def test_bandwidth_rows_per_direction_memory_and_size(self):
        self.assertEqual(row(self.text, "htod pinned 1GiB")[1:], ["50.00", "48.00", "0.960", "10.00", "0.200"])
        self.assertEqual(row(self.text, "htod pinned 4KiB")[1:], ["2.00", "1.00", "0.500", "-", "-"])
        self.assertEqual(row(self.text, "dtoh pinned 1GiB")[1:3], ["40.00", "39.00"])
        text = self.text
        self.assertLess(text.index("| htod pinned 4KiB |"), text.index("| htod pinned 1GiB |"))
        self.assertLess(text.index("| htod pinned 1GiB |"), text.index("| htod pageable 1GiB |"))

    def test_model_times_and_errors(self):
        self.assertEqual(row(self.text, "resnet50_b64_eager ms")[1:], ["20.00", "20.40", "1.020", "-", "-"])
        self.assertEqual(row(self.text, "gpt2_fwd_b1_s128 ms")[1:4], ["4.00", "error", "-"])
        self.assertNotIn("| env ", self.text)
        self.assertNotIn("resnet50_b64_eager reps", self.text)
        self.assertIn("- gpt2_fwd_b1_s128 (shm): RuntimeError: CUDA error: operation not supported | see log", self.text)

    def test_targets(self):
        launch = row(self.text, "async call client cost (cuLaunchKernel, mean) <= 500 ns")
        self.assertEqual(launch[1:], ["400.0 ns", "yes", "800.0 ns", "**no**"])
        rtt = row(self.text, "sync round trip (cuStreamSynchronize idle, p50) <= 10 µs shm, 40 µs tcp")
        self.assertEqual(rtt[1:], ["8.00 µs", "yes", "50.00 µs", "**no**"])
        # Bandwidth targets are for shared memory only: TCP's ratio is shown, not judged.
        pinned = row(self.text, "htod pinned bandwidth at 1GiB >= 95% of native (ratio; shm only)")
        self.assertEqual(pinned[1:], ["0.960", "yes", "0.200", "-"])
        pageable = row(self.text, "htod pageable bandwidth at 1GiB >= 80% of native (ratio; shm only)")
        self.assertEqual(pageable[1:3], ["0.850", "yes"])
        resnet = row(self.text, "resnet50_b64_eager time remote/native <= 1.03 shm, 1.08 tcp")
        self.assertEqual(resnet[1:], ["1.020", "yes", "-", "-"])

    def test_program_status_and_equality(self):
        self.assertEqual(row(self.text, "micro")[1:4], ["PASS (21.0 s)", "PASS (22.0 s)", "PASS (23.0 s)"])
        self.assertEqual(row(self.text, "micro")[4], "equal (same copy_check, status)")
        alloc = row(self.text, "alloc-mem_alloc")
        self.assertTrue(alloc[4].startswith("equal"))
        self.assertEqual(alloc[5], "**DIFFERENT** (total_mib: 2048 vs 1024)")
        rt = row(self.text, "rt-smoke")
        self.assertEqual(rt[2:4], ["SKIP (time budget spent)", "FAIL (no worker)"])
        self.assertEqual(rt[4:], ["- (shm did not run)", "- (tcp did not run)"])
        launch = row(self.text, "launch")
        self.assertEqual(launch[3], "FAIL (timed out after 60.0 s)")
        self.assertEqual(row(self.text, "tenant-kernel")[1:3], ["FAIL (not built)", "FAIL (exit 127)"])
        models = row(self.text, "models-key")
        self.assertEqual(models[2], "FAIL (exit 1 no number: gpt2_fwd_b1_s128)")
        self.assertEqual(models[4], "**DIFFERENT** (measured natively only: gpt2_fwd_b1_s128)")
        checks = row(self.text, "checks")
        self.assertEqual(checks[4], "equal (2 checks equal)")
        self.assertTrue(checks[5].startswith("**DIFFERENT** (eager_ops: DIFF"), checks[5])
        self.assertNotIn("| compare-checks |", self.text)

    def test_samples_per_sample_and_mode(self):
        self.assertEqual(row(self.text, "vecadd_driver")[1:], ["PASS", "PASS", "PASS", "equal",
                                                              "**DIFFERENT** (00000000000000ab vs 00000000000000aa)"])
        graph = row(self.text, "graph_update")
        self.assertEqual(graph[2], "FAIL (cudaGraphExecUpdate: cudaErrorNotSupported | x)")
        self.assertEqual(graph[4], "**DIFFERENT** (no result)")
        printf = row(self.text, "device_printf")
        self.assertEqual(printf[1:3], ["PASS", "PASS"])
        self.assertEqual(printf[3], "FAIL (1 expected lines not on stdout)")
        program = row(self.text, "samples")
        self.assertEqual(program[1:4], ["PASS (30.0 s)", "FAIL (exit 1)", "FAIL (exit 1)"])
        self.assertEqual(program[4], "**DIFFERENT** (differ: graph_update)")
        self.assertEqual(program[5], "**DIFFERENT** (differ: vecadd_driver)")

    def test_checks_table(self):
        sdpa = row(self.text, "sdpa")
        self.assertEqual(sdpa[1], "PASS (0.7 s)")
        self.assertTrue(sdpa[3].startswith("FAIL (AssertionError"), sdpa[3])
        self.assertEqual(sdpa[4], "EQUAL (2 tensors bit-identical, 2 within tolerance)")
        self.assertEqual(sdpa[5], "MISSING (no other output)")

    def test_empty_logs_folder_still_gives_a_summary(self):
        with tempfile.TemporaryDirectory() as empty:
            text = remote_summary.write_summary(empty)
        self.assertIn("(no numbers in the logs)", text)
        self.assertIn("(no steps.tsv)", text)
        self.assertNotIn("failed:", text)

    def test_command_line_writes_the_file(self):
        out = os.path.join(self.tmp.name, "summary.md")
        subprocess.run([sys.executable, os.path.join(HERE, "remote_summary.py"), "--logs", self.tmp.name, "--out", out,
                        "--elapsed", "12", "--budget", "540"], check=True, capture_output=True, timeout=60)
        with open(out) as f:
            self.assertIn("Run time 12 s of a 540 s budget", f.read())


class TorchScriptsTest(unittest.TestCase):
    """The PyTorch programs compile, and refuse bad flags before importing torch."""
    SCRIPTS = [os.path.join(HERE, "torch_remote.py"), os.path.join(HERE, "..", "..", "bench", "gpu", "torch_models.py"),
               os.path.join(HERE, "..", "..", "bench", "gpu", "gpt2_probe.py")]

    def test_scripts_compile(self):
        for path in self.SCRIPTS:
            py_compile.compile(path, cfile=os.path.join(tempfile.gettempdir(), "tf_rs_check.pyc"), doraise=True)

    def test_bad_flags_are_refused_with_a_reason(self):
        for args, reason in ((["--parts", "resnet50_b64_eager,bogus"], "unknown part 'bogus'"),
                             (["--reps", "0"], "must be > 0"),
                             (["--checks", "eager_ops,bogus"], "unknown checks ['bogus']"),
                             (["--check-budget-s", "-1", "--out", "x"], "budgets must be > 0"),
                             (["--steps", "0"], "every count must be positive")):
            script = (self.SCRIPTS[0] if args[0].startswith("--check") else
                      self.SCRIPTS[2] if args[0] == "--steps" else self.SCRIPTS[1])
            proc = subprocess.run([sys.executable, script] + args, capture_output=True, text=True, timeout=60)
            self.assertEqual(proc.returncode, 2, proc.stderr)
            self.assertIn(reason, proc.stderr)


class CompareScriptTest(unittest.TestCase):
    def test_build_without_gpu_programs_ends_with_a_summary(self):
        with tempfile.TemporaryDirectory() as tmp:
            build, out = os.path.join(tmp, "build"), os.path.join(tmp, "out")
            os.makedirs(build)
            # No torch is needed: an interpreter without it makes every PyTorch step fail at once.
            env = dict(os.environ, TF_REMOTE_BUDGET_S="90", PYTHON=sys.executable, TF_REMOTE_PORT="0")
            t0 = time.monotonic()
            proc = subprocess.run(["bash", os.path.join(HERE, "remote_compare.sh"), build, out], env=env,
                                  capture_output=True, text=True, timeout=150)
            self.assertLess(time.monotonic() - t0, 120)
            self.assertEqual(proc.returncode, 1, proc.stdout + proc.stderr)
            with open(os.path.join(out, "remote-summary.md")) as f:
                text = f.read()
            self.assertEqual(row(text, "micro")[1:4], ["FAIL (not built)"] * 3)
            # No tfusion in the build: every remote step is reported, none hangs.
            self.assertTrue(row(text, "checks")[2].startswith("FAIL (no worker)"), row(text, "checks"))
            with tarfile.open(os.path.join(out, "remote-logs.tar.gz")) as tar:
                names = tar.getnames()
            self.assertIn("logs/steps.tsv", names)
            self.assertIn("logs/micro-native.log", names)
            self.assertEqual(row(text, "samples")[1:4], ["FAIL (not built)"] * 3)
            self.assertIn("(no sample results in the logs)", text)

    def test_bad_settings_are_refused(self):
        with tempfile.TemporaryDirectory() as tmp:
            env = dict(os.environ, TF_REMOTE_PHASES="micro,bogus")
            proc = subprocess.run(["bash", os.path.join(HERE, "remote_compare.sh"), tmp, tmp], env=env,
                                  capture_output=True, text=True, timeout=30)
            self.assertEqual(proc.returncode, 2)
            self.assertIn("unknown phase 'bogus'", proc.stderr)


if __name__ == "__main__":
    unittest.main()
