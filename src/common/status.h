// Status and StatusOr: the error currency inside TensorFusion. No exceptions cross a module
// boundary; a Status carries a code and a human-readable message. Conversion to CUresult
// happens in exactly one place at the C edge (src/driver/cuda_result.h).
#pragma once

#include <string>
#include <string_view>
#include <utility>
#include <variant>

namespace tf {

enum class StatusCode {
  kOk = 0,
  kInvalidArgument,
  kNotFound,
  kAlreadyExists,
  kOutOfMemory,       // a VRAM or capacity quota would be exceeded
  kResourceExhausted, // a table or slot array is full
  kFailedPrecondition,
  kUnavailable,       // a peer, driver or GPU is not reachable
  kPermissionDenied,
  kUnauthenticated,
  kDeadlineExceeded,
  kAborted,
  kNotSupported,
  kInternal,
};

// Returns a stable lower-case name ("invalid_argument") for logs and the HTTP API.
std::string_view StatusCodeName(StatusCode code);

class Status {
 public:
  Status() = default;
  Status(StatusCode code, std::string message) : code_(code), message_(std::move(message)) {}

  static Status Ok() { return Status(); }
  bool ok() const { return code_ == StatusCode::kOk; }
  StatusCode code() const { return code_; }
  const std::string& message() const { return message_; }
  // "invalid_argument: --vram must be positive"
  std::string ToString() const;

 private:
  StatusCode code_ = StatusCode::kOk;
  std::string message_;
};

inline Status InvalidArgument(std::string m) { return {StatusCode::kInvalidArgument, std::move(m)}; }
inline Status NotFound(std::string m) { return {StatusCode::kNotFound, std::move(m)}; }
inline Status AlreadyExists(std::string m) { return {StatusCode::kAlreadyExists, std::move(m)}; }
inline Status OutOfMemory(std::string m) { return {StatusCode::kOutOfMemory, std::move(m)}; }
inline Status ResourceExhausted(std::string m) { return {StatusCode::kResourceExhausted, std::move(m)}; }
inline Status FailedPrecondition(std::string m) { return {StatusCode::kFailedPrecondition, std::move(m)}; }
inline Status Unavailable(std::string m) { return {StatusCode::kUnavailable, std::move(m)}; }
inline Status PermissionDenied(std::string m) { return {StatusCode::kPermissionDenied, std::move(m)}; }
inline Status Unauthenticated(std::string m) { return {StatusCode::kUnauthenticated, std::move(m)}; }
inline Status NotSupported(std::string m) { return {StatusCode::kNotSupported, std::move(m)}; }
inline Status Internal(std::string m) { return {StatusCode::kInternal, std::move(m)}; }

// Either a value or a non-OK Status. REQUIRES: value() only when ok().
template <typename T>
class StatusOr {
 public:
  StatusOr(T value) : v_(std::move(value)) {}          // NOLINT: implicit by design
  StatusOr(Status status) : v_(std::move(status)) {}   // NOLINT: implicit by design
  bool ok() const { return std::holds_alternative<T>(v_); }
  Status status() const { return ok() ? Status::Ok() : std::get<Status>(v_); }
  const T& value() const& { return std::get<T>(v_); }
  T& value() & { return std::get<T>(v_); }
  T&& value() && { return std::get<T>(std::move(v_)); }
  const T& operator*() const& { return value(); }
  T& operator*() & { return value(); }
  const T* operator->() const { return &value(); }
  T* operator->() { return &value(); }

 private:
  std::variant<T, Status> v_;
};

}  // namespace tf

#define TF_RETURN_IF_ERROR(expr)            \
  do {                                      \
    ::tf::Status tf_status_ = (expr);       \
    if (!tf_status_.ok()) return tf_status_; \
  } while (0)
