#!/usr/bin/env python3
"""CI test (no GPU) of compute_share.py's measures on synthetic kernel segments: each tenant's
share per 1 s window (first second dropped), and the 100 ms bins in which a saturating group left
the GPU idle, which tell a stall of the host from a division of time."""
import os
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import compute_share as cs  # noqa: E402

MS = 1_000_000


def turns(start_ms, end_ms, shares, period_ms=200, gaps=()):
    """Segments of tenants taking turns: in each period tenant i runs shares[i] of it, in order;
    nothing runs inside any (from_ms, to_ms) of gaps (a stall of the host)."""
    out = [[] for _ in shares]
    t = start_ms
    while t < end_ms:
        at = t
        for i, share in enumerate(shares):
            length = period_ms * share
            a, b = at, min(at + length, end_ms)
            for g0, g1 in gaps:
                if a < g0 < b:
                    out[i].append((a, g0))
                    a = min(max(a, g1), b)
                elif g0 <= a < g1:
                    a = min(g1, b)
            if a < b:
                out[i].append((a, b))
            at += length
        t += period_ms
    return [[(int(a * MS), int(b * MS)) for a, b in segs] for segs in out]


def write(path, segs):
    with open(path, "w") as f:
        f.write("# start_ns end_ns\n")
        for a, b in segs:
            f.write(f"{a} {b}\n")


class ComputeShareMeasures(unittest.TestCase):
    def load(self, groups):
        with tempfile.TemporaryDirectory() as d:
            out = []
            for i, segs in enumerate(groups):
                p = os.path.join(d, f"t{i}.seg")
                write(p, segs)
                out.append(cs.load_segments(p))
            return out

    def test_shares_per_window_drop_the_first_second(self):
        segs = self.load(turns(0, 6000, [0.25, 0.75]))
        shares = cs.window_shares(segs)
        # The common active window is [50 ms, 5850 ms) (the second tenant's first turn starts 50 ms
        # in, the first one's last turn ends 5850 ms in); less its first second: 4 whole seconds.
        self.assertEqual(cs.measured_span(segs), (1050 * MS, 5850 * MS))
        self.assertEqual(len(shares[0]), 4)
        for got, want in zip(shares, (25.0, 75.0)):
            for w in got:
                self.assertAlmostEqual(w, want, places=6)

    def test_a_group_that_fills_the_gpu_has_no_idle_bins(self):
        segs = self.load(turns(0, 6000, [0.25, 0.75]))
        self.assertEqual(cs.idle_bins(segs), (0, 48))

    def test_stalls_of_the_host_are_counted_where_they_fall(self):
        # Two stalls of 25 ms inside the measured span (after the first second), one before it.
        gaps = [(500, 530), (3810, 3835), (5805, 5830)]
        segs = self.load(turns(0, 6000, [0.25, 0.75], gaps=gaps))
        idle, bins = cs.idle_bins(segs)
        self.assertEqual((idle, bins), (2, 48))
        # The stall costs the tenant whose turn it fell in: the small one's second is short.
        shares = cs.window_shares(segs)
        self.assertLess(shares[0][2], 24.0)

    def test_tenants_running_side_by_side_count_once(self):
        # Time-sliced tenants (no turns): each has kernels in flight all the time, their segments
        # overlapping, and a 40 ms stall of the host leaves the GPU idle in one bin. Adding the
        # tenants' busy time would read that bin 120% busy; what ran on the GPU was 60%.
        a = [(0, 3000 * MS), (3040 * MS, 6000 * MS)]
        segs = self.load([a, list(a)])
        self.assertEqual(cs.idle_bins(segs), (1, 50))

    def test_overlapping_segments_count_once(self):
        a = [(0, 2000 * MS), (500 * MS, 1500 * MS), (1000 * MS, 3000 * MS)]
        b = [(0, 3000 * MS)]
        segs = self.load([a, b])
        self.assertEqual(cs.busy_in(segs[0], 0, 3000 * MS), 3000 * MS)


if __name__ == "__main__":
    unittest.main()
