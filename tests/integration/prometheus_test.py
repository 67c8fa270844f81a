#!/usr/bin/env python3
"""A real Prometheus scrapes a real controller and a real node agent (on the fake driver, with two
fake GPUs); the series it stores must equal the controller's state, and every panel of the Grafana
dashboard must parse and return series.

Usage: prometheus_test.py TFUSION FAKE_LIB_DIR DASHBOARD_JSON
Needs `prometheus` on PATH (Debian's package). Everything lives in a temporary folder; ports are
chosen free; every wait polls against a deadline.
"""
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import unittest
import urllib.parse
import urllib.request

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "common"))
import tf_process  # noqa: E402
from tf_process import free_port, http_json, remove_fake_driver_shm, stop_processes  # noqa: E402

FAKE_SHM = f"/tf-prom-{os.getpid()}"  # the fake driver's shared memory, removed at the end

TFUSION, FAKE_LIB_DIR, DASHBOARD = (map(os.path.abspath, sys.argv[1:4]) if len(sys.argv) >= 4
                                    else (None, None, None))
MIB = 1024 * 1024
FAKE_GPU_MIB = 16384
DEADLINE_S = float(os.environ.get("TF_TEST_DEADLINE_S", "90"))


def wait_for(what, probe):
    return tf_process.wait_for(what, probe, DEADLINE_S)


