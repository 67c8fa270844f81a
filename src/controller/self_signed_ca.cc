#include "controller/self_signed_ca.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netinet/in.h>
#include <openssl/bn.h>
#include <openssl/ec.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/rand.h>
#include <openssl/x509.h>
#include <openssl/x509v3.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <ctime>
#include <memory>

#include "controller/openssl_handles.h"

namespace tf::controller {
namespace {

constexpr long kCaDays = 3650;
constexpr long kServerDays = 365;
constexpr int64_t kRenewBeforeS = 30 * 86400;
constexpr long kBackdateS = 300;  // tolerate a client clock a few minutes behind

using openssl::BioPtr;
using openssl::CertPtr;
using openssl::KeyPtr;

bool IsAddress(const std::string& s) {
  unsigned char buf[sizeof(in6_addr)];
  return inet_pton(AF_INET, s.c_str(), buf) == 1 || inet_pton(AF_INET6, s.c_str(), buf) == 1;
}

bool IsDnsName(const std::string& s) {
  if (s.empty() || s.size() > 253 || s.front() == '.' || s.back() == '.' || s.front() == '-') return false;
  return std::all_of(s.begin(), s.end(), [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' || c == '.';
  });
}

bool Exists(const std::string& path) { return access(path.c_str(), F_OK) == 0; }

// Writes `pem` to `path` through a temporary file and a rename, with `mode`.
Status WriteFileAtomically(const std::string& path, const std::string& pem, mode_t mode) {
  const std::string tmp = path + ".tmp";
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, mode);
  if (fd < 0) return Internal("cannot write " + tmp + ": " + std::strerror(errno));
  ::fchmod(fd, mode);
  size_t done = 0;
  while (done < pem.size()) {
    ssize_t n = ::write(fd, pem.data() + done, pem.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      const int err = errno;
      ::close(fd);
      return Internal("cannot write " + tmp + ": " + std::strerror(err));
    }
    done += static_cast<size_t>(n);
  }
  if (::fsync(fd) != 0 || ::close(fd) != 0) return Internal("cannot write " + tmp + ": " + std::strerror(errno));
  if (::rename(tmp.c_str(), path.c_str()) != 0) return Internal("cannot rename " + tmp + ": " + std::strerror(errno));
  return Status::Ok();
}

template <typename Writer>
std::string ToPem(Writer write) {
  BioPtr bio(BIO_new(BIO_s_mem()));
  if (!write(bio.get())) return "";
  char* data = nullptr;
  long n = BIO_get_mem_data(bio.get(), &data);
  return std::string(data, static_cast<size_t>(n));
}

bool AddExtension(X509* cert, X509* issuer, int nid, const std::string& value) {
  X509V3_CTX ctx;
  X509V3_set_ctx_nodb(&ctx);
  X509V3_set_ctx(&ctx, issuer, cert, nullptr, nullptr, 0);
  X509_EXTENSION* ext = X509V3_EXT_conf_nid(nullptr, &ctx, nid, value.c_str());
  if (ext == nullptr) return false;
  const bool ok = X509_add_ext(cert, ext, -1) == 1;
  X509_EXTENSION_free(ext);
  return ok;
}

// A certificate for `key`, named `common_name`, valid `days` from `now_s`; signed by
// `issuer`/`issuer_key`, or by itself when `issuer` is null (the CA).
CertPtr MakeCert(EVP_PKEY* key, const std::string& common_name, long days, int64_t now_s, X509* issuer,
                 EVP_PKEY* issuer_key, const std::vector<std::pair<int, std::string>>& extensions) {
  CertPtr cert(X509_new());
  if (!cert || X509_set_version(cert.get(), 2) != 1) return nullptr;
  unsigned char serial[16];
  if (RAND_bytes(serial, sizeof serial) != 1) return nullptr;
  serial[0] &= 0x7f;  // positive
  BIGNUM* bn = BN_bin2bn(serial, sizeof serial, nullptr);
  const bool serial_ok = bn != nullptr && BN_to_ASN1_INTEGER(bn, X509_get_serialNumber(cert.get())) != nullptr;
  BN_free(bn);
  if (!serial_ok) return nullptr;
  time_t now = static_cast<time_t>(now_s);
  if (X509_time_adj_ex(X509_getm_notBefore(cert.get()), 0, -kBackdateS, &now) == nullptr ||
      X509_time_adj_ex(X509_getm_notAfter(cert.get()), static_cast<int>(days), 0, &now) == nullptr)
    return nullptr;
  X509_NAME* name = X509_get_subject_name(cert.get());
  X509_NAME_add_entry_by_txt(name, "O", MBSTRING_ASC, reinterpret_cast<const unsigned char*>("tfusion"), -1, -1, 0);
  X509_NAME_add_entry_by_txt(name, "CN", MBSTRING_UTF8, reinterpret_cast<const unsigned char*>(common_name.c_str()),
                             -1, -1, 0);
  X509_set_issuer_name(cert.get(), issuer ? X509_get_subject_name(issuer) : name);
  if (X509_set_pubkey(cert.get(), key) != 1) return nullptr;
  X509* signer = issuer ? issuer : cert.get();
  for (const auto& [nid, value] : extensions)
    if (!AddExtension(cert.get(), signer, nid, value)) return nullptr;
  if (X509_sign(cert.get(), issuer_key ? issuer_key : key, EVP_sha256()) == 0) return nullptr;
  return cert;
}

std::string HostName() {
  char host[256] = {};
  if (gethostname(host, sizeof host - 1) != 0) return "";
  return host;
}

// Whether `cert` names `name` in its subjectAltName (addresses as IP entries).
bool Names(X509* cert, const std::string& name) {
  if (IsAddress(name)) return X509_check_ip_asc(cert, name.c_str(), 0) == 1;
  return X509_check_host(cert, name.c_str(), name.size(), 0, nullptr) == 1;
}

// Whether DIR's server certificate can stay: signed by `ca_key`, matching its key, naming every
// name, valid long enough.
bool ServerCertUsable(const SelfSignedTls& files, EVP_PKEY* ca_key, const std::vector<std::string>& names,
                      int64_t now_s) {
  CertPtr cert = openssl::CertFromFile(files.cert_file);
  KeyPtr key = openssl::KeyFromFile(files.key_file);
  if (!cert || !key) return false;
  if (X509_check_private_key(cert.get(), key.get()) != 1 || X509_verify(cert.get(), ca_key) != 1) return false;
  time_t renew_at = static_cast<time_t>(now_s + kRenewBeforeS);
  if (X509_cmp_time(X509_get0_notAfter(cert.get()), &renew_at) < 0) return false;
  return std::all_of(names.begin(), names.end(), [&](const std::string& n) { return Names(cert.get(), n); });
}

}  // namespace

