"""The CRDs in deploy/crds/ are valid v1 structural schemas; the examples in deploy/examples/ are
accepted by them, and each file in refused/ is refused with the message its first line names."""

import copy
import glob
import os
import sys
import unittest

import yaml

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "tools", "chart"))
import k8s_validate as kv  # noqa: E402
from cel import CelError, compile_rule, evaluate, parse_quantity  # noqa: E402

KINDS = {"GPUPool", "GPUNode", "GPU", "TensorFusionWorkload", "TensorFusionConnection",
         "SchedulingConfigTemplate", "WorkloadProfile"}


def load_all(pattern):
    out = []
    for path in sorted(glob.glob(pattern)):
        with open(path) as f:
            out.extend((path, d) for d in yaml.safe_load_all(f) if d is not None)
    return out


CRDS = [d for _, d in load_all(os.path.join(ROOT, "deploy", "crds", "*.yaml"))]
INDEX = kv.crd_index(CRDS)


class CrdTest(unittest.TestCase):
    def test_every_kind_of_the_model_has_a_crd_in_group_tensor_fusion_ai_v1(self):
        self.assertEqual({c["spec"]["names"]["kind"] for c in CRDS}, KINDS)
        for c in CRDS:
            self.assertEqual(c["spec"]["group"], "tensor-fusion.ai")
            self.assertEqual([v["name"] for v in c["spec"]["versions"]], ["v1"])

    def test_crds_are_valid_structural_schemas(self):
        for c in CRDS:
            with self.subTest(crd=c["metadata"]["name"]):
                self.assertEqual(kv.validate_crd(c), [])

    def test_every_kind_has_status_subresource_and_printer_columns(self):
        for c in CRDS:
            v = c["spec"]["versions"][0]
            self.assertIn("status", v["subresources"], c["metadata"]["name"])
            self.assertGreaterEqual(len(v["additionalPrinterColumns"]), 2, c["metadata"]["name"])

    def test_nothing_is_preserved_unknown(self):
        for c in CRDS:
            text = yaml.safe_dump(c)
            self.assertNotIn("x-kubernetes-preserve-unknown-fields", text, c["metadata"]["name"])

    def test_structural_checker_catches_what_the_api_server_refuses(self):
        base = copy.deepcopy(next(c for c in CRDS if c["spec"]["names"]["kind"] == "GPUPool"))
        schema = base["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
        schema["properties"]["spec"]["properties"]["untyped"] = {"description": "no type"}
        schema["properties"]["spec"]["properties"]["both"] = {
            "type": "object", "properties": {"a": {"type": "string"}},
            "additionalProperties": {"type": "string"}}
        schema["properties"]["spec"]["properties"]["badrule"] = {
            "type": "string", "x-kubernetes-validations": [{"rule": "self.matches('x')"}]}
        schema["properties"]["spec"]["properties"]["baddefault"] = {
            "type": "integer", "minimum": 1, "default": 0}
        base["spec"]["versions"][0]["additionalPrinterColumns"].append(
            {"name": "Nope", "type": "string", "jsonPath": ".status.nothing"})
        base["spec"]["versions"][0]["unknownField"] = True
        errors = "\n".join(kv.validate_crd(base))
        self.assertIn("untyped: type is required", errors)
        self.assertIn("both: properties and additionalProperties are mutually exclusive", errors)
        self.assertIn("method 'matches' is outside the supported CEL subset", errors)
        self.assertIn("baddefault.default: does not validate", errors)
        self.assertIn("printer column Nope: .status.nothing is not in the schema", errors)
        self.assertIn("unknownField: unknown field of V1CustomResourceDefinitionVersion", errors)


class ExampleTest(unittest.TestCase):
    def test_examples_are_accepted(self):
        examples = load_all(os.path.join(ROOT, "deploy", "examples", "*.yaml"))
        self.assertGreaterEqual({d["kind"] for _, d in examples}, KINDS)
        for path, doc in examples:
            with self.subTest(example=os.path.basename(path), name=doc["metadata"]["name"]):
                self.assertEqual(kv.validate_cr(doc, INDEX), [])

    def test_refused_examples_are_refused_with_their_message(self):
        files = sorted(glob.glob(os.path.join(os.path.dirname(__file__), "refused", "*.yaml")))
        self.assertGreaterEqual(len(files), 10)
        for path in files:
            with open(path) as f:
                first = f.readline()
                doc = yaml.safe_load(first + f.read())
            self.assertTrue(first.startswith("# refused: "), path)
            expected = first[len("# refused: "):].strip()
            with self.subTest(example=os.path.basename(path)):
                errors = kv.validate_cr(doc, INDEX)
                self.assertTrue(errors, "accepted, but should be refused")
                self.assertIn(expected, "\n".join(errors))

    def test_defaults_are_applied_before_validation(self):
        doc = {"apiVersion": "tensor-fusion.ai/v1", "kind": "SchedulingConfigTemplate",
               "metadata": {"name": "defaulted"}, "spec": {"placement": {}}}
        self.assertEqual(kv.validate_cr(doc, INDEX), [])

    def test_tensorfusion_style_integer_quantities_are_accepted(self):
        doc = {"apiVersion": "tensor-fusion.ai/v1", "kind": "TensorFusionWorkload",
               "metadata": {"name": "ints", "namespace": "default"},
               "spec": {"resources": {"requests": {"tflops": 10, "vram": "4Gi"},
                                      "limits": {"tflops": "1.5e1", "vram": 4294967296}}}}
        self.assertEqual(kv.validate_cr(doc, INDEX), [])


class CelSubset(unittest.TestCase):
    """The rule evaluator agrees with Kubernetes' quantity grammar and CEL's error rules."""

    def test_quantities_parse_exactly_as_kubernetes_reads_them(self):
        self.assertEqual(parse_quantity("1.5Gi"), 1610612736)
        self.assertEqual(parse_quantity("512Mi"), 512 * 2**20)
        self.assertEqual(parse_quantity("1e3"), 1000)
        self.assertEqual(parse_quantity("100m") * 10, 1)
        self.assertEqual(parse_quantity(".5"), parse_quantity("500m"))
        for bad in ("1K", "1 Gi", "Gi", "1GiB", "--1", "", "1.5.2", "NaN"):
            self.assertIsNone(parse_quantity(bad), bad)

    def test_quantity_comparisons(self):
        self.assertTrue(evaluate("quantity('1Gi').compareTo(quantity('1024Mi')) == 0", None))
        self.assertTrue(evaluate("quantity(string(self)).isGreaterThan(quantity('0'))", 3))
        self.assertFalse(evaluate("quantity(string(self)).isLessThan(quantity('1Mi'))", "8Gi"))
        self.assertTrue(evaluate("isQuantity('8Gi') && !isQuantity('8GB')", None))

    def test_absent_fields_are_errors_unless_guarded(self):
        with self.assertRaisesRegex(CelError, "no such key: limits"):
            evaluate("self.limits.tflops == 1", {})
        self.assertTrue(evaluate("!has(self.limits) || self.limits.tflops == 1", {}))
        # && and || absorb an error when the other side decides, as in CEL.
        self.assertFalse(evaluate("self.nope == 1 && false", {}))
        self.assertTrue(evaluate("self.nope == 1 || true", {}))

    def test_rules_outside_the_subset_are_refused(self):
        for rule in ("self.all(x, x > 0)", "self.matches('^a')", "self + 1 > 2", "oldSelf == self"):
            with self.subTest(rule=rule), self.assertRaises(CelError):
                compile_rule(rule)


if __name__ == "__main__":
    unittest.main()
