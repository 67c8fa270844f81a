"""deploy/webhook-cert.sh makes a certificate that the API server and the scheduler would accept
for the webhook Service: a real TLS handshake on loopback, verified against the CA and the
Service's DNS name as a client inside the cluster checks it. The chart takes what the script
prints and renders a valid Secret and webhook configuration from it. A renewal (a second run with
the same --out) signs with the CA already there, so the caBundle the cluster holds stays valid."""

import base64
import os
import socket
import ssl
import subprocess
import sys
import tempfile
import threading
import unittest

import yaml

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "tools", "chart"))
import k8s_validate as kv  # noqa: E402
from render_chart import render  # noqa: E402

SCRIPT = os.path.join(ROOT, "deploy", "webhook-cert.sh")


def run_script(*args):
    return subprocess.run(["bash", SCRIPT, *args], capture_output=True, text=True)


def handshake(out_dir, server_name, cafile=None):
    """Serves tls.crt/tls.key on loopback and connects as a client trusting only ca.crt (or
    cafile)."""
    server_ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server_ctx.load_cert_chain(os.path.join(out_dir, "tls.crt"), os.path.join(out_dir, "tls.key"))
    client_ctx = ssl.create_default_context(cafile=cafile or os.path.join(out_dir, "ca.crt"))
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]

    def serve():
        conn, _ = listener.accept()
        try:
            with server_ctx.wrap_socket(conn, server_side=True) as tls:
                tls.sendall(b"ok")
        except (ssl.SSLError, OSError):
            pass

    t = threading.Thread(target=serve, daemon=True)
    t.start()
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=10) as raw:
            with client_ctx.wrap_socket(raw, server_hostname=server_name) as tls:
                return tls.recv(2)
    finally:
        t.join(10)
        listener.close()


