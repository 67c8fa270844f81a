#include "transport/byte_stream.h"

#include <errno.h>
#include <poll.h>
#include <sys/socket.h>

#include <new>

#include "transport/socket_io.h"

namespace tf::transport {

TransportStatus ByteStream::RecvExact(void* buf, size_t n, int64_t deadline_ns) {
  size_t done = 0;
  while (done < n) {
    size_t got = 0;
    TF_TRANSPORT_RETURN_IF_ERROR(RecvSome(static_cast<char*>(buf) + done, n - done, &got));
    if (got == 0) {
      TF_TRANSPORT_RETURN_IF_ERROR(WaitReadable(deadline_ns, "recv"));
      continue;
    }
    done += got;
  }
  return TransportStatus::Ok();
}

namespace {

class PlainStream final : public ByteStream {
 public:
  explicit PlainStream(int fd) : fd_(fd) {}

  TransportStatus SendAll(struct iovec* iov, int iovcnt, int64_t deadline_ns) override {
    return internal::SendAll(fd_, iov, iovcnt, deadline_ns);
  }
  TransportStatus RecvSome(void* buf, size_t cap, size_t* got) override {
    *got = 0;
    for (;;) {
      ssize_t n = recv(fd_, buf, cap, MSG_DONTWAIT);
      if (n > 0) {
        *got = static_cast<size_t>(n);
        return TransportStatus::Ok();
      }
      if (n == 0) {
        return TransportStatus::Error(TransportErrc::kPeerClosed, 0, "peer closed the connection");
      }
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) return TransportStatus::Ok();
      return internal::ErrnoStatus(errno, "recv");
    }
  }
  TransportStatus WaitReadable(int64_t deadline_ns, const char* what) override {
    return internal::WaitFd(fd_, POLLIN, deadline_ns, what);
  }
  void Shutdown() override { shutdown(fd_, SHUT_RDWR); }
  int fd() const override { return fd_; }
  const char* description() const override { return "tcp"; }

 private:
  const int fd_;
};

}  // namespace

std::unique_ptr<ByteStream> NewPlainStream(int fd) {
  return std::unique_ptr<ByteStream>(new (std::nothrow) PlainStream(fd));
}

}  // namespace tf::transport
