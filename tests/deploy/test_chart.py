"""The Helm chart renders, with its default values and with everything switched on, into objects
that are valid against the Kubernetes API types and that fit together; the components get the
commands, mounts and permissions a working installation needs.

Optional argument: the path of a built tfusion binary; the flags the chart passes are then checked
against its --help."""

import copy
import json
import os
import re
import shutil
import socket
import ssl
import subprocess
import sys
import tempfile
import time
import unittest
import urllib.request

import yaml

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "tools", "chart"))
sys.path.insert(0, os.path.join(ROOT, "tests", "common"))
from test_ca import make_test_ca  # noqa: E402
import k8s_validate as kv  # noqa: E402
from gotemplate import TemplateError  # noqa: E402
from render_chart import render  # noqa: E402

CHART = os.path.join(ROOT, "deploy", "helm", "tensorfusion")
ALL_ON = os.path.join(os.path.dirname(os.path.abspath(__file__)), "values-all-on.yaml")
TLS_ON = os.path.join(os.path.dirname(os.path.abspath(__file__)), "values-controller-tls.yaml")
NS = "gpu-system"
TFUSION = None


def objects(values_files=(), release="tf", namespace=NS):
    return [o for _, _, o in render(CHART, values_files, release, namespace)]


def find(objs, kind, name):
    match = [o for o in objs if o["kind"] == kind and o["metadata"]["name"] == name]
    if len(match) != 1:
        raise AssertionError(f"{kind} {name}: found {len(match)}")
    return match[0]


def container(obj, name=None):
    cs = obj["spec"]["template"]["spec"]["containers"]
    return cs[0] if name is None else next(c for c in cs if c["name"] == name)


def mounts(obj):
    """{mountPath: volume} of the pod template's first container."""
    vols = {v["name"]: v for v in obj["spec"]["template"]["spec"].get("volumes", [])}
    return {m["mountPath"]: vols[m["name"]] for m in container(obj).get("volumeMounts", [])}


def all_errors(objs):
    errors = []
    for o in objs:
        errors.extend(kv.validate_builtin(o))
        if o["kind"] == "ConfigMap" and "config.yaml" in o.get("data", {}):
            errors.extend(kv.validate_scheduler_config(yaml.safe_load(o["data"]["config.yaml"])))
    return errors + kv.check_references(objs)


