#include "controller/tls_files.h"

#include <arpa/inet.h>
#include <openssl/x509.h>
#include <openssl/x509_vfy.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>

#include "controller/openssl_handles.h"

namespace tf::controller {
namespace {

using openssl::CertFromPem;
using openssl::CertPtr;
using openssl::KeyFromPem;
using openssl::KeyPtr;

// The whole file, or why it cannot be read (`what` names its role: "certificate file", `flag`
// where it came from: "--tls-cert").
StatusOr<std::string> ReadWholeFile(const std::string& path, const char* what, const char* flag) {
  std::FILE* f = std::fopen(path.c_str(), "rb");
  if (f == nullptr)
    return InvalidArgument(std::string("cannot read the ") + what + " " + path + " (" + flag + "): " + std::strerror(errno));
  std::string data;
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, f)) > 0) data.append(buf, n);
  const bool failed = std::ferror(f) != 0;
  const int err = errno;
  std::fclose(f);
  if (failed)
    return InvalidArgument(std::string("cannot read the ") + what + " " + path + " (" + flag + "): " + std::strerror(err));
  if (data.size() > (1u << 20)) return InvalidArgument(std::string("the ") + what + " " + path + " is larger than 1 MiB: not a PEM file");
  return data;
}

std::string TimeText(const ASN1_TIME* t) {
  std::tm tm{};
  if (t == nullptr || ASN1_TIME_to_tm(t, &tm) != 1) return "(unreadable time)";
  char out[64];
  std::strftime(out, sizeof out, "%Y-%m-%d %H:%M:%S UTC", &tm);
  return out;
}

std::string SubjectText(X509* cert) {
  char name[256] = {};
  X509_NAME_oneline(X509_get_subject_name(cert), name, sizeof name - 1);
  return name;
}

}  // namespace

StatusOr<std::string> CheckServerTls(const ServerTlsFiles& files, int64_t now_s) {
  if (files.cert_file.empty() || files.key_file.empty()) {
    return InvalidArgument(files.cert_file.empty()
                               ? "--tls-key needs --tls-cert: give the certificate and its key together"
                               : "--tls-cert needs --tls-key: give the certificate and its key together");
  }
  StatusOr<std::string> cert_pem = ReadWholeFile(files.cert_file, "certificate file", "--tls-cert");
  if (!cert_pem.ok()) return cert_pem.status();
  StatusOr<std::string> key_pem = ReadWholeFile(files.key_file, "private key file", "--tls-key");
  if (!key_pem.ok()) return key_pem.status();

  CertPtr cert = CertFromPem(*cert_pem);
  if (!cert) {
    return InvalidArgument("the certificate file " + files.cert_file +
                           " holds no PEM certificate (a \"-----BEGIN CERTIFICATE-----\" block)");
  }
  KeyPtr key = KeyFromPem(*key_pem);
  if (!key) {
    return InvalidArgument("the private key file " + files.key_file +
                           " holds no PEM private key, or the key is encrypted (give an unencrypted key, "
                           "readable only by the controller's user)");
  }
  if (X509_check_private_key(cert.get(), key.get()) != 1) {
    return InvalidArgument("the private key in " + files.key_file + " does not belong to the certificate in " +
                           files.cert_file + " (" + SubjectText(cert.get()) + ")");
  }
  time_t now = static_cast<time_t>(now_s);
  if (X509_cmp_time(X509_get0_notBefore(cert.get()), &now) > 0) {
    return InvalidArgument("the certificate in " + files.cert_file + " is not valid before " +
                           TimeText(X509_get0_notBefore(cert.get())) + " (check this machine's clock)");
  }
  if (X509_cmp_time(X509_get0_notAfter(cert.get()), &now) < 0) {
    return InvalidArgument("the certificate in " + files.cert_file + " (" + SubjectText(cert.get()) +
                           ") expired on " + TimeText(X509_get0_notAfter(cert.get())) + ": renew it");
  }
  return SubjectText(cert.get()) + ", valid until " + TimeText(X509_get0_notAfter(cert.get()));
}

Status CheckCaFile(const std::string& ca_file) {
  StatusOr<std::string> pem = ReadWholeFile(ca_file, "CA file", "--ca-file / TFUSION_CA_FILE");
  if (!pem.ok()) return pem.status();
  if (!CertFromPem(*pem)) {
    return InvalidArgument("the CA file " + ca_file +
                           " (--ca-file / TFUSION_CA_FILE) holds no PEM certificate (a \"-----BEGIN "
                           "CERTIFICATE-----\" block)");
  }
  return Status::Ok();
}

std::string DefaultCaFile() {
  const char* env = std::getenv("TFUSION_CA_FILE");
  return env != nullptr ? env : "";
}

std::string VerifyResultText(long verify_result) {
  const char* text = X509_verify_cert_error_string(verify_result);
  return text != nullptr ? text : "verification failed";
}

bool IsLoopbackHost(const std::string& host) {
  if (host == "localhost" || host == "::1" || host == "[::1]") return true;
  in_addr v4{};
  if (inet_pton(AF_INET, host.c_str(), &v4) == 1) return (ntohl(v4.s_addr) >> 24) == 127;
  return false;
}

}  // namespace tf::controller
