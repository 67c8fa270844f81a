"""Validation of Kubernetes objects without a cluster.

- Built-in kinds: against the API types of the Kubernetes Python client (Debian's
  python3-kubernetes): every field known to its model class, required fields present, values of
  the declared type, recursively (validate_builtin).
- References between the objects of one release that the API server would accept but that would
  break at run time: selectors that match no pod template, volumes mounted but not declared,
  service accounts, roles and services named but not rendered (check_references).
- kube-scheduler's configuration file (validate_scheduler_config), which no client library types.
- CustomResourceDefinitions: the model check plus the rules the API server applies to v1 CRD
  schemas (structural schema, forbidden keywords, defaults that validate, printer columns that
  point into the schema, CEL rules that parse) (validate_crd).
- Custom resources: against their CRD's schema with python3-jsonschema, unknown fields refused
  as kubectl's default strict field validation does, and the CEL rules evaluated (validate_cr).

Every function returns a list of error strings naming the object and the path; empty: valid.
"""

import base64
import copy
import functools
import inspect
import re

import jsonschema
import kubernetes.client as kclient

from cel import CelError, compile_rule, evaluate

# (apiVersion, kind) -> model class of the Python client, for the kinds our charts render.
BUILTIN = {
    ("v1", "Namespace"): "V1Namespace",
    ("v1", "ServiceAccount"): "V1ServiceAccount",
    ("v1", "Secret"): "V1Secret",
    ("v1", "ConfigMap"): "V1ConfigMap",
    ("v1", "Service"): "V1Service",
    ("v1", "PersistentVolumeClaim"): "V1PersistentVolumeClaim",
    ("apps/v1", "Deployment"): "V1Deployment",
    ("apps/v1", "DaemonSet"): "V1DaemonSet",
    ("rbac.authorization.k8s.io/v1", "ClusterRole"): "V1ClusterRole",
    ("rbac.authorization.k8s.io/v1", "ClusterRoleBinding"): "V1ClusterRoleBinding",
    ("rbac.authorization.k8s.io/v1", "Role"): "V1Role",
    ("rbac.authorization.k8s.io/v1", "RoleBinding"): "V1RoleBinding",
    ("admissionregistration.k8s.io/v1", "MutatingWebhookConfiguration"):
        "V1MutatingWebhookConfiguration",
    ("apiextensions.k8s.io/v1", "CustomResourceDefinition"): "V1CustomResourceDefinition",
}

# Fields newer than the Python client's API types (it describes Kubernetes 1.22), checked by hand:
# model class -> {JSON field: checker(value, path) -> [errors]}.
def _check_validation_rules(value, path):
    if not isinstance(value, list):
        return [f"{path}: must be a list"]
    errors = []
    for i, rule in enumerate(value):
        p = f"{path}[{i}]"
        if not isinstance(rule, dict):
            errors.append(f"{p}: must be an object")
            continue
        for k in rule:
            if k not in ("rule", "message", "messageExpression", "reason", "fieldPath",
                         "optionalOldSelf"):
                errors.append(f"{p}.{k}: unknown field")
        if not isinstance(rule.get("rule"), str):
            errors.append(f"{p}.rule: required string")
        if "message" in rule and not isinstance(rule["message"], str):
            errors.append(f"{p}.message: must be a string")
    return errors


NEWER_FIELDS = {"V1JSONSchemaProps": {"x-kubernetes-validations": _check_validation_rules}}

_REQUIRED = re.compile(r"Invalid value for `(\w+)`, must not be `None`")
_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")


@functools.lru_cache(maxsize=None)
def _model(name):
    cls = getattr(kclient, name)
    required = set(_REQUIRED.findall(inspect.getsource(cls)))
    fields = {json_name: (attr, cls.openapi_types[attr])
              for attr, json_name in cls.attribute_map.items()}
    return fields, {cls.attribute_map[a] for a in required}


