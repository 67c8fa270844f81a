#!/usr/bin/env python3
"""The web console in a real headless Chromium against a real controller.

Starts the built `tfusion controller` (SQLite store in a temporary folder, a free port, a usage
history sample every second), seeds it through the API the way node agents and tenants do (pools,
nodes with GPUs, heartbeats, allocations of several QoS, a preemption that leaves an eviction, a
quota, a GPU model that is an HTML injection), then drives Chromium through chromedriver
(Debian's chromium, chromium-driver and python3-selenium) and checks what a user sees: the login
form, a refused token, the pools, nodes, GPUs, vGPUs, evictions, fragmentation and charts with the
right numbers, that the token appears nowhere in the page or its URL, that the hostile name is only
text, and logging out. On failure a screenshot and the page source are left in the temporary
folder (its path is printed) and the exit code is 1.

Usage: console_browser_test.py --tfusion PATH/TO/tfusion
"""
import argparse
import base64
import hashlib
import ssl
import json
import os
import secrets
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import traceback
import urllib.error
import urllib.request

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), '..', 'common'))
from test_ca import make_test_ca  # noqa: E402

from selenium import webdriver
from selenium.webdriver.chrome.options import Options
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.support import expected_conditions as EC
from selenium.webdriver.support.ui import WebDriverWait

HOSTILE_MODEL = '<img src=x onerror="window.__pwned=1">'


class Controller:
    """A `tfusion controller` process and a small client of its API."""

    def __init__(self, tfusion, folder, token, tls=False):
        self.token = token
        self.log = open(os.path.join(folder, 'controller.log'), 'w')
        extra, self.ssl = [], None
        if tls:  # the controller's own HTTPS, with a certificate of a test CA this client trusts
            extra = ['--tls-cert', os.path.join(folder, 'server.pem'), '--tls-key', os.path.join(folder, 'server.key')]
            self.ssl = ssl.create_default_context(cafile=os.path.join(folder, 'ca.pem'))
        self.proc = subprocess.Popen(
            [tfusion, 'controller', '--port', '0', '--store', 'sqlite:' + os.path.join(folder, 'state.db'),
             '--durability', 'process', '--token', token, '--history-interval', '1'] + extra,
            stdout=subprocess.PIPE, stderr=self.log, text=True)
        line = self.proc.stdout.readline()
        want = 'listening on https://' if tls else 'listening on http://'
        if want not in line:
            raise AssertionError('controller did not start: %r' % line)
        self.url = line.split('listening on ')[1].split()[0]

    def call(self, method, path, body=None, token=None):
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(self.url + path, data=data, method=method)
        req.add_header('Authorization', 'Bearer ' + (token or self.token))
        if data is not None:
            req.add_header('Content-Type', 'application/json')
        try:
            with urllib.request.urlopen(req, timeout=10, context=self.ssl) as r:
                return r.status, json.loads(r.read() or b'null'), dict(r.headers)
        except urllib.error.HTTPError as e:
            return e.code, json.loads(e.read() or b'null'), dict(e.headers)

    def ok(self, method, path, body=None, want=(200, 201)):
        status, answer, _ = self.call(method, path, body)
        if status not in want:
            raise AssertionError('%s %s -> %d %s' % (method, path, status, answer))
        return answer

    def stop(self):
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        self.log.close()


def check(cond, what):
    if not cond:
        raise AssertionError(what)


def seed(c):
    """Pools, nodes, GPUs, allocations and an eviction. Returns what the checks compare against."""
    c.ok('POST', '/v1/pools', {'name': 'train', 'tflops_oversell_ratio': 2, 'vram_expand_to_host_percent': 50})
    nodes = {
        'node-a': ('train', [('GPU-a0', 'H100-SXM', 100, 81920), ('GPU-a1', HOSTILE_MODEL, 100, 40960)]),
        'node-b': ('default', [('GPU-b0', 'A100-80GB', 200, 81920)]),
    }
    for name, (pool, gpus) in nodes.items():
        c.ok('POST', '/v1/nodes', {
            'name': name, 'pool': pool, 'address': name + ':9400', 'credential': 'cred-' + name,
            'gpus': [{'uuid': u, 'model': m, 'index': i, 'tflops': t, 'vram_mib': v}
                     for i, (u, m, t, v) in enumerate(gpus)]})
    allocs = {
        'low': c.ok('POST', '/v1/allocations', {'pool': 'train', 'tflops': 60, 'vram_mib': 20480, 'qos': 'low',
                                                'tenant': 'alice'}),
        'high': c.ok('POST', '/v1/allocations', {'pool': 'train', 'tflops': 30, 'tflops_limit': 50,
                                                 'vram_mib': 8192, 'qos': 'high', 'tenant': 'bob'}),
        'victim': c.ok('POST', '/v1/allocations', {'tflops': 150, 'vram_mib': 40960, 'qos': 'low',
                                                   'tenant': 'carol'}),
    }
    # Does not fit next to the victim (150 + 100 > 200 TFLOPS): preempts it.
    allocs['critical'] = c.ok('POST', '/v1/allocations', {'tflops': 100, 'vram_mib': 20480, 'qos': 'critical',
                                                          'tenant': 'dave'})
    check(allocs['critical']['preempted'] == [allocs['victim']['id']], 'the critical allocation preempted the victim')
    c.ok('PUT', '/v1/quotas/alice', {'max_tflops': 100})
    return nodes, allocs


