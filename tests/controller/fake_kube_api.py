"""A fake Kubernetes API server for the tensor-fusion.ai/v1 resources and core v1 pods, over real HTTPS.

It answers the way the API server does, with the same payload shapes: lists
({"kind": "GPUPoolList", "metadata": {"resourceVersion"}, "items"}), watch streams (chunked, one
JSON event per line: ADDED, MODIFIED, DELETED, BOOKMARK, and ERROR with a v1 Status of code 410
when the requested resourceVersion is too old), GET/POST/PUT/DELETE of objects and PUT of the
/status subresource with optimistic concurrency (409 Conflict on a stale resourceVersion), object
deletion that waits for finalizers (deletionTimestamp), generation bumped on spec changes only,
and status ignored on the main resource. Every object a client writes is validated against the
CRD schemas given (an invalid one gets 422 Invalid, as from the API server). Every request is
recorded.

What a user would do with kubectl (apply, delete) is done with the methods below, which emit the
same watch events the API server would.
"""
import copy
import datetime
import http.server
import json
import re
import socketserver
import ssl
import threading
import time
import urllib.parse
import uuid

GROUP_PATH = '/apis/tensor-fusion.ai/v1/'
KINDS = {'gpupools': 'GPUPool', 'gpunodes': 'GPUNode', 'gpus': 'GPU',
         'schedulingconfigtemplates': 'SchedulingConfigTemplate',
         'tensorfusionworkloads': 'TensorFusionWorkload', 'workloadprofiles': 'WorkloadProfile',
         'tensorfusionconnections': 'TensorFusionConnection', 'pods': 'Pod'}
CORE = {'pods'}  # served under /api/v1, the others under GROUP_PATH
PATH_RE = re.compile(r'^/(apis/tensor-fusion\.ai|api)/v1/(?:namespaces/([a-z0-9-]+)/)?([a-z]+)(?:/([a-z0-9.-]+))?(/status)?$')


def status_object(code, reason, message):
    return {'kind': 'Status', 'apiVersion': 'v1', 'metadata': {}, 'status': 'Failure',
            'message': message, 'reason': reason, 'code': code}


def now_rfc3339():
    return datetime.datetime.now(datetime.timezone.utc).strftime('%Y-%m-%dT%H:%M:%SZ')


