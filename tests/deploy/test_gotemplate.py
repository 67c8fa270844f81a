"""The chart renderer gives what Go's text/template and Helm give for the subset it supports, and
refuses what is outside it instead of rendering something else."""

import os
import sys
import unittest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "tools", "chart"))
from gotemplate import Renderer, TemplateError  # noqa: E402

ROOTCTX = {"Values": {"port": 9300, "name": "gpu", "empty": "", "zero": 0, "off": False,
                      "list": ["a", "b"], "map": {"z": 1, "a": 2},
                      "nested": {"b": [1, {"x": "y"}], "a": "text"}, "ratio": 1.5},
           "Release": {"Name": "rel", "Namespace": "ns", "Service": "Helm"},
           "Chart": {"Name": "tensorfusion", "AppVersion": "0.1.0"}}


def render(text, extra=None):
    templates = {"t.yaml": text}
    templates.update(extra or {})
    return Renderer(templates).render("t.yaml", ROOTCTX)


class GoTemplateSemantics(unittest.TestCase):
    def test_values_and_release(self):
        self.assertEqual(render("{{ .Release.Name }}:{{ .Values.port }} {{ $.Chart.Name }}"),
                         "rel:9300 tensorfusion")
        self.assertEqual(render("{{ .Values.ratio }} {{ .Values.off }}"), "1.5 false")

    def test_missing_value_prints_nothing_and_missing_parent_is_an_error(self):
        self.assertEqual(render("[{{ .Values.nothing }}]"), "[]")
        with self.assertRaisesRegex(TemplateError, r"t.yaml:1: nil pointer evaluating "
                                                   r"\.Values\.nothing\.deeper"):
            render("{{ .Values.nothing.deeper }}")

    def test_whitespace_trimming(self):
        self.assertEqual(render("a  \n  {{- \"b\" }}\n"), "ab\n")
        self.assertEqual(render("{{ \"a\" -}}  \n\n  b"), "ab")
        self.assertEqual(render("x\n{{- /* a comment */ -}}\ny"), "xy")
        self.assertEqual(render("x\n{{/* a comment */}}\ny"), "x\n\ny")

    def test_if_else_if_else(self):
        t = "{{ if .Values.off }}A{{ else if .Values.zero }}B{{ else if .Values.name }}C" \
            "{{ else }}D{{ end }}"
        self.assertEqual(render(t), "C")
        # Go's truth: false, 0, "", empty list and map are false.
        for field in ("off", "zero", "empty", "nothing"):
            self.assertEqual(render("{{ if .Values.%s }}T{{ else }}F{{ end }}" % field), "F")
        self.assertEqual(render("{{ if .Values.list }}T{{ end }}"), "T")

    def test_range_lists_and_maps_in_key_order(self):
        self.assertEqual(render("{{ range .Values.list }}<{{ . }}>{{ end }}"), "<a><b>")
        self.assertEqual(render("{{ range $k, $v := .Values.map }}{{ $k }}={{ $v }};{{ end }}"),
                         "a=2;z=1;")
        self.assertEqual(render("{{ range $i, $v := .Values.list }}{{ $i }}{{ $v }}{{ end }}"),
                         "0a1b")
        self.assertEqual(render("{{ range .Values.list }}{{ $.Release.Name }}{{ end }}"),
                         "relrel")
        self.assertEqual(render("{{ range .Values.nothing }}x{{ else }}none{{ end }}"), "none")

    def test_define_include_and_nindent(self):
        helpers = {"_h.tpl": '{{- define "labels" -}}\na: {{ .Release.Name }}\nb: c\n{{- end }}'}
        self.assertEqual(render("m:\n  {{- include \"labels\" . | nindent 2 }}\n", helpers),
                         "m:\n  a: rel\n  b: c\n")
        self.assertEqual(render('{{ include "labels" . | indent 4 }}', helpers),
                         "    a: rel\n    b: c")

    def test_quote_default_required(self):
        self.assertEqual(render("{{ .Values.port | quote }} {{ quote .Values.name }}"),
                         '"9300" "gpu"')
        self.assertEqual(render('{{ .Values.empty | default "d" }} {{ .Values.name | default "d" }}'),
                         "d gpu")
        self.assertEqual(render("{{ .Values.zero | default 5 }}"), "5")
        with self.assertRaisesRegex(TemplateError, "need a name"):
            render('{{ required "need a name" .Values.empty }}')

    def test_eq_ne_not_and_or(self):
        self.assertEqual(render('{{ if eq .Values.name "gpu" }}y{{ end }}'), "y")
        self.assertEqual(render("{{ if ne .Values.port -1 }}y{{ end }}"), "y")
        self.assertEqual(render("{{ if not .Values.off }}y{{ end }}"), "y")
        self.assertEqual(render("{{ if and .Values.name .Values.zero }}y{{ else }}n{{ end }}"), "n")
        self.assertEqual(render("{{ if or .Values.zero .Values.name }}y{{ end }}"), "y")
        self.assertEqual(render("{{ and .Values.name .Values.port }}"), "9300")

    def test_to_yaml_sorts_keys_in_block_style(self):
        self.assertEqual(render("x:\n  {{- toYaml .Values.nested | nindent 2 }}"),
                         "x:\n  a: text\n  b:\n  - 1\n  - x: y")
        self.assertEqual(render("{{ toYaml .Values.map }}"), "a: 2\nz: 1")

    def test_parenthesised_pipelines(self):
        self.assertEqual(render('{{ default (quote .Values.name) .Values.empty }}'), '"gpu"')

    def test_constructs_outside_the_subset_are_refused(self):
        for text, what in [("{{ with .Values.name }}{{ . }}{{ end }}", "'with'"),
                           ('{{ printf "%s" .Values.name }}', "'printf'"),
                           ('{{ tpl "x" . }}', "'tpl'"),
                           ('{{ template "x" . }}', "'template'"),
                           ("{{ .Values.name | upper }}", "'upper'")]:
            with self.subTest(text=text):
                with self.assertRaisesRegex(TemplateError, what + ".*outside the supported"):
                    render(text)

    def test_malformed_templates_are_refused_with_the_line(self):
        with self.assertRaisesRegex(TemplateError, "missing"):
            render("{{ if .Values.name }}\nx\n")
        with self.assertRaisesRegex(TemplateError, "t.yaml:3: unexpected 'end'"):
            render("a\nb\n{{ end }}")
        with self.assertRaisesRegex(TemplateError, "no template named 'nope'"):
            render('{{ include "nope" . }}')


if __name__ == "__main__":
    unittest.main()
