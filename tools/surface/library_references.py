#!/usr/bin/env python3
"""Which driver entry points the CUDA libraries can reach: writes api/library_references.tsv.

The CUDA libraries (cudart, linked statically into cuBLAS, cuDNN, cuFFT, cuSOLVER, cuSPARSE, cuRAND
and NCCL as well) find the driver's entry points by name through cuGetProcAddress, so the names
they can ask for are strings in their read-only data. A name asked for with a version resolves to
a versioned export (cuMemAlloc -> cuMemAlloc_v2) and, for the per-thread default stream, to its
_ptsz/_ptds variant, so each string counts for the export of that name and for every export that
adds a version or per-thread suffix to it.

Usage (on a machine with the CUDA toolkit; no GPU needed):
  python3 tools/surface/library_references.py --exports api/cuda-13.0/exports.txt \
      --out api/library_references.tsv LIBRARY.so...
Output: one line per export a library can reach, `name<TAB>lib,lib,...` (library names without
the `lib` prefix and the .so suffix), sorted by name. Standard library only.
"""
import argparse
import os
import re
import sys

NAME = re.compile(rb"(?<=\x00)cu[A-Z][A-Za-z0-9_]{2,80}(?=\x00)")
SUFFIX = re.compile(r"^(?P<base>.+?)(?:_v\d+)?(?:_pt[sd][sd]|_ptsz|_ptds)?$")


def library_name(path):
    base = os.path.basename(path)
    base = base[3:] if base.startswith("lib") else base
    return base.split(".so")[0]


def strings_of(path):
    with open(path, "rb") as f:
        data = f.read()
    return {m.group(0).decode("ascii") for m in NAME.finditer(data)}


def reachable(exports, names):
    """Exports reachable from the names a library holds: the name itself, and the exports that are
    the name plus a version and/or per-thread suffix."""
    out = set()
    for e in exports:
        if e in names:
            out.add(e)
            continue
        m = SUFFIX.match(e)
        if m and m.group("base") in names:
            out.add(e)
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--exports", required=True, help="the driver's exports, one name per line")
    ap.add_argument("--out", required=True, help="the TSV to write")
    ap.add_argument("libraries", nargs="+", help="shared libraries to read")
    args = ap.parse_args()
    with open(args.exports) as f:
        exports = [l.strip() for l in f if l.strip() and not l.startswith("#")]
    if len(exports) < 100:
        sys.exit(f"{args.exports}: only {len(exports)} names: not the driver's export list")
    uses = {}
    for lib in args.libraries:
        try:
            names = strings_of(lib)
        except OSError as e:
            sys.exit(f"{lib}: {e.strerror}")
        found = reachable(exports, names)
        if not found:
            print(f"{lib}: references no driver entry point (skipped)", file=sys.stderr)
        for e in found:
            uses.setdefault(e, set()).add(library_name(lib))
    with open(args.out, "w") as f:
        f.write("# Driver entry points the CUDA libraries can reach by name (cuGetProcAddress), written by\n")
        f.write("# tools/surface/library_references.py from the libraries of the CUDA toolkit named below.\n")
        f.write("# libraries: " + ",".join(sorted({library_name(l) for l in args.libraries})) + "\n")
        for e in sorted(uses):
            f.write(f"{e}\t{','.join(sorted(uses[e]))}\n")
    print(f"{args.out}: {len(uses)} of {len(exports)} exports reachable from {len(args.libraries)} libraries")


if __name__ == "__main__":
    main()
