#!/usr/bin/env python3
"""The systemd units in deploy/systemd/ are valid and start the daemons they name.

Usage: systemd_units_test.py TFUSION FAKE_LIB_DIR UNITS_DIR

- `systemd-analyze verify` accepts each unit (with ExecStart pointed at the built binary) and
  prints nothing about it (unknown keys are only warnings there, so any output fails).
- Each unit's sample environment file documents exactly the variables its ExecStart uses, each
  with a default in the unit.
- Each ExecStart, expanded as systemd would ($VAR split on spaces, ${VAR} one argument, %H/%d/%S
  specifiers) with an operator's environment file, starts the real daemon: the controller answers
  /healthz, the agent registers its (fake) GPUs and serves /metrics, the worker accepts
  connections. A bad value in the environment file is refused by the binary with a message.
"""
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import unittest
import urllib.request

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "common"))
import tf_process  # noqa: E402
from tf_process import free_port, remove_fake_driver_shm, stop_processes  # noqa: E402

FAKE_SHM = f"/tf-systemd-{os.getpid()}"  # the fake driver's shared memory, removed after each test

TFUSION, FAKE_LIB_DIR, UNITS = (map(os.path.abspath, sys.argv[1:4]) if len(sys.argv) >= 4
                                else (None, None, None))
INSTALLED_BINARY = "/usr/local/bin/tfusion"
DEADLINE_S = float(os.environ.get("TF_TEST_DEADLINE_S", "60"))


def wait_for(what, probe):
    return tf_process.wait_for(what, probe, DEADLINE_S, interval=0.2)


def read_unit(path):
    """{section: [(key, value)]}, continuation lines joined."""
    sections, section, pending = {}, None, ""
    with open(path) as f:
        for raw in f:
            line = pending + raw.rstrip("\n")
            if line.endswith("\\"):
                pending = line[:-1] + " "
                continue
            pending = ""
            s = line.strip()
            if not s or s[0] in "#;":
                continue
            if s.startswith("["):
                section = s.strip("[]")
                sections.setdefault(section, [])
                continue
            key, _, value = s.partition("=")
            sections[section].append((key.strip(), value.strip()))
    return sections


def read_env_file(path, commented=False):
    """KEY=VALUE lines; with commented=True the documented `#KEY=VALUE` lines instead."""
    out = {}
    with open(path) as f:
        for line in f:
            line = line.strip()
            m = re.fullmatch(r"#([A-Z_][A-Z0-9_]*)=(.*)" if commented else r"([A-Z_][A-Z0-9_]*)=(.*)", line)
            if m:
                out[m.group(1)] = m.group(2)
    return out


def expand_specifiers(text, specifiers):
    return re.sub(r"%([A-Za-z%])", lambda m: "%" if m.group(1) == "%" else specifiers[m.group(1)], text)