def _check_type(value, typ, path, errors):
    if typ.startswith("list["):
        if not isinstance(value, list):
            errors.append(f"{path}: must be a list, not {type(value).__name__}")
            return
        for i, item in enumerate(value):
            _check_type(item, typ[5:-1], f"{path}[{i}]", errors)
    elif typ.startswith("dict("):
        if not isinstance(value, dict):
            errors.append(f"{path}: must be a map, not {type(value).__name__}")
            return
        inner = typ[5:-1].split(", ", 1)[1]
        for k, v in value.items():
            if not isinstance(k, str):
                errors.append(f"{path}: key {k!r} must be a string")
            _check_type(v, inner, f"{path}.{k}", errors)
    elif typ == "str":
        if not isinstance(value, str):
            errors.append(f"{path}: must be a string, not {type(value).__name__} ({value!r})")
    elif typ == "int":
        if isinstance(value, bool) or not isinstance(value, int):
            errors.append(f"{path}: must be an integer, not {type(value).__name__}")
    elif typ == "float":
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            errors.append(f"{path}: must be a number, not {type(value).__name__}")
    elif typ == "bool":
        if not isinstance(value, bool):
            errors.append(f"{path}: must be true or false, not {value!r}")
    elif typ in ("datetime", "date"):
        if not isinstance(value, str):
            errors.append(f"{path}: must be a timestamp string")
    elif typ == "object":
        pass  # free-form in the API (IntOrString, JSON)
    else:
        _check_model(value, typ, path, errors)


def _check_model(value, name, path, errors):
    if not isinstance(value, dict):
        errors.append(f"{path}: must be an object ({name}), not {type(value).__name__}")
        return
    fields, required = _model(name)
    newer = NEWER_FIELDS.get(name, {})
    for key, v in value.items():
        p = f"{path}.{key}" if path else key
        if key in newer:
            errors.extend(newer[key](v, p))
        elif key not in fields:
            errors.append(f"{p}: unknown field of {name}")
        elif v is not None:
            _check_type(v, fields[key][1], p, errors)
    for key in sorted(required):
        if value.get(key) is None:
            errors.append(f"{path + '.' if path else ''}{key}: required by {name}")


def describe(obj):
    meta = obj.get("metadata") or {}
    ns = meta.get("namespace")
    return f"{obj.get('kind')} {ns + '/' if ns else ''}{meta.get('name')}"


def validate_builtin(obj):
    """Errors of a built-in object against the API types; [] when valid."""
    key = (obj.get("apiVersion"), obj.get("kind"))
    if key not in BUILTIN:
        return [f"{describe(obj)}: apiVersion/kind {key} is not a kind this validator knows"]
    errors = []
    _check_model(obj, BUILTIN[key], "", errors)
    meta = obj.get("metadata") or {}
    name = meta.get("name", "")
    if not isinstance(name, str) or not _DNS_SUBDOMAIN.match(name) or len(name) > 253:
        errors.append(f"metadata.name: {name!r} is not a DNS subdomain")
    if obj["kind"] in ("Service", "Namespace") and not (_DNS_LABEL.match(name or "") and
                                                       len(name) <= 63):
        errors.append(f"metadata.name: a {obj['kind']} name must be a DNS label of at most 63")
    for k, v in (meta.get("labels") or {}).items():
        if not isinstance(v, str) or len(v) > 63:
            errors.append(f"metadata.labels.{k}: label values are strings of at most 63")
    if not errors:  # the semantic checks rely on the types being right
        errors.extend(_semantic_checks(obj))
    return [f"{describe(obj)}: {e}" for e in errors]


def _pod_spec(obj):
    if obj.get("kind") in ("Deployment", "DaemonSet"):
        return ((obj.get("spec") or {}).get("template") or {}).get("spec") or {}
    return None