class PrometheusScrapesTensorFusion(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.procs = []
        cls.logs = []
        cls.dir = tempfile.mkdtemp(prefix="tf-prometheus-")
        cls.token = "prom-test-" + os.urandom(8).hex()
        token_file = os.path.join(cls.dir, "token")
        with open(token_file, "w") as f:
            f.write(cls.token + "\n")
        os.chmod(token_file, 0o600)
        try:
            cls.start_controller()
            cls.start_agent()
            cls.start_prometheus(token_file)
        except BaseException:
            cls.tearDownClass()
            raise

    @classmethod
    def tearDownClass(cls):
        stop_processes(cls.procs)
        for f in cls.logs:
            f.close()
        shutil.rmtree(cls.dir, ignore_errors=True)
        remove_fake_driver_shm(FAKE_SHM)

    @classmethod
    def spawn(cls, name, argv, env=None):
        log = open(os.path.join(cls.dir, name + ".log"), "w")
        cls.logs.append(log)
        p = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=cls.dir)
        cls.procs.append(p)
        return p

    @classmethod
    def log(cls, name):
        try:
            with open(os.path.join(cls.dir, name + ".log")) as f:
                return f.read()
        except OSError:
            return ""

    @classmethod
    def wait_log(cls, name, pattern, proc):
        def probe():
            if proc.poll() is not None:
                raise AssertionError(f"{name} exited with {proc.returncode}:\n{cls.log(name)}")
            return re.search(pattern, cls.log(name))
        try:
            return wait_for(f"{name} to print {pattern}", probe)
        except AssertionError:
            print(cls.log(name), file=sys.stderr)
            raise

    @classmethod
    def start_controller(cls):
        p = cls.spawn("controller", [TFUSION, "controller", "--port", "0", "--token", cls.token,
                                     "--store", "sqlite:" + os.path.join(cls.dir, "state.db")])
        cls.url = cls.wait_log("controller", r"http://127\.0\.0\.1:\d+", p).group(0)

    @classmethod
    def start_agent(cls):
        env = dict(os.environ,
                   LD_LIBRARY_PATH=FAKE_LIB_DIR,  # libnvidia-ml.so.1 = the fake NVML
                   FAKECUDA_DEVICES="2", FAKECUDA_TOTAL_MIB=str(FAKE_GPU_MIB),
                   FAKECUDA_SHM_NAME=FAKE_SHM,
                   TFUSION_SHM_DIR=os.path.join(cls.dir, "shm"))
        p = cls.spawn("agent", [TFUSION, "hypervisor", "--controller", cls.url, "--token", cls.token,
                                "--node", "gpu-node-1", "--metrics-port", "0",
                                "--credential-file", os.path.join(cls.dir, "node-credential")], env)
        cls.agent_metrics = cls.wait_log("agent", r"metrics at http://(127\.0\.0\.1:\d+)/metrics", p).group(1)
        cls.wait_log("agent", r"registered", p)

    @classmethod
    def start_prometheus(cls, token_file):
        config = os.path.join(cls.dir, "prometheus.yml")
        with open(config, "w") as f:
            f.write(f"""global:
  scrape_interval: 1s
  evaluation_interval: 1s
scrape_configs:
  - job_name: tfusion-controller
    authorization:
      type: Bearer
      credentials_file: {token_file}
    static_configs:
      - targets: ['{urllib.parse.urlparse(cls.url).netloc}']
  - job_name: tfusion-node
    static_configs:
      - targets: ['{cls.agent_metrics}']
""")
        for attempt in range(3):  # the free port may be taken between the probe and the bind
            port = free_port()
            p = cls.spawn(f"prometheus-{attempt}", [
                "prometheus", "--config.file=" + config,
                "--storage.tsdb.path=" + os.path.join(cls.dir, "tsdb"),
                f"--web.listen-address=127.0.0.1:{port}", "--log.level=warn"])
            cls.prom = f"http://127.0.0.1:{port}"

            def ready():
                if p.poll() is not None:
                    return "exited"
                return urllib.request.urlopen(cls.prom + "/-/ready", timeout=2).status == 200 and "ready"
            if wait_for("prometheus to be ready", ready) == "ready":
                return
        raise AssertionError("prometheus did not start:\n" + cls.log("prometheus-2"))

    # ---- helpers

    def api(self, method, path, body=None):
        return http_json(method, self.url + path, self.token, body)

    def query(self, promql):
        """Instant query; returns the result list (raises on a PromQL error)."""
        url = self.prom + "/api/v1/query?" + urllib.parse.urlencode({"query": promql})
        try:
            with urllib.request.urlopen(url, timeout=10) as r:
                answer = json.loads(r.read())
        except urllib.error.HTTPError as e:
            answer = json.loads(e.read())
        self.assertEqual(answer.get("status"), "success", f"{promql}: {answer}")
        return answer["data"]["result"]

    def wait_value(self, promql, expected, rel=1e-9):
        """Polls until the query returns exactly one series whose value equals `expected`."""
        def probe():
            r = self.query(promql)
            return len(r) == 1 and abs(float(r[0]["value"][1]) - expected) <= rel * max(1.0, abs(expected)) and r
        try:
            wait_for(f"{promql} == {expected}", probe)
        except AssertionError as e:
            self.fail(f"{e}; now: {self.query(promql)}")

    # ---- the test

    def test_series_equal_the_controllers_state_and_every_dashboard_panel_returns_series(self):
        # Both targets are scraped and up.
        self.wait_value('up{job="tfusion-controller"}', 1)
        self.wait_value('up{job="tfusion-node"}', 1)

        # Seed: two placements, one refused for room, one refused by quota, one preemption.
        status, _ = self.api("PUT", "/v1/quotas/capped", {"max_tflops": 10})
        self.assertEqual(status, 200)
        seeded = {}
        for name, req in [("train", {"tflops": 100, "tflops_limit": 300, "vram_mib": 2048, "qos": "high",
                                     "tenant": "acme"}),
                          ("serve", {"tflops": 250, "vram_mib": 4096, "qos": "medium", "tenant": "acme"}),
                          ("batch", {"tflops": 50, "vram_mib": 13 * 1024, "qos": "low", "tenant": "labs"})]:
            status, body = self.api("POST", "/v1/allocations", req)
            self.assertEqual(status, 201, body)
            seeded[name] = body
        status, body = self.api("POST", "/v1/allocations", {"tflops": 10, "vram_mib": 100 * 1024})
        self.assertEqual(status, 409, body)  # no GPU has 100 GiB
        status, body = self.api("POST", "/v1/allocations", {"tflops": 50, "vram_mib": 1024, "tenant": "capped"})
        self.assertNotEqual(status, 201, body)  # over the tenant's quota
        status, body = self.api("POST", "/v1/allocations", {"tflops": 60, "vram_mib": 13 * 1024, "qos": "critical",
                                                             "tenant": "labs"})
        self.assertEqual(status, 201, body)
        self.assertEqual(body.get("preempted"), [seeded["batch"]["id"]])
        seeded["urgent"] = body
        del seeded["batch"]

        # What the controller says it holds.
        status, allocations = self.api("GET", "/v1/allocations")
        self.assertEqual(status, 200)
        live = allocations["allocations"]
        self.assertEqual(sorted(a["id"] for a in live), sorted(a["id"] for a in seeded.values()))
        status, gpus = self.api("GET", "/v1/gpus")
        gpus = gpus["gpus"]
        self.assertEqual(len(gpus), 2)
        tflops = sum(v["tflops"] for a in live for v in a["vgpus"])
        vram = sum(v["vram_mib"] for a in live for v in a["vgpus"]) * MIB
        self.assertAlmostEqual(tflops, 100 + 250 + 60)

        # Pool allocation equals the sum of the allocations; capacity the sum of the GPUs.
        self.wait_value('tf_pool_allocated_tflops{pool="default"}', tflops)
        self.wait_value('tf_pool_allocated_vram_bytes{pool="default"}', vram)
        self.wait_value('tf_pool_capacity_tflops{pool="default"}', sum(g["tflops"] for g in gpus))
        self.wait_value('tf_pool_capacity_vram_bytes{pool="default"}', 2 * FAKE_GPU_MIB * MIB)
        self.wait_value('sum(tf_gpu_allocated_tflops)', tflops)
        self.wait_value('sum by (pool) (tf_allocation_request_tflops)', tflops)
        self.wait_value('sum(tf_allocation_request_tflops{tenant="acme"})', 350)
        # Scheduling outcomes by result.
        for result, n in [("placed", 3), ("placed_preempting", 1), ("no_capacity", 1), ("quota", 1), ("invalid", 0)]:
            self.wait_value(f'tf_controller_placements_total{{pool="default",result="{result}"}}', n)
        self.wait_value("tf_controller_allocations_preempted_total", 1)
        self.wait_value('tf_controller_nodes{state="ready"}', 1)

        # The node agent: its GPUs, and per vGPU the limits that were asked (read from the quota
        # regions the agent keeps in step with the controller).
        self.wait_value('tf_node_gpus{node="gpu-node-1"}', 2)
        for g in gpus:
            self.wait_value(f'tf_gpu_vram_total_bytes{{gpu="{g["uuid"]}"}}', FAKE_GPU_MIB * MIB)
            self.wait_value(f'tf_gpu_capacity_tflops{{gpu="{g["uuid"]}"}}', g["tflops"])
        for a in live:
            v = a["vgpus"][0]
            sel = f'vgpu="{a["id"]}",gpu="{v["gpu"]}",node="gpu-node-1",qos="{a["qos"]}"'
            self.wait_value(f'tf_vgpu_vram_limit_bytes{{{sel}}}', v["vram_mib"] * MIB)
            self.wait_value(f'tf_vgpu_compute_request_ratio{{{sel}}}', v["share_ppm"] / 1e6)
            self.wait_value(f'tf_vgpu_compute_limit_ratio{{{sel}}}', v["limit_ppm"] / 1e6)
            self.wait_value(f'tf_allocation_limit_tflops{{allocation="{a["id"]}"}}', v["tflops_limit"])
        train = next(a for a in live if a["id"] == seeded["train"]["id"])
        self.assertAlmostEqual(train["vgpus"][0]["tflops_limit"], 300)
        self.wait_value(f'tf_allocation_limit_tflops{{allocation="{train["id"]}"}}', 300)
        # The preempted allocation's vGPU is gone from the node.
        wait_for("the preempted vGPU to leave the node's metrics",
                 lambda: not self.query(f'tf_vgpu_vram_limit_bytes{{vgpu="{seeded["urgent"]["preempted"][0]}"}}'))

        # Every dashboard panel's expression parses and returns series. rate() needs two samples
        # in its window: wait for the agent's series to have them first.
        wait_for("two scrapes of the vGPU counters",
                 lambda: self.query('rate(tf_vgpu_busy_seconds_total[1m])'))
        with open(DASHBOARD) as f:
            dashboard = json.load(f)
        variables = {v["name"] for v in dashboard["templating"]["list"]}
        self.assertEqual(variables, {"pool", "node"})
        for v in dashboard["templating"]["list"]:
            m = re.fullmatch(r"label_values\((\w+), *(\w+)\)", v["query"]["query"])
            self.assertIsNotNone(m, v)
            self.assertTrue(self.query(f'group by ({m.group(2)}) ({m.group(1)})'), v)
        panels = [p for p in dashboard["panels"] if p["type"] != "row"]
        self.assertGreaterEqual(len(panels), 12)
        checked = 0
        for p in panels:
            self.assertTrue(p.get("targets"), p["title"])
            for t in p["targets"]:
                expr = (t["expr"].replace("$__rate_interval", "1m")
                        .replace('"$pool"', '".*"').replace('"$node"', '".*"'))
                self.assertNotIn("$", expr, f"panel {p['title']}: unknown variable in {t['expr']}")
                result = self.query(expr)
                self.assertTrue(result, f"panel {p['title']!r}: {expr} returned no series")
                checked += 1
        print(f"{checked} dashboard expressions returned series", file=sys.stderr)


if __name__ == "__main__":
    if not TFUSION:
        sys.exit(__doc__)
    if not shutil.which("prometheus"):
        sys.exit("prometheus is not installed (scripts/setup.sh installs Debian's package)")
    unittest.main(argv=[sys.argv[0]], verbosity=2)
