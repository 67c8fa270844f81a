#!/usr/bin/env python3
"""Renders a Helm chart as `helm template` does, for the template subset gotemplate.py supports.

  render_chart.py CHART_DIR [-f VALUES.yaml ...] [--name RELEASE] [--namespace NS] [--include-crds]

Prints the objects as a multi-document YAML stream, each preceded by "# Source: chart/templates/F",
ordered by kind the way Helm installs them.
"""

import argparse
import os
import re
import sys

import yaml

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gotemplate import Renderer, TemplateError  # noqa: E402

# Helm's install order (kinds not listed go last, in file order).
INSTALL_ORDER = [
    "Namespace", "NetworkPolicy", "ResourceQuota", "LimitRange", "PodSecurityPolicy",
    "PodDisruptionBudget", "ServiceAccount", "Secret", "SecretList", "ConfigMap", "StorageClass",
    "PersistentVolume", "PersistentVolumeClaim", "CustomResourceDefinition", "ClusterRole",
    "ClusterRoleList", "ClusterRoleBinding", "ClusterRoleBindingList", "Role", "RoleList",
    "RoleBinding", "RoleBindingList", "Service", "DaemonSet", "Pod", "ReplicationController",
    "ReplicaSet", "Deployment", "HorizontalPodAutoscaler", "StatefulSet", "Job", "CronJob",
    "IngressClass", "Ingress", "APIService", "MutatingWebhookConfiguration",
    "ValidatingWebhookConfiguration",
]


def merge_values(base, override):
    """Helm's coalescing of a values file over another: maps merge, a null removes the key."""
    out = dict(base)
    for k, v in override.items():
        if v is None:
            out.pop(k, None)
        elif isinstance(v, dict) and isinstance(out.get(k), dict):
            out[k] = merge_values(out[k], v)
        else:
            out[k] = v
    return out


def load_yaml_file(path):
    with open(path) as f:
        data = yaml.safe_load(f)
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise TemplateError(f"{path}: a values file must hold a map")
    return data


def render(chart_dir, values_files=(), release="tensorfusion", namespace="default"):
    """Returns [(source, text, object)] for every non-empty document the templates produce."""
    chart = load_yaml_file(os.path.join(chart_dir, "Chart.yaml"))
    values = load_yaml_file(os.path.join(chart_dir, "values.yaml"))
    for path in values_files:
        values = merge_values(values, load_yaml_file(path))
    root = {
        "Values": values,
        "Release": {"Name": release, "Namespace": namespace, "Service": "Helm",
                    "IsInstall": True, "IsUpgrade": False, "Revision": 1},
        "Chart": {k[:1].upper() + k[1:]: v for k, v in chart.items()},
    }
    tdir = os.path.join(chart_dir, "templates")
    templates = {}
    for name in sorted(os.listdir(tdir)):
        if name.endswith((".yaml", ".yml", ".tpl")):
            with open(os.path.join(tdir, name)) as f:
                templates[name] = f.read()
    renderer = Renderer(templates)
    docs = []
    chart_name = chart["name"]
    for name in sorted(templates):
        if name.startswith("_"):
            continue
        text = renderer.render(name, root)
        for part in re.split(r"(?m)^---[ \t]*$", text):
            body = "\n".join(line for line in part.strip("\n").split("\n")).strip()
            try:
                obj = yaml.safe_load(body) if body else None
            except yaml.YAMLError as e:
                raise TemplateError(f"{name}: rendered YAML does not parse: {e}") from None
            if obj is None:
                continue
            if not isinstance(obj, dict):
                raise TemplateError(f"{name}: a rendered document is not an object")
            docs.append((f"{chart_name}/templates/{name}", body, obj))

    def order(doc):
        kind = doc[2].get("kind")
        return INSTALL_ORDER.index(kind) if kind in INSTALL_ORDER else len(INSTALL_ORDER)

    return sorted(docs, key=order)  # stable: file order within a kind


def crd_documents(chart_dir):
    """[(source, text, object)] of the chart's crds/ folder, in file order."""
    out = []
    cdir = os.path.join(chart_dir, "crds")
    chart_name = load_yaml_file(os.path.join(chart_dir, "Chart.yaml"))["name"]
    for name in sorted(os.listdir(cdir)):
        if name.endswith((".yaml", ".yml")):
            with open(os.path.join(cdir, name)) as f:
                text = f.read()
            for obj in yaml.safe_load_all(text):
                if obj is not None:
                    out.append((f"{chart_name}/crds/{name}", text.strip("\n"), obj))
    return out


def to_stream(docs):
    return "".join(f"---\n# Source: {src}\n{text}\n" for src, text, _ in docs)


def main(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("chart")
    ap.add_argument("-f", "--values", action="append", default=[])
    ap.add_argument("--name", default="tensorfusion")
    ap.add_argument("--namespace", default="default")
    ap.add_argument("--include-crds", action="store_true")
    args = ap.parse_args(argv)
    try:
        docs = render(args.chart, args.values, args.name, args.namespace)
        if args.include_crds:
            docs = crd_documents(args.chart) + docs
    except (TemplateError, OSError, yaml.YAMLError) as e:
        print(f"render_chart: {e}", file=sys.stderr)
        return 1
    sys.stdout.write(to_stream(docs))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
