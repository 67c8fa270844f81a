#!/usr/bin/env python3
"""What NVIDIA's CUDA samples print, compared between runs (cuda_samples.sh).

A sample that passes natively must pass remotely with the same output. Two runs of one sample never
print byte-identical text: timings, rates and dates change from run to run. `normalize` masks
exactly those, by the rules below, and leaves every other character alone, so results (checksums,
"Result = PASS", computed values, error counts, sizes) are still compared:

  1. A number followed by a unit of time or of rate (`12.5 ms`, `3.1 (ms)`, `0.01 sec`,
     `812.4 GB/s`, `55.2 MB/sec`, `1.2e+03 GFlop/s`, `7.5 sims/s`: any `UNIT/s` or `UNIT/sec`)
     becomes `<T>` (time) or `<R>` (rate).
  2. A number after a word that names a timing or a rate and a `=` or `:` (`Time = 1.234`,
     `Throughput= 33`, `Performance = 12`, `Average clocks/block = 1234`, `elapsed: 3`,
     `Bandwidth: 12`, `TFLOPS: 410.2`, `TOPS: 201.5`) becomes `<T>`; the word itself stays.
  3. Dates (`2026-11-26`, `Thu Nov 26`) and clock times (`23:14:05`) become `<DATE>` / `<CLOCK>`.
  4. A process id after `pid`/`PID`/`process` becomes `<PID>`.
  5. Hexadecimal addresses of 6 or more digits (`0x7f3a2c000000`) become `<ADDR>`.
  6. PCI bus ids (`0000:19:00.0`, `00000000:19:00.0`) become `<BUSID>`; in a line naming a
     `Bus ID` or `PCI`, every number becomes `<N>` (the device's slot, not a result).
  7. Trailing white space and carriage returns go; lines are otherwise kept as printed.
  8. Per sample (SAMPLE_MASKS), timings printed without a unit: simpleStreams' `memcopy:`,
     `kernel:`, `non-streamed:` and `N streams:` (ms), simplePitchLinearTexture's bandwidth and
     fetch rate of each layout, asyncAPI's count of host polls while the GPU worked,
     graphMemoryFootprint's footprint after each numbered launch (a race the sample describes).

Some samples print what no rule can mask without masking results: they are listed in
NOT_COMPARED (the outputs are not compared, with the reason) or UNORDERED (the lines are compared
as a multiset: the GPU or the OpenMP threads decide their order).

  sample_output.py normalize FILE [SAMPLE]   the normalized lines of FILE
  sample_output.py compare SAMPLE A B         SAME, or DIFFERENT and the first differing line
  sample_output.py report WORK LIST MODES OUT the Markdown report of cuda_samples.sh (see there)
"""
import os
import re
import sys

TIME_UNITS = r"(?:ns|nsec|us|usec|usecs|µs|ms|msec|msecs|s|sec|secs|seconds?|milliseconds?|microseconds?|minutes?|clocks?|cycles)"
# Any "<unit>/s" or "<unit>/sec" (GB/s, MB/sec, MPixels/sec, Mpix/s, sims/s, GFlop/s, ...) and FLOPS.
RATE_UNITS = r"(?:[A-Za-z]+/s(?:ec)?|[KMGT]?FLOPS|GOPS)"
NUM = r"[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?"

# Rule 1: a number and its unit, the unit optionally in parentheses or brackets.
_RATE = re.compile(rf"(?<![\w.]){NUM}(\s*[(\[]?\s*)({RATE_UNITS})(?![A-Za-z])")
_TIME = re.compile(rf"(?<![\w.]){NUM}(\s*[(\[]?\s*)({TIME_UNITS})(?![A-Za-z/])")
# Rule 2: a timing or rate word, then `=` or `:` and a number (possibly after a parenthesized unit).
_KEYED = re.compile(
    r"(?i)(\b(?:time|timing|elapsed|duration|latency|throughput|bandwidth|performance|[kmgt]?flop/?s|(?-i:[KMGT]OPS)|"
    r"clocks?(?:/block)?)\b[^=:\n]{0,40}?[=:]\s*(?:\([^)]*\)\s*)?)" + NUM)
# Rule 3
_DATE = re.compile(r"\b\d{4}-\d{2}-\d{2}\b|\b(?:Mon|Tue|Wed|Thu|Fri|Sat|Sun) (?:Jan|Feb|Mar|Apr|May|Jun|Jul|Aug|"
                   r"Sep|Oct|Nov|Dec) +\d{1,2}\b")
