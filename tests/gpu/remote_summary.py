#!/usr/bin/env python3
"""Writes remote-summary.md for remote_compare.sh from its logs folder: the issue's targets,
then every benchmark number native vs remote over shared memory (shm) vs remote over loopback
TCP (tcp) with the ratio remote/native (of times and of bandwidths alike), then PASS/FAIL per
program and mode and whether the outputs equal native. Reads only; standard library only. A
missing or cut-off log becomes '-' cells, never an exception: each section is built on its own.

Inputs (logs/): steps.tsv ("phase program mode rc ms log" per command, written by the script;
rc -1 not built, -2 no worker, -3 skipped for the budget),
micro-MODE.log (bench/gpu/remote_micro), models-{key,rest}-MODE.log (bench/gpu/torch_models.py),
checks-MODE.log and compare-checks-MODE.log (tests/gpu/torch_remote.py), alloc-PATH-MODE.log,
arrays-MODE.log (drvtest arrays), ipc-MODE.log (ipc_pair), rt-smoke-MODE.log, launch-MODE.log, tenant-{kernel,graph}-MODE.log,
samples-MODE.log (tests/gpu/samples: `SAMPLE name PASS|FAIL detail`, `RESULT name checksum`,
`EXPECT_LINE name text` for lines the program's stdout must hold).
"""
import argparse
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import tier_common as tc  # noqa: E402

MODES = ["native", "shm", "tcp"]
REMOTE = ["shm", "tcp"]
# Keys written by remote_micro that are settings or counts, not measurements.
MICRO_SETTINGS = {"burst", "sync_iters", "bw_budget_s", "copy_check_bytes"}
# Model-part fields that are settings, not measurements.
MODEL_SETTINGS = {"reps", "iters", "part_s"}
# The RESULT keys whose values must be the same remotely as natively, per program (prefix).
EQUAL_KEYS = {
    "micro": ["copy_check", "status", "error"],
    "alloc-": ["status", "total_mib", "error", "failed_call", "realloc", "verdict"],
    "rt-smoke": ["values_wrong", "total_mib", "verdict", "error"],
    "arrays": ["htoa_atoh_ok", "async_htoa_atoh_ok", "dtoa_atoa_atod_ok", "descriptor_ok",
               "copy2d_host_array_ok", "copy2d_array_device_ok", "copy2d_async_unified_ok",
               "copy3d_ok", "copy3d_async_ok", "big_ok", "mip_level_desc_ok", "mip_level_copy_ok",
               "tex_objects_ok", "surf_object_ok", "refused_2d_outside_array",
               "refused_3d_outside_array", "refused_atoh_past_end", "after_refusals_ok",
               "failed_checks", "verdict"],
    "launch": ["launch_error", "sync_error", "launches"],
    # tests/gpu/ipc_pair: the bytes each side sees and the driver's answers to bad handles.
    "ipc": ["a_ipc_event_supported", "b_reads_producer_copy", "b_reads_producer_memset",
            "b_range_ok", "b_ptr_is_device", "b_unified_copy_ok", "b_open_again_same_pointer",
            "a_sees_consumer_memset", "a_sees_consumer_copy", "a_rest_unchanged",
            "a_timed_interprocess_event", "a_plain_event_handle", "a_wild_pointer_handle",
            "a_open_own_handle", "b_double_close", "b_close_wild", "b_open_zero_handle",
            "b_open_ones_handle", "b_open_reversed_handle", "b_open_zero_event_handle",
            "a_consumer_exit", "verdict"],
    "tenant-": ["error", "setup_failed"],
}
# Fields that run to the end of the line in multi-field RESULT lines (they may hold spaces).
TAIL_FIELDS = ("error", "note")


# --- reading --------------------------------------------------------------------------------

def read_log(logs, name):
    return tc.read(os.path.join(logs, name))


def single_results(text):
    """`RESULT key=value` lines -> dict (tests/gpu/tier_common.py)."""
    return tc.parse_results(text)


