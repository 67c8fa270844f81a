"""What each TensorFusion component may do in the Kubernetes API, and what it did.

- needed(): the table next to the code (src/controller/kube_api_access.json) as
  {component: {(apiGroup, resource, verb)}};
- granted(objects, namespace, release): what a rendered chart grants each component's
  ServiceAccount, through the Roles and ClusterRoles it binds, in the same form;
- access_of(method, path, query): the RBAC (apiGroup, resource, verb) a request needs, as the API
  server's authorizer derives it from the request.
"""
import json
import os
import re
import urllib.parse

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TABLE = os.path.join(ROOT, 'src', 'controller', 'kube_api_access.json')

_PATH = re.compile(r'^/(?:api/(?P<core>v1)|apis/(?P<group>[^/]+)/(?P<version>[^/]+))'
                   r'(?:/namespaces/(?P<ns>[^/]+))?/(?P<resource>[^/]+)(?:/(?P<name>[^/]+)(?:/(?P<sub>[^/]+))?)?$')


def load_table(path=TABLE):
    with open(path) as f:
        return json.load(f)


def needed(table=None):
    table = table or load_table()
    out = {}
    for component, spec in table['components'].items():
        out[component] = {(r['apiGroup'], r['resource'], v) for r in spec['rules'] for v in r['verbs']}
    return out


def access_of(method, path, query=None):
    """(apiGroup, resource, verb) of a resource request; ValueError for a path that is not one."""
    if query is None:
        split = urllib.parse.urlsplit(path)
        path, query = split.path, dict(urllib.parse.parse_qsl(split.query))
    m = _PATH.match(path)
    if not m:
        raise ValueError('not a Kubernetes resource path: ' + path)
    group = '' if m.group('core') else m.group('group')
    resource = m.group('resource') + ('/' + m.group('sub') if m.group('sub') else '')
    named = m.group('name') is not None
    if method == 'GET':
        verb = 'get' if named else ('watch' if query.get('watch') in ('true', '1') else 'list')
    elif method == 'DELETE':
        verb = 'delete' if named else 'deletecollection'
    else:
        verb = {'POST': 'create', 'PUT': 'update', 'PATCH': 'patch'}[method]
    return group, resource, verb


def granted(objects, namespace, release):
    """{component: {(apiGroup, resource, verb)}} for the ServiceAccounts RELEASE-<component>, from
    the chart's own Roles and ClusterRoles (built-in roles it binds are reported by name in
    the set as ('<role>', kind, name))."""
    roles = {}
    for o in objects:
        if o.get('kind') in ('Role', 'ClusterRole'):
            ns = o['metadata'].get('namespace', namespace) if o['kind'] == 'Role' else None
            roles[(o['kind'], ns, o['metadata']['name'])] = o.get('rules') or []
    out = {}
    for o in objects:
        if o.get('kind') not in ('RoleBinding', 'ClusterRoleBinding'):
            continue
        ref = o['roleRef']
        ns = o['metadata'].get('namespace', namespace) if ref['kind'] == 'Role' else None
        for s in o.get('subjects') or []:
            prefix = release + '-'
            if s.get('kind') != 'ServiceAccount' or s.get('namespace') != namespace or not s['name'].startswith(prefix):
                continue
            component = s['name'][len(prefix):]
            grants = out.setdefault(component, set())
            rules = roles.get((ref['kind'], ns, ref['name']))
            if rules is None:  # a role the chart does not define (Kubernetes' own)
                grants.add(('<role>', ref['kind'], ref['name']))
                continue
            for r in rules:
                for g in r.get('apiGroups') or []:
                    for res in r.get('resources') or []:
                        for v in r.get('verbs') or []:
                            grants.add((g, res, v))
    return out