std::vector<std::string> ServerNamesFor(const std::string& listen_host) {
  std::vector<std::string> names = {"localhost", "127.0.0.1", "::1"};
  auto add = [&](const std::string& n) {
    if (!n.empty() && std::find(names.begin(), names.end(), n) == names.end()) names.push_back(n);
  };
  if (!listen_host.empty() && listen_host != "0.0.0.0" && listen_host != "::") {
    add(listen_host);
    return names;
  }
  if (std::string host = HostName(); IsDnsName(host)) add(host);
  ifaddrs* list = nullptr;
  if (getifaddrs(&list) != 0) return names;
  for (ifaddrs* i = list; i != nullptr; i = i->ifa_next) {
    if (i->ifa_addr == nullptr || (i->ifa_flags & IFF_UP) == 0) continue;
    char text[INET6_ADDRSTRLEN] = {};
    if (i->ifa_addr->sa_family == AF_INET) {
      inet_ntop(AF_INET, &reinterpret_cast<sockaddr_in*>(i->ifa_addr)->sin_addr, text, sizeof text);
    } else if (i->ifa_addr->sa_family == AF_INET6) {
      const in6_addr& a = reinterpret_cast<sockaddr_in6*>(i->ifa_addr)->sin6_addr;
      if (IN6_IS_ADDR_LINKLOCAL(&a)) continue;  // needs a scope: no use in a URL
      inet_ntop(AF_INET6, &a, text, sizeof text);
    } else {
      continue;
    }
    add(text);
  }
  freeifaddrs(list);
  return names;
}