def records(text, first_key):
    """Multi-field lines `RESULT first_key=NAME k=v ... [error=rest of line]` -> list of dicts."""
    out = []
    prefix = f"RESULT {first_key}="
    for line in text.splitlines():
        if not line.startswith(prefix):
            continue
        fields = {}
        body = line[len("RESULT "):]
        while body:
            token, _, rest = body.partition(" ")
            key, eq, value = token.partition("=")
            if not eq:
                break
            if key in TAIL_FIELDS:
                fields[key] = body.split("=", 1)[1].strip()
                break
            fields[key] = value
            body = rest.strip()
        out.append(fields)
    return out


def by_name(text, first_key):
    """records() keyed by their first field; a repeated name keeps its last record."""
    return {r[first_key]: r for r in records(text, first_key) if first_key in r}


def sample_records(text):
    """tests/gpu/samples output -> {name: {status, detail, result, expect, missing}} in order of
    appearance. A sample whose EXPECT_LINE texts are not all lines of the output counts as FAIL."""
    out = {}
    lines = text.splitlines()
    present = set(lines)
    for line in lines:
        if line.startswith("SAMPLE "):
            parts = line.split(" ", 3)
            if len(parts) >= 3 and parts[2] in ("PASS", "FAIL"):
                rec = out.setdefault(parts[1], {})
                rec["status"] = parts[2]
                rec["detail"] = parts[3].strip() if len(parts) > 3 else ""
        elif line.startswith("RESULT "):
            parts = line.split(" ")
            if len(parts) == 3 and "=" not in parts[1]:
                out.setdefault(parts[1], {})["result"] = parts[2]
        elif line.startswith("EXPECT_LINE "):
            name, _, want = line[len("EXPECT_LINE "):].partition(" ")
            out.setdefault(name, {}).setdefault("expect", []).append(want)
    for rec in out.values():
        rec["missing"] = [w for w in rec.get("expect", []) if w not in present]
        if rec["missing"] and rec.get("status") == "PASS":
            rec["status"] = "FAIL"
            rec["detail"] = f"{len(rec['missing'])} expected lines not on stdout"
    return out


def num(value):
    try:
        v = float(value)
    except (TypeError, ValueError):
        return None
    return v if v == v else None  # NaN is no number


def steps(logs):
    """steps.tsv -> {(program, mode): (rc, ms, log)}, last entry wins; order of first appearance."""
    table, order = {}, []
    for line in read_log(logs, "steps.tsv").splitlines():
        parts = line.split("\t")
        if len(parts) < 6:
            continue
        _, prog, mode, rc, ms, log = parts[:6]
        try:
            rc_i, ms_i = int(rc), int(ms)
        except ValueError:
            continue
        if prog not in order:
            order.append(prog)
        table[(prog, mode)] = (rc_i, ms_i, log)
    return table, order


# --- formatting -----------------------------------------------------------------------------

def fmt(value):
    v = num(value)
    if v is None:
        return "-" if value in (None, "") else str(value).replace("|", "\\|")
    if v == 0:
        return "0"
    if abs(v) >= 1000:
        return f"{v:,.0f}"
    if abs(v) >= 100:
        return f"{v:.1f}"
    if abs(v) >= 1:
        return f"{v:.2f}"
    return f"{v:.3g}"


def ratio(value, base):
    v, b = num(value), num(base)
    if v is None or b is None or b == 0:
        return "-"
    return f"{v / b:.3f}"


def metric_table(title, label, rows, note=None):
    """rows: [(row label, {mode: value})] -> Markdown with a ratio column per remote mode."""
    out = [f"### {title}", ""]
    if note:
        out += [note, ""]
    out += [f"| {label} | native | shm | shm/native | tcp | tcp/native |", "| --- | --- | --- | --- | --- | --- |"]
    if not rows:
        out.append("| (no numbers in the logs) | - | - | - | - | - |")
    for name, values in rows:
        base = values.get("native")
        out.append(f"| {name} | {fmt(base)} | {fmt(values.get('shm'))} | {ratio(values.get('shm'), base)} | "
                   f"{fmt(values.get('tcp'))} | {ratio(values.get('tcp'), base)} |")
    return out + [""]


# --- sections -------------------------------------------------------------------------------