_CLOCK = re.compile(r"\b\d{1,2}:\d{2}:\d{2}(?:\.\d+)?\b")
# Rule 4
_PID = re.compile(r"(?i)\b(pid|process)(\s*[=:#]?\s*)\d+")
# Rule 5
_ADDR = re.compile(r"\b0x[0-9a-fA-F]{6,}\b")
# Rule 6
_BUSID = re.compile(r"\b[0-9a-fA-F]{4,8}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.[0-7]\b")
_BUS_LINE = re.compile(r"(?i)bus id|\bpci\b")
_ANY_NUM = re.compile(r"\b\d+\b")
# Rule 8: timings a sample prints without a unit (sample -> the text before each such number).
SAMPLE_MASKS = {
    "simpleStreams": re.compile(r"^((?:memcopy|kernel|non-streamed|\d+ streams):\s*)" + NUM + "$"),
    "simplePitchLinearTexture": re.compile(r"((?:pitch linear|for array): )" + NUM),
    # How often the host loop polled while the GPU worked: a race between host and GPU by design.
    "asyncAPI": re.compile(r"^(CPU executed )\d+(?= iterations while waiting)"),
    # The footprint after each launch of graphs in separate streams: whether a graph that already
    # finished lends its memory to the next is a race the sample itself describes.
    "graphMemoryFootprint": re.compile(r"^(\d+:\s+FOOTPRINT: )\d+(?= bytes)"),
}

# Outputs no rule can make comparable without masking results: sample -> why.
NOT_COMPARED = {
    "fp16ScalarProduct": "its inputs come from srand(time(NULL)): the printed sums change every run",
    "UnifiedMemoryStreams": "task sizes from a time(NULL) seed, printed by OpenMP threads in any order",
    "UnifiedMemoryPerf": "tables of timings whose cells carry no unit",
    "cudaGraphsPerfScaling": "CSV rows of timings whose cells carry no unit",
}
# Outputs whose lines come in an order the program does not fix: compared as a multiset.
UNORDERED = {
    "simplePrintf": "device printf of several blocks appears in the order the blocks ran",
    "simpleAssert": "device assertions of several threads appear in the order the threads ran",
    "simpleAssert_nvrtc": "device assertions of several threads appear in the order the threads ran",
    "simpleCallback": "the workloads' callbacks print from host threads in the order they finish",
}


def normalize_line(line, sample=None):
    """One printed line with what varies between runs masked (rules 1-8 above)."""
    line = line.rstrip("\r\n").rstrip()
    line = _DATE.sub("<DATE>", line)
    line = _CLOCK.sub("<CLOCK>", line)
    line = _BUSID.sub("<BUSID>", line)
    if _BUS_LINE.search(line):
        line = _ANY_NUM.sub("<N>", line)
    line = _ADDR.sub("<ADDR>", line)
    line = _PID.sub(lambda m: m.group(1) + m.group(2) + "<PID>", line)
    line = _RATE.sub(r"<R>\1\2", line)
    line = _TIME.sub(r"<T>\1\2", line)
    line = _KEYED.sub(lambda m: m.group(1) + "<T>", line)
    if sample in SAMPLE_MASKS:
        line = SAMPLE_MASKS[sample].sub(lambda m: m.group(1) + "<T>", line)
    return line


def normalize(text, sample=None):
    """The normalized lines of a sample's stdout (a str)."""
    return [normalize_line(l, sample) for l in text.splitlines()]


def compare(sample, native_text, other_text):
    """(verdict, detail): ('SAME', ''), ('DIFFERENT', 'line N: native "..." / here "..."') or
    ('NOT COMPARED', why) for a sample in NOT_COMPARED."""
    if sample in NOT_COMPARED:
        return "NOT COMPARED", NOT_COMPARED[sample]
    a, b = normalize(native_text, sample), normalize(other_text, sample)
    if sample in UNORDERED:
        if sorted(a) == sorted(b):
            return "SAME", ""
        only_a = sorted(set(a) - set(b)) or [l for l in a if a.count(l) != b.count(l)]
        only_b = sorted(set(b) - set(a)) or [l for l in b if a.count(l) != b.count(l)]
        return "DIFFERENT", 'native only "%s" / here only "%s"' % (
            (only_a[0] if only_a else "")[:120], (only_b[0] if only_b else "")[:120])
    for i in range(max(len(a), len(b))):
        x = a[i] if i < len(a) else "(end of output)"
        y = b[i] if i < len(b) else "(end of output)"
        if x != y:
            return "DIFFERENT", 'line %d: native "%s" / here "%s"' % (i + 1, x[:120], y[:120])
    return "SAME", ""


