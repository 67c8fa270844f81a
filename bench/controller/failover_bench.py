#!/usr/bin/env python3
"""Failover of the controller as a node agent sees it (prints numbers; not a pass/fail test).

A real etcd, two `tfusion controller` replicas on it, and a node agent (`tfusion hypervisor` on the
fake NVML) given both URLs, holding the vGPUs of two allocations. Each round kills the leader with
SIGKILL and measures, from the kill: when the standby serves (GET /healthz says serving), and when
the agent is served again (its tf_node_syncs_total{result="ok"} counter moves after that). It then
checks that the agent kept its vGPUs and stopped none (tf_node_vgpu_stops_total,
tf_node_process_signals_total) and that the new leader still holds both allocations, and restarts
the killed replica as the standby for the next round.

Usage: failover_bench.py --tfusion build/src/cli/tfusion --fakecuda build/tests/fakecuda [--rounds 5]
                         [--leader-ttl SECONDS]  (the replicas' --leader-ttl; default theirs, 10 s)
"""
import argparse
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request

TOKEN = 'bench-token'


def free_port():
    with socket.socket() as s:
        s.bind(('127.0.0.1', 0))
        return s.getsockname()[1]


def get(url, path, token=TOKEN):
    req = urllib.request.Request(url + path)
    if token:
        req.add_header('Authorization', 'Bearer ' + token)
    try:
        with urllib.request.urlopen(req, timeout=2) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()
    except (urllib.error.URLError, OSError):
        return None, ''


def post(url, path, body):
    req = urllib.request.Request(url + path, data=json.dumps(body).encode(), method='POST')
    req.add_header('Authorization', 'Bearer ' + TOKEN)
    req.add_header('Content-Type', 'application/json')
    with urllib.request.urlopen(req, timeout=5) as r:
        return json.loads(r.read())


def serving(url):
    status, body = get(url, '/healthz', token=None)
    return status == 200 and json.loads(body).get('serving', False)


def metric(metrics_url, family, **labels):
    """Sum of the family's samples whose labels include `labels`; None when unreachable."""
    status, body = get(metrics_url, '/metrics', token=None)
    if status != 200:
        return None
    total = 0.0
    for line in body.splitlines():
        m = re.match(r'^' + family + r'(\{([^}]*)\})? ([0-9.eE+-]+)$', line)
        if not m:
            continue
        have = dict(re.findall(r'(\w+)="([^"]*)"', m.group(2) or ''))
        if all(have.get(k) == v for k, v in labels.items()):
            total += float(m.group(3))
    return total