class RenderAndValidate(unittest.TestCase):
    def test_default_values_give_valid_objects(self):
        objs = objects()
        self.assertEqual(all_errors(objs), [])
        kinds = sorted({o["kind"] for o in objs})
        self.assertEqual(kinds, ["ClusterRole", "ClusterRoleBinding", "ConfigMap", "DaemonSet",
                                 "Deployment", "MutatingWebhookConfiguration",
                                 "PersistentVolumeClaim", "RoleBinding", "Service",
                                 "ServiceAccount"])
        # No credential is ever rendered from the defaults: the Secrets are made by the user.
        self.assertNotIn("Secret", kinds)

    def test_everything_switched_on_gives_valid_objects(self):
        objs = objects([ALL_ON])
        self.assertEqual(all_errors(objs), [])
        self.assertIn("Secret", {o["kind"] for o in objs})

    def test_validator_refuses_broken_objects(self):
        """The checks are not vacuous: typical mistakes are caught with the path named."""
        objs = objects()
        dep = copy.deepcopy(find(objs, "Deployment", "tf-controller"))
        container(dep)["volumeMount"] = []                      # misspelt field
        container(dep)["ports"][0]["containerPort"] = "9300"    # string for an integer
        errors = "\n".join(kv.validate_builtin(dep))
        self.assertIn("spec.template.spec.containers[0].volumeMount: unknown field of V1Container",
                      errors)
        self.assertIn("containers[0].ports[0].containerPort: must be an integer", errors)
        dep = copy.deepcopy(find(objs, "Deployment", "tf-controller"))
        container(dep)["volumeMounts"][0]["name"] = "stat"
        container(dep)["readinessProbe"]["httpGet"]["port"] = "http"
        dep["spec"]["selector"]["matchLabels"]["app.kubernetes.io/component"] = "agent"
        errors = "\n".join(kv.validate_builtin(dep))
        self.assertIn("mounts undeclared volume stat", errors)
        self.assertIn("readinessProbe names port 'http' the container does not declare", errors)
        self.assertIn("does not match the pod template's labels", errors)
        svc = copy.deepcopy(find(objs, "Service", "tf-webhook"))
        svc["spec"]["selector"]["app.kubernetes.io/component"] = "nothing"
        refs = kv.check_references([o for o in objs if o is not find(objs, "Service",
                                                                      "tf-webhook")] + [svc])
        self.assertIn("Service gpu-system/tf-webhook: selector", "\n".join(refs))
        role = copy.deepcopy(find(objs, "ClusterRole", "tf-gpu-system-webhook"))
        role["rules"][0]["verb"] = role["rules"][0].pop("verbs")  # misspelt
        self.assertIn("rules[0].verb: unknown field of V1PolicyRule",
                      "\n".join(kv.validate_builtin(role)))
        self.assertIn("rules[0].verbs: required by V1PolicyRule",
                      "\n".join(kv.validate_builtin(role)))

    def test_values_that_cannot_work_are_refused_when_rendering(self):
        bad = os.path.join(os.environ.get("TMPDIR", "/tmp"), f"tf-bad-values-{os.getpid()}.yaml")
        with open(bad, "w") as f:
            yaml.safe_dump({"token": {"create": True, "value": ""}}, f)
        try:
            with self.assertRaisesRegex(TemplateError, "token.create needs token.value"):
                objects([bad])
            with open(bad, "w") as f:
                yaml.safe_dump({"agent": {"metricsListen": ""}}, f)
            with self.assertRaisesRegex(TemplateError, "agent.metricsListen needs an address"):
                objects([bad])
            with open(bad, "w") as f:
                yaml.safe_dump({"webhook": {"workerTokenSecret": "shared", "ticketTokenSecret": "workers"}}, f)
            with self.assertRaisesRegex(TemplateError, "set one, not both"):
                objects([bad])
        finally:
            os.unlink(bad)


