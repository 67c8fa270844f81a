// A throw-away CA for tests that need real TLS, made with the openssl command (so our own TLS code
// is not what checks itself), in `dir`:
//   ca.pem, ca.key          the test CA
//   server.pem, server.key  a server certificate for 127.0.0.1 and localhost, signed by it
//   other.pem, other.key    a CA that signed nothing (a client trusting only it must refuse)
// Returns "" on success, else openssl's output.
#pragma once

#include <array>
#include <cstdio>
#include <string>

namespace tf::testing {

inline std::string MakeTestCa(const std::string& dir) {
  const std::string key = "-newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 30 -config min.cnf ";
  const std::string cmd =
      "cd '" + dir + "' && printf '[req]\\ndistinguished_name=dn\\n[dn]\\n' > min.cnf && "
      "openssl req -x509 " + key + "-keyout ca.key -out ca.pem -subj '/CN=tfusion test CA' "
      "-addext basicConstraints=critical,CA:TRUE -addext keyUsage=critical,keyCertSign && "
      "openssl req -x509 " + key + "-keyout server.key -out server.pem -subj '/CN=test server' "
      "-CA ca.pem -CAkey ca.key -addext basicConstraints=CA:FALSE "
      "-addext subjectAltName=IP:127.0.0.1,DNS:localhost && "
      "openssl req -x509 " + key + "-keyout other.key -out other.pem -subj '/CN=another CA' 2>&1";
  FILE* p = popen(("( " + cmd + " ) 2>&1").c_str(), "r");
  if (p == nullptr) return "cannot run openssl";
  std::string out;
  std::array<char, 512> buf;
  while (size_t n = fread(buf.data(), 1, buf.size(), p)) out.append(buf.data(), n);
  return pclose(p) == 0 ? "" : (out.empty() ? "openssl failed" : out);
}

}  // namespace tf::testing
