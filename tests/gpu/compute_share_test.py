#!/usr/bin/env python3
"""CI test (no GPU) of compute_share.py's measures on synthetic kernel segments: each tenant's
share per 1 s window (first second dropped), and the 100 ms bins in which a saturating group left
the GPU idle, which tell a stall of the host from a division of time; and share_bins.py, which
prints a kept group's shares per bin."""
import contextlib
import io
import os
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import compute_share as cs  # noqa: E402
import share_bins  # noqa: E402

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


class ShareBins(unittest.TestCase):
    def run_main(self, argv):
        out, err = io.StringIO(), io.StringIO()
        code = 0
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                code = share_bins.main(argv)
            except SystemExit as e:
                code = e.code
        return code, out.getvalue(), err.getvalue()

    def test_a_stall_shows_in_the_bin_it_fell_in_and_whose_turn_it_cut(self):
        with tempfile.TemporaryDirectory() as d:
            for i, segs in enumerate(turns(0, 3000, [0.25, 0.75], gaps=[(2012, 2040)])):
                write(os.path.join(d, f"t{i}.seg"), segs)
            code, out, _ = self.run_main([d, "--bin-ms", "10", "--from-ms", "1950", "--to-ms", "2050"])
        self.assertEqual(code, 0)
        bins = out.split("per 1 s window")[0].splitlines()[1:]  # below the header: ms, t0, t1, sum[, idle]
        lines = {int(line.split()[0]): line.split() for line in bins}
        self.assertEqual(sorted(lines), list(range(1950, 2050, 10)))
        # The common window starts 50 ms in (the second tenant's first turn): 2012-2040 ms of the
        # run are 1962-1990 ms of it, inside the first tenant's turn (1950-2000 of the window). The
        # bin at 1960 ran a kernel 20% of its time: idle (the GPU idle more than 15% of it).
        self.assertEqual(lines[1960][1:], ["20.0", "0.0", "20.0", "idle"])
        self.assertEqual(lines[1970][-1], "idle")
        self.assertNotIn("idle", lines[1950])
        self.assertIn("per 1 s window (first second dropped):", out)

    def test_bad_input_is_named(self):
        with tempfile.TemporaryDirectory() as d:
            code, _, err = self.run_main([d])
            self.assertEqual(code, 2)
            self.assertIn("no t*.seg files", err)
            write(os.path.join(d, "t0.seg"), [(0, MS)])
            code, _, err = self.run_main([d, "--bin-ms", "0"])
            self.assertEqual(code, 2)
            self.assertIn("--bin-ms 0 is not in 0.1..10000", err)
            write(os.path.join(d, "t1.seg"), [])
            code, _, err = self.run_main([d])
            self.assertEqual(code, 2)
            self.assertIn("no kernel segments in t1.seg", err)


if __name__ == "__main__":
    unittest.main()
