"""The CustomResourceDefinitions of group tensor-fusion.ai, version v1: one source for the YAML in
deploy/crds/ (written by tools/chart/regen.py, checked by tests/deploy).

Field names follow TensorFusion's CRDs where our model has the same concept, so their manifests
keep working; fields for what we do not implement are absent, so a strict client (kubectl's
default field validation) refuses them instead of the cluster silently ignoring them. Units:
tflops are FP16 dense TFLOPS, compute is percent of one GPU, vram is bytes as a Kubernetes
quantity (8Gi). Limits are the ceiling a vGPU may burst to; requests are what placement counts.
"""

GROUP = "tensor-fusion.ai"
VERSION = "v1"
CATEGORY = "tensor-fusion"

# A Kubernetes object name that is also a valid name in our store (at most 128 characters).
NAME_PATTERN = r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$"
# A non-negative Kubernetes quantity: no sign, decimal or binary suffix, or an exponent.
QUANTITY_PATTERN = (r"^([0-9]+(\.[0-9]*)?|\.[0-9]+)"
                    r"((Ki|Mi|Gi|Ti|Pi|Ei|n|u|m|k|M|G|T|P|E)|[eE][+-]?[0-9]+)?$")
PLACEMENT_MODES = ["NodeCompactGPULowLoad", "CompactFirst", "LowLoadFirst", "BestFit", "FGD",
                   "FragAware"]
QOS = ["low", "medium", "high", "critical"]
MAX_GPU_COUNT = 64


def _str(description, **extra):
    return {"type": "string", "description": description, **extra}


def _int(description, minimum, maximum, **extra):
    return {"type": "integer", "format": "int64" if maximum > 2**31 else "int32",
            "description": description, "minimum": minimum, "maximum": maximum, **extra}


def _bool(description):
    return {"type": "boolean", "description": description}


def _obj(description, properties, required=None, rules=None):
    out = {"type": "object", "description": description, "properties": properties}
    if required:
        out["required"] = required
    if rules:
        out["x-kubernetes-validations"] = [{"rule": r, "message": m} for r, m in rules]
    return out


def _name_ref(description):
    return _str(description, pattern=NAME_PATTERN, maxLength=128)


def _quantity(description, rules=()):
    out = {"anyOf": [{"type": "integer"}, {"type": "string"}],
           "x-kubernetes-int-or-string": True, "description": description,
           "pattern": QUANTITY_PATTERN, "minimum": 0, "maxLength": 64}
    if rules:
        out["x-kubernetes-validations"] = [{"rule": r, "message": m} for r, m in rules]
    return out


def _q(field):
    """CEL: the quantity of an int-or-string field."""
    return f"quantity(string({field}))"


def _tflops(description):
    return _quantity(description + " FP16 dense TFLOPS, e.g. 20 or 12.5.", rules=[
        (f"{_q('self')}.isGreaterThan(quantity('0'))", "tflops must be more than 0"),
        (f"{_q('self')}.compareTo(quantity('1000000')) <= 0", "tflops must be at most 1000000"),
    ])


def _compute(description):
    return _quantity(description + " Percent of one GPU's time, more than 0 and at most 100.",
                     rules=[
        (f"{_q('self')}.isGreaterThan(quantity('0'))", "compute must be more than 0 percent"),
        (f"{_q('self')}.compareTo(quantity('100')) <= 0", "compute must be at most 100 percent"),
    ])


def _vram(description):
    return _quantity(description + " Bytes as a Kubernetes quantity, e.g. 8Gi or 512Mi (a bare "
                     "number is bytes), at least 1Mi and at most 16Ti.", rules=[
        (f"{_q('self')}.compareTo(quantity('1Mi')) >= 0",
         "vram is bytes as a Kubernetes quantity (8Gi, 512Mi) and must be at least 1Mi"),
        (f"{_q('self')}.compareTo(quantity('16Ti')) <= 0", "vram must be at most 16Ti per GPU"),
    ])


def _resource_amounts(which):
    return _obj(f"Per vGPU (per GPU of a multi-GPU workload): the {which}. Give tflops or "
                "compute, not both.", {
        "tflops": _tflops(f"Compute {which}."),
        "compute": _compute(f"Compute {which}."),
        "vram": _vram(f"VRAM {which}."),
    }, rules=[("!(has(self.tflops) && has(self.compute))",
               "give tflops or compute, not both")])