def _read(path):
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return f.read()
    except OSError:
        return None


def _cell(text):
    return text.replace("|", "\\|").replace("\n", " ")


def report(work, list_file, modes, header=""):
    """The Markdown report of a cuda_samples.sh run. WORK holds MODE-NAME.status (PASS, WAIVED,
    FAIL(n), TIMEOUT, BUILD-FAIL) and MODE-NAME.out (the run's stdout) per sample and mode; LIST
    the sample folders, one per line. Per sample and non-native mode: the status and, where both
    the native run and this one passed, SAME/DIFFERENT OUTPUT against native (the first differing
    line below the table)."""
    with open(list_file) as f:
        samples = [os.path.basename(l.strip()) for l in f if l.strip()]
    others = [m for m in modes if m != "native"]
    status = {(m, s): (_read(os.path.join(work, f"{m}-{s}.status")) or "-").strip() for m in modes for s in samples}
    lines = [f"# NVIDIA CUDA samples: {'/'.join(modes)}", ""]
    if header:
        lines += [header, ""]
    lines += ["| sample | " + " | ".join(modes) + " |", "|" + " --- |" * (len(modes) + 1)]
    diffs, verdicts = [], {}
    for s in samples:
        row = [s]
        native_out = _read(os.path.join(work, f"native-{s}.out"))
        for m in modes:
            st = status[(m, s)]
            cell = st
            if m != "native" and "native" in modes and status[("native", s)] == "PASS" and st == "PASS":
                other_out = _read(os.path.join(work, f"{m}-{s}.out"))
                if native_out is None or other_out is None:
                    v, why = "NOT COMPARED", "no saved output"
                else:
                    v, why = compare(s, native_out, other_out)
                verdicts[(m, s)] = v
                cell = {"SAME": "PASS, same output", "DIFFERENT": "PASS, **DIFFERENT OUTPUT**"}.get(v, "PASS, not compared")
                if v == "DIFFERENT":
                    diffs.append(f"- {s} ({m}): {_cell(why)}")
            row.append(cell)
        lines.append("| " + " | ".join(row) + " |")
    lines.append("")
    native_ok = [s for s in samples if status[("native", s)] == "PASS"] if "native" in modes else []
    lines.append(f"Samples: {len(samples)}; PASS natively: {len(native_ok)}.")
    for m in others:
        ok = [s for s in native_ok if status[(m, s)] == "PASS"]
        same = [s for s in ok if verdicts.get((m, s)) == "SAME"]
        diff = [s for s in ok if verdicts.get((m, s)) == "DIFFERENT"]
        lines.append(f"Of those, PASS over {m}: {len(ok)}; same output as native: {len(same)}, "
                     f"different: {len(diff)}, not compared: {len(ok) - len(same) - len(diff)}.")
    if diffs:
        lines += ["", "First differing line (after masking timings, rates, dates, pids, addresses, bus ids):", ""]
        lines += diffs
    listed = [s for s in samples if s in NOT_COMPARED or s in UNORDERED]
    if listed:
        lines += ["", "Outputs not compared line by line (tests/gpu/sample_output.py):", ""]
        for s in listed:
            how = "not compared" if s in NOT_COMPARED else "compared as a multiset of lines"
            lines.append(f"- {s}: {how}: {NOT_COMPARED.get(s) or UNORDERED[s]}")
    failed = any(status[(m, s)] != "PASS" or verdicts.get((m, s)) == "DIFFERENT" for m in others for s in native_ok)
    return "\n".join(lines) + "\n", failed


def main(argv):
    if len(argv) in (3, 4) and argv[1] == "normalize":
        sys.stdout.write("\n".join(normalize(_read(argv[2]) or "", argv[3] if len(argv) == 4 else None)) + "\n")
        return 0
    if len(argv) == 5 and argv[1] == "compare":
        a, b = _read(argv[3]), _read(argv[4])
        if a is None or b is None:
            print("cannot read", argv[3] if a is None else argv[4], file=sys.stderr)
            return 2
        v, why = compare(argv[2], a, b)
        print(v + (": " + why if why else ""))
        return 0 if v != "DIFFERENT" else 1
    if len(argv) in (6, 7) and argv[1] == "report":
        text, failed = report(argv[2], argv[3], argv[4].split(), argv[6] if len(argv) == 7 else "")
        with open(argv[5], "w") as f:
            f.write(text)
        sys.stdout.write(text)
        return 1 if failed else 0
    print(__doc__.split("\n\n")[-1], file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv))