class Logs:
    def __init__(self, logs):
        self.dir = logs
        self.micro = {m: single_results(read_log(logs, f"micro-{m}.log")) for m in MODES}
        self.models = {}
        self.model_order = []
        for m in MODES:
            parts = {}
            for group in ("key", "rest"):
                for name, rec in by_name(read_log(logs, f"models-{group}-{m}.log"), "name").items():
                    if name in ("env", "total"):
                        continue
                    parts[name] = rec
                    if name not in self.model_order:
                        self.model_order.append(name)
            self.models[m] = parts
        self.checks = {m: by_name(read_log(logs, f"checks-{m}.log"), "check") for m in MODES}
        self.compares = {m: by_name(read_log(logs, f"compare-checks-{m}.log"), "compare") for m in REMOTE}
        self.steps, self.order = steps(logs)
        self.samples = {m: sample_records(read_log(logs, f"samples-{m}.log")) for m in MODES}

    def micro_keys(self, want_bandwidth):
        keys = []
        for m in MODES:
            for key, value in self.micro[m].items():
                bandwidth = key.startswith(("htod_", "dtoh_"))
                if (bandwidth != want_bandwidth or key in MICRO_SETTINGS or key.endswith("_calls")
                        or key.endswith("_copies") or key in keys):
                    continue
                if num(value) is None and not bandwidth:
                    continue
                keys.append(key)
        return keys


def targets_section(L):
    out = ["## Targets of issue 3", "",
           "| target | shm | met | tcp | met |", "| --- | --- | --- | --- | --- |"]

    def unit(value, suffix):
        return "-" if num(value) is None else f"{fmt(value)} {suffix}"

    def row(label, shm, shm_ok, tcp, tcp_ok):
        def met(ok):
            return "-" if ok is None else ("yes" if ok else "**no**")
        out.append(f"| {label} | {shm} | {met(shm_ok)} | {tcp} | {met(tcp_ok)} |")

    def check(value, limit, at_most):
        v = num(value)
        if v is None:
            return None
        return v <= limit if at_most else v >= limit

    for key, what in (("launch_ns_mean", "cuLaunchKernel"), ("record_ns_mean", "cuEventRecord")):
        vals = {m: L.micro[m].get(key) for m in REMOTE}
        row(f"async call client cost ({what}, mean) <= 500 ns", unit(vals["shm"], "ns"),
            check(vals["shm"], 500, True), unit(vals["tcp"], "ns"), check(vals["tcp"], 500, True))
    for key in ("stream_sync_us_p50", "stream_sync_us_mean"):
        vals = {m: L.micro[m].get(key) for m in REMOTE}
        row(f"sync round trip (cuStreamSynchronize idle, {key.rsplit('_', 1)[1]}) <= 10 µs shm, 40 µs tcp",
            unit(vals["shm"], "µs"), check(vals["shm"], 10, True), unit(vals["tcp"], "µs"),
            check(vals["tcp"], 40, True))
    for mem, limit in (("pinned", 0.95), ("pageable", 0.80)):
        for d in ("htod", "dtoh"):
            key = largest_common(L, f"{d}_{mem}_")
            if key is None:
                row(f"{d} {mem} bandwidth >= {limit:.0%} of native", "-", None, "-", None)
                continue
            base = L.micro["native"].get(key)
            cells = {m: ratio(L.micro[m].get(key), base) for m in REMOTE}
            # The issue sets bandwidth targets over shared memory only; TCP's ratio is shown as is.
            row(f"{d} {mem} bandwidth at {key.split('_')[2]} >= {limit:.0%} of native (ratio; shm only)",
                cells["shm"], check(cells["shm"], limit, False), cells["tcp"], None)
    for part in ("resnet50_b64_eager", "resnet50_b64_compile", "gpt2_fwd_b1_s128", "gpt2_fwd_b8_s512"):
        base = L.models["native"].get(part, {}).get("ms")
        cells = {m: ratio(L.models[m].get(part, {}).get("ms"), base) for m in REMOTE}
        row(f"{part} time remote/native <= 1.03 shm, 1.08 tcp", cells["shm"], check(cells["shm"], 1.03, True),
            cells["tcp"], check(cells["tcp"], 1.08, True))
    eq = {m: equality_counts(L, m) for m in REMOTE}
    row("programs and checks with results equal to native", f"{eq['shm'][0]} of {eq['shm'][1]}",
        None if not eq["shm"][1] else eq["shm"][0] == eq["shm"][1], f"{eq['tcp'][0]} of {eq['tcp'][1]}",
        None if not eq["tcp"][1] else eq["tcp"][0] == eq["tcp"][1])
    return out + [""]