def _limit_rule(field):
    return (f"!has(self.limits) || !has(self.limits.{field}) || "
            f"(has(self.requests) && has(self.requests.{field}) && "
            f"{_q('self.limits.' + field)}.compareTo({_q('self.requests.' + field)}) >= 0)",
            f"limits.{field} needs requests.{field} and must be at least it "
            "(a limit is in its request's unit)")


def _resources(required):
    requests = _resource_amounts("request (guaranteed under contention; what placement counts)")
    if required:
        requests["required"] = ["vram"]
        requests["x-kubernetes-validations"].append(
            {"rule": "has(self.tflops) || has(self.compute)",
             "message": "requests needs tflops or compute"})
    out = _obj("Compute and VRAM per vGPU.", {
        "requests": requests,
        "limits": _resource_amounts("limit (the ceiling it may burst to while the GPU is idle)"),
    }, required=["requests"] if required else None,
        rules=[_limit_rule("tflops"), _limit_rule("compute"), _limit_rule("vram")])
    return out


def workload_spec(required):
    """WorkloadProfile's spec, and TensorFusionWorkload's (where resources are required)."""
    spec = _obj("What each replica of the workload gets.", {
        "poolName": _name_ref("GPUPool to place in (default: the pool the controller uses by "
                              "default)."),
        "qos": _str("Quality of service: who borrows idle compute first and who may preempt "
                    "whom (default medium).", enum=QOS),
        "gpuCount": _int("vGPUs per replica, all on one node.", 1, MAX_GPU_COUNT),
        "gpuModel": _str("Only GPUs whose model name contains this text (case-insensitive), "
                         "e.g. H100.", pattern=r"^[A-Za-z0-9 ._-]+$", maxLength=64),
        "isLocalGPU": _bool("Run on the GPU's node (true) or anywhere, forwarding CUDA calls "
                            "to the GPU's node (false)."),
        "resources": _resources(required),
    }, required=["resources"] if required else None)
    return spec


def _conditions():
    condition = _obj("One aspect of the object's state.", {
        "type": _str("Condition type, e.g. Ready.", maxLength=316,
                     pattern=r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?"
                             r"(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])$"),
        "status": _str("True, False or Unknown.", enum=["True", "False", "Unknown"]),
        "observedGeneration": _int("The generation the condition was computed for.", 0, 2**62),
        "lastTransitionTime": _str("When status last changed.", format="date-time"),
        "reason": _str("Machine-readable reason, CamelCase.", maxLength=1024, minLength=1,
                       pattern=r"^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$"),
        "message": _str("Human-readable detail.", maxLength=32768),
    }, required=["type", "status", "lastTransitionTime", "reason", "message"])
    return {"type": "array", "description": "Conditions of the object.", "maxItems": 16,
            "items": condition, "x-kubernetes-list-type": "map",
            "x-kubernetes-list-map-keys": ["type"]}


def _observed_generation():
    return _int("metadata.generation the status was written for.", 0, 2**62)


def _tflops_status(description):
    return _quantity(description + " (FP16 dense TFLOPS).")


def _vram_status(description):
    return _quantity(description + " (bytes).")


def _capacity_fields(prefix_description):
    return {
        "totalTFlops": _tflops_status(f"Physical compute of the {prefix_description}"),
        "totalVRAM": _vram_status(f"Physical VRAM of the {prefix_description}"),
        "virtualTFlops": _tflops_status(f"Schedulable compute of the {prefix_description}, "
                                        "after oversubscription"),
        "virtualVRAM": _vram_status(f"Schedulable VRAM of the {prefix_description}, after "
                                    "expansion into host memory and disk"),
        "availableTFlops": _tflops_status(f"Schedulable compute of the {prefix_description} "
                                          "not held by allocations"),
        "availableVRAM": _vram_status(f"Schedulable VRAM of the {prefix_description} not held "
                                      "by allocations"),
    }


def _capacity_columns():
    """Printer columns of _capacity_fields (VRAM only with -o wide)."""
    return [("TFLOPS", "string", ".status.totalTFlops", False),
            ("Available TFLOPS", "string", ".status.availableTFlops", False),
            ("VRAM", "string", ".status.totalVRAM", True),
            ("Available VRAM", "string", ".status.availableVRAM", True)]