class Components(unittest.TestCase):
    def setUp(self):
        self.objs = objects()
        self.url = f"http://tf-controller.{NS}.svc:9300"

    def test_controller_runs_the_api_on_all_interfaces_with_sqlite_on_a_volume(self):
        dep = find(self.objs, "Deployment", "tf-controller")
        self.assertEqual(container(dep)["args"], [
            "controller", "--listen", "0.0.0.0", "--port", "9300",
            "--store", "sqlite:/var/lib/tensorfusion/state.db", "--durability", "power",
            "--token-file", "/etc/tensorfusion/token/token", "--insecure-listen",
            "--kube-api", "in-cluster",
            "--kube-token-file", "/var/run/secrets/kubernetes.io/serviceaccount/token",
            "--kube-ca-file", "/var/run/secrets/kubernetes.io/serviceaccount/ca.crt"])
        self.assertEqual(dep["spec"]["replicas"], 1)
        self.assertEqual(dep["spec"]["strategy"]["type"], "Recreate")
        m = mounts(dep)
        self.assertEqual(m["/var/lib/tensorfusion"]["persistentVolumeClaim"]["claimName"],
                         "tf-controller-state")
        self.assertEqual(m["/etc/tensorfusion/token"]["secret"],
                         {"secretName": "tf-token", "defaultMode": 0o440,
                          "items": [{"key": "token", "path": "token"}]})
        self.assertEqual(container(dep)["readinessProbe"]["httpGet"]["path"], "/healthz")
        svc = find(self.objs, "Service", "tf-controller")
        self.assertEqual(svc["spec"]["ports"][0]["port"], 9300)

    def test_controller_state_is_an_empty_dir_when_persistence_is_off(self):
        dep = find(objects([ALL_ON]), "Deployment", "tf-controller")
        self.assertEqual(mounts(dep)["/var/lib/tensorfusion"]["emptyDir"], {})
        self.assertNotIn("PersistentVolumeClaim", {o["kind"] for o in objects([ALL_ON])})

    def test_agent_runs_on_gpu_nodes_with_host_pids_shared_memory_and_its_node_name(self):
        ds = find(self.objs, "DaemonSet", "tf-agent")
        pod = ds["spec"]["template"]["spec"]
        self.assertTrue(pod["hostPID"])
        self.assertFalse(pod["automountServiceAccountToken"])
        self.assertEqual(pod["runtimeClassName"], "nvidia")
        self.assertEqual(pod["nodeSelector"], {"nvidia.com/gpu.present": "true"})
        args = container(ds)["args"]
        self.assertEqual(args[0], "hypervisor")
        flags = dict(zip(args[1::2], args[2::2]))
        self.assertEqual(flags["--controller"], self.url)
        self.assertEqual(flags["--node"], "$(NODE_NAME)")
        self.assertEqual(flags["--token-file"], "/etc/tensorfusion/token/token")
        self.assertEqual(flags["--credential-file"], "/var/lib/tensorfusion/node-credential")
        # Prometheus scrapes the pod's IP: the metrics port listens on every interface of the
        # pod, not on the agent's own default (127.0.0.1, which only the pod itself reaches).
        self.assertEqual(flags["--metrics-port"], "9400")
        self.assertEqual(flags["--metrics-listen"], "0.0.0.0")
        self.assertEqual(container(ds)["ports"], [{"name": "metrics", "containerPort": 9400,
                                                   "protocol": "TCP"}])
        env = {e["name"]: e for e in container(ds)["env"]}
        self.assertEqual(env["NODE_NAME"]["valueFrom"]["fieldRef"]["fieldPath"], "spec.nodeName")
        self.assertEqual(env["TFUSION_SHM_DIR"]["value"], "/dev/shm/tensorfusion")
        m = mounts(ds)
        self.assertEqual(m["/dev/shm/tensorfusion"]["hostPath"]["path"], "/dev/shm/tensorfusion")
        self.assertEqual(m["/var/lib/tensorfusion"]["hostPath"]["path"], "/var/lib/tensorfusion")
        self.assertEqual(container(ds)["securityContext"]["capabilities"],
                         {"drop": ["ALL"], "add": ["KILL", "SYS_PTRACE"]})

    def test_agent_with_everything_on(self):
        ds = find(objects([ALL_ON]), "DaemonSet", "tf-agent")
        args = container(ds)["args"]
        flags = dict(zip(args[1::2], args[2::2]))
        self.assertEqual(flags["--pool"], "training")
        self.assertEqual(flags["--metrics-port"], "-1")
        self.assertEqual(flags["--stop-grace"], "30")
        self.assertNotIn("ports", container(ds))
        self.assertNotIn("runtimeClassName", ds["spec"]["template"]["spec"])

    def test_device_plugin_runs_beside_the_agent_in_the_kubelet_folder(self):
        ds = find(self.objs, "DaemonSet", "tf-agent")
        dp = container(ds, "device-plugin")
        self.assertEqual(dp["args"][0], "device-plugin")
        flags = dict(zip(dp["args"][1::2], dp["args"][2::2]))
        self.assertEqual(flags, {"--plugin-dir": "/var/lib/kubelet/device-plugins",
                                 "--resource-name": "tensor-fusion.ai/vgpu",
                                 "--devices-per-gpu": "16",
                                 "--host-shm-dir": "/dev/shm/tensorfusion",
                                 "--container-shm-dir": "/dev/shm/tensorfusion"})
        vols = {v["name"]: v for v in ds["spec"]["template"]["spec"]["volumes"]}
        dp_mounts = {m["mountPath"]: vols[m["name"]] for m in dp["volumeMounts"]}
        self.assertEqual(dp_mounts, {"/var/lib/kubelet/device-plugins": {
            "name": "device-plugins",
            "hostPath": {"path": "/var/lib/kubelet/device-plugins", "type": "Directory"}}})
        self.assertEqual(dp["securityContext"]["capabilities"], {"drop": ["ALL"]})
        self.assertTrue(dp["securityContext"]["readOnlyRootFilesystem"])
        on = find(objects([ALL_ON]), "DaemonSet", "tf-agent")
        dp = container(on, "device-plugin")
        flags = dict(zip(dp["args"][1::2], dp["args"][2::2]))
        self.assertEqual(flags["--resource-name"], "example.com/gpu-slice")
        self.assertEqual(flags["--devices-per-gpu"], "8")
        vols = {v["name"]: v for v in on["spec"]["template"]["spec"]["volumes"]}
        self.assertEqual(vols["device-plugins"]["hostPath"]["path"], "/var/lib/k0s/kubelet/device-plugins")
        self.assertEqual(dp["resources"], {"requests": {"cpu": "10m", "memory": "32Mi"}})

    def test_device_plugin_can_be_switched_off(self):
        off = os.path.join(os.environ.get("TMPDIR", "/tmp"), f"tf-dp-off-{os.getpid()}.yaml")
        with open(off, "w") as f:
            yaml.safe_dump({"agent": {"devicePlugin": {"enabled": False}}}, f)
        try:
            objs = objects([off])
        finally:
            os.unlink(off)
        self.assertEqual(all_errors(objs), [])
        pod = find(objs, "DaemonSet", "tf-agent")["spec"]["template"]["spec"]
        self.assertEqual([c["name"] for c in pod["containers"]], ["agent"])
        self.assertNotIn("device-plugins", {v["name"] for v in pod["volumes"]})

    def test_webhook_serves_tls_and_calls_the_controller(self):
        dep = find(self.objs, "Deployment", "tf-webhook")
        self.assertEqual(container(dep)["args"], [
            "k8s", "--listen", "0.0.0.0", "--port", "9443",
            "--tls-cert", "/etc/tensorfusion/tls/tls.crt",
            "--tls-key", "/etc/tensorfusion/tls/tls.key",
            "--controller", self.url, "--token-file", "/etc/tensorfusion/token/token",
            "--scheduler-name", "tensor-fusion-scheduler", "--host-shm-dir", "/dev/shm/tensorfusion"])
        self.assertEqual(mounts(dep)["/etc/tensorfusion/tls"]["secret"]["secretName"],
                         "tf-webhook-tls")
        self.assertEqual(container(dep)["readinessProbe"]["httpGet"],
                         {"path": "/healthz", "port": "https", "scheme": "HTTPS"})
        svc = find(self.objs, "Service", "tf-webhook")
        self.assertEqual(svc["spec"]["ports"][0]["port"], 443)

    def test_controller_tls_serves_https_and_every_client_verifies_it(self):
        objs = objects([TLS_ON])
        url = f"https://tf-controller.{NS}.svc:9300"
        dep = find(objs, "Deployment", "tf-controller")
        args = container(dep)["args"]
        flags = dict(zip(args[1::2], args[2::2]))
        self.assertEqual(flags["--tls-cert"], "/etc/tensorfusion/tls/tls.crt")
        self.assertEqual(flags["--tls-key"], "/etc/tensorfusion/tls/tls.key")
        self.assertEqual(mounts(dep)["/etc/tensorfusion/tls"]["secret"],
                         {"secretName": "tf-controller-tls", "defaultMode": 0o440,
                          "items": [{"key": "tls.crt", "path": "tls.crt"}, {"key": "tls.key", "path": "tls.key"}]})
        for probe in ("readinessProbe", "livenessProbe"):
            self.assertEqual(container(dep)[probe]["httpGet"]["scheme"], "HTTPS", probe)
        # The agent and tfusion k8s reach it over https and verify it against the Secret's CA;
        # they mount ca.crt only, never the key.
        for kind, name in (("DaemonSet", "tf-agent"), ("Deployment", "tf-webhook")):
            obj = find(objs, kind, name)
            args = container(obj)["args"]
            flags = dict(zip(args[1::2], args[2::2]))
            self.assertEqual(flags["--controller"], url, name)
            self.assertEqual(flags["--ca-file"], "/etc/tensorfusion/controller-ca/ca.crt", name)
            self.assertEqual(mounts(obj)["/etc/tensorfusion/controller-ca"]["secret"],
                             {"secretName": "tf-controller-tls", "items": [{"key": "ca.crt", "path": "ca.crt"}]})
        # Off (the default): plain http, no TLS flag and no certificate volume.
        self.assertNotIn("--tls-cert", container(find(self.objs, "Deployment", "tf-controller"))["args"])
        for kind, name in (("DaemonSet", "tf-agent"), ("Deployment", "tf-webhook")):
            obj = find(self.objs, kind, name)
            self.assertNotIn("--ca-file", container(obj)["args"], name)
            self.assertNotIn("/etc/tensorfusion/controller-ca", mounts(obj), name)

    def test_mutating_webhook_sends_only_labelled_pods_and_fails_closed(self):
        mwc = find(self.objs, "MutatingWebhookConfiguration", "tf-gpu-system-pods")
        (hook,) = mwc["webhooks"]
        self.assertEqual(hook["objectSelector"], {"matchLabels": {"tensor-fusion.ai/enabled":
                                                                  "true"}})
        self.assertEqual(hook["failurePolicy"], "Fail")
        self.assertEqual(hook["sideEffects"], "None")
        self.assertEqual(hook["admissionReviewVersions"], ["v1"])
        self.assertEqual(hook["clientConfig"]["service"],
                         {"name": "tf-webhook", "namespace": NS, "path": "/mutate", "port": 443})
        self.assertNotIn("caBundle", hook["clientConfig"])  # set by deploy/webhook-cert.sh
        self.assertEqual(hook["rules"], [{"operations": ["CREATE"], "apiGroups": [""],
                                          "apiVersions": ["v1"], "resources": ["pods"],
                                          "scope": "Namespaced"}])
        excluded = hook["namespaceSelector"]["matchExpressions"][0]
        self.assertEqual((excluded["key"], excluded["operator"]),
                         ("kubernetes.io/metadata.name", "NotIn"))
        self.assertEqual(excluded["values"], [NS, "kube-system"])
        on = find(objects([ALL_ON]), "MutatingWebhookConfiguration", "tf-gpu-system-pods")
        self.assertEqual(on["webhooks"][0]["clientConfig"]["caBundle"], "cGxhY2Vob2xkZXIgQ0E=")
        self.assertEqual(on["webhooks"][0]["namespaceSelector"]["matchExpressions"][0]["values"],
                         [NS, "kube-system", "monitoring"])

    def test_scheduler_calls_the_extender_over_https_with_the_webhook_ca(self):
        cm = find(self.objs, "ConfigMap", "tf-scheduler-config")
        config = yaml.safe_load(cm["data"]["config.yaml"])
        self.assertEqual(kv.validate_scheduler_config(config), [])
        self.assertEqual(config["profiles"], [{"schedulerName": "tensor-fusion-scheduler"}])
        (ext,) = config["extenders"]
        self.assertEqual(ext["urlPrefix"], f"https://tf-webhook.{NS}.svc:443")
        self.assertEqual((ext["filterVerb"], ext["prioritizeVerb"], ext["bindVerb"]),
                         ("filter", "prioritize", "bind"))
        self.assertIs(ext["nodeCacheCapable"], False)
        self.assertIs(ext["enableHTTPS"], True)
        dep = find(self.objs, "Deployment", "tf-scheduler")
        self.assertIn("--config=/etc/kubernetes/tensorfusion/config.yaml",
                      container(dep)["command"])
        m = mounts(dep)
        self.assertEqual(m["/etc/kubernetes/tensorfusion"]["configMap"]["name"],
                         "tf-scheduler-config")
        ca_dir = os.path.dirname(ext["tlsConfig"]["caFile"])
        # Only the CA certificate reaches the scheduler, never the webhook's private key.
        self.assertEqual(m[ca_dir]["secret"]["items"], [{"key": "ca.crt", "path": "ca.crt"}])
        on = yaml.safe_load(find(objects([ALL_ON]), "ConfigMap",
                                 "tf-scheduler-config")["data"]["config.yaml"])
        self.assertEqual(on["profiles"][0]["schedulerName"], "gpu-pool-scheduler")
        self.assertEqual(on["extenders"][0]["weight"], 5)
        # The webhook gives pods that scheduler, and mounts the agents' quota regions from where
        # the agents keep them.
        args = container(find(objects([ALL_ON]), "Deployment", "tf-webhook"))["args"]
        flags = dict(zip(args[1::2], args[2::2]))
        self.assertEqual(flags["--scheduler-name"], "gpu-pool-scheduler")
        self.assertEqual(flags["--host-shm-dir"], "/run/tensorfusion-shm")
        self.assertEqual(flags["--limiter-image"], "registry.example.com/gpu/tfusion-lib:0.1.0-test")
        self.assertEqual(flags["--worker-token-secret"], "worker-token")

    def test_webhook_mints_a_ticket_per_pod_from_the_workers_token_secret(self):
        values = os.path.join(os.environ.get("TMPDIR", "/tmp"), f"tf-tickets-{os.getpid()}.yaml")
        with open(values, "w") as f:
            yaml.safe_dump({"webhook": {"ticketTokenSecret": "worker-token", "ticketDays": 30}}, f)
        try:
            objs = objects([values])
        finally:
            os.unlink(values)
        self.assertEqual(all_errors(objs), [])
        dep = find(objs, "Deployment", "tf-webhook")
        args = container(dep)["args"]
        flags = dict(zip(args[1::2], args[2::2]))
        self.assertEqual(flags["--worker-token-file"], "/etc/tensorfusion/worker-token/token")
        self.assertEqual(flags["--ticket-days"], "30")
        self.assertNotIn("--worker-token-secret", flags)
        vol = mounts(dep)["/etc/tensorfusion/worker-token"]
        self.assertEqual(vol["secret"]["secretName"], "worker-token")
        self.assertEqual(vol["secret"]["items"], [{"key": "token", "path": "token"}])
        if TFUSION:
            r = subprocess.run([TFUSION, "k8s", "--help"], capture_output=True, text=True)
            for flag in ("--worker-token-file", "--ticket-days"):
                self.assertIn(flag, r.stdout)

    def test_components_can_be_switched_off(self):
        off = os.path.join(os.environ.get("TMPDIR", "/tmp"), f"tf-off-{os.getpid()}.yaml")
        with open(off, "w") as f:
            yaml.safe_dump({"agent": {"enabled": False}, "webhook": {"enabled": False}}, f)
        try:
            objs = objects([off])
        finally:
            os.unlink(off)
        self.assertEqual(all_errors(objs), [])
        names = {o["metadata"]["name"] for o in objs}
        self.assertEqual(names, {"tf-controller", "tf-controller-state",
                                 "tf-gpu-system-controller"})