StatusOr<SelfSignedTls> EnsureSelfSignedTls(const std::string& dir, const std::vector<std::string>& names,
                                            int64_t now_s) {
  std::string san;
  for (const std::string& n : names) {
    if (!IsAddress(n) && !IsDnsName(n))
      return InvalidArgument("'" + n + "' is neither a host name nor an IP address: it cannot be a certificate name");
    san += (san.empty() ? "" : ",") + std::string(IsAddress(n) ? "IP:" : "DNS:") + n;
  }
  if (names.empty()) return InvalidArgument("a server certificate needs at least one name");
  if (::mkdir(dir.c_str(), 0700) != 0 && errno != EEXIST)
    return Internal("cannot create " + dir + ": " + std::strerror(errno));
  SelfSignedTls out{dir + "/ca.pem", dir + "/server.pem", dir + "/server.key", false, false};
  const std::string ca_key_file = dir + "/ca.key";

  CertPtr ca;
  KeyPtr ca_key;
  const bool have_cert = Exists(out.ca_file), have_key = Exists(ca_key_file);
  if (have_cert != have_key) {
    return FailedPrecondition(std::string("the CA in ") + dir + " is half there (" + (have_cert ? ca_key_file : out.ca_file) +
                              " is missing): clients may trust it, so it is not replaced; remove " + dir +
                              " to make a new CA");
  }
  if (have_cert) {
    ca = openssl::CertFromFile(out.ca_file);
    ca_key = openssl::KeyFromFile(ca_key_file);
    if (!ca || !ca_key) return FailedPrecondition("cannot read the CA in " + out.ca_file + " / " + ca_key_file + "; remove " + dir + " to make a new CA");
    if (X509_check_private_key(ca.get(), ca_key.get()) != 1)
      return FailedPrecondition(ca_key_file + " does not belong to " + out.ca_file + "; remove " + dir + " to make a new CA");
    time_t now = static_cast<time_t>(now_s);
    if (X509_cmp_time(X509_get0_notAfter(ca.get()), &now) < 0)
      return FailedPrecondition("the CA " + out.ca_file + " has expired; remove " + dir + " to make a new CA (and give clients the new ca.pem)");
  } else {
    ca_key = KeyPtr(EVP_EC_gen("P-256"));
    if (!ca_key) return Internal("cannot generate a P-256 key for the CA");
    std::string host = HostName();
    ca = MakeCert(ca_key.get(), "tfusion CA" + (host.empty() ? std::string() : " " + host), kCaDays, now_s, nullptr,
                  nullptr,
                  {{NID_basic_constraints, "critical,CA:TRUE,pathlen:0"},
                   {NID_key_usage, "critical,keyCertSign,cRLSign"},
                   {NID_subject_key_identifier, "hash"}});
    if (!ca) return Internal("cannot make the CA certificate");
    std::string key_pem = ToPem([&](BIO* b) {
      return PEM_write_bio_PrivateKey(b, ca_key.get(), nullptr, nullptr, 0, nullptr, nullptr) == 1;
    });
    std::string cert_pem = ToPem([&](BIO* b) { return PEM_write_bio_X509(b, ca.get()) == 1; });
    if (Status st = WriteFileAtomically(ca_key_file, key_pem, 0600); !st.ok()) return st;
    if (Status st = WriteFileAtomically(out.ca_file, cert_pem, 0644); !st.ok()) return st;
    out.ca_created = true;
  }

  if (!out.ca_created && ServerCertUsable(out, ca_key.get(), names, now_s)) return out;
  KeyPtr key(EVP_EC_gen("P-256"));
  if (!key) return Internal("cannot generate a P-256 key for the server certificate");
  CertPtr cert = MakeCert(key.get(), "tfusion controller", kServerDays, now_s, ca.get(),
                          ca_key.get(),
                          {{NID_basic_constraints, "critical,CA:FALSE"},
                           {NID_key_usage, "critical,digitalSignature"},
                           {NID_ext_key_usage, "serverAuth"},
                           {NID_subject_key_identifier, "hash"},
                           {NID_authority_key_identifier, "keyid:always"},
                           {NID_subject_alt_name, san}});
  if (!cert) return Internal("cannot make the server certificate");
  std::string key_pem = ToPem([&](BIO* b) {
    return PEM_write_bio_PrivateKey(b, key.get(), nullptr, nullptr, 0, nullptr, nullptr) == 1;
  });
  std::string cert_pem = ToPem([&](BIO* b) { return PEM_write_bio_X509(b, cert.get()) == 1; });
  if (Status st = WriteFileAtomically(out.key_file, key_pem, 0600); !st.ok()) return st;
  if (Status st = WriteFileAtomically(out.cert_file, cert_pem, 0644); !st.ok()) return st;
  out.cert_issued = true;
  return out;
}

}  // namespace tf::controller