def size_bytes(label):
    units = {"GiB": 1 << 30, "MiB": 1 << 20, "KiB": 1 << 10, "B": 1}
    for unit, scale in units.items():
        if label.endswith(unit) and label[: -len(unit)].isdigit():
            return int(label[: -len(unit)]) * scale
    return -1


def largest_common(L, prefix):
    """The _gbps key with this prefix and the largest size that native and a remote mode measured."""
    best = None
    for key, value in L.micro["native"].items():
        if not (key.startswith(prefix) and key.endswith("_gbps")) or num(value) is None:
            continue
        if not any(num(L.micro[m].get(key)) is not None for m in REMOTE):
            continue
        size = size_bytes(key[len(prefix):-len("_gbps")])
        if best is None or size > best[0]:
            best = (size, key)
    return None if best is None else best[1]


def micro_section(L):
    rows = [(k, {m: L.micro[m].get(k) for m in MODES}) for k in L.micro_keys(False)]
    note = ("`_ns`: client CPU time per asynchronous call (issue only, bursts of "
            f"{L.micro['native'].get('burst', '?')}); `_us`: one synchronizing call on an idle stream.")
    return metric_table("Micro-benchmarks (bench/gpu/remote_micro)", "metric", rows, note)


def bandwidth_section(L):
    keys = L.micro_keys(True)

    def sort_key(k):
        d, mem, size = (k.split("_") + ["", "", ""])[:3]
        return (mem != "pinned", d != "htod", size_bytes(size))

    out = []
    for suffix, title, note in (("_gbps", "Copy bandwidth, GB/s (synchronous cuMemcpyHtoD/DtoH)",
                                 "GB/s = 10^9 bytes/s over all timed copies of a size; ratio remote/native."),
                                ("_us", "Copy time, median µs per synchronous copy", None)):
        rows = [(k[: -len(suffix)].replace("_", " "), {m: L.micro[m].get(k) for m in MODES})
                for k in sorted((k for k in keys if k.endswith(suffix)), key=sort_key)]
        out += metric_table(title, "direction memory size", rows, note)
    return out


def models_section(L):
    rows = []
    for part in L.model_order:
        fields = []
        for m in MODES:
            for k in L.models[m].get(part, {}):
                if k not in fields and k not in ("name", "error") and k not in MODEL_SETTINGS:
                    fields.append(k)
        for f in fields:
            rows.append((f"{part} {f}", {m: L.models[m].get(part, {}).get(f, error_cell(L.models[m].get(part)))
                                         for m in MODES}))
    out = metric_table("PyTorch models (bench/gpu/torch_models.py)", "part, number", rows,
                       "`ms`: median wall time per call (synchronize-bracketed); `gpu_ms`: the same loop "
                       "timed by CUDA events; ratio remote/native.")
    errors = [(part, m, L.models[m][part]["error"]) for part in L.model_order for m in MODES
              if "error" in L.models[m].get(part, {})]
    if errors:
        out += ["Parts that gave no number:", ""] + [f"- {part} ({m}): {err}" for part, m, err in errors] + [""]
    return out


def error_cell(record):
    if record is None:
        return None
    return "error" if "error" in record else None


def driver_numbers_section(L):
    rows = []
    for prog, keys in (("launch", ["mean_ns", "p50_ns", "p99_ns", "launches_per_s", "sync_ms"]),
                       ("tenant-kernel", ["gpu_kernels_per_s", "host_kernels_per_s", "kernels"]),
                       ("tenant-graph", ["gpu_kernels_per_s", "host_kernels_per_s", "kernels"])):
        res = {m: single_results(read_log(L.dir, f"{prog}-{m}.log")) for m in MODES}
        for k in keys:
            if any(k in res[m] for m in MODES):
                rows.append((f"{prog} {k}", {m: res[m].get(k) for m in MODES}))
    return metric_table("Driver-API programs (launch_overhead 200k launches, compute_tenant 3 s)", "program, number",
                        rows)