class LeastPrivilege(unittest.TestCase):
    def setUp(self):
        self.objs = objects([ALL_ON])

    def test_no_wildcards_and_no_secret_or_rbac_or_webhook_access(self):
        for o in self.objs:
            for rule in o.get("rules") or []:
                for field in ("apiGroups", "resources", "verbs"):
                    self.assertNotIn("*", rule[field], f"{o['metadata']['name']}: {rule}")
                self.assertFalse(set(rule["resources"]) & {
                    "secrets", "clusterroles", "clusterrolebindings", "roles", "rolebindings",
                    "mutatingwebhookconfigurations", "customresourcedefinitions"}, rule)

    def test_agent_has_no_api_access(self):
        bound = {s["name"] for o in self.objs if o["kind"].endswith("Binding")
                 for s in o["subjects"]}
        self.assertNotIn("tf-agent", bound)
        self.assertFalse(find(self.objs, "ServiceAccount", "tf-agent")
                         ["automountServiceAccountToken"])

    def test_every_rule_says_why(self):
        with open(os.path.join(CHART, "templates", "rbac.yaml")) as f:
            lines = f.read().split("\n")
        rule_lines = [i for i, line in enumerate(lines) if line.strip() == "- apiGroups:"]
        self.assertGreaterEqual(len(rule_lines), 6)
        for i in rule_lines:
            self.assertTrue(lines[i - 1].strip().startswith("#"),
                            f"rbac.yaml:{i + 1}: a rule without a comment saying why")