class WebhookCert(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.TemporaryDirectory()
        cls.out = os.path.join(cls.tmp.name, "certs")
        cls.result = run_script("--namespace", "gpu-system", "--release", "tf", "--out", cls.out)

    @classmethod
    def tearDownClass(cls):
        cls.tmp.cleanup()

    def test_script_writes_the_files_and_prints_the_ca_bundle(self):
        self.assertEqual(self.result.returncode, 0, self.result.stderr)
        for name in ("ca.crt", "tls.crt", "tls.key"):
            self.assertTrue(os.path.exists(os.path.join(self.out, name)), name)
        self.assertEqual(oct(os.stat(os.path.join(self.out, "tls.key")).st_mode & 0o777), "0o600")
        bundle = self.result.stdout.split("caBundle: ", 1)[1].strip()
        with open(os.path.join(self.out, "ca.crt"), "rb") as f:
            self.assertEqual(base64.b64decode(bundle), f.read())

    def test_tls_handshake_verifies_for_every_service_name(self):
        for name in ("tf-webhook.gpu-system.svc", "tf-webhook.gpu-system.svc.cluster.local",
                     "tf-webhook.gpu-system", "tf-webhook"):
            with self.subTest(name=name):
                self.assertEqual(handshake(self.out, name), b"ok")

    def test_tls_handshake_fails_for_another_name(self):
        with self.assertRaises(ssl.SSLCertVerificationError):
            handshake(self.out, "tf-webhook.other-namespace.svc")

    def test_chart_renders_a_valid_secret_and_ca_bundle_from_the_output(self):
        def b64(name):
            with open(os.path.join(self.out, name), "rb") as f:
                return base64.b64encode(f.read()).decode()
        values = os.path.join(self.tmp.name, "values.yaml")
        with open(values, "w") as f:
            yaml.safe_dump({"token": {"create": True, "value": "x"},
                            "webhook": {"tls": {"create": True, "certData": b64("tls.crt"),
                                                "keyData": b64("tls.key"),
                                                "caBundle": b64("ca.crt")}}}, f)
        objs = [o for _, _, o in render(os.path.join(ROOT, "deploy", "helm", "tensorfusion"),
                                        [values], "tf", "gpu-system")]
        errors = [e for o in objs for e in kv.validate_builtin(o)] + kv.check_references(objs)
        self.assertEqual(errors, [])
        secret = next(o for o in objs if o["kind"] == "Secret" and
                      o["metadata"]["name"] == "tf-webhook-tls")
        self.assertEqual(secret["type"], "kubernetes.io/tls")
        mwc = next(o for o in objs if o["kind"] == "MutatingWebhookConfiguration")
        self.assertEqual(mwc["webhooks"][0]["clientConfig"]["caBundle"], b64("ca.crt"))

    def test_bad_arguments_are_refused_and_write_nothing(self):
        for args, message in [((), "--namespace is required"),
                              (("--namespace", "Bad_NS"), "'Bad_NS' is not a Kubernetes name"),
                              (("--namespace", "ok", "--days", "0"), "--days takes 1 to 3650"),
                              (("--namespace", "ok", "--bogus"), "unknown argument '--bogus'")]:
            with self.subTest(args=args):
                out = os.path.join(self.tmp.name, "refused")
                r = run_script(*args, "--out", out)
                self.assertEqual(r.returncode, 2)
                self.assertIn(message, r.stderr)
                self.assertFalse(os.path.exists(out))

    def test_help_prints_the_usage_and_exits_0(self):
        r = run_script("--help")
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("deploy/webhook-cert.sh --namespace NS", r.stdout)
        self.assertIn("--new-ca", r.stdout)
        self.assertNotIn("set -euo pipefail", r.stdout)
        self.assertFalse(r.stdout.lstrip().startswith("!"), r.stdout)  # no shebang


def read(path):
    with open(path, "rb") as f:
        return f.read()


def ca_bundle(result):
    return result.stdout.split("caBundle: ", 1)[1].strip()


class WebhookCertRenewal(unittest.TestCase):
    """docs/kubernetes.md: keep the folder; a run with the same --out renews the certificate."""

    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        self.out = os.path.join(self.tmp.name, "webhook-tls")
        first = run_script("--namespace", "gpu-system", "--release", "tf", "--out", self.out)
        self.assertEqual(first.returncode, 0, first.stderr)
        self.assertIn("with a new CA", first.stdout)
        self.bundle = ca_bundle(first)
        # What the cluster holds after the install: the caBundle, i.e. this ca.crt.
        self.installed_ca = os.path.join(self.tmp.name, "installed-ca.crt")
        with open(self.installed_ca, "wb") as f:
            f.write(read(os.path.join(self.out, "ca.crt")))
        self.ca_key = read(os.path.join(self.out, "ca.key"))
        self.tls_crt = read(os.path.join(self.out, "tls.crt"))

    def tearDown(self):
        self.tmp.cleanup()

    def test_renewal_in_the_same_folder_signs_with_the_kept_ca(self):
        r = run_script("--namespace", "gpu-system", "--release", "tf", "--out", self.out)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("signed with the CA already there", r.stdout)
        self.assertEqual(ca_bundle(r), self.bundle)
        self.assertEqual(read(os.path.join(self.out, "ca.crt")), read(self.installed_ca))
        self.assertEqual(read(os.path.join(self.out, "ca.key")), self.ca_key)
        self.assertNotEqual(read(os.path.join(self.out, "tls.crt")), self.tls_crt)
        # The new certificate verifies against the caBundle installed with the first one.
        self.assertEqual(handshake(self.out, "tf-webhook.gpu-system.svc", self.installed_ca), b"ok")

    def test_new_ca_makes_a_new_ca_and_says_the_ca_bundle_changes(self):
        r = run_script("--namespace", "gpu-system", "--release", "tf", "--out", self.out,
                       "--new-ca")
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("is replaced: set the new caBundle", r.stdout)
        self.assertNotEqual(ca_bundle(r), self.bundle)
        self.assertEqual(base64.b64decode(ca_bundle(r)), read(os.path.join(self.out, "ca.crt")))
        self.assertEqual(handshake(self.out, "tf-webhook.gpu-system.svc"), b"ok")
        with self.assertRaises(ssl.SSLCertVerificationError):
            handshake(self.out, "tf-webhook.gpu-system.svc", self.installed_ca)

    def assert_refused_and_unchanged(self, message, *args):
        before = {n: read(os.path.join(self.out, n)) for n in os.listdir(self.out)}
        r = run_script("--namespace", "gpu-system", "--release", "tf", "--out", self.out, *args)
        self.assertEqual(r.returncode, 2, r.stdout)
        self.assertIn(message, r.stderr)
        self.assertEqual({n: read(os.path.join(self.out, n)) for n in os.listdir(self.out)}, before)

    def test_a_folder_with_half_a_ca_is_refused(self):
        os.unlink(os.path.join(self.out, "ca.crt"))
        self.assert_refused_and_unchanged("holds only one of ca.crt and ca.key")

    def test_a_ca_key_of_another_ca_is_refused(self):
        other = os.path.join(self.tmp.name, "other")
        self.assertEqual(run_script("--namespace", "x", "--out", other).returncode, 0)
        with open(os.path.join(self.out, "ca.key"), "wb") as f:
            f.write(read(os.path.join(other, "ca.key")))
        self.assert_refused_and_unchanged("ca.key is not the key of")

    def test_a_ca_that_expires_before_the_new_certificate_is_refused(self):
        subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "5",
                        "-subj", "/CN=short-lived-ca", "-keyout", os.path.join(self.out, "ca.key"),
                        "-out", os.path.join(self.out, "ca.crt")], check=True, capture_output=True)
        self.assert_refused_and_unchanged("before a certificate of 30 days would", "--days", "30")
        r = run_script("--namespace", "gpu-system", "--release", "tf", "--out", self.out,
                       "--days", "3")
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertEqual(handshake(self.out, "tf-webhook.gpu-system.svc"), b"ok")


if __name__ == "__main__":
    unittest.main()