def wait(cond, timeout, what):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return
        time.sleep(0.05)
    raise SystemExit('failover_bench: timed out waiting until ' + what)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument('--tfusion', required=True)
    ap.add_argument('--fakecuda', required=True, help='folder of the fake libcuda/libnvidia-ml')
    ap.add_argument('--rounds', type=int, default=5)
    ap.add_argument('--leader-ttl', type=int, default=0)
    a = ap.parse_args()
    if a.rounds < 1:
        raise SystemExit('failover_bench: --rounds must be at least 1')
    if not shutil.which('etcd'):
        raise SystemExit('failover_bench: etcd is not installed')
    folder = tempfile.mkdtemp(prefix='tf-failover-')
    procs = {}

    def start(name, cmd, env=None):
        log = open(os.path.join(folder, name + '.log'), 'a')
        procs[name] = subprocess.Popen(cmd, stdout=log, stderr=log, env=dict(os.environ, **(env or {})))

    try:
        client, peer = free_port(), free_port()
        etcd = 'http://127.0.0.1:%d' % client
        start('etcd', ['etcd', '--name', 'b', '--data-dir', os.path.join(folder, 'etcd'),
                       '--listen-client-urls', etcd, '--advertise-client-urls', etcd,
                       '--listen-peer-urls', 'http://127.0.0.1:%d' % peer,
                       '--initial-advertise-peer-urls', 'http://127.0.0.1:%d' % peer,
                       '--initial-cluster', 'b=http://127.0.0.1:%d' % peer])
        ports = {'a': free_port(), 'b': free_port()}
        urls = {k: 'http://127.0.0.1:%d' % p for k, p in ports.items()}

        def start_controller(k):
            ttl = ['--leader-ttl', str(a.leader_ttl)] if a.leader_ttl else []
            start('controller-' + k, [a.tfusion, 'controller', '--port', str(ports[k]), '--store', 'etcd:' + etcd,
                                      '--token', TOKEN, '--identity', urls[k]] + ttl)
        start_controller('a')
        wait(lambda: serving(urls['a']), 30, 'the first replica leads')
        start_controller('b')
        wait(lambda: get(urls['b'], '/healthz', None)[0] == 200, 30, 'the second replica answers')
        metrics_port = free_port()
        start('agent', [a.tfusion, 'hypervisor', '--controller', urls['a'] + ',' + urls['b'], '--token', TOKEN,
                        '--node', 'n1', '--metrics-port', str(metrics_port),
                        '--credential-file', os.path.join(folder, 'credential')],
              env={'LD_LIBRARY_PATH': a.fakecuda, 'TFUSION_SHM_DIR': os.path.join(folder, 'shm'),
                   'FAKECUDA_SHM_NAME': '/tf-failover-%d' % os.getpid()})
        metrics_url = 'http://127.0.0.1:%d' % metrics_port
        wait(lambda: get(urls['a'], '/v1/nodes/n1')[0] == 200, 30, 'the agent registers')
        for _ in range(2):
            post(urls['a'], '/v1/allocations', {'percent': 10, 'vram_mib': 64})
        wait(lambda: metric(metrics_url, 'tf_node_vgpus') == 2, 30, 'the agent holds both vGPUs')

        print('failover_bench: %d rounds; etcd, two controller replicas (lease TTL %s), one agent with both URLs'
              % (a.rounds, '%d s' % a.leader_ttl if a.leader_ttl else 'default'))
        print('%-5s %-8s %18s %18s %6s %6s %8s' % ('round', 'killed', 'standby_serves_s', 'agent_served_s',
                                                   'vgpus', 'stops', 'allocs'))
        results = []
        for rnd in range(1, a.rounds + 1):
            leader = next(k for k in urls if serving(urls[k]))
            standby = 'b' if leader == 'a' else 'a'
            syncs = metric(metrics_url, 'tf_node_syncs_total', result='ok')
            t0 = time.monotonic()
            procs['controller-' + leader].send_signal(signal.SIGKILL)
            procs['controller-' + leader].wait()
            t_serving = t_agent = None
            while time.monotonic() - t0 < 60 and t_agent is None:
                now = time.monotonic()
                if t_serving is None and serving(urls[standby]):
                    t_serving = now - t0
                if t_serving is not None and metric(metrics_url, 'tf_node_syncs_total', result='ok') > syncs:
                    t_agent = time.monotonic() - t0
                time.sleep(0.02)
            vgpus = metric(metrics_url, 'tf_node_vgpus')
            stops = (metric(metrics_url, 'tf_node_vgpu_stops_total') or 0) + \
                (metric(metrics_url, 'tf_node_process_signals_total') or 0)
            status, body = get(urls[standby], '/v1/allocations')
            allocs = len(json.loads(body)['allocations']) if status == 200 else -1
            results.append((t_serving, t_agent, vgpus, stops, allocs))
            print('%-5d %-8s %18s %18s %6s %6s %8d' % (rnd, leader, '%.2f' % t_serving if t_serving else 'never',
                                                       '%.2f' % t_agent if t_agent else 'never', vgpus, stops, allocs))
            sys.stdout.flush()
            start_controller(leader)  # back as the standby
            wait(lambda: get(urls[leader], '/healthz', None)[0] == 200, 30, 'the killed replica is back')
            time.sleep(1)
        served = sorted(r[1] for r in results if r[1] is not None)
        if served:
            print('failover_bench: agent served again after %.2f s median, %.2f s max; vGPUs stopped or signalled: %d'
                  % (served[len(served) // 2], served[-1], int(sum(r[3] for r in results))))
        return 0
    finally:
        for p in procs.values():
            if p.poll() is None:
                p.kill()
                p.wait()
        shutil.rmtree(folder, ignore_errors=True)


if __name__ == '__main__':
    sys.exit(main())
