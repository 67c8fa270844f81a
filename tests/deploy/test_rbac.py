"""RBAC least privilege, from the code: the chart grants each component's ServiceAccount exactly
the Kubernetes API calls listed for it in src/controller/kube_api_access.json (the table kept next
to the API client, which the fake-API-server tests hold the code to), nothing more and nothing
less, with the default values, with every option on, and with the optional components off."""

import os
import sys
import tempfile
import unittest

import yaml

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "tools", "chart"))
import rbac  # noqa: E402
from render_chart import render  # noqa: E402

CHART = os.path.join(ROOT, "deploy", "helm", "tensorfusion")
ALL_ON = os.path.join(os.path.dirname(os.path.abspath(__file__)), "values-all-on.yaml")
NS, REL = "gpu-system", "tf"
VERBS = {"get", "list", "watch", "create", "update", "patch", "delete", "deletecollection"}
# kube-scheduler runs with the roles Kubernetes defines for it; the chart only binds them.
SCHEDULER = {("<role>", "ClusterRole", "system:kube-scheduler"),
             ("<role>", "ClusterRole", "system:volume-scheduler"),
             ("<role>", "Role", "extension-apiserver-authentication-reader")}


def objects(values_files=()):
    return [o for _, _, o in render(CHART, values_files, REL, NS)]


def difference(granted, needed):
    """'' when equal, else what is granted beyond the need and what is missing."""
    more, less = sorted(granted - needed), sorted(needed - granted)
    return "; ".join(([f"grants more than the code calls: {more}"] if more else []) +
                     ([f"lacks what the code calls: {less}"] if less else []))


class TableIsWellFormed(unittest.TestCase):
    def test_every_rule_names_a_verb_and_says_why(self):
        table = rbac.load_table()
        self.assertEqual(set(table["components"]), {"controller", "webhook", "agent"})
        for component, spec in table["components"].items():
            for r in spec["rules"]:
                self.assertTrue(r["why"].strip(), r)
                self.assertTrue(set(r["verbs"]) <= VERBS, r)
                self.assertEqual(len(r["verbs"]), len(set(r["verbs"])), r)
                self.assertNotIn("*", r["resource"] + r["apiGroup"], r)

    def test_requests_map_to_the_verbs_the_api_server_authorizes(self):
        cases = {
            ("GET", "/api/v1/namespaces/ns/pods/p"): ("", "pods", "get"),
            ("POST", "/api/v1/namespaces/ns/pods/p/binding"): ("", "pods/binding", "create"),
            ("GET", "/apis/tensor-fusion.ai/v1/gpupools?limit=500"): ("tensor-fusion.ai", "gpupools", "list"),
            ("GET", "/apis/tensor-fusion.ai/v1/gpus?watch=true&resourceVersion=7"): ("tensor-fusion.ai", "gpus", "watch"),
            ("PUT", "/apis/tensor-fusion.ai/v1/gpupools/a/status"): ("tensor-fusion.ai", "gpupools/status", "update"),
            ("PUT", "/apis/tensor-fusion.ai/v1/namespaces/n/tensorfusionworkloads/w"):
                ("tensor-fusion.ai", "tensorfusionworkloads", "update"),
            ("PATCH", "/apis/tensor-fusion.ai/v1/gpus/g"): ("tensor-fusion.ai", "gpus", "patch"),
            ("DELETE", "/apis/tensor-fusion.ai/v1/gpunodes/n"): ("tensor-fusion.ai", "gpunodes", "delete"),
            ("DELETE", "/apis/tensor-fusion.ai/v1/gpunodes"): ("tensor-fusion.ai", "gpunodes", "deletecollection"),
        }
        for (method, path), want in cases.items():
            self.assertEqual(rbac.access_of(method, path), want, path)
        with self.assertRaises(ValueError):
            rbac.access_of("GET", "/healthz")


class ChartGrantsExactlyWhatTheCodeCalls(unittest.TestCase):
    def check(self, objs, webhook=True, scheduler=True):
        need = rbac.needed()
        got = rbac.granted(objs, NS, REL)
        self.assertEqual(difference(got.get("controller", set()), need["controller"]), "", "controller")
        if webhook:
            self.assertEqual(difference(got.get("webhook", set()), need["webhook"]), "", "webhook")
        else:
            self.assertNotIn("webhook", got)
        self.assertEqual(need["agent"], set())
        self.assertNotIn("agent", got, "the node agent is bound to nothing")
        self.assertEqual(got.get("scheduler", set()), SCHEDULER if scheduler else set())
        self.assertEqual(set(got) - {"controller", "webhook", "scheduler"}, set(), "no other account is bound")

    def test_default_values(self):
        self.check(objects())

    def test_everything_on(self):
        self.check(objects([ALL_ON]))

    def test_optional_components_off(self):
        with tempfile.NamedTemporaryFile("w", suffix=".yaml", delete=False) as f:
            yaml.safe_dump({"webhook": {"enabled": False}, "scheduler": {"enabled": False},
                            "agent": {"enabled": False}}, f)
        try:
            self.check(objects([f.name]), webhook=False, scheduler=False)
        finally:
            os.unlink(f.name)

    def test_a_verb_more_or_less_is_reported(self):
        def controller_role(objs):
            return next(o for o in objs if o["kind"] == "ClusterRole" and o["metadata"]["name"].endswith("-controller"))
        more = objects()
        controller_role(more)["rules"][0]["verbs"].append("patch")
        msg = difference(rbac.granted(more, NS, REL)["controller"], rbac.needed()["controller"])
        self.assertIn("grants more than the code calls: [('tensor-fusion.ai', 'gpupools', 'patch')", msg)
        less = objects()
        role = controller_role(less)
        role["rules"] = [r for r in role["rules"] if "gpupools/status" not in r["resources"]]
        msg = difference(rbac.granted(less, NS, REL)["controller"], rbac.needed()["controller"])
        self.assertIn("lacks what the code calls: [('tensor-fusion.ai', 'gpunodes/status', 'update')", msg)

if __name__ == "__main__":
    unittest.main()
