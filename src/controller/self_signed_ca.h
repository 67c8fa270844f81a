// The certificates `tfusion up --tls` keeps in its state folder, so that one machine gets an HTTPS
// API with one flag: a CA made at the first start (ca.pem, ca.key) and a server certificate it
// signs (server.pem, server.key) naming every address the API is reached by. Clients trust the
// CA (--ca-file DIR/ca.pem), so the server certificate can be re-issued (a new listen address,
// close to expiry) without touching them.
//
// Keys are ECDSA P-256, written mode 0600; certificates SHA-256 signed. The CA is valid 10 years,
// a server certificate 1 year and is re-issued at a start less than 30 days before it expires.
// Thread safety: none needed (called once at start); two processes on one folder race.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/status.h"

namespace tf::controller {

struct SelfSignedTls {
  std::string ca_file;    // DIR/ca.pem: what clients pass as --ca-file / TFUSION_CA_FILE
  std::string cert_file;  // DIR/server.pem
  std::string key_file;   // DIR/server.key
  bool ca_created = false;   // this call made the CA (first start)
  bool cert_issued = false;  // this call issued a new server certificate
};

// Makes DIR (mode 0700) and the CA in it unless DIR/ca.pem and DIR/ca.key exist, then keeps the
// server certificate when it was signed by that CA, matches its key, names every entry of
// `names` (host names, IPv4 or IPv6 addresses) and stays valid 30 days past `now_s`; otherwise
// issues a new one. Errors: kInvalidArgument for a name that is neither a DNS name nor an
// address; kFailedPrecondition for a CA that is half there, unreadable, expired or does not match
// its key (it is never replaced silently: clients trust it; remove DIR to start over);
// kInternal when a file cannot be written.
StatusOr<SelfSignedTls> EnsureSelfSignedTls(const std::string& dir, const std::vector<std::string>& names,
                                            int64_t now_s);

// The names a server listening on `listen_host` is reached by: localhost, 127.0.0.1 and ::1; the
// listen host itself unless it is a wildcard (0.0.0.0, ::, empty); for a wildcard this machine's
// host name and the addresses of its network interfaces (link-local IPv6 left out).
std::vector<std::string> ServerNamesFor(const std::string& listen_host);

}  // namespace tf::controller
