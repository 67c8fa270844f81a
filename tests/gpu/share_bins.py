#!/usr/bin/env python3
"""Each tenant's share of GPU kernel time per bin, from a compute_share.py group kept with --work:
    python3 tests/gpu/share_bins.py WORK/25-75 [--bin-ms 100] [--from-ms 0] [--to-ms END]
Reads the group's t*.seg files (one per tenant, in tenant order), prints one row per bin of the
tenants' common active window (time from its start, each tenant's %, their sum, and `idle` where the
GPU sat idle more than 15% of the bin), then the same per 1 s window as compute_share.py measures
them (first second dropped). What a turn lost, and to whom, shows in bins of 10-100 ms."""
import argparse
import glob
import os
import sys

import compute_share as cs


def rows(all_segments, bin_ns, from_ns=0, to_ns=None):
    """[(offset ns, [each tenant's %], % of the bin any kernel ran)] over the common active window."""
    start = max(s[0][0] for s in all_segments)
    end = min(s[-1][1] for s in all_segments)
    if to_ns is not None:
        end = min(end, start + to_ns)
    return [(t - start, shares, busy) for t, shares, busy in cs.bins(all_segments, start + from_ns, end, bin_ns)]


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("group", help="a group's folder under compute_share.py's --work (holds t0.seg, t1.seg, ...)")
    ap.add_argument("--bin-ms", type=float, default=100.0)
    ap.add_argument("--from-ms", type=float, default=0.0)
    ap.add_argument("--to-ms", type=float, default=None)
    args = ap.parse_args(argv)
    if not 0.1 <= args.bin_ms <= 10_000:
        ap.error(f"--bin-ms {args.bin_ms:g} is not in 0.1..10000")
    if args.from_ms < 0 or (args.to_ms is not None and args.to_ms <= args.from_ms):
        ap.error("--from-ms must be >= 0 and below --to-ms")
    files = sorted(glob.glob(os.path.join(args.group, "t*.seg")), key=lambda p: int(os.path.basename(p)[1:-4]))
    if not files:
        ap.error(f"no t*.seg files in {args.group} (run compute_share.py with --work and keep it)")
    segments = [cs.load_segments(f) for f in files]
    empty = [os.path.basename(f) for f, s in zip(files, segments) if not s]
    if empty:
        ap.error(f"no kernel segments in {', '.join(empty)}")
    names = " ".join(f"{'t' + str(i):>6}" for i in range(len(files)))
    print(f"{'ms':>7} {names}    sum")
    for off, shares, any_pct in rows(segments, int(args.bin_ms * 1e6), int(args.from_ms * 1e6),
                                     None if args.to_ms is None else int(args.to_ms * 1e6)):
        idle = "  idle" if any_pct < cs.IDLE_UNDER_PCT else ""
        print(f"{off / 1e6:7.0f} " + " ".join(f"{x:6.1f}" for x in shares) + f" {sum(shares):6.1f}{idle}")
    windows = cs.window_shares(segments)
    if windows:
        print("per 1 s window (first second dropped):")
        for w in range(len(windows[0])):
            print(f"{w + 1:7d} " + " ".join(f"{s[w]:6.1f}" for s in windows) + f" {sum(s[w] for s in windows):6.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