class FakeKubeApi:
    def __init__(self, cert_file, key_file, token, validate=None):
        """`validate(obj)` returns the schema errors of an object a client writes (a list)."""
        self.token = token
        self.validate = validate or (lambda obj: [])
        self.lock = threading.Condition()
        self.rv = 100
        self.objects = {p: {} for p in KINDS}      # plural -> key -> object
        self.history = {p: [] for p in KINDS}      # plural -> [(rv, event)]
        self.compacted = {p: 0 for p in KINDS}     # watches from before this rv get 410
        self.expire_now = {p: 0 for p in KINDS}    # bumped: active watches send ERROR 410
        self.end_generation = 0                    # bumped: active watches end (like a timeout)
        self.conflicts = set()                     # (plural, key): next status PUT meets a newer object
        self.requests = []                         # dicts: method, path, query, body, status, token
        self.watch_sent = []                       # (plural, rv of the last event sent on a stream)
        fake = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = 'HTTP/1.1'

            def log_message(self, *args):
                pass

            def do_GET(self):
                fake._handle(self, 'GET')

            def do_POST(self):
                fake._handle(self, 'POST')

            def do_PUT(self):
                fake._handle(self, 'PUT')

            def do_DELETE(self):
                fake._handle(self, 'DELETE')

            def do_PATCH(self):
                fake._handle(self, 'PATCH')

        class Server(socketserver.ThreadingMixIn, http.server.HTTPServer):
            daemon_threads = True
            allow_reuse_address = True

        self.server = Server(('127.0.0.1', 0), Handler)
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.load_cert_chain(cert_file, key_file)
        self.server.socket = ctx.wrap_socket(self.server.socket, server_side=True)
        self.port = self.server.server_address[1]
        self.url = 'https://127.0.0.1:%d' % self.port
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self):
        with self.lock:
            self.end_generation += 1
            self.lock.notify_all()
        self.server.shutdown()
        self.server.server_close()

    # ---- what users (kubectl) and the test do ----

    @staticmethod
    def key_of(obj):
        m = obj['metadata']
        return m['namespace'] + '/' + m['name'] if m.get('namespace') else m['name']

    def _emit(self, plural, kind, obj, record=True):
        if record:
            self.history[plural].append((int(obj['metadata']['resourceVersion']),
                                         {'type': kind, 'object': copy.deepcopy(obj)}))
        self.lock.notify_all()

    def apply(self, plural, obj, emit=True):
        """kubectl apply: create, or replace the spec (and labels) of an existing object."""
        with self.lock:
            obj = copy.deepcopy(obj)
            key = self.key_of(obj)
            self.rv += 1
            cur = self.objects[plural].get(key)
            if cur is None:
                obj.setdefault('apiVersion', 'v1' if plural in CORE else 'tensor-fusion.ai/v1')
                obj.setdefault('kind', KINDS[plural])
                obj['metadata'].update({'uid': str(uuid.uuid4()), 'resourceVersion': str(self.rv),
                                        'generation': 1, 'creationTimestamp': now_rfc3339()})
                obj.pop('status', None)
                self.objects[plural][key] = obj
                self._emit(plural, 'ADDED', obj, emit)
                return copy.deepcopy(obj)
            if cur.get('spec') != obj.get('spec'):
                cur['metadata']['generation'] += 1
            cur['spec'] = obj.get('spec')
            cur['metadata']['resourceVersion'] = str(self.rv)
            self._emit(plural, 'MODIFIED', cur, emit)
            return copy.deepcopy(cur)

    def set_status(self, plural, key, status):
        """What a controller of the object (the kubelet, for a pod) writes: a new status."""
        with self.lock:
            cur = self.objects[plural][key]
            self.rv += 1
            cur['status'] = copy.deepcopy(status)
            cur['metadata']['resourceVersion'] = str(self.rv)
            self._emit(plural, 'MODIFIED', cur)

    def delete(self, plural, key):
        """kubectl delete: with finalizers the object only gets its deletionTimestamp."""
        with self.lock:
            self._delete_locked(plural, key)

    def _delete_locked(self, plural, key):
        cur = self.objects[plural].get(key)
        if cur is None:
            return False
        self.rv += 1
        cur['metadata']['resourceVersion'] = str(self.rv)
        if cur['metadata'].get('finalizers'):
            cur['metadata'].setdefault('deletionTimestamp', now_rfc3339())
            self._emit(plural, 'MODIFIED', cur)
        else:
            del self.objects[plural][key]
            self._emit(plural, 'DELETED', cur)
        return True

    def get(self, plural, key):
        with self.lock:
            obj = self.objects[plural].get(key)
            return copy.deepcopy(obj) if obj else None

    def bookmark(self, plural):
        """A BOOKMARK event at a new resourceVersion (other objects changed meanwhile)."""
        with self.lock:
            self.rv += 10
            ev = {'type': 'BOOKMARK', 'object': {'kind': KINDS[plural], 'apiVersion': 'tensor-fusion.ai/v1',
                                                  'metadata': {'resourceVersion': str(self.rv)}}}
            self.history[plural].append((self.rv, ev))
            self.lock.notify_all()
            return str(self.rv)

    def end_watches(self):
        """Every open watch ends, as when its timeoutSeconds runs out."""
        with self.lock:
            self.end_generation += 1
            self.lock.notify_all()

    def expire(self, plural):
        """etcd compacted: watches of `plural` get ERROR 410 and must relist."""
        with self.lock:
            self.compacted[plural] = self.rv
            self.expire_now[plural] += 1
            self.lock.notify_all()

    def conflict_once(self, plural, key):
        with self.lock:
            self.conflicts.add((plural, key))

    def recorded(self, method=None, path=None, predicate=None):
        with self.lock:
            out = list(self.requests)
        return [r for r in out if (method is None or r['method'] == method)
                and (path is None or r['path'] == path) and (predicate is None or predicate(r))]

    # ---- the HTTP side ----

    def _reply(self, h, code, obj):
        body = json.dumps(obj).encode()
        h.send_response(code)
        h.send_header('Content-Type', 'application/json')
        h.send_header('Content-Length', str(len(body)))
        h.end_headers()
        h.wfile.write(body)

    def _handle(self, h, method):
        url = urllib.parse.urlsplit(h.path)
        query = dict(urllib.parse.parse_qsl(url.query))
        length = int(h.headers.get('Content-Length') or 0)
        raw = h.rfile.read(length) if length else b''
        try:
            body = json.loads(raw) if raw else None
        except ValueError:
            body = raw.decode(errors='replace')
        auth = h.headers.get('Authorization', '')
        rec = {'method': method, 'path': url.path, 'query': query, 'body': body, 'status': None,
               'token': auth[len('Bearer '):] if auth.startswith('Bearer ') else None, 't': time.time()}
        with self.lock:
            self.requests.append(rec)
        if rec['token'] != self.token:
            rec['status'] = 401
            return self._reply(h, 401, status_object(401, 'Unauthorized', 'Unauthorized'))
        m = PATH_RE.match(url.path)
        if not m or m.group(3) not in KINDS or (m.group(1) == 'api') != (m.group(3) in CORE):
            rec['status'] = 404
            return self._reply(h, 404, status_object(404, 'NotFound', 'the server could not find the requested resource'))
        _, ns, plural, name, sub = m.groups()
        key = (ns + '/' + name if ns else name) if name else None
        if method == 'GET' and name is None and query.get('watch') == 'true':
            rec['status'] = 200
            return self._watch(h, plural, query)
        with self.lock:
            code, answer = self._serve_locked(method, plural, ns, key, name, sub, query, body)
            rec['status'] = code
        self._reply(h, code, answer)

    def _selected(self, obj, selector):
        if not selector:
            return True
        labels = obj['metadata'].get('labels') or {}
        for term in selector.split(','):
            k, _, v = term.partition('=')
            if labels.get(k) != v:
                return False
        return True

    def _serve_locked(self, method, plural, ns, key, name, sub, query, body):
        store = self.objects[plural]
        if method == 'GET' and key is None:
            items = [copy.deepcopy(o) for k, o in sorted(store.items())
                     if (ns is None or o['metadata'].get('namespace') == ns) and self._selected(o, query.get('labelSelector'))]
            return 200, {'kind': KINDS[plural] + 'List', 'apiVersion': 'tensor-fusion.ai/v1',
                         'metadata': {'resourceVersion': str(self.rv)}, 'items': items}
        if method == 'POST' and key is None:
            if not isinstance(body, dict) or not body.get('metadata', {}).get('name'):
                return 422, status_object(422, 'Invalid', 'metadata.name: Required value')
            if ns:
                body['metadata']['namespace'] = ns
            k = self.key_of(body)
            if k in store:
                return 409, status_object(409, 'AlreadyExists', '%s "%s" already exists' % (plural, k))
            obj = copy.deepcopy(body)
            obj.pop('status', None)
            errors = self.validate(obj)
            if errors:
                return 422, status_object(422, 'Invalid', '; '.join(errors))
            self.rv += 1
            obj['metadata'].update({'uid': str(uuid.uuid4()), 'resourceVersion': str(self.rv), 'generation': 1,
                                    'creationTimestamp': now_rfc3339()})
            store[k] = obj
            self._emit(plural, 'ADDED', obj)
            return 201, copy.deepcopy(obj)
        cur = store.get(key)
        if cur is None:
            return 404, status_object(404, 'NotFound', '%s.tensor-fusion.ai "%s" not found' % (plural, name))
        if method == 'GET':
            return 200, copy.deepcopy(cur)
        if method == 'DELETE':
            self._delete_locked(plural, key)
            return 200, status_object(200, '', '') | {'status': 'Success'}
        if method != 'PUT' or not isinstance(body, dict):
            return 405, status_object(405, 'MethodNotAllowed', 'only PUT is served here')
        if sub and (plural, key) in self.conflicts:  # another writer got there first
            self.conflicts.discard((plural, key))
            self.rv += 1
            cur['metadata']['resourceVersion'] = str(self.rv)
            self._emit(plural, 'MODIFIED', cur)
        sent_rv = body.get('metadata', {}).get('resourceVersion')
        if sent_rv != cur['metadata']['resourceVersion']:
            return 409, status_object(
                409, 'Conflict', 'Operation cannot be fulfilled on %s.tensor-fusion.ai "%s": the object has been '
                'modified; please apply your changes to the latest version and try again' % (plural, name))
        candidate = copy.deepcopy(cur)
        if sub:
            candidate['status'] = body.get('status')
        else:
            candidate['spec'] = body.get('spec')
        errors = self.validate(candidate)
        if errors:
            return 422, status_object(422, 'Invalid', '; '.join(errors))
        self.rv += 1
        if sub:  # /status: only status changes
            cur['status'] = copy.deepcopy(body.get('status'))
        else:    # main resource: metadata (finalizers, labels) and spec; status is ignored
            if cur.get('spec') != body.get('spec'):
                cur['metadata']['generation'] += 1
            cur['spec'] = copy.deepcopy(body.get('spec'))
            cur['metadata']['finalizers'] = list(body['metadata'].get('finalizers') or [])
            if cur['metadata'].get('deletionTimestamp') and not cur['metadata']['finalizers']:
                cur['metadata']['resourceVersion'] = str(self.rv)
                del store[key]
                self._emit(plural, 'DELETED', cur)
                return 200, copy.deepcopy(cur)
        cur['metadata']['resourceVersion'] = str(self.rv)
        self._emit(plural, 'MODIFIED', cur)
        return 200, copy.deepcopy(cur)

    def _watch(self, h, plural, query):
        h.send_response(200)
        h.send_header('Content-Type', 'application/json')
        h.send_header('Transfer-Encoding', 'chunked')
        h.end_headers()

        def send(ev):
            data = (json.dumps(ev) + '\n').encode()
            h.wfile.write(b'%x\r\n%s\r\n' % (len(data), data))
            h.wfile.flush()

        deadline = time.time() + int(query.get('timeoutSeconds', '1800'))
        since = int(query.get('resourceVersion') or 0)
        with self.lock:
            end_gen, expire_gen = self.end_generation, self.expire_now[plural]
            too_old = since and since < self.compacted[plural]
        try:
            if too_old:
                send({'type': 'ERROR', 'object': status_object(
                    410, 'Expired', 'too old resource version: %d (%d)' % (since, self.compacted[plural]))})
            else:
                cursor = since
                while time.time() < deadline:
                    with self.lock:
                        pending = [(rv, ev) for rv, ev in self.history[plural] if rv > cursor]
                        ended = self.end_generation != end_gen
                        expired = self.expire_now[plural] != expire_gen
                        if not pending and not ended and not expired:
                            self.lock.wait(0.2)
                            continue
                    selector = query.get('labelSelector')
                    for rv, ev in pending:
                        if ev['type'] == 'BOOKMARK' or self._selected(ev['object'], selector):
                            send(ev)
                        cursor = rv
                        with self.lock:
                            self.watch_sent.append((plural, rv))
                    if expired:
                        send({'type': 'ERROR', 'object': status_object(
                            410, 'Expired', 'too old resource version: %d (%d)' % (cursor, self.compacted[plural]))})
                        break
                    if ended:
                        break
            h.wfile.write(b'0\r\n\r\n')
            h.wfile.flush()
        except (BrokenPipeError, ConnectionResetError, ssl.SSLError, OSError):
            pass
        h.close_connection = True
