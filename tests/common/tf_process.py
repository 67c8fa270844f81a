"""Helpers for tests that run the built daemons as real processes: a free port, polling against a
deadline, a JSON call to an HTTP API, stopping what was started, and removing the fake driver's
shared memory afterwards."""
import json
import os
import re
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request


def free_port():
    """A TCP port on 127.0.0.1 that nothing listened on a moment ago."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for(what, probe, timeout, interval=0.25):
    """Calls probe() until it returns something truthy; fails naming `what` and the last value."""
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        try:
            last = probe()
            if last:
                return last
        except Exception as e:  # the server may not be up yet
            last = e
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout}s waiting for {what} (last: {last!r})")


def http_json(method, url, token=None, body=None):
    """(status, decoded JSON answer) of a call with an optional bearer token and JSON body."""
    req = urllib.request.Request(url, method=method,
                                 data=None if body is None else json.dumps(body).encode())
    if token:
        req.add_header("Authorization", "Bearer " + token)
    if body is not None:
        req.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status, json.loads(r.read() or b"null")
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"null")


def stop_processes(procs, timeout=20):
    """SIGTERM to each process still running, the last started first; SIGKILL after `timeout`."""
    for p in reversed(procs):
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
            try:
                p.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()


def remove_fake_driver_shm(name):
    """Remove the fake driver's shared memory objects of FAKECUDA_SHM_NAME `name` (its per-device
    tables, NAME-devN, and its checkpoint table, NAME-ckpt) once the processes using them stopped."""
    name = name.lstrip("/")
    if not name:
        return
    pattern = re.compile(re.escape(name) + r"-(ckpt|dev[0-9]+)")
    try:
        entries = os.listdir("/dev/shm")
    except OSError:
        return
    for entry in entries:
        if pattern.fullmatch(entry):
            try:
                os.unlink(os.path.join("/dev/shm", entry))
            except OSError:
                pass
