#!/usr/bin/env python3
"""Compares the outputs torch_checks.py saved natively and under the limiter: every tensor must
be bit-identical (torch.equal). Appends one line per part to the results TSV."""
import argparse
import os

import torch

import tier_common as tc


def flatten(prefix, value):
    if isinstance(value, dict):
        for k, v in value.items():
            yield from flatten(f"{prefix}.{k}" if prefix else k, v)
    else:
        yield prefix, value


def compare(native_path, limited_path):
    if not os.path.exists(native_path) or not os.path.exists(limited_path):
        missing = [p for p in (native_path, limited_path) if not os.path.exists(p)]
        return "FAIL", f"missing {', '.join(os.path.basename(os.path.dirname(p)) for p in missing)} output"
    a = dict(flatten("", torch.load(native_path)))
    b = dict(flatten("", torch.load(limited_path)))
    if a.keys() != b.keys():
        return "FAIL", "different outputs saved"
    diffs = []
    for key in a:
        if not torch.equal(a[key], b[key]):
            d = (a[key].double() - b[key].double()).abs().max().item()
            diffs.append(f"{key} max|diff|={d:.3g}")
    if diffs:
        return "FAIL", "; ".join(diffs[:4])
    return "PASS", f"{len(a)} tensors bit-identical"


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--native", required=True)
    ap.add_argument("--limited", required=True)
    ap.add_argument("--results", required=True)
    ap.add_argument("--parts", default="eager,train,compile,graphs")
    args = ap.parse_args()
    for part in args.parts.split(","):
        try:
            status, note = compare(os.path.join(args.native, f"{part}.pt"), os.path.join(args.limited, f"{part}.pt"))
        except Exception as e:
            status, note = "FAIL", f"compare error: {e!r}"
        tc.record(args.results, f"torch {part} native == limiter", status, note)


if __name__ == "__main__":
    main()
