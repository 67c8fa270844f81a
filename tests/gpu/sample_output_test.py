#!/usr/bin/env python3
"""CI test (no GPU) of the GPU tier's output comparisons: sample_output.py (what cuda_samples.sh
compares between a sample's native and remote stdout) on lines written in the form NVIDIA's
samples print them, its report on a synthetic run folder, cuda_samples.sh end to end with a
stand-in nvcc, nvidia-smi and tfusion, and framework_checks.py's VRAM-cap verdicts (frameworks.sh);
the two scripts parse (bash -n)."""
import os
import subprocess
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import sample_output as so  # noqa: E402

# Two runs of one sample as they print, differing only in what legitimately varies.
NATIVE = """[Matrix Multiply Using CUDA] - Starting...
GPU Device 0: "Hopper" with compute capability 9.0

MatrixA(320,320), MatrixB(640,320)
Computing result using CUDA Kernel...
done
Performance= 2436.12 GFlop/s, Time= 0.054 msec, Size= 131072000 Ops, WorkgroupSize= 1024 threads/block
Checking computed result for correctness: Result = PASS
histogram256() time (average) : 0.00003 sec, 21345.1234 MB/sec
Processing time: 3.141000 (ms)
Average clocks/block = 3064.156250
Expected time for serial execution of 32 sets of kernels is between 0.320s and 0.640s
Measured time for sample = 0.081s
transpose naive , Throughput = 812.4456 GB/s, Time = 0.01032 ms, Size = 1048576 fp32 elements, NumDevsUsed = 1, Workgroup = 256
Run at Thu Nov 26 23:14:05 2026 (2026-11-26) by pid 4242
Host buffer at 0x7f3a2c000000, device at 0x7f3a00000000
Device PCI Domain ID / Bus ID / location ID:   0 / 25 / 0
GPU 00000000:19:00.0
checksum = 1234.5678, errors = 0
"""
REMOTE = """[Matrix Multiply Using CUDA] - Starting...
GPU Device 0: "Hopper" with compute capability 9.0

MatrixA(320,320), MatrixB(640,320)
Computing result using CUDA Kernel...
done
Performance= 1998.7 GFlop/s, Time= 0.066 msec, Size= 131072000 Ops, WorkgroupSize= 1024 threads/block
Checking computed result for correctness: Result = PASS
histogram256() time (average) : 0.0001 sec, 7000 MB/sec
Processing time: 4.0 (ms)
Average clocks/block = 3071.5
Expected time for serial execution of 32 sets of kernels is between 0.320s and 0.640s
Measured time for sample = 0.112s
transpose naive , Throughput = 640 GB/s, Time = 0.0131 ms, Size = 1048576 fp32 elements, NumDevsUsed = 1, Workgroup = 256
Run at Fri Nov 27 00:01:59 2026 (2026-11-27) by pid 777\r
Host buffer at 0x55d0c0a01000, device at 0x7f0000200000
Device PCI Domain ID / Bus ID / location ID:   0 / 3 / 0
GPU 00000000:03:00.0
checksum = 1234.5678, errors = 0   
"""


