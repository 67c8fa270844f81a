"""deploy/crds/ and deploy/manifests/ are what tools/chart/regen.py makes from the sources (the CRD
definitions and the chart with its default values): nobody edited them by hand, nobody forgot to
regenerate them."""

import os
import subprocess
import sys
import unittest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


class ManifestsCurrent(unittest.TestCase):
    def test_generated_files_are_up_to_date(self):
        r = subprocess.run([sys.executable, os.path.join(ROOT, "tools", "chart", "regen.py"),
                            "--check"], capture_output=True, text=True)
        self.assertEqual(r.returncode, 0, r.stderr)

    def test_chart_crds_are_the_deploy_crds(self):
        crds = os.path.join(ROOT, "deploy", "helm", "tensorfusion", "crds")
        self.assertEqual(os.path.realpath(crds), os.path.join(os.path.realpath(ROOT), "deploy",
                                                              "crds"))

    def test_plain_manifests_hold_every_object_of_the_default_render(self):
        import yaml
        docs = []
        for name in ("00-namespace.yaml", "01-crds.yaml", "02-tensorfusion.yaml"):
            with open(os.path.join(ROOT, "deploy", "manifests", name)) as f:
                docs.extend(d for d in yaml.safe_load_all(f) if d)
        kinds = [d["kind"] for d in docs]
        self.assertEqual(kinds[0], "Namespace")
        self.assertEqual(kinds.count("CustomResourceDefinition"), 7)
        self.assertEqual(kinds[-1], "MutatingWebhookConfiguration")  # after what it calls
        self.assertTrue(all(d["metadata"].get("namespace") in (None, "tensor-fusion-sys",
                                                                "kube-system") for d in docs))


if __name__ == "__main__":
    unittest.main()