def heartbeats(c, nodes, allocs, stop):
    """What the node agents do: report GPU use every second (and keep the nodes alive), and the
    processes on the high allocation's vGPU."""
    use = {'GPU-a0': (50, 10240), 'GPU-a1': (0, 0), 'GPU-b0': (80, 30000)}
    high = allocs['high']
    while not stop.is_set():
        for name, (_, gpus) in nodes.items():
            vgpus = [{'allocation': high['id'], 'gpu': v['gpu'], 'busy_ns_total': 0, 'throttled_ns_total': 0,
                      'processes': [{'pid': 4242, 'vram_bytes': 512 << 20}, {'pid': 4343, 'vram_bytes': 0}]}
                     for v in high['vgpus']] if high['node'] == name else []
            c.call('POST', '/v1/nodes/%s/heartbeat' % name, {
                'credential': 'cred-' + name,
                'gpus': [{'uuid': u, 'utilization_percent': use[u][0], 'memory_used_mib': use[u][1]}
                         for (u, _, _, _) in gpus],
                'vgpus': vgpus})
        stop.wait(1)


def spki_sha256(cert_file):
    """The base64 SHA-256 of a certificate's public key: what Chromium pins with
    --ignore-certificate-errors-spki-list (it then accepts that key's certificate, and no other)."""
    pub = subprocess.run(['openssl', 'x509', '-in', cert_file, '-pubkey', '-noout'], check=True,
                         capture_output=True).stdout
    der = subprocess.run(['openssl', 'pkey', '-pubin', '-outform', 'der'], input=pub, check=True,
                         capture_output=True).stdout
    return base64.b64encode(hashlib.sha256(der).digest()).decode()


def start_browser(folder, pin=None):
    o = Options()
    o.binary_location = shutil.which('chromium') or '/usr/bin/chromium'
    for a in ('--headless=new', '--no-sandbox', '--disable-gpu', '--disable-dev-shm-usage',
              '--window-size=1500,1000', '--user-data-dir=' + os.path.join(folder, 'chromium')):
        o.add_argument(a)
    if pin:
        o.add_argument('--ignore-certificate-errors-spki-list=' + pin)
    o.set_capability('goog:loggingPrefs', {'browser': 'ALL'})
    service = Service(shutil.which('chromedriver') or '/usr/bin/chromedriver',
                      log_path=os.path.join(folder, 'chromedriver.log'))
    return webdriver.Chrome(service=service, options=o)


# Reads go through one script call each: the console re-renders every few seconds, so an element
# found by one WebDriver command may be replaced before the next.
def text(d, selector):
    got = d.execute_script('const e = document.querySelector(arguments[0]); return e ? e.textContent : null', selector)
    check(got is not None, 'no element ' + selector)
    return got


def attrs(d, selector, name):
    return d.execute_script(
        'return Array.from(document.querySelectorAll(arguments[0]), e => e.getAttribute(arguments[1]))', selector, name)


def cell(d, table_id, key, col):
    return text(d, '#%s tr[data-key="%s"] td[data-col="%s"]' % (table_id, key, col))


def tab(d, view):
    d.find_element(By.CSS_SELECTOR, '#tabs button[data-view="%s"]' % view).click()
    WebDriverWait(d, 5).until(EC.visibility_of_element_located((By.ID, 'view-' + view)))


