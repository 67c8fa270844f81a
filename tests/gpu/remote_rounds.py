#!/usr/bin/env python3
"""Summarises the `rounds` phase of remote_compare.sh: logs/rounds-MODE-rR.log hold
bench/gpu/torch_models.py RESULT lines of the same parts, and logs/micro-MODE-rR.log
bench/gpu/remote_micro's (async-call costs, 1 GiB copies), run native, shm, tcp in turn R times.
Prints a markdown table per part or number: each round's value per mode, the median over the
rounds, and the ratios remote/native both of the medians and per round (a round's modes ran
minutes apart at most, so the per-round ratio is the one least moved by drift of the host).
Standard library only; usage: remote_rounds.py LOGS_DIR."""
import os
import re
import statistics
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from remote_summary import MODES, by_name, read_log, single_results  # noqa: E402

LOG_NAME = re.compile(r"^rounds-(native|shm|tcp)-r(\d+)\.log$")
MICRO_LOG_NAME = re.compile(r"^micro-(native|shm|tcp)-r(\d+)\.log$")
# remote_micro numbers with a target: async-call costs (ns) and 1 GiB copy bandwidths (GB/s).
MICRO_KEYS = ["launch_ns_mean", "record_ns_mean", "htod_pinned_1GiB_gbps", "dtoh_pinned_1GiB_gbps",
              "htod_pageable_1GiB_gbps", "dtoh_pageable_1GiB_gbps"]


def collect(logs):
    """{part: {round: {mode: ms}}} from the round logs present."""
    table = {}
    for name in sorted(os.listdir(logs)):
        m = LOG_NAME.match(name)
        if not m:
            continue
        mode, rnd = m.group(1), int(m.group(2))
        for part, rec in by_name(read_log(logs, name), "name").items():
            try:
                ms = float(rec["ms"])
            except (KeyError, ValueError):
                continue
            table.setdefault(part, {}).setdefault(rnd, {})[mode] = ms
    return table


def collect_micro(logs):
    """{key: {round: {mode: value}}} from the micro round logs present."""
    table = {}
    for name in sorted(os.listdir(logs)):
        m = MICRO_LOG_NAME.match(name)
        if not m:
            continue
        mode, rnd = m.group(1), int(m.group(2))
        results = single_results(read_log(logs, name))
        for key in MICRO_KEYS:
            try:
                table.setdefault(key, {}).setdefault(rnd, {})[mode] = float(results[key])
            except (KeyError, ValueError):
                continue
    return table


def fmt(v, digits=2):
    return "-" if v is None else f"{v:.{digits}f}"


def part_table(part, rounds, unit="ms"):
    lines = [f"### {part}", "", "| round | " + " | ".join(f"{m} {unit}" for m in MODES) +
             " | shm/native | tcp/native |", "| --- " * (len(MODES) + 3) + "|"]
    ratios = {"shm": [], "tcp": []}
    for rnd in sorted(rounds):
        row = rounds[rnd]
        cells = [fmt(row.get(m)) for m in MODES]
        for m in ("shm", "tcp"):
            r = row[m] / row["native"] if row.get(m) and row.get("native") else None
            if r is not None:
                ratios[m].append(r)
            cells.append(fmt(r, 3))
        lines.append(f"| {rnd} | " + " | ".join(cells) + " |")
    med = {m: statistics.median(v) if v else None
           for m in MODES for v in [[rounds[r][m] for r in rounds if m in rounds[r]]]}
    cells = [fmt(med[m]) for m in MODES]
    for m in ("shm", "tcp"):
        cells.append(fmt(med[m] / med["native"], 3) if med[m] and med["native"] else "-")
    lines.append("| median | " + " | ".join(cells) + " |")
    per_round = [fmt(statistics.median(ratios[m]), 3) if ratios[m] else "-" for m in ("shm", "tcp")]
    lines.append("| median of the rounds' ratios | " + " | ".join([""] * len(MODES)) + " | " +
                 " | ".join(per_round) + " |")
    return lines


def main():
    if len(sys.argv) != 2:
        print("usage: remote_rounds.py LOGS_DIR", file=sys.stderr)
        return 2
    table = collect(sys.argv[1])
    micro = collect_micro(sys.argv[1])
    out = ["# Interleaved rounds (native, shm, tcp in turn)", ""]
    if not table and not micro:
        out.append("No round produced a number (see logs/rounds-*.log, logs/micro-*-r*.log).")
    for part in sorted(table):
        out += part_table(part, table[part]) + [""]
    if micro:
        out += ["## remote_micro (ratios remote/native: above 1 is slower for ns, faster for GB/s)", ""]
    for key in MICRO_KEYS:
        if key in micro:
            out += part_table(key, micro[key], "ns" if key.endswith("_ns_mean") else "GB/s") + [""]
    print("\n".join(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
