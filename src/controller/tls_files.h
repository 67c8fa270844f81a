// TLS material of the controller's HTTPS API, checked before anything listens or connects: the
// server's certificate and key (tfusion controller|up --tls-cert/--tls-key) and the CA file a
// client verifies the server against (--ca-file / TFUSION_CA_FILE). Every check names the file
// and says what is wrong with it, so a bad file stops a daemon at start with a clear message
// instead of every TLS handshake failing later.
//
// Files are PEM. Thread safety: the functions keep no state.
#pragma once

#include <cstdint>
#include <string>

#include "common/status.h"

namespace tf::controller {

// The certificate (chain: leaf first) and private key a server presents. Both empty: plain HTTP.
struct ServerTlsFiles {
  std::string cert_file;
  std::string key_file;
  bool enabled() const { return !cert_file.empty() || !key_file.empty(); }
};

// Checks that `files.cert_file` holds a PEM certificate valid at `now_s` (seconds since the
// epoch) and `files.key_file` a PEM private key that matches it. Returns a one-line description
// ("CN=..., valid until 2027-11-25 10:00:00 UTC") for the start message. Errors
// (kInvalidArgument): only one of the two given, a file missing or unreadable, not PEM, a key
// that belongs to another certificate, a certificate expired or not yet valid.
StatusOr<std::string> CheckServerTls(const ServerTlsFiles& files, int64_t now_s);

// Checks that `ca_file` is readable and holds at least one PEM certificate (kInvalidArgument
// naming the file otherwise).
Status CheckCaFile(const std::string& ca_file);

// The CA file a client uses when it is given none: $TFUSION_CA_FILE, or "" (the system's trust
// store).
std::string DefaultCaFile();

// OpenSSL's words for a certificate verification result (X509_V_ERR_*), e.g. "self-signed
// certificate in certificate chain".
std::string VerifyResultText(long verify_result);

// True for addresses only this machine can reach: 127.0.0.0/8, ::1, "localhost". A listener
// anywhere else (0.0.0.0, a LAN address, a host name) is reachable from the network.
bool IsLoopbackHost(const std::string& host);

}  // namespace tf::controller
