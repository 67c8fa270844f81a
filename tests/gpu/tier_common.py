"""Helpers shared by the GPU tier's Python coordinators (standard library only).

Results go to a TSV file that run_all.sh turns into summary.md: one line per test,
"name<TAB>PASS|FAIL|SKIP<TAB>note".
"""
import os
import signal
import subprocess
import time

GIB = 1 << 30
MIB = 1 << 20


def record(results_path, name, status, note=""):
    note = " ".join(str(note).split())
    with open(results_path, "a") as f:
        f.write(f"{name}\t{status}\t{note}\n")
    print(f"[{status}] {name} {note}", flush=True)


def parse_results(text):
    """RESULT key=value lines -> dict (a repeated key keeps its last value)."""
    out = {}
    for line in text.splitlines():
        if not line.startswith("RESULT "):
            continue
        body = line[len("RESULT "):]
        if "=" in body and " " not in body.split("=", 1)[0]:
            key, value = body.split("=", 1)
            out[key] = value.strip()
    return out


def read(path):
    try:
        with open(path) as f:
            return f.read()
    except OSError:
        return ""


def limited(tfusion, vram, percent, vgpu, cmd):
    """The command line that runs cmd under the limiter in vGPU `vgpu`."""
    args = [tfusion, "run", "--vram", vram, "--percent", str(percent)]
    if vgpu:
        args += ["--vgpu", vgpu]
    return args + ["--"] + list(cmd)


def start(cmd, log_path, env=None):
    """Starts cmd in its own process group with stdout and stderr into log_path."""
    log = open(log_path, "w")
    log.write("$ " + " ".join(cmd) + "\n")
    log.flush()
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True, env=env)
    proc.log_file = log
    proc.log_path = log_path
    return proc


def finish(proc, timeout):
    """Waits up to timeout seconds, then kills the whole process group. Returns the exit status
    (None when it had to be killed) and the log text."""
    try:
        rc = proc.wait(timeout=max(timeout, 0.1))
    except subprocess.TimeoutExpired:
        kill_group(proc)
        proc.wait()
        rc = None
    proc.log_file.close()
    return rc, read(proc.log_path)


def kill_group(proc):
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def wait_files(paths, timeout, procs=()):
    """True when every path exists; False after timeout or as soon as a process in procs exits."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if all(os.path.exists(p) for p in paths):
            return True
        if any(p.poll() is not None for p in procs):
            return all(os.path.exists(p) for p in paths)
        time.sleep(0.005)
    return False


def touch(path):
    with open(path, "w") as f:
        f.write("go\n")


def run(cmd, log_path, timeout, env=None):
    """Runs cmd to completion (killed after timeout). Returns (rc or None, log text)."""
    return finish(start(cmd, log_path, env), timeout)