def _semantic_checks(obj):
    """What the API server itself refuses beyond types, for the fields our charts use."""
    errors = []
    kind = obj.get("kind")
    spec = obj.get("spec") or {}
    pod = _pod_spec(obj)
    if pod is not None:
        tmpl_labels = ((spec.get("template") or {}).get("metadata") or {}).get("labels") or {}
        selector = (spec.get("selector") or {}).get("matchLabels") or {}
        if not selector:
            errors.append("spec.selector.matchLabels: empty")
        for k, v in selector.items():
            if tmpl_labels.get(k) != v:
                errors.append(f"spec.selector: {k}={v} does not match the pod template's labels")
        volumes = {v.get("name") for v in pod.get("volumes") or []}
        if len(volumes) != len(pod.get("volumes") or []):
            errors.append("spec.template.spec.volumes: duplicate names")
        for c in (pod.get("containers") or []) + (pod.get("initContainers") or []):
            for m in c.get("volumeMounts") or []:
                if m.get("name") not in volumes:
                    errors.append(f"container {c.get('name')}: mounts undeclared volume "
                                  f"{m.get('name')}")
            ports = set()
            for p in c.get("ports") or []:
                name = p.get("name")
                if name is not None:
                    if not re.match(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$", name) or len(name) > 15:
                        errors.append(f"container {c.get('name')}: port name {name!r} is not an "
                                      "IANA service name (at most 15)")
                    ports.add(name)
                if not 1 <= p.get("containerPort", 0) <= 65535:
                    errors.append(f"container {c.get('name')}: containerPort out of range")
            for probe in ("readinessProbe", "livenessProbe", "startupProbe"):
                port = ((c.get(probe) or {}).get("httpGet") or {}).get("port")
                if isinstance(port, str) and port not in ports:
                    errors.append(f"container {c.get('name')}: {probe} names port {port!r} the "
                                  "container does not declare")
            if not isinstance(c.get("image"), str) or not c["image"] or " " in c["image"]:
                errors.append(f"container {c.get('name')}: image {c.get('image')!r}")
    if kind == "Service":
        for p in spec.get("ports") or []:
            if not 1 <= p.get("port", 0) <= 65535:
                errors.append(f"spec.ports: port {p.get('port')} out of range")
    if kind == "Secret":
        for k, v in (obj.get("data") or {}).items():
            try:
                base64.b64decode(v, validate=True)
            except (ValueError, TypeError):
                errors.append(f"data.{k}: not base64")
    if kind == "MutatingWebhookConfiguration":
        for i, w in enumerate(obj.get("webhooks") or []):
            name = w.get("name", "")
            if not _DNS_SUBDOMAIN.match(name) or name.count(".") < 2:
                errors.append(f"webhooks[{i}].name: {name!r} needs at least three DNS segments")
            if w.get("sideEffects") not in ("None", "NoneOnDryRun"):
                errors.append(f"webhooks[{i}].sideEffects: must be None or NoneOnDryRun for "
                              "admissionregistration.k8s.io/v1")
            if not w.get("admissionReviewVersions"):
                errors.append(f"webhooks[{i}].admissionReviewVersions: required")
            t = w.get("timeoutSeconds", 10)
            if not 1 <= t <= 30:
                errors.append(f"webhooks[{i}].timeoutSeconds: must be 1-30")
            if w.get("failurePolicy", "Fail") not in ("Fail", "Ignore"):
                errors.append(f"webhooks[{i}].failurePolicy: Fail or Ignore")
    return errors


def check_references(objs):
    """Cross-object errors among the objects of one release."""
    errors = []
    by_kind = {}
    for o in objs:
        by_kind.setdefault(o.get("kind"), []).append(o)

    def names(kind, namespace=None):
        return {(o["metadata"].get("namespace"), o["metadata"]["name"])
                for o in by_kind.get(kind, [])
                if namespace is None or o["metadata"].get("namespace") == namespace}

    def has(kind, ns, name):
        return (ns, name) in names(kind)

    pods = []
    for o in by_kind.get("Deployment", []) + by_kind.get("DaemonSet", []):
        ns = o["metadata"].get("namespace")
        tmpl = o["spec"]["template"]
        pods.append((ns, tmpl.get("metadata", {}).get("labels", {}), o))
        sa = tmpl["spec"].get("serviceAccountName")
        if sa and not has("ServiceAccount", ns, sa):
            errors.append(f"{describe(o)}: ServiceAccount {sa} is not part of the release")
        for v in tmpl["spec"].get("volumes") or []:
            if "configMap" in v and not has("ConfigMap", ns, v["configMap"]["name"]):
                errors.append(f"{describe(o)}: ConfigMap {v['configMap']['name']} is not part of "
                              "the release")
            if "persistentVolumeClaim" in v and not has(
                    "PersistentVolumeClaim", ns, v["persistentVolumeClaim"]["claimName"]):
                errors.append(f"{describe(o)}: PVC {v['persistentVolumeClaim']['claimName']} is "
                              "not part of the release")
    for svc in by_kind.get("Service", []):
        ns = svc["metadata"].get("namespace")
        sel = svc["spec"].get("selector") or {}
        matching = [p for p in pods if p[0] == ns and all(p[1].get(k) == v for k, v in sel.items())]
        if not matching:
            errors.append(f"{describe(svc)}: selector {sel} matches no pod template")
        for port in svc["spec"].get("ports") or []:
            target = port.get("targetPort")
            if isinstance(target, str):
                for _, _, o in matching:
                    declared = {p.get("name") for c in o["spec"]["template"]["spec"]["containers"]
                                for p in c.get("ports") or []}
                    if target not in declared:
                        errors.append(f"{describe(svc)}: targetPort {target} is not a port of "
                                      f"{describe(o)}")
    for b in by_kind.get("ClusterRoleBinding", []) + by_kind.get("RoleBinding", []):
        ref = b.get("roleRef") or {}
        name = ref.get("name", "")
        if not name.startswith("system:") and name != "extension-apiserver-authentication-reader":
            ns = b["metadata"].get("namespace") if ref.get("kind") == "Role" else None
            if not has(ref.get("kind"), ns, name):
                errors.append(f"{describe(b)}: {ref.get('kind')} {name} is not part of the release")
        for s in b.get("subjects") or []:
            if s.get("kind") == "ServiceAccount" and not has("ServiceAccount", s.get("namespace"),
                                                             s.get("name")):
                errors.append(f"{describe(b)}: ServiceAccount {s.get('name')} is not part of the "
                              "release")
    for w in by_kind.get("MutatingWebhookConfiguration", []):
        for hook in w.get("webhooks") or []:
            svc = (hook.get("clientConfig") or {}).get("service")
            if svc:
                match = [s for s in by_kind.get("Service", [])
                         if s["metadata"]["name"] == svc.get("name")
                         and s["metadata"].get("namespace") == svc.get("namespace")]
                if not match:
                    errors.append(f"{describe(w)}: Service {svc.get('name')} is not part of the "
                                  "release")
                elif svc.get("port", 443) not in [p.get("port") for p in match[0]["spec"]["ports"]]:
                    errors.append(f"{describe(w)}: Service {svc.get('name')} has no port "
                                  f"{svc.get('port', 443)}")
    return errors


# kube-scheduler's configuration (kubescheduler.config.k8s.io/v1, Kubernetes 1.25+), for the
# fields our chart writes; unknown fields are refused, as kube-scheduler's strict decoding does.
_DURATION = {"type": "string", "pattern": r"^([0-9]+(\.[0-9]+)?(ns|us|ms|s|m|h))+$"}
SCHEDULER_CONFIG_SCHEMA = {
    "type": "object",
    "additionalProperties": False,
    "required": ["apiVersion", "kind"],
    "properties": {
        "apiVersion": {"const": "kubescheduler.config.k8s.io/v1"},
        "kind": {"const": "KubeSchedulerConfiguration"},
        "leaderElection": {"type": "object", "additionalProperties": False, "properties": {
            "leaderElect": {"type": "boolean"}, "resourceName": {"type": "string"},
            "resourceNamespace": {"type": "string"}}},
        "profiles": {"type": "array", "minItems": 1, "items": {
            "type": "object", "additionalProperties": False, "required": ["schedulerName"],
            "properties": {"schedulerName": {"type": "string", "minLength": 1}}}},
        "extenders": {"type": "array", "items": {
            "type": "object", "additionalProperties": False, "required": ["urlPrefix"],
            "properties": {
                "urlPrefix": {"type": "string", "pattern": r"^https?://[^\s]+$"},
                "filterVerb": {"type": "string"}, "preemptVerb": {"type": "string"},
                "prioritizeVerb": {"type": "string"}, "bindVerb": {"type": "string"},
                "weight": {"type": "integer", "minimum": 1},
                "enableHTTPS": {"type": "boolean"},
                "tlsConfig": {"type": "object", "additionalProperties": False, "properties": {
                    k: {"type": "string"} for k in ("serverName", "certFile", "keyFile", "caFile",
                                                    "certData", "keyData", "caData")} | {
                    "insecure": {"type": "boolean"}}},
                "httpTimeout": _DURATION,
                "nodeCacheCapable": {"type": "boolean"},
                "managedResources": {"type": "array"},
                "ignorable": {"type": "boolean"},
            }}},
    },
}


def validate_scheduler_config(config):
    errors = [f"KubeSchedulerConfiguration: {'.'.join(map(str, e.absolute_path))}: {e.message}"
              for e in jsonschema.Draft7Validator(SCHEDULER_CONFIG_SCHEMA).iter_errors(config)]
    for i, ext in enumerate(config.get("extenders") or []):
        if ext.get("prioritizeVerb") and not ext.get("weight"):
            errors.append(f"KubeSchedulerConfiguration: extenders[{i}]: a prioritizeVerb needs "
                          "a positive weight")
        if ext.get("enableHTTPS") and not ext["urlPrefix"].startswith("https://"):
            errors.append(f"KubeSchedulerConfiguration: extenders[{i}]: enableHTTPS with a "
                          "plain http urlPrefix")
    return errors


# ---------------------------------------------------------------------------------------------
# CustomResourceDefinitions.

_FORBIDDEN = {"$ref": "$ref is not allowed in CRD schemas", "definitions": "not allowed",
              "dependencies": "not allowed", "additionalItems": "not allowed",
              "patternProperties": "not allowed in CRD schemas"}
_VALUE_ONLY = ("type", "description", "default", "nullable", "additionalProperties",
               "x-kubernetes-preserve-unknown-fields", "x-kubernetes-embedded-resource",
               "x-kubernetes-int-or-string")


def _schema_nodes(schema, path):
    """(path, node) for the schema and every schema below it (properties, items, additional)."""
    yield path, schema
    for k, v in (schema.get("properties") or {}).items():
        yield from _schema_nodes(v, f"{path}.properties.{k}")
    if isinstance(schema.get("items"), dict):
        yield from _schema_nodes(schema["items"], f"{path}.items")
    if isinstance(schema.get("additionalProperties"), dict):
        yield from _schema_nodes(schema["additionalProperties"], f"{path}.additionalProperties")


def _is_int_or_string_pattern(node):
    any_of = node.get("anyOf") or []
    return [a.get("type") for a in any_of[:2]] == ["integer", "string"]


def structural_errors(schema, root="openAPIV3Schema"):
    """The structural-schema and v1 CRD rules the API server checks, for one version's schema."""
    errors = []
    for path, node in _schema_nodes(schema, root):
        for key, why in _FORBIDDEN.items():
            if key in node:
                errors.append(f"{path}.{key}: {why}")
        if node.get("uniqueItems") is True:
            errors.append(f"{path}.uniqueItems: must not be true")
        if "items" in node and not isinstance(node["items"], dict):
            errors.append(f"{path}.items: must be one schema, not a list")
        typ = node.get("type")
        if node.get("x-kubernetes-int-or-string"):
            if typ:
                errors.append(f"{path}: x-kubernetes-int-or-string must not set type")
            if "anyOf" in node and not _is_int_or_string_pattern(node):
                errors.append(f"{path}: x-kubernetes-int-or-string needs anyOf [integer, string]")
        elif node.get("x-kubernetes-preserve-unknown-fields") and not typ:
            pass
        elif not typ:
            errors.append(f"{path}: type is required (structural schema)")
        elif typ not in ("object", "array", "string", "integer", "number", "boolean"):
            errors.append(f"{path}: unknown type {typ!r}")
        if typ == "array" and "items" not in node:
            errors.append(f"{path}: an array needs items")
        if node.get("properties") and "additionalProperties" in node:
            errors.append(f"{path}: properties and additionalProperties are mutually exclusive")
        if "properties" in node and typ != "object":
            errors.append(f"{path}: properties on a non-object")
        for req in node.get("required") or []:
            if req not in (node.get("properties") or {}):
                errors.append(f"{path}.required: {req!r} is not a property")
        for junction in ("anyOf", "allOf", "oneOf"):
            for i, sub in enumerate(node.get(junction) or []):
                for k in _VALUE_ONLY:
                    if k in sub and not (k == "type" and node.get("x-kubernetes-int-or-string")
                                         and junction == "anyOf"):
                        errors.append(f"{path}.{junction}[{i}].{k}: only value validations may "
                                      "appear under a junction (structural schema)")
        if "not" in node:
            for k in _VALUE_ONLY:
                if k in node["not"]:
                    errors.append(f"{path}.not.{k}: only value validations allowed")
        if node.get("x-kubernetes-list-type") == "map":
            keys = node.get("x-kubernetes-list-map-keys") or []
            item = node.get("items") or {}
            if not keys:
                errors.append(f"{path}: list-type map needs x-kubernetes-list-map-keys")
            for k in keys:
                if k not in (item.get("required") or []):
                    errors.append(f"{path}: list map key {k!r} must be required in the items")
        for i, rule in enumerate(node.get("x-kubernetes-validations") or []):
            try:
                compile_rule(rule.get("rule", ""))
            except CelError as e:
                errors.append(f"{path}.x-kubernetes-validations[{i}]: {e}")
        if "default" in node:
            try:
                jsonschema.validate(node["default"], to_jsonschema(node))
            except jsonschema.ValidationError as e:
                errors.append(f"{path}.default: does not validate: {e.message}")
    meta = (schema.get("properties") or {}).get("metadata")
    if meta is not None and set(meta) - {"type", "description"}:
        errors.append(f"{root}.properties.metadata: only type may be given at the root's metadata")
    if schema.get("type") != "object":
        errors.append(f"{root}: the root must be of type object")
    return errors


def _json_path_in_schema(schema, json_path):
    node = schema
    for part in json_path.strip(".").split("."):
        if part == "metadata" and node is schema:
            return True  # ObjectMeta is not in the CRD schema
        props = node.get("properties") or {}
        if part not in props:
            return False
        node = props[part]
    return True


def validate_crd(obj):
    errors = validate_builtin(obj)
    spec = obj.get("spec") or {}
    names = spec.get("names") or {}
    group = spec.get("group", "")
    if obj.get("metadata", {}).get("name") != f"{names.get('plural')}.{group}":
        errors.append(f"{describe(obj)}: metadata.name must be <plural>.<group>")
    for field in ("plural", "singular"):
        if not _DNS_LABEL.match(names.get(field) or ""):
            errors.append(f"{describe(obj)}: names.{field} must be a lowercase DNS label")
    versions = spec.get("versions") or []
    if sum(1 for v in versions if v.get("storage")) != 1:
        errors.append(f"{describe(obj)}: exactly one version must be the storage version")
    for v in versions:
        schema = (v.get("schema") or {}).get("openAPIV3Schema")
        where = f"{describe(obj)} {v.get('name')}"
        if not schema:
            errors.append(f"{where}: no openAPIV3Schema")
            continue
        errors.extend(f"{where}: {e}" for e in structural_errors(schema))
        for path, node in _schema_nodes(schema, "openAPIV3Schema"):
            if path.endswith((".items", ".additionalProperties")):
                node_errors = []
                _check_model(node, "V1JSONSchemaProps", path, node_errors)
                errors.extend(f"{where}: {e}" for e in node_errors)
        if "status" in (v.get("subresources") or {}) and \
                "status" not in (schema.get("properties") or {}):
            errors.append(f"{where}: a status subresource without a status in the schema")
        for col in v.get("additionalPrinterColumns") or []:
            if col.get("type") not in ("integer", "number", "string", "boolean", "date"):
                errors.append(f"{where}: printer column {col.get('name')}: bad type")
            if not _json_path_in_schema(schema, col.get("jsonPath", "")):
                errors.append(f"{where}: printer column {col.get('name')}: {col.get('jsonPath')} "
                              "is not in the schema")
    return errors


def to_jsonschema(node, strict=True):
    """A CRD schema node as a JSON Schema; with strict, unknown fields are refused."""
    out = {}
    for k, v in node.items():
        if k == "properties":
            out[k] = {p: to_jsonschema(s, strict) for p, s in v.items()}
        elif k in ("items", "additionalProperties") and isinstance(v, dict):
            out[k] = to_jsonschema(v, strict)
        elif k in ("anyOf", "allOf", "oneOf"):
            out[k] = [to_jsonschema(s, strict) for s in v]
        elif k == "not":
            out[k] = to_jsonschema(v, strict)
        elif k.startswith("x-kubernetes-") or k in ("nullable", "default", "example"):
            continue
        else:
            out[k] = copy.deepcopy(v)
    if strict and node.get("type") == "object" and "properties" in node and \
            "additionalProperties" not in node and \
            not node.get("x-kubernetes-preserve-unknown-fields"):
        out["additionalProperties"] = False
    if node.get("nullable"):
        out = {"anyOf": [out, {"type": "null"}]}
    return out


def _apply_defaults(node, value):
    """The API server applies defaults before validating; so do we (objects only)."""
    if not isinstance(value, dict) or node.get("type") != "object":
        return value
    out = dict(value)
    for k, sub in (node.get("properties") or {}).items():
        if k not in out and "default" in sub:
            out[k] = copy.deepcopy(sub["default"])
        if k in out:
            out[k] = _apply_defaults(sub, out[k])
    return out


def _cel_errors(node, value, path):
    errors = []
    for rule in node.get("x-kubernetes-validations") or []:
        try:
            ok = evaluate(rule["rule"], value)
            why = rule.get("message") or f"failed rule: {rule['rule']}"
        except CelError as e:
            ok, why = False, f"rule {rule['rule']!r}: {e}"
        if not ok:
            errors.append(f"{path or '<root>'}: {why}")
    if isinstance(value, dict):
        for k, sub in (node.get("properties") or {}).items():
            if k in value:
                errors.extend(_cel_errors(sub, value[k], f"{path}.{k}" if path else k))
    elif isinstance(value, list) and isinstance(node.get("items"), dict):
        for i, item in enumerate(value):
            errors.extend(_cel_errors(node["items"], item, f"{path}[{i}]"))
    return errors


def crd_index(crds):
    """{(apiVersion, kind): (crd, version schema)} for served versions."""
    index = {}
    for crd in crds:
        spec = crd["spec"]
        for v in spec["versions"]:
            if v.get("served"):
                index[(f"{spec['group']}/{v['name']}", spec["names"]["kind"])] = (
                    crd, v["schema"]["openAPIV3Schema"])
    return index


def validate_cr(obj, index):
    """Errors of a custom resource against the CRDs in index (see crd_index)."""
    key = (obj.get("apiVersion"), obj.get("kind"))
    if key not in index:
        return [f"{describe(obj)}: no CRD serves {key}"]
    crd, schema = index[key]
    meta = obj.get("metadata") or {}
    errors = []
    name = meta.get("name")
    if not isinstance(name, str) or not _DNS_SUBDOMAIN.match(name):
        errors.append(f"metadata.name: {name!r} is not a DNS subdomain")
    namespaced = crd["spec"]["scope"] == "Namespaced"
    if not namespaced and "namespace" in meta:
        errors.append("metadata.namespace: the kind is cluster-scoped")
    value = _apply_defaults(schema, obj)
    js = to_jsonschema(schema)
    js["properties"]["metadata"] = {"type": "object"}
    for e in sorted(jsonschema.Draft7Validator(js).iter_errors(value), key=lambda e: list(e.path)):
        path = ".".join(str(p) for p in e.absolute_path)
        errors.append(f"{path or '<root>'}: {e.message}")
    if not errors:
        errors.extend(_cel_errors(schema, value, ""))
    return [f"{describe(obj)}: {e}" for e in errors]