@unittest.skipIf(len(sys.argv) < 2 and not os.environ.get("TFUSION_BIN"),
                 "no tfusion binary given")
class FlagsExist(unittest.TestCase):
    """Every flag the chart passes to tfusion is one the binary accepts."""

    def help_flags(self, subcommand):
        r = subprocess.run([TFUSION, subcommand, "--help"], capture_output=True, text=True)
        if r.returncode != 0 or not re.search(rf"^Usage: \S+ {subcommand} ", r.stdout, re.M):
            return None
        return set(re.findall(r"(--[a-z][a-z0-9-]*)", r.stdout))

    def check(self, kind, name, container_name=None):
        args = container(find(objects([ALL_ON]), kind, name), container_name)["args"]
        accepted = self.help_flags(args[0])
        if accepted is None:
            self.skipTest(f"tfusion has no '{args[0]}' subcommand in this build")
        used = {a for a in args if a.startswith("--")}
        self.assertEqual(used - accepted, set(), f"tfusion {args[0]}")

    def test_controller_flags(self):
        self.check("Deployment", "tf-controller")

    def test_agent_flags(self):
        self.check("DaemonSet", "tf-agent")

    def test_webhook_flags(self):
        self.check("Deployment", "tf-webhook")

    def test_device_plugin_flags(self):
        self.check("DaemonSet", "tf-agent", "device-plugin")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def http_get(url, token=None, context=None):
    req = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"} if token else {})
    with urllib.request.urlopen(req, timeout=5, context=context) as r:
        return r.status, r.read().decode()