def expand(command, env, specifiers):
    """ExecStart's command line as systemd splits it."""
    command = expand_specifiers(command, specifiers)
    argv = []
    for word in command.split():
        m = re.fullmatch(r"\$([A-Za-z_][A-Za-z0-9_]*)", word)
        if m:
            argv.extend(env.get(m.group(1), "").split())  # $VAR: split, empty = nothing
            continue
        argv.append(re.sub(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}", lambda m: env.get(m.group(1), ""), word))
    return argv


class SystemdUnits(unittest.TestCase):
    units = {"controller": "tensorfusion-controller.service", "agent": "tensorfusion-agent.service",
             "worker": "tensorfusion-worker.service"}

    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="tf-systemd-")
        self.procs = []

    def tearDown(self):
        stop_processes(self.procs)
        shutil.rmtree(self.dir, ignore_errors=True)
        remove_fake_driver_shm(FAKE_SHM)

    def service(self, name):
        return dict(read_unit(os.path.join(UNITS, self.units[name])).get("Service", []))

    def defaults(self, name):
        unit = read_unit(os.path.join(UNITS, self.units[name]))
        env = {}
        for k, v in unit["Service"]:
            if k == "Environment":
                key, _, value = v.partition("=")
                env[key] = value
        return env

    def exec_start(self, name):
        unit = read_unit(os.path.join(UNITS, self.units[name]))
        (cmd,) = [v for k, v in unit["Service"] if k == "ExecStart"]
        return cmd

    def test_systemd_analyze_verify_accepts_every_unit(self):
        analyze = shutil.which("systemd-analyze")
        self.assertIsNotNone(analyze, "systemd-analyze is missing (scripts/setup.sh installs systemd)")
        copies = []
        for unit in self.units.values():
            with open(os.path.join(UNITS, unit)) as f:
                text = f.read()
            self.assertIn(INSTALLED_BINARY + " ", text)
            copy = os.path.join(self.dir, unit)
            with open(copy, "w") as f:
                f.write(text.replace(INSTALLED_BINARY, TFUSION))
            copies.append(copy)
        r = subprocess.run([analyze, "verify", *copies], capture_output=True, text=True)
        ours = [l for l in (r.stdout + r.stderr).splitlines() if "tensorfusion" in l or self.dir in l]
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        self.assertEqual(ours, [], "systemd-analyze verify complained")

    def test_each_sample_environment_file_documents_exactly_the_units_variables(self):
        for name, unit in self.units.items():
            cmd = self.exec_start(name)
            used = set(re.findall(r"\$\{?([A-Z_][A-Z0-9_]*)\}?", cmd))
            defaults = self.defaults(name)
            documented = read_env_file(os.path.join(UNITS, name + ".env"), commented=True)
            self.assertEqual(set(documented), used, f"{name}.env vs the ExecStart of {unit}")
            self.assertEqual(set(defaults), used, f"Environment= defaults of {unit}")
            service = self.service(name)
            self.assertEqual(service.get("EnvironmentFile"), f"-/etc/tensorfusion/{name}.env")
            self.assertEqual(service.get("LoadCredential"), f"token:/etc/tensorfusion/{name}.token")
            self.assertEqual(service.get("Restart"), "on-failure")
            self.assertTrue(service.get("StateDirectory"), unit)

    # ---- starting the daemons the way the units do

    def start(self, name, operator_env, extra_env=None):
        """Expands the unit's ExecStart with its defaults overridden by `operator_env` (what an
        operator writes in /etc/tensorfusion/NAME.env) and starts it; returns (process, log path)."""
        env_file = os.path.join(self.dir, name + ".env")
        with open(env_file, "w") as f:
            f.write("".join(f"{k}={v}\n" for k, v in operator_env.items()))
        creds = os.path.join(self.dir, "credentials-" + name)
        state = os.path.join(self.dir, "state")
        specifiers = {"H": "test-host", "d": creds, "S": state}
        # Environment= values take specifiers; an EnvironmentFile's values are taken as written.
        env = {k: expand_specifiers(v, specifiers) for k, v in self.defaults(name).items()}
        env.update(read_env_file(env_file))
        os.makedirs(creds, exist_ok=True)
        with open(os.path.join(creds, "token"), "w") as f:
            f.write("systemd-test-token\n")
        unit_state = self.service(name)["StateDirectory"]
        os.makedirs(os.path.join(state, unit_state), exist_ok=True)
        argv = expand(self.exec_start(name), env, specifiers)
        self.assertEqual(argv[0], INSTALLED_BINARY)
        argv[0] = TFUSION
        log = os.path.join(self.dir, name + ".log")
        proc_env = dict(os.environ, **(extra_env or {}))
        with open(log, "w") as out:
            p = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=proc_env,
                                 cwd=os.path.join(state, unit_state))
        self.procs.append(p)
        return p, log, argv

    def wait_log(self, proc, log, pattern):
        def probe():
            with open(log) as f:
                text = f.read()
            if proc.poll() is not None:
                raise AssertionError(f"exited {proc.returncode}: {text}")
            return re.search(pattern, text)
        return wait_for(f"{pattern} in {log}", probe)

    def test_the_units_command_lines_start_the_daemons(self):
        api_port, metrics_port, worker_port = free_port(), free_port(), free_port()
        store = os.path.join(self.dir, "state", "tensorfusion", "state.db")
        ctl, ctl_log, argv = self.start("controller", {"TFUSION_PORT": api_port, "TFUSION_STORE": "sqlite:" + store})
        self.assertIn("--identity", argv)
        self.assertEqual(argv[argv.index("--identity") + 1], "test-host")  # %H
        self.wait_log(ctl, ctl_log, f"listening on http://127.0.0.1:{api_port}")
        with urllib.request.urlopen(f"http://127.0.0.1:{api_port}/healthz", timeout=5) as r:
            self.assertEqual(r.status, 200)
        self.assertTrue(os.path.exists(store))

        agent, agent_log, _ = self.start(
            "agent", {"TFUSION_CONTROLLER": f"http://127.0.0.1:{api_port}", "TFUSION_NODE": "unit-node",
                      "TFUSION_METRICS_LISTEN": "127.0.0.1", "TFUSION_METRICS_PORT": metrics_port},
            {"LD_LIBRARY_PATH": FAKE_LIB_DIR, "FAKECUDA_SHM_NAME": FAKE_SHM,
             "TFUSION_SHM_DIR": os.path.join(self.dir, "shm")})
        self.wait_log(agent, agent_log, r"node unit-node registered .*\(1 GPU")
        with urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=5) as r:
            self.assertIn('tf_node_gpus{node="unit-node"} 1', r.read().decode())
        self.assertTrue(os.path.exists(os.path.join(self.dir, "state", "tensorfusion-agent", "node-credential")))

        worker, worker_log, _ = self.start("worker", {"TFUSION_WORKER_LISTEN": f"127.0.0.1:{worker_port}"},
                                           {"TFUSION_REAL_LIBCUDA": os.path.join(FAKE_LIB_DIR, "libcuda.so.1")})

        def accepting():
            if worker.poll() is not None:
                with open(worker_log) as f:
                    raise AssertionError(f"the worker exited {worker.returncode}: {f.read()}")
            with socket.create_connection(("127.0.0.1", worker_port), 2):
                return True
        wait_for("the worker to accept connections", accepting)

    def test_a_bad_value_in_an_environment_file_is_refused_by_the_binary(self):
        p, log, _ = self.start("agent", {"TFUSION_STOP_GRACE": "soon"})
        self.assertNotEqual(p.wait(timeout=30), 0)
        with open(log) as f:
            self.assertIn("--stop-grace", f.read())
        p, log, _ = self.start("controller", {"TFUSION_CONTROLLER_ARGS": "--no-such-flag"})
        self.assertNotEqual(p.wait(timeout=30), 0)
        with open(log) as f:
            self.assertIn("--no-such-flag", f.read())


if __name__ == "__main__":
    if not TFUSION:
        sys.exit(__doc__)
    unittest.main(argv=[sys.argv[0]], verbosity=2)
