#include "transport/tls_stream.h"

#include <arpa/inet.h>
#include <dlfcn.h>
#include <errno.h>
#include <openssl/bio.h>
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <openssl/x509_vfy.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>

#include <new>

#include "transport/socket_io.h"
#include "transport/sync.h"

namespace tf::transport {
namespace {

// OpenSSL's entry points, resolved from libssl.so.3 (its libcrypto dependency answers the
// libcrypto ones). Types come from the headers; nothing is linked.
#define TF_OPENSSL_FUNCTIONS(X)                                                                    \
  X(OPENSSL_init_ssl) X(TLS_client_method) X(TLS_server_method) X(SSL_CTX_new) X(SSL_CTX_free)     \
  X(SSL_CTX_ctrl) X(SSL_CTX_set_options) X(SSL_CTX_load_verify_locations) X(SSL_CTX_set_verify)    \
  X(SSL_CTX_use_certificate_chain_file) X(SSL_CTX_use_PrivateKey_file)                              \
  X(SSL_CTX_check_private_key) X(SSL_CTX_set_num_tickets) X(SSL_CTX_set_default_passwd_cb)         \
  X(SSL_CTX_set_default_read_buffer_len) X(SSL_CTX_set_ciphersuites)                               \
  X(SSL_new) X(SSL_free) X(SSL_set_fd) X(SSL_connect) X(SSL_accept) X(SSL_read) X(SSL_write)       \
  X(SSL_get_error) X(SSL_shutdown) X(SSL_ctrl) X(SSL_set1_host) X(SSL_get0_param)                  \
  X(SSL_get_verify_result) X(SSL_get_version) X(SSL_get_current_cipher) X(SSL_CIPHER_get_name)     \
  X(SSL_get_wbio) X(SSL_get_rbio) X(BIO_ctrl) X(X509_VERIFY_PARAM_set1_ip_asc)                     \
  X(X509_verify_cert_error_string) X(ERR_get_error) X(ERR_error_string_n) X(ERR_clear_error)

struct OpenSsl {
#define TF_DECLARE(name) decltype(&::name) name = nullptr;
  TF_OPENSSL_FUNCTIONS(TF_DECLARE)
#undef TF_DECLARE
  char error[512] = {};  // why loading failed; "" when loaded
};

OpenSsl g_ssl;
pthread_once_t g_ssl_once = PTHREAD_ONCE_INIT;

void LoadOpenSsl() {
  const char* lib = getenv("TFUSION_LIBSSL");
  if (lib == nullptr || *lib == '\0') lib = "libssl.so.3";
  void* h = dlopen(lib, RTLD_NOW | RTLD_LOCAL);
  if (h == nullptr) {
    const char* why = dlerror();
    snprintf(g_ssl.error, sizeof(g_ssl.error),
             "TLS needs OpenSSL 3 and %s cannot be loaded (%s): install the distribution's "
             "libssl3 package", lib, why ? why : "not found");
    return;
  }
#define TF_RESOLVE(name)                                                                      \
  g_ssl.name = reinterpret_cast<decltype(g_ssl.name)>(dlsym(h, #name));                       \
  if (g_ssl.name == nullptr) {                                                                \
    snprintf(g_ssl.error, sizeof(g_ssl.error), "%s has no %s: TLS needs OpenSSL 3", lib, #name); \
    return;                                                                                   \
  }
  TF_OPENSSL_FUNCTIONS(TF_RESOLVE)
#undef TF_RESOLVE
  if (g_ssl.OPENSSL_init_ssl(OPENSSL_INIT_NO_ATEXIT, nullptr) != 1) {
    snprintf(g_ssl.error, sizeof(g_ssl.error), "OpenSSL (%s) failed to initialise", lib);
  }
}

const OpenSsl* Ssl(TransportStatus* st) {
  pthread_once(&g_ssl_once, &LoadOpenSsl);
  if (g_ssl.error[0] != '\0') {
    *st = TransportStatus::Error(TransportErrc::kInvalidArgument, 0, "%s", g_ssl.error);
    return nullptr;
  }
  return &g_ssl;
}

// OpenSSL's queued errors as one line (and the queue emptied).
void ErrorText(const OpenSsl& s, char* out, size_t cap) {
  out[0] = '\0';
  size_t used = 0;
  unsigned long e;
  while ((e = s.ERR_get_error()) != 0) {
    char one[256];
    s.ERR_error_string_n(e, one, sizeof(one));
    // "error:0A000086:SSL routines::certificate verify failed": keep the words after "::".
    const char* words = strstr(one, "::");
    words = words ? words + 2 : one;
    int n = snprintf(out + used, cap - used, "%s%s", used ? "; " : "", words);
    if (n < 0 || static_cast<size_t>(n) >= cap - used) break;
    used += static_cast<size_t>(n);
  }
}

int NoPassphrase(char*, int, int, void*) { return -1; }

// Blocks SIGPIPE on this thread while OpenSSL writes to the socket (its socket BIO uses plain
// write()), and swallows one the write raised, so a dead peer is an error, not a killed program.
class SigpipeGuard {
 public:
  explicit SigpipeGuard(bool active) : active_(active) {
    if (!active_) return;
    sigset_t pipe;
    sigemptyset(&pipe);
    sigaddset(&pipe, SIGPIPE);
    sigset_t pending;
    sigpending(&pending);
    was_pending_ = sigismember(&pending, SIGPIPE) == 1;
    pthread_sigmask(SIG_BLOCK, &pipe, &old_);
  }
  ~SigpipeGuard() {
    if (!active_) return;
    sigset_t pending;
    sigpending(&pending);
    if (!was_pending_ && sigismember(&pending, SIGPIPE) == 1) {
      sigset_t pipe;
      sigemptyset(&pipe);
      sigaddset(&pipe, SIGPIPE);
      timespec zero{0, 0};
      while (sigtimedwait(&pipe, nullptr, &zero) < 0 && errno == EINTR) {
      }
    }
    pthread_sigmask(SIG_SETMASK, &old_, nullptr);
  }

 private:
  bool active_;
  bool was_pending_ = false;
  sigset_t old_;
};

bool SigpipeIgnored() {
  struct sigaction sa;
  return sigaction(SIGPIPE, nullptr, &sa) == 0 && sa.sa_handler == SIG_IGN;
}

}  // namespace

class TlsContext {
 public:
  TlsContext(const OpenSsl* s, SSL_CTX* ctx, const char* ca_file) : s_(s), ctx_(ctx) {
    snprintf(ca_file_, sizeof(ca_file_), "%s", ca_file ? ca_file : "");
  }
  ~TlsContext() { s_->SSL_CTX_free(ctx_); }
  const OpenSsl* s_;
  SSL_CTX* ctx_;
  char ca_file_[256];
};

namespace {

class TlsStream final : public ByteStream {
 public:
  TlsStream(const OpenSsl* s, SSL* ssl, int fd) : s_(s), ssl_(ssl), fd_(fd) {
    guard_writes_ = !SigpipeIgnored();
  }
  ~TlsStream() override { s_->SSL_free(ssl_); }

  // Client: the certificate must name host (a DNS name, sent as SNI too, or an IP address).
  TransportStatus ExpectHost(const char* host) {
    in6_addr addr;
    const bool literal = inet_pton(AF_INET, host, &addr) == 1 || inet_pton(AF_INET6, host, &addr) == 1;
    const bool ok = literal ? s_->X509_VERIFY_PARAM_set1_ip_asc(s_->SSL_get0_param(ssl_), host) == 1
                            : s_->SSL_set1_host(ssl_, host) == 1 &&
                                  s_->SSL_ctrl(ssl_, SSL_CTRL_SET_TLSEXT_HOSTNAME,
                                               TLSEXT_NAMETYPE_host_name,
                                               const_cast<char*>(host)) == 1;
    if (ok) return TransportStatus::Ok();
    return TransportStatus::Error(TransportErrc::kInvalidArgument, 0,
                                  "TLS: cannot check the certificate against host \"%s\"", host);
  }
  // Runs SSL_connect or SSL_accept to completion or the deadline.
  TransportStatus Handshake(bool client, int64_t deadline_ns, const char* ca_file);

  TransportStatus SendAll(struct iovec* iov, int iovcnt, int64_t deadline_ns) override;
  TransportStatus RecvSome(void* buf, size_t cap, size_t* got) override;
  TransportStatus WaitReadable(int64_t deadline_ns, const char* what) override {
    return internal::WaitFd(fd_, read_wants_write_ ? POLLOUT : POLLIN, deadline_ns, what);
  }
  void Shutdown() override {
    {
      internal::MutexLock l(&mu_);
      SigpipeGuard g(guard_writes_);
      s_->ERR_clear_error();
      s_->SSL_shutdown(ssl_);  // close_notify, best effort (non-blocking)
    }
    shutdown(fd_, SHUT_RDWR);
  }
  int fd() const override { return fd_; }
  const char* description() const override { return desc_; }

 private:
  // Writes len bytes of p (one SSL_write per call that fits the socket).
  TransportStatus Write(const uint8_t* p, size_t len, int64_t deadline_ns);
  // An SSL call's failure as a status; `what` names the step.
  TransportStatus Failure(int err, const char* what);

  const OpenSsl* s_;
  SSL* ssl_;
  const int fd_;
  bool guard_writes_ = true;
  internal::Mutex mu_;            // every OpenSSL call on ssl_
  bool read_wants_write_ = false;  // reader only
  bool need_socket_ = false;       // reader only: the last read wanted more of the socket
  char desc_[160] = "tls";
  // Small pieces of a frame (header, payload, descriptor) are gathered into one record.
  uint8_t stage_[16 << 10];  // writer only
};

TransportStatus TlsStream::Failure(int err, const char* what) {
  char text[400];
  ErrorText(*s_, text, sizeof(text));
  if (err == SSL_ERROR_ZERO_RETURN) {
    return TransportStatus::Error(TransportErrc::kPeerClosed, 0, "peer closed the connection");
  }
  if (err == SSL_ERROR_SYSCALL) {
    if (errno != 0) return internal::ErrnoStatus(errno, what);
    return TransportStatus::Error(TransportErrc::kPeerClosed, 0, "peer closed the connection");
  }
  return TransportStatus::Error(TransportErrc::kProtocol, 0, "TLS %s: %s", what,
                                text[0] ? text : "failed");
}

TransportStatus TlsStream::Handshake(bool client, int64_t deadline_ns, const char* ca_file) {
  for (;;) {
    int r, err;
    {
      SigpipeGuard g(guard_writes_);
      s_->ERR_clear_error();
      errno = 0;
      r = client ? s_->SSL_connect(ssl_) : s_->SSL_accept(ssl_);
      err = r == 1 ? SSL_ERROR_NONE : s_->SSL_get_error(ssl_, r);
    }
    if (r == 1) break;
    if (err == SSL_ERROR_WANT_READ || err == SSL_ERROR_WANT_WRITE) {
      TransportStatus st = internal::WaitFd(fd_, err == SSL_ERROR_WANT_READ ? POLLIN : POLLOUT,
                                            deadline_ns, "TLS handshake");
      if (!st.ok()) return st;
      continue;
    }
    const int saved_errno = errno;
    char text[400];
    ErrorText(*s_, text, sizeof(text));
    const long verify = client ? s_->SSL_get_verify_result(ssl_) : X509_V_OK;
    if (client && verify != X509_V_OK) {
      return TransportStatus::Error(
          TransportErrc::kProtocol, 0,
          "TLS: the worker's certificate is not trusted: %s (checked against the CA file %s, "
          "TFUSION_CA_FILE)", s_->X509_verify_cert_error_string(verify), ca_file);
    }
    if (err == SSL_ERROR_SYSCALL || (err == SSL_ERROR_SSL && strstr(text, "unexpected eof"))) {
      if (saved_errno != 0 && saved_errno != EPIPE && saved_errno != ECONNRESET) {
        return internal::ErrnoStatus(saved_errno, "TLS handshake");
      }
      return TransportStatus::Error(
          TransportErrc::kPeerClosed, saved_errno,
          client ? "TLS handshake: the worker closed the connection (does it serve TLS? start it "
                   "with --tls-cert/--tls-key)"
                 : "TLS handshake: the client closed the connection");
    }
    return TransportStatus::Error(TransportErrc::kProtocol, 0, "TLS handshake failed: %s",
                                  text[0] ? text : "unknown error");
  }
  const char* cipher = s_->SSL_CIPHER_get_name(s_->SSL_get_current_cipher(ssl_));
  const bool ktls_tx = s_->BIO_ctrl(s_->SSL_get_wbio(ssl_), BIO_CTRL_GET_KTLS_SEND, 0, nullptr) > 0;
  const bool ktls_rx = s_->BIO_ctrl(s_->SSL_get_rbio(ssl_), BIO_CTRL_GET_KTLS_RECV, 0, nullptr) > 0;
  snprintf(desc_, sizeof(desc_), "tls (%s %s%s%s)", s_->SSL_get_version(ssl_),
           cipher ? cipher : "?", ktls_tx ? ", kernel TLS tx" : "", ktls_rx ? ", kernel TLS rx" : "");
  return TransportStatus::Ok();
}

TransportStatus TlsStream::Write(const uint8_t* p, size_t len, int64_t deadline_ns) {
  while (len > 0) {
    const int chunk = len > (1u << 30) ? (1 << 30) : static_cast<int>(len);
    int r, err = SSL_ERROR_NONE;
    {
      internal::MutexLock l(&mu_);
      SigpipeGuard g(guard_writes_);
      s_->ERR_clear_error();
      errno = 0;
      r = s_->SSL_write(ssl_, p, chunk);
      if (r <= 0) err = s_->SSL_get_error(ssl_, r);
    }
    if (r > 0) {
      p += r;
      len -= static_cast<size_t>(r);
      continue;
    }
    if (err == SSL_ERROR_WANT_WRITE || err == SSL_ERROR_WANT_READ) {
      TF_TRANSPORT_RETURN_IF_ERROR(internal::WaitFd(
          fd_, err == SSL_ERROR_WANT_WRITE ? POLLOUT : POLLIN, deadline_ns, "send"));
      continue;
    }
    return Failure(err, "send");
  }
  return TransportStatus::Ok();
}

TransportStatus TlsStream::SendAll(struct iovec* iov, int iovcnt, int64_t deadline_ns) {
  size_t staged = 0;
  for (int i = 0; i < iovcnt; ++i) {
    const auto* p = static_cast<const uint8_t*>(iov[i].iov_base);
    const size_t n = iov[i].iov_len;
    if (n == 0) continue;
    if (staged + n <= sizeof(stage_)) {
      memcpy(stage_ + staged, p, n);
      staged += n;
      continue;
    }
    if (staged) {
      TF_TRANSPORT_RETURN_IF_ERROR(Write(stage_, staged, deadline_ns));
      staged = 0;
    }
    if (n <= sizeof(stage_)) {
      memcpy(stage_, p, n);
      staged = n;
    } else {
      TF_TRANSPORT_RETURN_IF_ERROR(Write(p, n, deadline_ns));
    }
  }
  if (staged) TF_TRANSPORT_RETURN_IF_ERROR(Write(stage_, staged, deadline_ns));
  return TransportStatus::Ok();
}

TransportStatus TlsStream::RecvSome(void* buf, size_t cap, size_t* got) {
  *got = 0;
  // A receiver polls this while it spins for the next frame: when OpenSSL has asked for more of
  // the socket and the socket has nothing, say so without taking the lock a writer needs.
  if (need_socket_) {
    pollfd p{fd_, POLLIN, 0};
    if (poll(&p, 1, 0) == 0) return TransportStatus::Ok();
  }
  const int want = cap > (1u << 30) ? (1 << 30) : static_cast<int>(cap);
  int r, err = SSL_ERROR_NONE;
  {
    // No SIGPIPE guard: a read writes only to answer a key update, which neither end sends.
    internal::MutexLock l(&mu_);
    s_->ERR_clear_error();
    errno = 0;
    r = s_->SSL_read(ssl_, buf, want);
    if (r <= 0) err = s_->SSL_get_error(ssl_, r);
  }
  read_wants_write_ = err == SSL_ERROR_WANT_WRITE;
  need_socket_ = err == SSL_ERROR_WANT_READ;
  if (r > 0) {
    *got = static_cast<size_t>(r);
    return TransportStatus::Ok();
  }
  if (err == SSL_ERROR_WANT_READ || err == SSL_ERROR_WANT_WRITE) return TransportStatus::Ok();
  return Failure(err, "recv");
}

TransportStatus NewStream(const TlsContext& ctx, int fd, TlsStream** out) {
  const OpenSsl& s = *ctx.s_;
  SSL* ssl = s.SSL_new(ctx.ctx_);
  if (ssl == nullptr || s.SSL_set_fd(ssl, fd) != 1) {
    if (ssl) s.SSL_free(ssl);
    return TransportStatus::Error(TransportErrc::kResourceExhausted, 0, "TLS: cannot make a session");
  }
  s.SSL_ctrl(ssl, SSL_CTRL_MODE, SSL_MODE_ENABLE_PARTIAL_WRITE | SSL_MODE_ACCEPT_MOVING_WRITE_BUFFER,
             nullptr);
  *out = new (std::nothrow) TlsStream(&s, ssl, fd);
  if (*out == nullptr) {
    s.SSL_free(ssl);
    return TransportStatus::Error(TransportErrc::kResourceExhausted, 0, "out of memory");
  }
  return TransportStatus::Ok();
}

TransportStatus NewContext(const OpenSsl& s, bool server, SSL_CTX** out) {
  SSL_CTX* ctx = s.SSL_CTX_new(server ? s.TLS_server_method() : s.TLS_client_method());
  if (ctx == nullptr) {
    return TransportStatus::Error(TransportErrc::kResourceExhausted, 0, "TLS: cannot make a context");
  }
  s.SSL_CTX_ctrl(ctx, SSL_CTRL_SET_MIN_PROTO_VERSION, TLS1_3_VERSION, nullptr);
  // Read ahead into a large buffer: one recv brings many records, not two recvs per record.
  s.SSL_CTX_ctrl(ctx, SSL_CTRL_SET_READ_AHEAD, 1, nullptr);
  s.SSL_CTX_set_default_read_buffer_len(ctx, 256 << 10);
  // AES-128-GCM first: as strong as the data needs, and the fastest with AES instructions.
  s.SSL_CTX_set_ciphersuites(
      ctx, "TLS_AES_128_GCM_SHA256:TLS_AES_256_GCM_SHA384:TLS_CHACHA20_POLY1305_SHA256");
  s.SSL_CTX_set_options(ctx, SSL_OP_ENABLE_KTLS | SSL_OP_IGNORE_UNEXPECTED_EOF);
  s.SSL_CTX_set_default_passwd_cb(ctx, &NoPassphrase);
  *out = ctx;
  return TransportStatus::Ok();
}

}  // namespace

TransportStatus NewTlsClientContext(const char* ca_file, std::shared_ptr<TlsContext>* out) {
  TransportStatus st;
  const OpenSsl* s = Ssl(&st);
  if (s == nullptr) return st;
  SSL_CTX* ctx;
  TF_TRANSPORT_RETURN_IF_ERROR(NewContext(*s, false, &ctx));
  s->ERR_clear_error();
  if (s->SSL_CTX_load_verify_locations(ctx, ca_file, nullptr) != 1) {
    char text[400];
    ErrorText(*s, text, sizeof(text));
    s->SSL_CTX_free(ctx);
    return TransportStatus::Error(TransportErrc::kInvalidArgument, 0,
                                  "cannot use the CA file %s (TFUSION_CA_FILE): %s", ca_file,
                                  text[0] ? text : "no PEM certificate in it");
  }
  s->SSL_CTX_set_verify(ctx, SSL_VERIFY_PEER, nullptr);
  out->reset(new (std::nothrow) TlsContext(s, ctx, ca_file));
  if (!*out) {
    s->SSL_CTX_free(ctx);
    return TransportStatus::Error(TransportErrc::kResourceExhausted, 0, "out of memory");
  }
  return TransportStatus::Ok();
}

TransportStatus NewTlsServerContext(const char* cert_file, const char* key_file,
                                    std::shared_ptr<TlsContext>* out) {
  TransportStatus st;
  const OpenSsl* s = Ssl(&st);
  if (s == nullptr) return st;
  SSL_CTX* ctx;
  TF_TRANSPORT_RETURN_IF_ERROR(NewContext(*s, true, &ctx));
  s->ERR_clear_error();
  const char* failed = nullptr;
  if (s->SSL_CTX_use_certificate_chain_file(ctx, cert_file) != 1) failed = "the certificate file";
  else if (s->SSL_CTX_use_PrivateKey_file(ctx, key_file, SSL_FILETYPE_PEM) != 1) failed = "the key file";
  else if (s->SSL_CTX_check_private_key(ctx) != 1) failed = "the key (does it belong to the certificate?)";
  if (failed != nullptr) {
    char text[400];
    ErrorText(*s, text, sizeof(text));
    s->SSL_CTX_free(ctx);
    return TransportStatus::Error(TransportErrc::kInvalidArgument, 0,
                                  "TLS: cannot use %s (--tls-cert %s, --tls-key %s): %s", failed,
                                  cert_file, key_file, text[0] ? text : "unreadable");
  }
  s->SSL_CTX_set_num_tickets(ctx, 0);  // no resumption: nothing is sent after the handshake
  out->reset(new (std::nothrow) TlsContext(s, ctx, nullptr));
  if (!*out) {
    s->SSL_CTX_free(ctx);
    return TransportStatus::Error(TransportErrc::kResourceExhausted, 0, "out of memory");
  }
  return TransportStatus::Ok();
}

TransportStatus TlsConnect(const TlsContext& ctx, int fd, const char* host, int64_t deadline_ns,
                           std::unique_ptr<ByteStream>* out) {
  TlsStream* t;
  TF_TRANSPORT_RETURN_IF_ERROR(NewStream(ctx, fd, &t));
  std::unique_ptr<ByteStream> owned(t);
  TF_TRANSPORT_RETURN_IF_ERROR(t->ExpectHost(host));
  TF_TRANSPORT_RETURN_IF_ERROR(t->Handshake(true, deadline_ns, ctx.ca_file_));
  *out = std::move(owned);
  return TransportStatus::Ok();
}

TransportStatus TlsAccept(const TlsContext& ctx, int fd, int64_t deadline_ns,
                          std::unique_ptr<ByteStream>* out) {
  TlsStream* t;
  TF_TRANSPORT_RETURN_IF_ERROR(NewStream(ctx, fd, &t));
  std::unique_ptr<ByteStream> owned(t);
  TF_TRANSPORT_RETURN_IF_ERROR(t->Handshake(false, deadline_ns, nullptr));
  *out = std::move(owned);
  return TransportStatus::Ok();
}

}  // namespace tf::transport
