#!/usr/bin/env python3
"""Builds api/nvml-exports.txt: every function name that NVIDIA's nvml.h declares.

Usage: extract_nvml_exports.py NVML_H [NVML_H ...] > api/nvml-exports.txt

Run by hand when a new NVML release appears (not part of the build: nvml.h is not a build
dependency). Give it every header release you want covered; the result is the sorted union, so a
name removed from a newer header (but still exported by the library for old binaries) stays.

What counts as an exported function:
  - every `DECLDIR nvmlXxx(` declaration, including the legacy block under
    NVML_NO_UNVERSIONED_FUNC_DEFS (nvmlInit, nvmlDeviceGetCount, nvmlDeviceGetPciInfo_v2, ...);
  - both sides of the "auto upgrade" aliases `#define nvmlXxx nvmlXxx_v2` and the renames
    `#define nvmlGetBlacklistDeviceCount nvmlGetExcludedDeviceCount`, when the right-hand side is
    a declared function (the left-hand side is the name older binaries were linked against).
Type aliases (`#define nvmlBlacklistDeviceInfo_t ...`) and struct-version macros are not
functions and are skipped.

Plus UNDECLARED below: entry points the real libnvidia-ml.so.1 exports that nvml.h does not
declare (checked with `nm -D --defined-only` on a real driver's library).
"""
import re
import sys

# `nvmlReturn_t DECLDIR nvmlInit_v2(`, `const DECLDIR char* nvmlErrorString(`
DECL = re.compile(r"\bDECLDIR\b[^;(){}]*?\b(nvml[A-Za-z0-9_]+)\s*\(")
ALIAS = re.compile(r"^\s*#\s*define\s+(nvml[A-Za-z0-9_]+)\s+(nvml[A-Za-z0-9_]+)\s*(?://.*)?$",
                   re.MULTILINE)


# Exported by libnvidia-ml.so.1 but absent from nvml.h. nvidia-smi uses the first.
UNDECLARED = [
    "nvmlInternalGetExportTable",
]


def strip_comments(text):
    text = re.sub(r"/\*.*?\*/", " ", text, flags=re.DOTALL)
    return text


def names_of(path):
    with open(path, encoding="utf-8", errors="replace") as f:
        text = strip_comments(f.read())
    declared = set(DECL.findall(text))
    for lhs, rhs in ALIAS.findall(text):
        if rhs in declared and not lhs.endswith("_t"):
            declared.add(lhs)
    return declared


def main(argv):
    if len(argv) < 2:
        sys.stderr.write(__doc__)
        return 2
    names = set(UNDECLARED)
    for path in argv[1:]:
        found = names_of(path)
        if not found:
            sys.stderr.write(f"{path}: no NVML function declarations found\n")
            return 1
        names |= found
    for name in sorted(names):
        print(name)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