def _gpu_uuid(description):
    return _str(description, maxLength=128, pattern=r"^[A-Za-z0-9._:-]+$")


def _name_length_rule():
    return [("size(self.metadata.name) <= 128",
             "metadata.name must be at most 128 characters (the controller's limit)")]


def _crd(kind, plural, scope, description, spec, status, columns, singular=None,
         root_rules=None):
    properties = {
        "apiVersion": {"type": "string", "description": "tensor-fusion.ai/v1"},
        "kind": {"type": "string", "description": kind},
        "metadata": {"type": "object"},
    }
    if spec is not None:
        properties["spec"] = spec
    properties["status"] = status
    schema = {"type": "object", "description": description, "properties": properties}
    if spec is not None and spec.get("required"):
        schema["required"] = ["spec"]
    if root_rules:
        schema["x-kubernetes-validations"] = [{"rule": r, "message": m} for r, m in root_rules]
    printer = [{"name": n, "type": t, "jsonPath": p, **({"priority": 1} if wide else {})}
               for n, t, p, wide in columns]
    printer.append({"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"})
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{plural}.{GROUP}",
                     "labels": {"app.kubernetes.io/part-of": "tensorfusion"}},
        "spec": {
            "group": GROUP,
            "scope": scope,
            "names": {"kind": kind, "listKind": kind + "List", "plural": plural,
                      "singular": singular or kind.lower(), "categories": [CATEGORY]},
            "versions": [{
                "name": VERSION,
                "served": True,
                "storage": True,
                "schema": {"openAPIV3Schema": schema},
                "subresources": {"status": {}},
                "additionalPrinterColumns": printer,
            }],
        },
    }


def gpupool():
    spec = _obj("How the pool places vGPUs and how far it oversubscribes its GPUs.", {
        "schedulingConfigTemplate": _name_ref(
            "SchedulingConfigTemplate whose placement mode the pool uses (default: "
            "NodeCompactGPULowLoad)."),
        "capacityConfig": _obj("Capacity settings.", {
            "oversubscription": _obj("How much more than the physical GPUs the pool hands out.", {
                "tflopsOversellRatio": _int(
                    "vGPU TFLOPS on a GPU may sum to this percent of its physical TFLOPS "
                    "(100: no overselling, 500: five times).", 100, 10000),
                "vramExpandToHostMem": _int(
                    "Percent of each GPU's VRAM that idle tenants' memory may be moved to host "
                    "memory for (VRAM tiering), 0-400.", 0, 400),
                "vramExpandToHostDisk": _int(
                    "Percent of each GPU's VRAM that may be moved on to disk, 0-400.", 0, 400),
            }),
        }),
    })
    status = _obj("What the pool holds, as the controller last saw it.", {
        "phase": _str("Running once a node has joined, else Pending.", enum=["Pending", "Running"]),
        "placementMode": _str("The placement mode in effect.", enum=PLACEMENT_MODES),
        "totalNodes": _int("Nodes in the pool.", 0, 100000),
        "readyNodes": _int("Nodes whose agent is heartbeating.", 0, 100000),
        "totalGPUs": _int("GPUs in the pool.", 0, 1000000),
        **_capacity_fields("pool"),
        "conditions": _conditions(),
        "observedGeneration": _observed_generation(),
    })
    return _crd("GPUPool", "gpupools", "Cluster",
                "A pool of GPU nodes that vGPUs are placed in.", spec, status, [
                    ("Mode", "string", ".status.placementMode", False),
                    ("Nodes", "integer", ".status.totalNodes", False),
                    ("GPUs", "integer", ".status.totalGPUs", False),
                    *_capacity_columns(),
                    ("Phase", "string", ".status.phase", False),
                ], root_rules=_name_length_rule())


