"""A throw-away CA for tests that need real TLS, made with the openssl command, in `folder` (the
same files as tests/common/test_ca.h):
  ca.pem, ca.key          the test CA
  server.pem, server.key  a server certificate for 127.0.0.1 and localhost, signed by it
  other.pem, other.key    a CA that signed nothing (a client trusting only it must refuse)"""
import os
import subprocess


def make_test_ca(folder):
    with open(os.path.join(folder, 'min.cnf'), 'w') as f:
        f.write('[req]\ndistinguished_name=dn\n[dn]\n')
    key = ['-newkey', 'ec', '-pkeyopt', 'ec_paramgen_curve:P-256', '-nodes', '-days', '30', '-config', 'min.cnf']

    def req(*args):
        subprocess.run(['openssl', 'req', '-x509'] + key + list(args), check=True, cwd=folder,
                       stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    req('-keyout', 'ca.key', '-out', 'ca.pem', '-subj', '/CN=tfusion test CA',
        '-addext', 'basicConstraints=critical,CA:TRUE', '-addext', 'keyUsage=critical,keyCertSign')
    req('-keyout', 'server.key', '-out', 'server.pem', '-subj', '/CN=test server', '-CA', 'ca.pem',
        '-CAkey', 'ca.key', '-addext', 'basicConstraints=CA:FALSE',
        '-addext', 'subjectAltName=IP:127.0.0.1,DNS:localhost')
    req('-keyout', 'other.key', '-out', 'other.pem', '-subj', '/CN=another CA')
