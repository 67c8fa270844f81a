#!/usr/bin/env python3
"""The Kubernetes reconciler of a real `tfusion controller` against a fake API server.

No Kubernetes API server can run here, so fake_kube_api.py serves the tensor-fusion.ai/v1
resources over HTTPS (a CA made for the test) with the API server's payload shapes: lists, watch
streams of JSON lines (ADDED/MODIFIED/DELETED/BOOKMARK/ERROR 410), the /status subresource with
resourceVersion checks (409 on a stale one), finalizers and deletionTimestamp, and checks every
object written against the CRDs of deploy/crds/ (schemas and validation rules). The controller is
the built binary, started with --kube-api; its own HTTP API is used the way node agents and
tenants use it. Checked, in order:

- a GPUPool ADDED on the watch creates our pool with its template's placement mode, its oversell
  ratio and VRAM expansion, and gets the finalizer; a MODIFIED updates it;
- the pool's status carries capacity and the allocated numbers, written through /status with the
  object's resourceVersion; a 409 is followed by a re-read and a successful retry;
- GPUNode and GPU objects mirror the registered node and GPUs, with use and vGPUs;
- a watch that ends is resumed from the last resourceVersion, BOOKMARK's included; an ERROR 410
  makes a relist, which picks up a change the watch never delivered;
- an invalid spec (unknown placement mode) changes nothing and is reported in the Ready condition;
- a TensorFusionWorkload is placed as an allocation of its namespace, shown in its status, and
  released when it is deleted;
- the allocation the extender made for a pod (request_id pod-<uid>) is released when the pod
  ends (phase Succeeded or Failed) or is deleted, and not while the pod runs or, for a pod the
  watch has not delivered, before the grace after the bind, or ever while the API server lists it;
- deleting a GPUPool that holds allocations keeps the finalizer until they are released;
- a standby replica (the store's lock is held by the leader) sends the API server nothing;
- bad --kube-api flags are refused before anything starts, and a CA that did not sign the server's
  certificate is refused (no request reaches the server).

Usage: k8s_reconciler_test.py --tfusion PATH/TO/tfusion
"""
import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import traceback

import yaml

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(ROOT, 'tests', 'common'))
sys.path.insert(0, os.path.join(ROOT, 'tools', 'chart'))
from fake_kube_api import FakeKubeApi  # noqa: E402
from test_ca import make_test_ca  # noqa: E402
from tf_process import http_json, stop_processes  # noqa: E402
import k8s_validate  # noqa: E402
import rbac  # noqa: E402

FINALIZER = 'tensor-fusion.ai/controller'
POOLS = '/apis/tensor-fusion.ai/v1/gpupools'


def check(cond, what):
    if not cond:
        raise AssertionError(what)
    print('ok:', what)


def wait_for(fn, what, timeout=20):
    deadline = time.time() + timeout
    last = None
    while time.time() < deadline:
        try:
            last = fn()
            if last:
                print('ok:', what)
                return last
        except (KeyError, IndexError, TypeError):
            pass
        time.sleep(0.1)
    raise AssertionError('timed out waiting until ' + what + ' (last: %r)' % (last,))


class Controller:
    def __init__(self, tfusion, folder, name, token, extra):
        self.token = token
        self.log_path = os.path.join(folder, name + '.log')
        self.log = open(self.log_path, 'w')
        self.proc = subprocess.Popen(
            [tfusion, 'controller', '--port', '0', '--store', 'sqlite:' + os.path.join(folder, 'state.db'),
             '--durability', 'process', '--token', token] + extra,
            stdout=subprocess.PIPE, stderr=self.log, text=True)
        line = self.proc.stdout.readline()
        if 'listening on http://' not in line:
            raise AssertionError('controller did not start: %r (log %s)' % (line, self.log_path))
        self.url = line.split('listening on ')[1].split()[0]
        self.standby = 'standby' in line

    def call(self, method, path, body=None):
        return http_json(method, self.url + path, self.token, body)

    def ok(self, method, path, body=None):
        status, answer = self.call(method, path, body)
        if status not in (200, 201):
            raise AssertionError('%s %s -> %d %s' % (method, path, status, answer))
        return answer

    def pool(self, name):
        status, answer = self.call('GET', '/v1/pools/' + name)
        return answer if status == 200 else None

    def stop(self):
        stop_processes([self.proc], timeout=10)
        self.log.close()