class NormalizerTest(unittest.TestCase):
    def test_timings_rates_dates_pids_addresses_and_bus_ids_are_masked(self):
        self.assertEqual(so.compare("matrixMul", NATIVE, REMOTE), ("SAME", ""))
        n = so.normalize(NATIVE)
        self.assertIn("Performance= <R> GFlop/s, Time= <T> msec, Size= 131072000 Ops, "
                      "WorkgroupSize= 1024 threads/block", n)
        self.assertIn("histogram256() time (average) : <T> sec, <R> MB/sec", n)
        self.assertIn("Average clocks/block = <T>", n)
        self.assertIn("Run at <DATE> <CLOCK> 2026 (<DATE>) by pid <PID>", n)
        self.assertIn("Host buffer at <ADDR>, device at <ADDR>", n)
        self.assertIn("GPU <BUSID>", n)

    def test_results_sizes_and_error_counts_are_still_compared(self):
        for old, new in [("Result = PASS", "Result = FAIL"),
                         ("checksum = 1234.5678", "checksum = 1234.5679"),
                         ("errors = 0", "errors = 3"),
                         ("Size= 131072000 Ops", "Size= 131072 Ops"),
                         ("MatrixA(320,320)", "MatrixA(320,321)"),
                         ("compute capability 9.0", "compute capability 8.0")]:
            verdict, detail = so.compare("matrixMul", NATIVE, NATIVE.replace(old, new))
            self.assertEqual(verdict, "DIFFERENT", old)
            self.assertIn(new, detail)
            self.assertRegex(detail, r"^line \d+: native ")

    def test_the_first_differing_line_is_named_and_a_shorter_output_differs(self):
        verdict, detail = so.compare("matrixMul", NATIVE, NATIVE.replace("done\n", "done\nretrying\n"))
        self.assertEqual(verdict, "DIFFERENT")
        self.assertTrue(detail.startswith('line 7: native "Performance= <R>'), detail)
        self.assertIn('here "retrying"', detail)
        cut = "\n".join(NATIVE.splitlines()[:7])
        verdict, detail = so.compare("matrixMul", NATIVE, cut)
        self.assertEqual(verdict, "DIFFERENT")
        self.assertIn("(end of output)", detail)

    def test_words_that_contain_a_timing_word_or_a_unit_are_not_masked(self):
        for line in ["CUDA Driver Version / Runtime Version = 13.0 / 13.0", "Runtime = 2",
                     "Processing 1048576 elements", "Found 16 streams and 4 sets",
                     "[1, 3]:\t\tValue is:10", "Error count: 0", "simpleAtomicIntrinsics completed, returned OK"]:
            self.assertEqual(so.normalize_line(line), line)

    def test_lines_of_nvidia_samples_lose_only_their_timings_and_rates(self):
        cases = [
            (None, "MonteCarloEstimatePiP, Performance = 1234.56 sims/s, Time = 12.34(ms), NumDevsUsed = 1",
             "MonteCarloEstimatePiP, Performance = <R> sims/s, Time = <T>(ms), NumDevsUsed = 1"),
            (None, "FP64 TFLOPS: 50.1", "FP64 TFLOPS: <T>"),
            (None, "convolutionSeparable, Throughput = 1234.5678 MPixels/sec, Time = 0.00123 s, Size = 9437184 Pixels",
             "convolutionSeparable, Throughput = <R> MPixels/sec, Time = <T> s, Size = 9437184 Pixels"),
            (None, "Average convolutionRowsGPU() time: 0.123 msecs; //1234.5 Mpix/s",
             "Average convolutionRowsGPU() time: <T> msecs; //<R> Mpix/s"),
            (None, "Running saxpy with 1024 blocks x 256 threads = 0.123 ms 3.210 TB/s",
             "Running saxpy with 1024 blocks x 256 threads = <T> ms <R> TB/s"),
            (None, "2048 elements scanned in 0.012 ms -> 170.6 MegaElements/s",
             "2048 elements scanned in <T> ms -> <R> MegaElements/s"),
            (None, "time spent executing by the GPU: 12.34", "time spent executing by the GPU: <T>"),
            (None, "> 132 Multiprocessor(s) x 128 (Cores/Multiprocessor) = 16896 (Cores)",
             "> 132 Multiprocessor(s) x 128 (Cores/Multiprocessor) = 16896 (Cores)"),
            ("simpleStreams", "4 streams:\t1.23", "4 streams:\t<T>"),
            ("simpleStreams", "> array_size   = 16777216", "> array_size   = 16777216"),
            ("asyncAPI", "CPU executed 4059 iterations while waiting for GPU to finish",
             "CPU executed <T> iterations while waiting for GPU to finish"),
            ("asyncAPI", "time spent by CPU in CUDA calls: 0.02", "time spent by CPU in CUDA calls: <T>"),
            ("immaTensorCoreGemm", "TOPS: 201.53", "TOPS: <T>"),
            ("graphMemoryFootprint", "05:     FOOTPRINT: 335544320 bytes", "05:     FOOTPRINT: <T> bytes"),
            ("graphMemoryFootprint", "    FOOTPRINT: 0 bytes", "    FOOTPRINT: 0 bytes"),
            ("simplePitchLinearTexture", "Texture fetch rate (Mpix/s) for pitch linear: 1.23e+04; for array: 9.87e+03",
             "Texture fetch rate (Mpix/s) for pitch linear: <T>; for array: <T>"),
        ]
        for sample, line, want in cases:
            self.assertEqual(so.normalize_line(line, sample), want)
        # Rule 8 is the sample's own: another sample's "4 streams: 1.23" is a result.
        self.assertEqual(so.normalize_line("4 streams:\t1.23", "vectorAdd"), "4 streams:\t1.23")

    def test_unordered_samples_compare_lines_as_a_multiset(self):
        a = "[0, 0]:\t\tValue is:10\n[1, 0]:\t\tValue is:10\n"
        b = "[1, 0]:\t\tValue is:10\n[0, 0]:\t\tValue is:10\n"
        self.assertEqual(so.compare("simplePrintf", a, b)[0], "SAME")
        self.assertEqual(so.compare("vectorAdd", a, b)[0], "DIFFERENT")
        verdict, detail = so.compare("simplePrintf", a, a.replace("[1, 0]:\t\tValue is:10", "[1, 0]:\t\tValue is:11"))
        self.assertEqual(verdict, "DIFFERENT")
        self.assertIn("Value is:11", detail)

    def test_listed_nondeterministic_samples_are_not_compared_with_a_reason(self):
        verdict, why = so.compare("fp16ScalarProduct", "Result native operators\t: 1.0\n", "Result native operators\t: 2.0\n")
        self.assertEqual(verdict, "NOT COMPARED")
        self.assertIn("time", why)