def browse(d, c, nodes, allocs):
    wait = WebDriverWait(d, 20)
    # Not logged in: the login form and nothing else.
    d.get(c.url + '/')
    check(d.current_url == c.url + '/console/', '/ redirects to /console/, got ' + d.current_url)
    wait.until(EC.visibility_of_element_located((By.ID, 'login-form')))
    check(not d.find_element(By.ID, 'app-view').is_displayed(), 'no data before logging in')
    check('node-a' not in d.page_source, 'no data before logging in')

    # A wrong token: a clear error, still logged out, nothing stored.
    d.find_element(By.ID, 'token').send_keys('not-the-token')
    d.find_element(By.ID, 'login').click()
    err = wait.until(EC.visibility_of_element_located((By.ID, 'login-error')))
    check('refused this token' in err.text, 'wrong token error: ' + err.text)
    check('not-the-token' not in d.page_source, 'the wrong token is not shown')
    check(not d.find_element(By.ID, 'app-view').is_displayed(), 'still logged out')
    check(d.execute_script('return sessionStorage.length') == 0, 'nothing stored for a wrong token')

    # The right token.
    d.find_element(By.ID, 'token').send_keys(c.token)
    d.find_element(By.ID, 'login').click()
    wait.until(lambda d: d.execute_script('return document.body.dataset.loaded'))
    check(not d.find_element(By.ID, 'login-view').is_displayed(), 'the login form is gone')

    # Pools: allocated against physical and virtual capacity.
    # train: 2 GPUs of 100 TFLOPS (x2 oversell), 81920 + 40960 MiB VRAM (+50% host) ; 60 + 30 TFLOPS held.
    check(cell(d, 'pools', 'train', 'gpus') == '2', 'train has 2 GPUs')
    check(cell(d, 'pools', 'train', 'tflops_allocated') == '90.0', 'train TFLOPS allocated')
    check(cell(d, 'pools', 'train', 'tflops_physical') == '200.0 (45.0%)', cell(d, 'pools', 'train', 'tflops_physical'))
    check(cell(d, 'pools', 'train', 'tflops_virtual') == '400.0 (22.5%)', cell(d, 'pools', 'train', 'tflops_virtual'))
    check(cell(d, 'pools', 'train', 'vram_allocated') == '28672', 'train VRAM allocated')
    check(cell(d, 'pools', 'train', 'vram_physical') == '122880 (23.3%)', cell(d, 'pools', 'train', 'vram_physical'))
    check(cell(d, 'pools', 'train', 'vram_virtual') == '184320 (15.6%)', cell(d, 'pools', 'train', 'vram_virtual'))
    check(cell(d, 'pools', 'train', 'oversell') == '2.00x', 'oversell ratio')
    check(cell(d, 'pools', 'default', 'tflops_allocated') == '100.0', 'default: only the critical allocation')
    check(cell(d, 'pools', 'default', 'tflops_physical') == '200.0 (50.0%)', 'default TFLOPS')
    check(cell(d, 'pools', 'default', 'utilization') == '80.0%', 'default GPU use')
    check(cell(d, 'quotas', 'alice', 'tflops') == '60.0 / 100.0', 'alice quota: ' + cell(d, 'quotas', 'alice', 'tflops'))

    # Nodes and GPUs.
    tab(d, 'nodes')
    check(cell(d, 'nodes', 'node-a', 'pool') == 'train', 'node-a pool')
    check(cell(d, 'nodes', 'node-a', 'state') == 'ready', 'node-a ready')
    check(cell(d, 'nodes', 'node-a', 'gpus') == '2', 'node-a GPUs')
    check(cell(d, 'nodes', 'node-b', 'address') == 'node-b:9400', 'node-b address')
    held = {}
    for a in allocs.values():
        if a['id'] == allocs['victim']['id']:
            continue
        for v in a['vgpus']:
            t, m = held.get(v['gpu'], (0, 0))
            held[v['gpu']] = (t + v['tflops'], m + v['vram_mib'])
    for name, (pool, gpus) in nodes.items():
        for (uuid, model, tflops, vram) in gpus:
            t, m = held.get(uuid, (0, 0))
            factor, vfactor = (2, 1.5) if pool == 'train' else (1, 1)
            want = '%.1f / %.1f / %.1f' % (t, tflops, tflops * factor)
            check(cell(d, 'gpus', uuid, 'tflops') == want, '%s TFLOPS: %s != %s' % (uuid, cell(d, 'gpus', uuid, 'tflops'), want))
            want = '%d / %d / %d' % (m, vram, int(vram * vfactor))
            check(cell(d, 'gpus', uuid, 'vram') == want, '%s VRAM: %s != %s' % (uuid, cell(d, 'gpus', uuid, 'vram'), want))
            check(cell(d, 'gpus', uuid, 'model') == model, '%s model shown as text' % uuid)
    check(cell(d, 'gpus', 'GPU-a0', 'utilization') == '50.0%', 'GPU-a0 use from the heartbeats')

    # The hostile GPU model is text: no element made from it, no script run.
    check(d.execute_script('return document.querySelectorAll("img").length') == 0, 'no <img> element')
    check(d.execute_script('return window.__pwned === undefined'), 'no script ran')
    check('&lt;img src=x onerror=' in d.page_source, 'the hostile model is escaped text in the page')

    # Fragmentation: a bar per GPU and the largest slice that still fits.
    tab(d, 'fragmentation')
    for name, (pool, gpus) in nodes.items():
        for (uuid, _, tflops, vram) in gpus:
            t, m = held.get(uuid, (0, 0))
            factor, vfactor = (2, 1.5) if pool == 'train' else (1, 1)
            box = '#fragmentation [data-uuid="%s"]' % uuid
            want = 'Largest slice: %.1f TFLOPS, %d MiB' % (tflops * factor - t, int(vram * vfactor) - m)
            got = text(d, box + ' [data-field="slice"]')
            check(got == want, '%s slice: %s != %s' % (uuid, got, want))
            widths = attrs(d, box + ' svg.bar rect.allocated', 'width')
            check(len(widths) == 2, '%s has a TFLOPS and a VRAM bar' % uuid)
            check(abs(float(widths[0]) - 240 * t / (tflops * factor)) < 0.5, '%s TFLOPS bar width %s' % (uuid, widths))

    # vGPUs with QoS; the preempted one is gone from them ...
    tab(d, 'allocations')
    for kind, a in allocs.items():
        rows = attrs(d, '#allocations tr[data-key^="%s/"]' % a['id'], 'data-key')
        if kind == 'victim':
            check(not rows, 'the preempted allocation is no longer listed')
            continue
        check(len(rows) == len(a['vgpus']), '%s listed' % a['id'])
        v = a['vgpus'][0]
        key = a['id'] + '/' + v['gpu']
        check(cell(d, 'allocations', key, 'qos') == a['qos'], '%s QoS' % kind)
        check(cell(d, 'allocations', key, 'node') == a['node'], '%s node' % kind)
        check(cell(d, 'allocations', key, 'tflops') == '%.1f' % v['tflops'], '%s TFLOPS' % kind)
        check(cell(d, 'allocations', key, 'vram') == str(v['vram_mib']), '%s VRAM' % kind)
    hv = allocs['high']['vgpus'][0]
    check(cell(d, 'allocations', allocs['high']['id'] + '/' + hv['gpu'], 'limit') == '50.0', 'limit of the high one')
    check(cell(d, 'allocations', allocs['high']['id'] + '/' + hv['gpu'], 'processes') == '4242 (512 MiB), 4343 (0 MiB)',
          'the processes its node reports on the high one')
    lv = allocs['low']['vgpus'][0] if 'low' in allocs else None
    if lv is not None:
        check(cell(d, 'allocations', allocs['low']['id'] + '/' + lv['gpu'], 'processes') == 'not reported',
              'no processes reported for the low one')

    # ... and listed among the evictions.
    tab(d, 'evictions')
    vid = allocs['victim']['id']
    check(cell(d, 'evictions', vid, 'reason') == 'preempted', 'eviction reason')
    check(cell(d, 'evictions', vid, 'by') == allocs['critical']['id'], 'preempted by the critical allocation')
    check(cell(d, 'evictions', vid, 'tenant') == 'carol', 'evicted tenant')
    check(cell(d, 'evictions', vid, 'state') == 'stopping', 'no agent reported it stopped yet')

    # Charts with data points from the history (one sample a second).
    tab(d, 'charts')
    points = '#charts [data-pool="train"] svg.chart circle.point[data-series="allocated"]'
    wait.until(lambda d: len(attrs(d, points, 'data-value')) >= 6)  # 3+ samples, 2 charts
    values = {float(v) for v in attrs(d, points, 'data-value')}
    check(90.0 in values, 'the train TFLOPS chart has the allocated 90 TFLOPS: %s' % values)
    check(28672.0 in values, 'the train VRAM chart has the allocated 28672 MiB: %s' % values)
    line = attrs(d, '#charts [data-pool="train"] svg.chart polyline[data-series="allocated"]', 'points')[0]
    check(len(line.split()) >= 3, 'the line has several points')

    # The token is nowhere in the page or its URL (only in this tab's sessionStorage).
    for view in ('pools', 'nodes', 'fragmentation', 'allocations', 'evictions', 'charts'):
        tab(d, view)
        check(c.token not in d.page_source, 'token in the page source (%s)' % view)
        check(c.token not in d.execute_script('return document.documentElement.outerHTML'), 'token in the DOM')
        check(c.token not in d.current_url, 'token in the URL')
        check(d.find_element(By.ID, 'token').get_attribute('value') == '', 'the token field was cleared')
    check(d.execute_script('return sessionStorage.getItem("tfusion.console.token")') == c.token, 'kept for this tab')
    check(d.execute_script('return localStorage.length') == 0, 'nothing in localStorage')
    check(not d.get_cookies(), 'no cookies')

    # The page obeys its own Content-Security-Policy (no violation reported).
    logs = d.get_log('browser')
    violations = [l for l in logs if 'Content Security Policy' in l.get('message', '')]
    check(not violations, 'CSP violations: %s' % violations)

    # Log out: the data and the token are gone, and a reload shows the login form.
    d.find_element(By.ID, 'logout').click()
    wait.until(EC.visibility_of_element_located((By.ID, 'login-form')))
    check(d.execute_script('return sessionStorage.length') == 0, 'logging out forgets the token')
    check('node-a' not in d.page_source and 'GPU-a0' not in d.page_source, 'logging out clears the data')
    d.refresh()
    wait.until(EC.visibility_of_element_located((By.ID, 'login-form')))
    check(not d.find_element(By.ID, 'app-view').is_displayed(), 'still logged out after a reload')