def step_status(L, prog, mode):
    """(PASS|FAIL|SKIP|-, note) of one program in one mode."""
    entry = L.steps.get((prog, mode))
    if entry is None:
        return "-", ""
    rc, ms, log = entry
    res = single_results(read_log(L.dir, log))
    secs = f"{ms / 1000:.1f} s"
    if rc == -3:
        return "SKIP", "time budget spent"
    if rc == -2:
        return "FAIL", "no worker"
    if rc == -1:
        return "FAIL", "not built"
    if rc in (124, 137):
        return "FAIL", f"timed out after {secs}"
    if rc == 0 and res.get("verdict") != "FAIL":
        return "PASS", secs
    why = res.get("reason") or res.get("error") or ""
    if prog == "checks":
        failed = [n for n, r in L.checks[mode].items() if r.get("status") != "PASS"]
        why = f"failed: {', '.join(failed)}" if failed else why
    elif prog.startswith("models-"):
        failed = [n for n, r in L.models[mode].items() if "error" in r and n in group_parts(L, prog, mode)]
        why = f"no number: {', '.join(failed)}" if failed else why
    return "FAIL", f"exit {rc} {why}".strip()


def group_parts(L, prog, mode):
    text = read_log(L.dir, f"{prog}-{mode}.log")
    return set(by_name(text, "name"))


def equality(L, prog, mode):
    """(equal: True/False/None, note) of a program's outputs in `mode` against native."""
    if L.steps.get((prog, mode)) is None or L.steps.get((prog, "native")) is None:
        return None, ""
    for m in ("native", mode):
        status, note = step_status(L, prog, m)
        if status == "SKIP" or note in ("no worker", "not built"):
            return None, f"{m} did not run"
    if prog == "checks":
        comp = L.compares.get(mode, {})
        if not comp:
            return None, "no comparison"
        diff = [f"{n}: {r.get('status', '?')}" for n, r in comp.items() if r.get("status") != "EQUAL"]
        return (not diff), (f"{len(comp)} checks equal" if not diff else "; ".join(diff))
    if prog.startswith("models-"):
        ok = {m: {n for n, r in L.models[m].items() if "error" not in r and n in group_parts(L, prog, m)}
              for m in ("native", mode)}
        if ok["native"] == ok[mode]:
            return True, f"same {len(ok[mode])} parts measured"
        return False, f"measured natively only: {', '.join(sorted(ok['native'] - ok[mode])) or '-'}"
    if prog == "samples":
        native = {n: r["result"] for n, r in L.samples["native"].items() if "result" in r}
        if not native:
            return None, "no native result"
        other = L.samples[mode]
        diff = [n for n, v in native.items() if other.get(n, {}).get("result") != v]
        if not diff:
            return True, f"{len(native)} results equal"
        return False, "differ: " + ", ".join(diff[:6]) + (" ..." if len(diff) > 6 else "")
    keys = next((v for p, v in EQUAL_KEYS.items() if prog == p or (p.endswith("-") and prog.startswith(p))), None)
    if keys is None:
        return None, ""
    a = single_results(read_log(L.dir, L.steps[(prog, "native")][2]))
    b = single_results(read_log(L.dir, L.steps[(prog, mode)][2]))
    diff = [f"{k}: {a.get(k, '-')} vs {b.get(k, '-')}" for k in keys if a.get(k) != b.get(k)][:4]
    if not any(k in a for k in keys):
        return None, "no native result"
    return (not diff), ("same " + ", ".join(k for k in keys if k in a)) if not diff else "; ".join(diff)


def equality_counts(L, mode):
    equal = total = 0
    for prog in L.order:
        if prog == "compare-checks":
            continue
        eq, _ = equality(L, prog, mode)
        if eq is not None:
            total += 1
            equal += bool(eq)
    return equal, total