class ReportTest(unittest.TestCase):
    def write(self, d, name, text):
        with open(os.path.join(d, name), "w") as f:
            f.write(text)

    def test_report_counts_pass_and_same_output_per_mode(self):
        with tempfile.TemporaryDirectory() as d:
            self.write(d, "list.txt", "0_Introduction/matrixMul\n0_Introduction/vectorAdd\n"
                                      "0_Introduction/fp16ScalarProduct\n0_Introduction/systemWideAtomics\n\n")
            out = {"matrixMul": NATIVE, "vectorAdd": "Test PASSED\nDone\n", "fp16ScalarProduct": "Result : 1\n",
                   "systemWideAtomics": "PASSED\n"}
            for s, text in out.items():
                self.write(d, f"native-{s}.status", "PASS\n")
                self.write(d, f"native-{s}.out", text)
            for m in ("shm", "tcp"):
                self.write(d, f"{m}-matrixMul.status", "PASS\n")
                self.write(d, f"{m}-matrixMul.out", REMOTE)
                self.write(d, f"{m}-fp16ScalarProduct.status", "PASS\n")
                self.write(d, f"{m}-fp16ScalarProduct.out", "Result : 2\n")
                self.write(d, f"{m}-systemWideAtomics.status", "FAIL(1)\n")
                self.write(d, f"{m}-systemWideAtomics.out", "")
            self.write(d, "shm-vectorAdd.status", "PASS\n")
            self.write(d, "shm-vectorAdd.out", "Test PASSED\nDone\n")
            self.write(d, "tcp-vectorAdd.status", "PASS\n")
            self.write(d, "tcp-vectorAdd.out", "Test FAILED at element 7\nDone\n")
            md = os.path.join(d, "samples.md")
            r = subprocess.run([sys.executable, os.path.join(HERE, "sample_output.py"), "report", d,
                                os.path.join(d, "list.txt"), "native shm tcp", md, "H100, driver 580"],
                               capture_output=True, text=True, timeout=60)
            self.assertEqual(r.returncode, 1, r.stdout + r.stderr)  # something failed or differed
            with open(md) as f:
                text = f.read()
        self.assertIn("H100, driver 580", text)
        self.assertIn("| matrixMul | PASS | PASS, same output | PASS, same output |", text)
        self.assertIn("| vectorAdd | PASS | PASS, same output | PASS, **DIFFERENT OUTPUT** |", text)
        self.assertIn("| systemWideAtomics | PASS | FAIL(1) | FAIL(1) |", text)
        self.assertIn("| fp16ScalarProduct | PASS | PASS, not compared | PASS, not compared |", text)
        self.assertIn("Samples: 4; PASS natively: 4.", text)
        self.assertIn("Of those, PASS over shm: 3; same output as native: 2, different: 0, not compared: 1.", text)
        self.assertIn("Of those, PASS over tcp: 3; same output as native: 1, different: 1, not compared: 1.", text)
        self.assertIn('- vectorAdd (tcp): line 1: native "Test PASSED" / here "Test FAILED at element 7"', text)
        self.assertIn("- fp16ScalarProduct: not compared: its inputs come from srand(time(NULL))", text)

    def test_a_run_where_everything_passed_with_the_same_output_exits_0(self):
        with tempfile.TemporaryDirectory() as d:
            self.write(d, "list.txt", "0_Introduction/vectorAdd\n")
            for m in ("native", "local", "shm"):
                self.write(d, f"{m}-vectorAdd.status", "PASS\n")
                self.write(d, f"{m}-vectorAdd.out", "Copy time 1.5 ms\nTest PASSED\n" if m != "shm" else "Copy time 9 ms\nTest PASSED\n")
            text, failed = so.report(d, os.path.join(d, "list.txt"), ["native", "local", "shm"])
        self.assertFalse(failed, text)
        self.assertIn("| vectorAdd | PASS | PASS, same output | PASS, same output |", text)