def gpunode():
    status = _obj("The node as its agent registered it with the controller.", {
        "phase": _str("Ready while its agent heartbeats; Lost after 15 s of silence (its "
                      "allocations are released 60 s later).", enum=["Ready", "Lost"]),
        "poolName": _name_ref("The pool the node joined."),
        "address": _str("Where the node agent can be reached (HOST:PORT), informational.",
                        maxLength=260),
        "workerAddress": _str("HOST:PORT of the node's tfusion worker for remote vGPUs.",
                              maxLength=260),
        "registeredAt": _str("When the agent first registered.", format="date-time"),
        "lostSince": _str("When the node was marked lost.", format="date-time"),
        "totalGPUs": _int("GPUs on the node.", 0, 1024),
        **_capacity_fields("node"),
        "managedGPUDeviceIDs": {"type": "array", "description": "UUIDs of the node's GPUs.",
                                "maxItems": 1024, "x-kubernetes-list-type": "set",
                                "items": _gpu_uuid("GPU UUID.")},
        "conditions": _conditions(),
    })
    return _crd("GPUNode", "gpunodes", "Cluster",
                "A GPU host whose node agent (tfusion hypervisor) registered with the controller. "
                "Written by the controller; status only.", None, status, [
                    ("Phase", "string", ".status.phase", False),
                    ("Pool", "string", ".status.poolName", False),
                    ("GPUs", "integer", ".status.totalGPUs", False),
                    *_capacity_columns(),
                ])


def gpu():
    amounts = lambda what: _obj(what, {  # noqa: E731
        "tflops": _tflops_status(what),
        "vram": _vram_status(what),
    })
    status = _obj("The GPU as its node agent discovered it and the controller accounts it.", {
        "uuid": _gpu_uuid("The GPU's UUID as NVML reports it."),
        "nodeName": _name_ref("The GPUNode the GPU is on."),
        "poolName": _name_ref("The pool of its node."),
        "gpuModel": _str("Model name, e.g. NVIDIA H100 80GB HBM3.", maxLength=256),
        "index": _int("Index on its node, as nvidia-smi numbers it.", 0, 1023),
        "numaNode": _int("NUMA node, -1 when unknown.", -1, 1023),
        "phase": _str("Running while new vGPUs may be placed on it; Unschedulable while its "
                      "node is lost.", enum=["Running", "Unschedulable"]),
        "capacity": amounts("Physical capacity (compute from the GPU catalog)"),
        "available": amounts("Physical capacity not held by allocations"),
        "allocated": amounts("Sum of the requests of the vGPUs placed on it"),
        "utilizationPercent": _int("GPU utilization its node agent last reported, percent.", 0, 100),
        "memoryUsed": _vram_status("VRAM in use its node agent last reported"),
        "vgpus": {"type": "array", "description": "The vGPUs placed on it.", "maxItems": 64,
                  "items": _obj("One vGPU: an allocation's slice of this GPU.", {
                      "allocation": _str("Allocation id in the controller.", maxLength=128,
                                         pattern=r"^[A-Za-z0-9._:-]+$"),
                      "tenant": _str("Tenant of the allocation (a TensorFusionWorkload's namespace).",
                                     maxLength=128),
                      "qos": _str("Quality of service.", enum=QOS),
                      "tflops": _tflops_status("Compute request"),
                      "tflopsLimit": _tflops_status("Compute limit"),
                      "vram": _vram_status("VRAM limit"),
                  }, required=["allocation"])},
    })
    return _crd("GPU", "gpus", "Cluster",
                "One physical GPU. Written by the controller; status only.", None, status, [
                    ("Node", "string", ".status.nodeName", False),
                    ("Model", "string", ".status.gpuModel", False),
                    ("Index", "integer", ".status.index", True),
                    ("TFLOPS", "string", ".status.capacity.tflops", False),
                    ("Available TFLOPS", "string", ".status.available.tflops", False),
                    ("VRAM", "string", ".status.capacity.vram", False),
                    ("Available VRAM", "string", ".status.available.vram", False),
                    ("Phase", "string", ".status.phase", False),
                ])


def _workload_columns():
    return [
        ("Pool", "string", ".spec.poolName", False),
        ("QoS", "string", ".spec.qos", False),
        ("TFLOPS", "string", ".spec.resources.requests.tflops", False),
        ("Compute%", "string", ".spec.resources.requests.compute", True),
        ("VRAM", "string", ".spec.resources.requests.vram", False),
        ("GPUs", "integer", ".spec.gpuCount", False),
    ]