def check_headers(c):
    req = urllib.request.Request(c.url + '/console/')
    with urllib.request.urlopen(req, timeout=10, context=c.ssl) as r:
        page = r.read().decode()
        csp = r.headers.get('Content-Security-Policy', '')
        check("script-src 'self'" in csp and 'unsafe' not in csp, 'strict CSP: ' + csp)
        check(r.headers.get('X-Content-Type-Options') == 'nosniff', 'nosniff on the page')
    check('<script>' not in page and '<script src="console.js"' in page, 'no inline script')
    check('http://' not in page and 'https://' not in page, 'no outside resources')
    status, _, headers = c.call('GET', '/v1/pools')
    check(status == 200 and headers.get('Cache-Control') == 'no-store', 'API answers are not cached')
    status, _, _ = c.call('GET', '/v1/pools', token='not-the-token')
    check(status == 401, 'the API needs the token')


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument('--tfusion', required=True)
    ap.add_argument('--tls', action='store_true', help='the controller serves HTTPS (a test CA)')
    args = ap.parse_args()
    folder = tempfile.mkdtemp(prefix='tfusion-console-')
    token = secrets.token_hex(24)
    pin = None
    if args.tls:
        make_test_ca(folder)
        pin = spki_sha256(os.path.join(folder, 'server.pem'))
    c = Controller(args.tfusion, folder, token, tls=args.tls)
    stop = threading.Event()
    driver = None
    ok = False
    try:
        nodes, allocs = seed(c)
        beats = threading.Thread(target=heartbeats, args=(c, nodes, allocs, stop), daemon=True)
        beats.start()
        check_headers(c)
        deadline = time.time() + 30
        while len(c.ok('GET', '/v1/history')['samples']) < 3:  # a few samples with the seeded state
            check(time.time() < deadline, 'the usage history collects samples')
            time.sleep(0.5)
        if args.tls:
            check(c.url.startswith('https://'), 'the controller serves HTTPS: ' + c.url)
            plain = 'http://' + c.url[len('https://'):] + '/console/'
            try:
                urllib.request.urlopen(plain, timeout=5)
                check(False, 'plain HTTP to the TLS port must not serve the console')
            except (urllib.error.URLError, ConnectionError, OSError):
                pass
        driver = start_browser(folder, pin)
        browse(driver, c, nodes, allocs)
        if args.tls:
            check(driver.current_url.startswith('https://'), 'the console ran over HTTPS: ' + driver.current_url)
        ok = True
        print('PASS: the console in headless Chromium' + (' over HTTPS' if args.tls else ''))
    except Exception:
        traceback.print_exc()
        if driver is not None:
            try:
                driver.save_screenshot(os.path.join(folder, 'failure.png'))
                with open(os.path.join(folder, 'failure.html'), 'w') as f:
                    f.write(driver.page_source)
            except Exception:
                traceback.print_exc()
        print('FAIL: screenshot, page source and logs are in ' + folder)
    finally:
        stop.set()
        if driver is not None:
            driver.quit()
        c.stop()
        if ok:
            shutil.rmtree(folder, ignore_errors=True)
    return 0 if ok else 1


if __name__ == '__main__':
    sys.exit(main())