def condition(obj, ctype='Ready'):
    for c in (obj or {}).get('status', {}).get('conditions', []):
        if c['type'] == ctype:
            return c
    return None


def gpupool(name, template, oversell=None, host=None):
    spec = {'schedulingConfigTemplate': template}
    over = {}
    if oversell is not None:
        over['tflopsOversellRatio'] = oversell
    if host is not None:
        over['vramExpandToHostMem'] = host
    if over:
        spec['capacityConfig'] = {'oversubscription': over}
    return {'apiVersion': 'tensor-fusion.ai/v1', 'kind': 'GPUPool', 'metadata': {'name': name}, 'spec': spec}


def template(name, mode):
    return {'apiVersion': 'tensor-fusion.ai/v1', 'kind': 'SchedulingConfigTemplate', 'metadata': {'name': name},
            'spec': {'placement': {'mode': mode}}}


def watches(api, plural='gpupools'):
    return api.recorded('GET', '/apis/tensor-fusion.ai/v1/' + plural, lambda r: r['query'].get('watch') == 'true')


def lists(api, plural='gpupools'):
    return api.recorded('GET', '/apis/tensor-fusion.ai/v1/' + plural, lambda r: 'watch' not in r['query'])


def run(tfusion, folder):
    make_test_ca(folder)  # ca.pem signed server.pem (127.0.0.1); other.pem signed nothing
    kube_token = 'kube-sa-token-for-the-test'
    with open(os.path.join(folder, 'kube-token'), 'w') as f:
        f.write(kube_token + '\n')
    crds = []
    crd_dir = os.path.join(ROOT, 'deploy', 'crds')
    for name in sorted(os.listdir(crd_dir)):
        with open(os.path.join(crd_dir, name)) as f:
            crds.extend(d for d in yaml.safe_load_all(f) if d)
    index = k8s_validate.crd_index(crds)
    api = FakeKubeApi(os.path.join(folder, 'server.pem'), os.path.join(folder, 'server.key'), kube_token,
                      validate=lambda obj: k8s_validate.validate_cr(obj, index))
    api.apply('schedulingconfigtemplates', template('frag', 'FragAware'))
    api.apply('schedulingconfigtemplates', template('compact', 'CompactFirst'))
    api.apply('schedulingconfigtemplates', template('bad-mode', 'Bogus'))
    kube_flags = ['--kube-api', api.url, '--kube-ca-file', os.path.join(folder, 'ca.pem'),
                  '--kube-token-file', os.path.join(folder, 'kube-token'), '--kube-resync', '1']
    procs = []
    stop_heartbeats = threading.Event()
    try:
        # ---- flags refused before anything starts ----
        for flags, message in [
                (['--kube-api', 'ftp://example'], 'is not an http(s)://HOST[:PORT] URL or in-cluster'),
                (['--kube-api', 'in-cluster'], 'KUBERNETES_SERVICE_HOST'),
                (['--kube-api', api.url], '--kube-ca-file must name the CA'),
                (['--kube-api', api.url, '--kube-ca-file', os.path.join(folder, 'missing.crt')], 'cannot read')]:
            env = {k: v for k, v in os.environ.items() if not k.startswith('KUBERNETES_')}
            r = subprocess.run([tfusion, 'controller', '--port', '0', '--token', 't',
                                '--store', 'sqlite:' + os.path.join(folder, 'refused.db')] + flags,
                               capture_output=True, text=True, timeout=30, env=env)
            check(r.returncode == 2 and message in r.stderr, 'refused %s: %s' % (flags, r.stderr.strip()))
            check(not os.path.exists(os.path.join(folder, 'refused.db')), 'a refused start creates no store')

        # ---- a CA that did not sign the server: TLS is refused ----
        wrong = Controller(tfusion, folder, 'wrong-ca', 'tok', [
            '--kube-api', api.url, '--kube-ca-file', os.path.join(folder, 'other.pem'),
            '--kube-token-file', os.path.join(folder, 'kube-token'), '--kube-resync', '1'])
        procs.append(wrong)
        wait_for(lambda: 'certificate' in open(wrong.log_path).read(), 'the wrong CA is reported in the log')
        wrong.stop()
        procs.remove(wrong)
        check(api.recorded() == [], 'no request got through TLS with the wrong CA')
        os.remove(os.path.join(folder, 'state.db'))

        # ---- the leader ----
        c = Controller(tfusion, folder, 'leader', 'admin-token', kube_flags)
        procs.append(c)
        check(not c.standby, 'the first controller leads')
        wait_for(lambda: watches(api), 'the reconciler lists and then watches GPUPools')
        first_list = lists(api)[0]
        check(first_list['token'] == kube_token, 'requests carry the service-account token')
        check(watches(api)[0]['query'].get('allowWatchBookmarks') == 'true', 'watches ask for bookmarks')

        # A GPUPool ADDED on the watch creates our pool.
        api.apply('gpupools', gpupool('train', 'frag', oversell=200, host=50))
        p = wait_for(lambda: c.pool('train'), 'GPUPool ADDED -> pool train exists in the controller')
        check(p['placement_mode'] == 'FragAware' and p['tflops_oversell_ratio'] == 2 and
              p['vram_expand_to_host_percent'] == 50, 'with the template mode, oversell 2 and VRAM +50%%: %s' % p)
        wait_for(lambda: FINALIZER in api.get('gpupools', 'train')['metadata'].get('finalizers', []),
                 'the GPUPool got our finalizer')

        # Nodes and allocations through the controller's API; status follows.
        c.ok('POST', '/v1/nodes', {'name': 'node-a', 'pool': 'train', 'address': 'node-a:9400', 'credential': 'cred-a',
                                   'gpus': [{'uuid': 'GPU-A0', 'model': 'H100', 'index': 0, 'tflops': 100,
                                             'vram_mib': 81920},
                                            {'uuid': 'GPU-A1', 'model': 'H100', 'index': 1, 'tflops': 100,
                                             'vram_mib': 81920}]})

        def heartbeats():
            while not stop_heartbeats.is_set():
                c.call('POST', '/v1/nodes/node-a/heartbeat', {
                    'credential': 'cred-a', 'gpus': [{'uuid': 'GPU-A0', 'utilization_percent': 40,
                                                      'memory_used_mib': 1024}]})
                stop_heartbeats.wait(1)
        threading.Thread(target=heartbeats, daemon=True).start()
        a1 = c.ok('POST', '/v1/allocations', {'pool': 'train', 'tflops': 60, 'vram_mib': 20480, 'tenant': 'alice'})

        def pool_status(**want):
            s = api.get('gpupools', 'train').get('status', {})
            return s if all(s.get(k) == v for k, v in want.items()) else None
        s = wait_for(lambda: pool_status(availableTFlops='340'), 'GPUPool status shows 60 of 400 TFLOPS allocated')
        check(s['totalGPUs'] == 2 and s['totalNodes'] == 1 and s['readyNodes'] == 1 and s['phase'] == 'Running',
              'status counts the node and its GPUs')
        check(s['totalTFlops'] == '200' and s['virtualTFlops'] == '400' and s['totalVRAM'] == '163840Mi' and
              s['virtualVRAM'] == '245760Mi' and s['availableVRAM'] == '225280Mi',
              'status capacity: physical, virtual (x2 TFLOPS, +50%% VRAM), available: %s' % s)
        check(s['placementMode'] == 'FragAware' and condition(api.get('gpupools', 'train'))['status'] == 'True',
              'status placement mode and Ready=True')
        puts = api.recorded('PUT', POOLS + '/train/status', lambda r: r['status'] == 200 and
                            r['body']['status'].get('availableTFlops') == '340')
        check(puts and puts[0]['body']['metadata'].get('resourceVersion'),
              'the status was written through /status carrying a resourceVersion')

        # GPUNode and GPU mirrors.
        node = wait_for(lambda: (api.get('gpunodes', 'node-a') or {}).get('status', {}).get('totalGPUs') == 2 and
                        api.get('gpunodes', 'node-a'), 'a GPUNode mirrors node-a')
        check(node['status']['phase'] == 'Ready' and node['status']['poolName'] == 'train' and
              node['status']['managedGPUDeviceIDs'] == ['GPU-A0', 'GPU-A1'] and
              node['metadata']['labels']['app.kubernetes.io/managed-by'] == 'tensorfusion-controller',
              'GPUNode status: phase, pool, GPUs, managed-by label')
        gpu = wait_for(lambda: (api.get('gpus', 'gpu-a0') or {}).get('status', {}).get('utilizationPercent') == 40 and
                       api.get('gpus', 'gpu-a0'), 'a GPU object mirrors GPU-A0 with its reported use')
        gs = gpu['status']
        placed_on_a0 = any(v['gpu'] == 'GPU-A0' for v in a1['vgpus'])
        check(gs['uuid'] == 'GPU-A0' and gs['nodeName'] == 'node-a' and gs['capacity'] == {'tflops': '100', 'vram': '81920Mi'}
              and gs['memoryUsed'] == '1024Mi', 'GPU status: uuid, node, capacity, memory used')
        check((len(gs['vgpus']) == 1 and gs['vgpus'][0]['allocation'] == a1['id'] and gs['vgpus'][0]['tenant'] == 'alice')
              if placed_on_a0 else gs['vgpus'] == [], 'GPU status lists the vGPUs placed on it')

        # MODIFIED updates our pool.
        api.apply('gpupools', gpupool('train', 'compact', oversell=300, host=50))
        wait_for(lambda: (c.pool('train') or {}).get('placement_mode') == 'CompactFirst' and
                 c.pool('train')['tflops_oversell_ratio'] == 3, 'GPUPool MODIFIED -> pool mode and oversell updated')
        wait_for(lambda: pool_status(virtualTFlops='600', availableTFlops='540'), 'status follows the new oversell ratio')

        # 409: another writer changes the object between our read and our status write.
        api.conflict_once('gpupools', 'train')
        conflicts_before = len(api.recorded('PUT', POOLS + '/train/status', lambda r: r['status'] == 409))
        a2 = c.ok('POST', '/v1/allocations', {'pool': 'train', 'tflops': 40, 'vram_mib': 10240, 'tenant': 'bob'})
        wait_for(lambda: pool_status(availableTFlops='500'), 'status shows the second allocation')
        reqs = api.recorded(predicate=lambda r: r['path'].startswith(POOLS + '/train'))
        i409 = [i for i, r in enumerate(reqs) if r['method'] == 'PUT' and r['status'] == 409]
        check(len(i409) == conflicts_before + 1, 'one status write met 409 Conflict')
        after = reqs[i409[-1] + 1:]
        check(after[0]['method'] == 'GET' and after[0]['path'] == POOLS + '/train', 'the 409 was followed by a re-read')
        retry = [r for r in after if r['method'] == 'PUT' and r['path'].endswith('/status')][0]
        check(retry['status'] == 200 and retry['body']['metadata']['resourceVersion'] !=
              reqs[i409[-1]]['body']['metadata']['resourceVersion'] and retry['body']['status']['availableTFlops'] == '500',
              'and by a retry with the fresh resourceVersion and the new numbers')

        # A watch that ends is resumed from the last resourceVersion it delivered.
        n = len(watches(api))
        last_rv = api.get('gpupools', 'train')['metadata']['resourceVersion']
        time.sleep(1.5)  # let the watch deliver our own writes' events
        last_rv = max(rv for plural, rv in api.watch_sent if plural == 'gpupools')
        lists_before = len(lists(api))
        api.end_watches()
        w = wait_for(lambda: watches(api)[n:], 'the ended watch is opened again')
        check(w[0]['query'].get('resourceVersion') == str(last_rv),
              'it resumes from the last resourceVersion seen (%s): %s' % (last_rv, w[0]['query']))
        check(len(lists(api)) == lists_before, 'without listing again')

        # BOOKMARK moves the resume point.
        bm = api.bookmark('gpupools')
        wait_for(lambda: ('gpupools', int(bm)) in api.watch_sent, 'the BOOKMARK is sent on the watch')
        time.sleep(0.5)  # and read by the reconciler
        n = len(watches(api))
        api.end_watches()
        w = wait_for(lambda: watches(api)[n:], 'the watch is opened again after a bookmark')
        check(w[0]['query'].get('resourceVersion') == bm, 'it resumes from the BOOKMARK resourceVersion %s' % bm)

        # ERROR 410: relist; a change the watch never delivered is picked up by the list.
        lists_before = len(lists(api))
        api.apply('gpupools', gpupool('train', 'frag', oversell=300, host=50), emit=False)
        api.expire('gpupools')
        wait_for(lambda: len(lists(api)) > lists_before, 'ERROR 410 makes the reconciler list GPUPools again')
        wait_for(lambda: (c.pool('train') or {}).get('placement_mode') == 'FragAware',
                 'the relist applies the change the watch missed')
        relist = lists(api)[lists_before]
        later = [r for r in watches(api) if r['t'] > relist['t']]
        wait_for(lambda: [r for r in watches(api) if r['t'] > relist['t']], 'a new watch follows the relist')
        later = [r for r in watches(api) if r['t'] > relist['t']]
        check(int(later[0]['query']['resourceVersion']) >= api.compacted['gpupools'],
              'from the list\'s resourceVersion')

        # Invalid specs: reported, nothing changes.
        api.apply('gpupools', gpupool('broken', 'bad-mode'))
        cond = wait_for(lambda: condition(api.get('gpupools', 'broken')), 'the invalid GPUPool gets a condition')
        check(cond['status'] == 'False' and cond['reason'] == 'InvalidSpec' and "'Bogus'" in cond['message'],
              'Ready=False InvalidSpec naming the bad mode: %s' % cond['message'])
        check(c.pool('broken') is None, 'no pool was created for it')
        api.apply('gpupools', gpupool('train', 'bad-mode', oversell=500, host=50))
        wait_for(lambda: (condition(api.get('gpupools', 'train')) or {}).get('reason') == 'InvalidSpec',
                 'a bad change to train is reported')
        p = c.pool('train')
        check(p['placement_mode'] == 'FragAware' and p['tflops_oversell_ratio'] == 3,
              'and train keeps its settings (not even the valid oversell of the bad spec): %s' % p)
        api.apply('gpupools', gpupool('train', 'frag', oversell=300, host=50))
        wait_for(lambda: (condition(api.get('gpupools', 'train')) or {}).get('status') == 'True', 'fixed: Ready again')

        # A TensorFusionWorkload becomes an allocation of its namespace.
        wl = {'apiVersion': 'tensor-fusion.ai/v1', 'kind': 'TensorFusionWorkload',
              'metadata': {'name': 'trainer', 'namespace': 'team-a'},
              'spec': {'poolName': 'train', 'qos': 'high',
                       'resources': {'requests': {'tflops': '10', 'vram': '4Gi'}, 'limits': {'tflops': 20}}}}
        api.apply('tensorfusionworkloads', wl)
        ws = wait_for(lambda: (api.get('tensorfusionworkloads', 'team-a/trainer') or {}).get('status', {}).get('phase')
                      == 'Running' and api.get('tensorfusionworkloads', 'team-a/trainer')['status'],
                      'the workload is placed and Running')
        allocs = {a['id']: a for a in c.ok('GET', '/v1/allocations')['allocations']}
        wa = allocs[ws['allocations'][0]['id']]
        check(wa['tenant'] == 'team-a' and wa['qos'] == 'high' and wa['vgpus'][0]['tflops'] == 10 and
              wa['vgpus'][0]['tflops_limit'] == 20 and wa['vgpus'][0]['vram_mib'] == 4096 and wa['node'] == 'node-a',
              'as an allocation of tenant team-a with its request and limit: %s' % wa)
        check(ws['allocations'][0]['node'] == 'node-a' and ws['workerCount'] == 1, 'status names the node')
        bad = dict(wl, metadata={'name': 'huge', 'namespace': 'team-a'},
                   spec={'poolName': 'train', 'resources': {'requests': {'tflops': '900', 'vram': '4Gi'}}})
        api.apply('tensorfusionworkloads', bad)
        hs = wait_for(lambda: (api.get('tensorfusionworkloads', 'team-a/huge') or {}).get('status'),
                      'a workload that fits nowhere gets a status')
        check(hs['phase'] in ('Pending', 'Failed') and hs['workerCount'] == 0 and hs['message'],
              'not placed, with the reason: %s %s' % (hs['phase'], hs['message']))
        api.delete('tensorfusionworkloads', 'team-a/huge')
        api.delete('tensorfusionworkloads', 'team-a/trainer')
        wait_for(lambda: api.get('tensorfusionworkloads', 'team-a/trainer') is None,
                 'the deleted workload is gone once its finalizer is removed')
        check(wa['id'] not in {a['id'] for a in c.ok('GET', '/v1/allocations')['allocations']},
              'and its allocation was released')

        # Pods the extender bound: the allocation goes when the pod ends or is deleted.
        def labelled_pod(name):
            return {'kind': 'Pod', 'metadata': {'name': name, 'namespace': 'team-a',
                                                'labels': {'tensor-fusion.ai/enabled': 'true'}},
                    'spec': {'containers': [{'name': 'main', 'image': 'trainer:1'}]}}

        def pod_allocation(uid):
            return c.ok('POST', '/v1/allocations', {'pool': 'train', 'tflops': 1, 'vram_mib': 1024, 'tenant': 'team-a',
                                                    'request_id': 'pod-' + uid, 'allow_preemption': False})

        def held():
            return {a['id'] for a in c.ok('GET', '/v1/allocations')['allocations']}

        job = api.apply('pods', labelled_pod('job-0'))
        server = api.apply('pods', labelled_pod('server-0'))
        wait_for(lambda: any(w['path'] == '/api/v1/pods' and w['query'].get('labelSelector') ==
                             'tensor-fusion.ai/enabled=true' for w in api.recorded('GET')),
                 'the reconciler lists and watches the labelled pods')
        # A pod the watch never delivered (a watch that lags or backs off after an error): the
        # API server has it, so its allocation stays.
        lagging = api.apply('pods', labelled_pod('lagging-0'), emit=False)
        lagging_a = pod_allocation(lagging['metadata']['uid'])
        job_a = pod_allocation(job['metadata']['uid'])
        server_a = pod_allocation(server['metadata']['uid'])
        unseen_a = pod_allocation('0b5e3c4e-2f61-4b1e-9a57-1d2c3b4a5f60')  # bound; its pod not delivered yet
        made_at = time.time()
        api.set_status('pods', 'team-a/job-0', {'phase': 'Succeeded'})
        wait_for(lambda: job_a['id'] not in held(), 'the allocation of a pod that ended (Succeeded) is released')
        check(time.time() - made_at < 15 and {server_a['id'], unseen_a['id']} <= held(),
              'at once, while a running pod and a just-bound pod the watch has not shown keep theirs')
        check('pod team-a/job-0 (Succeeded) ended: allocation %s released' % job_a['id'] in open(c.log_path).read(),
              'the log says which pod ended and which allocation went')
        wait_for(lambda: unseen_a['id'] not in held(), 'a pod missing after the grace counts as gone', timeout=40)
        check(time.time() - made_at >= 19, 'not before the grace (%.1f s)' % (time.time() - made_at))
        check(server_a['id'] in held(), 'the running pod keeps its allocation')
        check(lagging_a['id'] in held(), 'and so does a pod the watch has not shown but the API server has')
        api.delete('pods', 'team-a/lagging-0')
        wait_for(lambda: lagging_a['id'] not in held(), 'once the API server no longer has it, its allocation goes',
                 timeout=40)
        api.delete('pods', 'team-a/server-0')
        wait_for(lambda: server_a['id'] not in held(), 'a deleted pod\'s allocation is released')

        # Deleting a GPUPool with allocations keeps the finalizer until they are released.
        api.delete('gpupools', 'train')
        cond = wait_for(lambda: (condition(api.get('gpupools', 'train')) or {}).get('reason') == 'Deleting' and
                        condition(api.get('gpupools', 'train')), 'the deleted pool reports that it waits')
        check('2 allocation(s)' in cond['message'], 'for its 2 allocations: ' + cond['message'])
        time.sleep(3)  # several resyncs
        obj = api.get('gpupools', 'train')
        check(obj is not None and FINALIZER in obj['metadata']['finalizers'], 'the finalizer stays while they live')
        check(c.pool('train') is not None, 'and so does the pool')
        c.ok('DELETE', '/v1/allocations/' + a1['id'])
        time.sleep(2)
        check(api.get('gpupools', 'train') is not None, 'one allocation left: still there')
        released = time.time()
        c.ok('DELETE', '/v1/allocations/' + a2['id'])
        wait_for(lambda: api.get('gpupools', 'train') is None, 'released: the finalizer is removed and the GPUPool goes')
        removal = api.recorded('PUT', POOLS + '/train', lambda r: r['status'] == 200 and
                               FINALIZER not in r['body']['metadata'].get('finalizers', []))
        check(removal and all(r['t'] >= released for r in removal), 'the finalizer was removed only after the release')

        # A standby replica does not talk to the API server.
        standby_token = 'standby-sa-token'
        with open(os.path.join(folder, 'standby-token'), 'w') as f:
            f.write(standby_token + '\n')
        flags = list(kube_flags)
        flags[flags.index('--kube-token-file') + 1] = os.path.join(folder, 'standby-token')
        sb = Controller(tfusion, folder, 'standby', 'admin-token', flags)
        procs.append(sb)
        check(sb.standby, 'a second controller on the same store is a standby')
        time.sleep(3)
        check(api.recorded(predicate=lambda r: r['token'] == standby_token) == [],
              'the standby sent the API server nothing')
        # Mirrors of a node the store no longer has (removed while no controller led) are deleted.
        managed = {'app.kubernetes.io/managed-by': 'tensorfusion-controller'}
        api.apply('gpunodes', {'kind': 'GPUNode', 'metadata': {'name': 'node-gone', 'labels': managed}})
        api.apply('gpus', {'kind': 'GPU', 'metadata': {'name': 'gpu-gone', 'labels': managed}})
        wait_for(lambda: api.get('gpunodes', 'node-gone') is None and api.get('gpus', 'gpu-gone') is None,
                 'the GPUNode and GPU of a node the store does not have are deleted')
        check(api.get('gpunodes', 'node-a') is not None, 'and only those')

        # Every call the reconciler made is one the table next to the code lists (and so one the
        # chart grants: tests/deploy/test_rbac.py), and every listed call was made, except the
        # re-reads after a 409 of the kinds this test forces no conflict on.
        made = {rbac.access_of(r['method'], r['path'], r['query']) for r in api.recorded()}
        listed = rbac.needed()['controller']
        check(made - listed == set(), 'every call is in src/controller/kube_api_access.json: %s' % sorted(made - listed))
        reread_only = {('tensor-fusion.ai', p, 'get') for p in ('gpunodes', 'gpus', 'tensorfusionworkloads')}
        check(listed - made <= reread_only, 'every other call listed there was made: %s' % sorted(listed - made - reread_only))
        print('not driven here (GET after a 409):', sorted(listed - made))
        invalid = api.recorded(predicate=lambda r: r['status'] == 422)
        check(invalid == [], 'every object the reconciler wrote passed the CRD schemas and rules: %s' %
              [(r['path'], r['body']) for r in invalid][:2])
        return 0
    finally:
        stop_heartbeats.set()
        for p in procs:
            p.stop()
        api.close()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument('--tfusion', required=True)
    args = ap.parse_args()
    folder = tempfile.mkdtemp(prefix='tf-k8s-reconciler-')
    try:
        rc = run(args.tfusion, folder)
    except Exception:
        traceback.print_exc()
        for name in ('leader.log', 'wrong-ca.log', 'standby.log'):
            path = os.path.join(folder, name)
            if os.path.exists(path):
                print('---- %s (tail) ----' % name)
                print(''.join(open(path).readlines()[-40:]))
        print('logs kept in', folder)
        return 1
    shutil.rmtree(folder, ignore_errors=True)
    print('PASS')
    return rc


if __name__ == '__main__':
    sys.exit(main())