@unittest.skipIf(len(sys.argv) < 2 and not os.environ.get("TFUSION_BIN"),
                 "no tfusion binary given")
class ChartCommandsRun(unittest.TestCase):
    """The controller and the node agent, started with exactly the arguments and environment the
    chart gives them (host paths and the Service name mapped onto a temporary folder and
    loopback), serve their probes and find each other: the agent's node registers."""

    def setUp(self):
        self.tmp = tempfile.mkdtemp()
        self.procs = []

    def tearDown(self):
        for p in self.procs:
            p.terminate()
        for p in self.procs:
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        shutil.rmtree(self.tmp, ignore_errors=True)

    def start(self, args, env, state_dir, log):
        port = self.port
        mapping = {"/var/lib/tensorfusion": state_dir,
                   "/etc/tensorfusion/tls": os.path.join(self.tmp, "tls"),
                   "/etc/tensorfusion/controller-ca": os.path.join(self.tmp, "tls"),
                   f"https://tf-controller.{NS}.svc:9300": f"https://127.0.0.1:{port}",
                   "/etc/tensorfusion/token": os.path.join(self.tmp, "token"),
                   f"http://tf-controller.{NS}.svc:9300": f"http://127.0.0.1:{port}",
                   "/dev/shm/tensorfusion": os.path.join(self.tmp, "shm"),
                   "/var/run/secrets/kubernetes.io/serviceaccount": os.path.join(self.tmp, "sa"),
                   "/var/lib/kubelet/device-plugins": os.path.join(self.tmp, "device-plugins")}

        def remap(text):
            for k, v in mapping.items():
                text = text.replace(k, v)
            return text.replace("$(NODE_NAME)", env.get("NODE_NAME", ""))

        args = [remap(a) for a in args]
        for flag, value in (("--listen", "127.0.0.1"), ("--port", str(port)),
                            ("--metrics-port", str(self.metrics_port))):
            if flag in args:
                args[args.index(flag) + 1] = value
        full_env = dict(os.environ, **{k: remap(v) for k, v in env.items()})
        full_env.pop("TFUSION_TOKEN", None)
        with open(os.path.join(self.tmp, log), "w") as out:
            p = subprocess.Popen([TFUSION] + args, env=full_env, cwd=self.tmp, stdout=out,
                                 stderr=subprocess.STDOUT)
        self.procs.append(p)
        return p

    def wait_for(self, what, fn, seconds=20):
        deadline = time.monotonic() + seconds
        last = None
        while time.monotonic() < deadline:
            try:
                result = fn()
                if result:
                    return result
            except OSError as e:
                last = e
            time.sleep(0.2)
        logs = ""
        for name in ("controller.log", "agent.log", "device-plugin.log"):
            path = os.path.join(self.tmp, name)
            if os.path.exists(path):
                with open(path) as f:
                    logs += f"--- {name}\n{f.read()[-2000:]}"
        self.fail(f"{what} did not happen within {seconds} s ({last})\n{logs}")

    def test_controller_and_agent_run_with_the_chart_commands(self):
        self.run_chart(objects(), "http")

    def test_controller_and_agent_run_with_the_chart_commands_over_tls(self):
        # The Secret's files as the kubelet mounts them: a test CA and a certificate for the
        # address the Service name is mapped onto.
        tls = os.path.join(self.tmp, "tls")
        os.makedirs(tls)
        make_test_ca(tls)
        for src, dst in (("server.pem", "tls.crt"), ("server.key", "tls.key"), ("ca.pem", "ca.crt")):
            shutil.copy(os.path.join(tls, src), os.path.join(tls, dst))
        self.run_chart(objects([TLS_ON]), "https", os.path.join(tls, "ca.crt"))

    def run_chart(self, objs, scheme, ca_file=None):
        ssl_context = ssl.create_default_context(cafile=ca_file) if ca_file else None
        self.port, self.metrics_port = free_port(), free_port()
        token = "chart-test-" + os.urandom(8).hex()
        os.makedirs(os.path.join(self.tmp, "token"))
        with open(os.path.join(self.tmp, "token", "token"), "w") as f:
            f.write(token + "\n")
        for d in ("controller-state", "agent-state", "shm"):
            os.makedirs(os.path.join(self.tmp, d))

        # The service account's files as the kubelet mounts them; no API server answers (the
        # reconciler is tested in tests/controller/k8s_reconciler_test.py), the API still serves.
        os.makedirs(os.path.join(self.tmp, "sa"))
        for name, text in (("token", "sa-token\n"), ("ca.crt", "not checked before a connection\n")):
            with open(os.path.join(self.tmp, "sa", name), "w") as f:
                f.write(text)
        ctl = container(find(objs, "Deployment", "tf-controller"))
        self.start(ctl["args"], {"KUBERNETES_SERVICE_HOST": "127.0.0.1", "KUBERNETES_SERVICE_PORT": str(free_port())},
                   os.path.join(self.tmp, "controller-state"), "controller.log")
        probe = ctl["readinessProbe"]["httpGet"]
        self.assertEqual(probe.get("scheme", "HTTP").lower(), scheme)
        base = f"{scheme}://127.0.0.1:{self.port}"
        self.wait_for("controller readiness", lambda: http_get(base + probe["path"], context=ssl_context)[0] == 200)

        agent = container(find(objs, "DaemonSet", "tf-agent"))
        env = {e["name"]: e.get("value", "") for e in agent["env"]}
        env["NODE_NAME"] = "gpu-node-1"  # what the downward API gives from spec.nodeName
        self.start(agent["args"], env, os.path.join(self.tmp, "agent-state"), "agent.log")

        def node_registered():
            status, body = http_get(base + "/v1/nodes", token, context=ssl_context)
            return status == 200 and "gpu-node-1" in json.dumps(json.loads(body))
        self.wait_for("the agent's node registration", node_registered)
        self.assertTrue(os.path.exists(os.path.join(self.tmp, "agent-state", "node-credential")))
        # Prometheus connects to the pod's IP, never to its 127.0.0.1: scrape at another address
        # of this machine (127.0.0.2 is one on every Linux host, and a port bound to 127.0.0.1
        # alone refuses it).
        status, metrics = self.wait_for(
            "agent metrics", lambda: http_get(f"http://127.0.0.2:{self.metrics_port}/metrics"))
        self.assertEqual(status, 200)
        self.assertIn("tf_", metrics)

    def test_device_plugin_serves_its_socket_with_the_chart_command(self):
        # Without a kubelet: it serves (zero devices on a machine without GPUs) and keeps trying
        # to register; tests/deviceplugin plays the kubelet.
        dp = container(find(objects(), "DaemonSet", "tf-agent"), "device-plugin")
        os.makedirs(os.path.join(self.tmp, "device-plugins"))
        self.port = self.metrics_port = 0
        p = self.start(dp["args"], {e["name"]: e.get("value", "") for e in dp["env"]},
                       self.tmp, "device-plugin.log")
        sock = os.path.join(self.tmp, "device-plugins", "tensor-fusion.ai_vgpu.sock")
        self.wait_for("the device plugin's socket", lambda: os.path.exists(sock))
        p.terminate()
        self.assertEqual(p.wait(10), 0)
        self.assertFalse(os.path.exists(sock))


if __name__ == "__main__":
    if len(sys.argv) > 1 and not sys.argv[1].startswith("-"):
        TFUSION = sys.argv.pop(1)
    else:
        TFUSION = os.environ.get("TFUSION_BIN")
    unittest.main()