class FrameworkMemoryVerdictTest(unittest.TestCase):
    """framework_checks.py's memory parts under a VRAM cap (frameworks.sh passes --vram-mib)."""

    def setUp(self):
        import framework_checks
        self.fc = framework_checks

    def test_cupy_total_must_be_the_cap(self):
        gib = 1 << 30
        self.assertEqual(self.fc.total_verdict(8 * gib, 8192), "")
        self.assertIn("not the cap", self.fc.total_verdict(80 * gib, 8192))
        self.assertEqual(self.fc.total_verdict(80 * gib, 0), "")  # native: no cap to check

    def test_jax_bytes_limit_must_lie_within_the_cap(self):
        gib = 1 << 30
        self.assertEqual(self.fc.limit_verdict(6 * gib, 8192), "")       # 75% of the cap
        self.assertEqual(self.fc.limit_verdict(8 * gib, 8192), "")       # all of it
        self.assertIn("above the cap", self.fc.limit_verdict(60 * gib, 8192))  # the whole GPU's 75%
        self.assertIn("below half", self.fc.limit_verdict(1 * gib, 8192))
        self.assertIn("no bytes_limit", self.fc.limit_verdict(0, 8192))


FAKE_NVCC = r"""#!/usr/bin/env bash
# Stands in for nvcc: the "program" it builds prints what a sample prints; remotely (FAKE_REMOTE=1,
# set by the fake tfusion) one sample prints a different result and one fails.
if [ "$1" = --version ]; then echo "Cuda compilation tools, release 13.0, V13.0.88"; echo "Build"; exit 0; fi
out=""; src=""
while [ $# -gt 0 ]; do case $1 in -o) out=$2; shift ;; *.cu|*.cpp) src=$1 ;; esac; shift; done
name=$(basename "$(dirname "$src")")
[ "$name" = brokenBuild ] && { echo "error: no such header" >&2; exit 1; }
cat > "$out" <<PROG
#!/usr/bin/env bash
echo "[$name] - Starting..."
echo "Processing time: \$((RANDOM % 100)).\$RANDOM (ms)"
echo "stub log line" >&2
if [ "$name" = resultDiffers ] && [ -n "\${FAKE_REMOTE:-}" ]; then echo "checksum = 41"; else echo "checksum = 42"; fi
[ "$name" = failsRemotely ] && [ -n "\${FAKE_REMOTE:-}" ] && exit 1
echo "Result = PASS"
PROG
chmod +x "$out"
"""
FAKE_TFUSION = r"""#!/usr/bin/env bash
# Stands in for tfusion: a worker that only says it is ready, and `run` that marks remote runs.
case $1 in
  worker) while [ $# -gt 0 ]; do [ "$1" = --ready-file ] && touch "$2"; shift; done; exec sleep 300 ;;
  run) remote=""; while [ "$1" != -- ]; do [ "$1" = --remote ] && remote=1; shift; done; shift
       FAKE_REMOTE=$remote exec "$@" ;;
esac
exit 2
"""
FAKE_SMI = """#!/usr/bin/env bash
case "$*" in *compute_cap*) echo 9.0 ;; *) echo "NVIDIA H100 80GB HBM3, 580.159.04" ;; esac
"""


