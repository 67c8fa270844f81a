// Owning handles for the OpenSSL objects the TLS code reads and makes (certificates, keys,
// memory BIOs), and PEM reading that never prompts for a passphrase. Internal to
// tls_files.cc and self_signed_ca.cc.
#pragma once

#include <openssl/bio.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/x509.h>

#include <memory>
#include <string>

namespace tf::controller::openssl {

struct BioFree {
  void operator()(BIO* b) const { BIO_free(b); }
};
struct X509Free {
  void operator()(X509* x) const { X509_free(x); }
};
struct PkeyFree {
  void operator()(EVP_PKEY* k) const { EVP_PKEY_free(k); }
};
using BioPtr = std::unique_ptr<BIO, BioFree>;
using CertPtr = std::unique_ptr<X509, X509Free>;
using KeyPtr = std::unique_ptr<EVP_PKEY, PkeyFree>;

// An encrypted key is refused (null), never asked for on the terminal.
inline int NoPassphrase(char*, int, int, void*) { return -1; }

// The first certificate / private key in PEM text; null when there is none.
inline CertPtr CertFromPem(const std::string& pem) {
  BioPtr bio(BIO_new_mem_buf(pem.data(), static_cast<int>(pem.size())));
  return CertPtr(bio ? PEM_read_bio_X509(bio.get(), nullptr, NoPassphrase, nullptr) : nullptr);
}
inline KeyPtr KeyFromPem(const std::string& pem) {
  BioPtr bio(BIO_new_mem_buf(pem.data(), static_cast<int>(pem.size())));
  return KeyPtr(bio ? PEM_read_bio_PrivateKey(bio.get(), nullptr, NoPassphrase, nullptr) : nullptr);
}

// The same from a file; null when it cannot be read or holds none.
inline CertPtr CertFromFile(const std::string& path) {
  BioPtr bio(BIO_new_file(path.c_str(), "r"));
  return CertPtr(bio ? PEM_read_bio_X509(bio.get(), nullptr, NoPassphrase, nullptr) : nullptr);
}
inline KeyPtr KeyFromFile(const std::string& path) {
  BioPtr bio(BIO_new_file(path.c_str(), "r"));
  return KeyPtr(bio ? PEM_read_bio_PrivateKey(bio.get(), nullptr, NoPassphrase, nullptr) : nullptr);
}

}  // namespace tf::controller::openssl