def programs_section(L):
    out = ["## Programs: PASS/FAIL per mode, results equal to native", "",
           "| program | native | shm | tcp | shm = native | tcp = native |", "| --- | --- | --- | --- | --- | --- |"]
    if not L.order:
        out.append("| (no steps.tsv) | - | - | - | - | - |")
    for prog in L.order:
        if prog == "compare-checks":
            continue
        cells = []
        for m in MODES:
            status, note = step_status(L, prog, m)
            cells.append(f"{status} ({note})" if note and status != "-" else status)
        for m in REMOTE:
            eq, note = equality(L, prog, m)
            word = "-" if eq is None else ("equal" if eq else "**DIFFERENT**")
            cells.append(f"{word} ({note})" if note else word)
        out.append(f"| {prog} | " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
    return out + [""]


def checks_section(L):
    names = []
    for m in MODES:
        names += [n for n in L.checks[m] if n not in names]
    out = ["### PyTorch checks (tests/gpu/torch_remote.py)", "",
           "| check | native | shm | tcp | shm vs native | tcp vs native |", "| --- | --- | --- | --- | --- | --- |"]
    if not names:
        out.append("| (no check results in the logs) | - | - | - | - | - |")
    for n in names:
        cells = []
        for m in MODES:
            r = L.checks[m].get(n)
            if r is None:
                cells.append("-")
            else:
                extra = r.get("error", r.get("seconds", ""))
                cells.append(f"{r.get('status', '?')} ({extra}{' s' if 'error' not in r and extra else ''})")
        for m in REMOTE:
            c = L.compares[m].get(n)
            cells.append("-" if c is None else f"{c.get('status', '?')} ({c.get('note', '')})")
        out.append(f"| {n} | " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
    return out + [""]


def samples_section(L):
    names = []
    for m in MODES:
        names += [n for n in L.samples[m] if n not in names]
    out = ["### CUDA samples (tests/gpu/samples)", "",
           "| sample | native | shm | tcp | shm = native | tcp = native |", "| --- | --- | --- | --- | --- | --- |"]
    if not names:
        out.append("| (no sample results in the logs) | - | - | - | - | - |")
    for n in names:
        cells = []
        for m in MODES:
            r = L.samples[m].get(n)
            if r is None or "status" not in r:
                cells.append("-")
            elif r["status"] == "PASS":
                cells.append("PASS")
            else:
                detail = r.get("detail", "")
                cells.append(f"FAIL ({detail[:160]})" if detail else "FAIL")
        base = L.samples["native"].get(n, {}).get("result")
        for m in REMOTE:
            got = L.samples[m].get(n, {}).get("result")
            if base is None or L.samples[m].get(n) is None:
                cells.append("-")
            elif got is None:
                cells.append("**DIFFERENT** (no result)")
            else:
                cells.append("equal" if got == base else f"**DIFFERENT** ({got} vs {base})")
        out.append(f"| {n} | " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
    return out + [""]


def write_summary(logs, elapsed=None, budget=None):
    L = Logs(logs)
    head = tc.read(os.path.join(logs, "preflight.log")).splitlines()[:1]
    out = ["# Remote vGPU: native vs shared memory vs loopback TCP", ""]
    if head:
        out += [head[0], ""]
    if elapsed is not None:
        out += [f"Run time {elapsed} s of a {budget if budget is not None else '?'} s budget. Ratios are "
                "remote/native: above 1 means slower for times, faster for bandwidths and rates.", ""]
    for section in (targets_section, micro_section, models_section, bandwidth_section, programs_section,
                    checks_section, samples_section, driver_numbers_section):
        try:
            out += section(L)
        except Exception as e:  # one broken section must not cost the others
            out += [f"({section.__name__} failed: {type(e).__name__}: {e})", ""]
    return "\n".join(out) + "\n"


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--logs", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--elapsed", type=int, default=None)
    ap.add_argument("--budget", type=int, default=None)
    args = ap.parse_args()
    text = write_summary(args.logs, args.elapsed, args.budget)
    with open(args.out, "w") as f:
        f.write(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