class CudaSamplesScriptTest(unittest.TestCase):
    """cuda_samples.sh end to end with a stand-in nvcc, nvidia-smi and tfusion: what it keeps and
    what samples.md says."""

    def test_outputs_are_kept_apart_and_compared_with_native(self):
        import tarfile
        with tempfile.TemporaryDirectory() as d:
            bindir, build, src, out = (os.path.join(d, x) for x in ("bin", "build", "samples", "out"))
            os.makedirs(os.path.join(build, "src", "cli"))
            os.makedirs(bindir)
            for path, text in ((os.path.join(bindir, "nvcc"), FAKE_NVCC), (os.path.join(bindir, "nvidia-smi"), FAKE_SMI),
                               (os.path.join(build, "src", "cli", "tfusion"), FAKE_TFUSION)):
                with open(path, "w") as f:
                    f.write(text)
                os.chmod(path, 0o755)
            names = ["sameEverywhere", "resultDiffers", "failsRemotely", "brokenBuild"]
            os.makedirs(os.path.join(src, "Common"))
            for n in names + ["notListed"]:
                os.makedirs(os.path.join(src, "Samples", "0_Introduction", n))
                open(os.path.join(src, "Samples", "0_Introduction", n, n + ".cu"), "w").close()
            os.makedirs(os.path.join(src, "Samples", "6_Performance", "otherFolder"))
            with open(os.path.join(src, "list.txt"), "w") as f:
                f.write("".join(f"0_Introduction/{n}\n" for n in names) + "6_Performance/otherFolder\n")
            env = dict(os.environ, PATH=bindir + os.pathsep + os.environ["PATH"], TF_SAMPLES_ONLY="0_Introduction",
                       TF_SAMPLES_MODES="native local tcp", TF_SAMPLES_BUDGET_S="120")
            r = subprocess.run(["bash", os.path.join(HERE, "cuda_samples.sh"), build, src, out], env=env,
                               capture_output=True, text=True, timeout=180)
            self.assertEqual(r.returncode, 1, r.stdout + r.stderr)
            with open(os.path.join(out, "samples.md")) as f:
                md = f.read()
            with tarfile.open(os.path.join(out, "samples-logs.tar.gz")) as t:
                members = set(t.getnames())
                native_out = t.extractfile("logs/runs/native-sameEverywhere.out").read().decode()
        self.assertIn("NVIDIA H100 80GB HBM3, 580.159.04", md)
        self.assertIn("| sameEverywhere | PASS | PASS, same output | PASS, same output |", md)
        self.assertIn("| resultDiffers | PASS | PASS, same output | PASS, **DIFFERENT OUTPUT** |", md)
        self.assertIn("| failsRemotely | PASS | PASS, same output | FAIL(1) |", md)
        self.assertIn("| brokenBuild | BUILD-FAIL | BUILD-FAIL | BUILD-FAIL |", md)
        self.assertNotIn("otherFolder", md)
        self.assertIn("Of those, PASS over tcp: 2; same output as native: 1, different: 1", md)
        self.assertIn('- resultDiffers (tcp): line 3: native "checksum = 42" / here "checksum = 41"', md)
        self.assertNotIn("stub log line", native_out)  # stderr is kept apart
        self.assertIn("Processing time:", native_out)
        self.assertIn("logs/runs/tcp-resultDiffers.err", members)
        self.assertIn("logs/build-brokenBuild.log", members)


class ScriptsParseTest(unittest.TestCase):
    def test_scripts_parse(self):
        for s in ("cuda_samples.sh", "frameworks.sh"):
            r = subprocess.run(["bash", "-n", os.path.join(HERE, s)], capture_output=True, text=True)
            self.assertEqual(r.returncode, 0, s + ": " + r.stderr)

    def test_cuda_samples_refuses_bad_settings_before_building(self):
        with tempfile.TemporaryDirectory() as d:
            env = dict(os.environ, TF_SAMPLES_MODES="native gpu")
            r = subprocess.run(["bash", os.path.join(HERE, "cuda_samples.sh"), d, d, d], env=env,
                               capture_output=True, text=True, timeout=60)
        self.assertEqual(r.returncode, 2)
        self.assertIn("unknown mode 'gpu'", r.stderr)


if __name__ == "__main__":
    unittest.main()