def tensorfusionworkload():
    allocation = _obj("One allocation of the workload.", {
        "id": _str("Allocation id in the controller.", maxLength=128,
                   pattern=r"^[A-Za-z0-9._:-]+$"),
        "node": _name_ref("Node it was placed on."),
        "gpus": {"type": "array", "description": "UUIDs of its GPUs.", "maxItems": MAX_GPU_COUNT,
                 "items": _gpu_uuid("GPU UUID.")},
    }, required=["id", "node"])
    status = _obj("Where the workload's replicas were placed.", {
        "phase": _str("Pending until placed, Running once every replica holds its vGPUs, "
                      "Failed when placement was refused.",
                      enum=["Pending", "Running", "Failed"]),
        "message": _str("Why the phase is what it is.", maxLength=1024),
        "workerCount": _int("Replicas that hold an allocation.", 0, 100000),
        "readyWorkers": _int("Replicas running on their vGPUs.", 0, 100000),
        "allocations": {"type": "array", "description": "The workload's allocations.",
                        "maxItems": 1024, "items": allocation},
        "conditions": _conditions(),
        "observedGeneration": _observed_generation(),
    })
    columns = _workload_columns() + [("Phase", "string", ".status.phase", False),
                                     ("Ready", "integer", ".status.readyWorkers", False)]
    return _crd("TensorFusionWorkload", "tensorfusionworkloads", "Namespaced",
                "A workload that holds vGPUs: what each replica asks for and where it was placed.",
                workload_spec(required=True), status, columns, root_rules=_name_length_rule())


def workloadprofile():
    return _crd("WorkloadProfile", "workloadprofiles", "Namespaced",
                "A reusable vGPU request that pods name with the tensor-fusion.ai/workload-profile "
                "annotation; annotations on the pod override its fields.",
                workload_spec(required=False),
                _obj("Unused; kept so that every kind has a status subresource.", {
                    "observedGeneration": _observed_generation()}),
                _workload_columns())


def tensorfusionconnection():
    spec = _obj("Which client pod uses which workload's vGPU remotely.", {
        "workloadName": _name_ref("TensorFusionWorkload (same namespace) whose vGPU the pod "
                                  "uses."),
        "clientPod": _str("Name of the client pod (same namespace).", maxLength=253,
                          pattern=NAME_PATTERN),
    }, required=["workloadName", "clientPod"])
    status = _obj("Where the client connects.", {
        "phase": _str("Pending until a worker serves the vGPU, then Running; Failed when it "
                      "cannot be served.", enum=["Pending", "Running", "Failed"]),
        "connectionURL": _str("tcp://HOST:PORT of the worker the client stub connects to.",
                              maxLength=300, pattern=r"^tcp://[^\s/]+:[0-9]{1,5}$"),
        "workerName": _name_ref("Node whose worker serves the connection."),
        "allocation": _str("Allocation id in the controller.", maxLength=128,
                           pattern=r"^[A-Za-z0-9._:-]+$"),
        "message": _str("Why the phase is what it is.", maxLength=1024),
        "conditions": _conditions(),
    })
    return _crd("TensorFusionConnection", "tensorfusionconnections", "Namespaced",
                "Binds a client pod to the worker that serves its remote vGPU.", spec, status, [
                    ("Workload", "string", ".spec.workloadName", False),
                    ("Pod", "string", ".spec.clientPod", False),
                    ("Phase", "string", ".status.phase", False),
                    ("URL", "string", ".status.connectionURL", True),
                ])


def schedulingconfigtemplate():
    spec = _obj("Placement policy that pools refer to.", {
        "placement": _obj("How vGPUs are placed (docs/scheduler.md).", {
            "mode": _str("Placement mode: NodeCompactGPULowLoad packs nodes and spreads over "
                         "the GPUs of a node; CompactFirst packs; LowLoadFirst spreads; BestFit "
                         "and FGD are the published references; FragAware minimises stranded "
                         "GPU capacity.", enum=PLACEMENT_MODES, default="NodeCompactGPULowLoad"),
        }, required=["mode"]),
    }, required=["placement"])
    return _crd("SchedulingConfigTemplate", "schedulingconfigtemplates", "Cluster",
                "A placement policy shared by pools.", spec,
                _obj("Unused; kept so that every kind has a status subresource.", {
                    "observedGeneration": _observed_generation()}),
                [("Mode", "string", ".spec.placement.mode", False)],
                root_rules=_name_length_rule())


def all_crds():
    """(file name, CRD) for every kind, in a fixed order."""
    crds = [gpupool(), gpunode(), gpu(), tensorfusionworkload(), tensorfusionconnection(),
            schedulingconfigtemplate(), workloadprofile()]
    return [(f"{GROUP}_{c['spec']['names']['plural']}.yaml", c) for c in crds]
