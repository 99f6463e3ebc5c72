// Status and Result<T>: how every fallible call in the engine reports failure.
//
// A Status carries a Code (which decides retry policy: only kUnavailable and
// kDeadlineExceeded are transient) and a message that names the URL, key or file
// concerned and the limit broken. Messages never contain credentials.
#pragma once

#include <cassert>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <variant>

namespace ddp {

enum class Code : int {
  kOk = 0,
  kCancelled,
  kInvalidArgument,
  kDeadlineExceeded,
  kNotFound,
  kAlreadyExists,
  kPermissionDenied,
  kResourceExhausted,
  kFailedPrecondition,
  kOutOfRange,
  kUnimplemented,
  kInternal,
  kUnavailable,
  kDataLoss,
  kUnauthenticated,
  // An object made in another process was used here: a fork()ed child using what its
  // parent made (common/process.h).
  kOtherProcess,
};

// Name of a code, e.g. "NOT_FOUND".
std::string_view CodeName(Code code);

class [[nodiscard]] Status {
 public:
  Status() = default;  // OK
  Status(Code code, std::string message) : code_(code), message_(std::move(message)) {}

  static Status Ok() { return {}; }
  bool ok() const { return code_ == Code::kOk; }
  Code code() const { return code_; }
  const std::string& message() const { return message_; }

  // "NOT_FOUND: s3://bucket/key: HTTP 404"
  std::string ToString() const;

  // Returns a copy whose message is "context: message" (the code is kept).
  Status WithContext(std::string_view context) const;

  // True for failures that may succeed when retried (unavailable, deadline exceeded).
  bool IsTransient() const {
    return code_ == Code::kUnavailable || code_ == Code::kDeadlineExceeded;
  }

  // Explicitly discard a status (for best-effort cleanup paths; say why at the call).
  void IgnoreError() const {}

 private:
  Code code_ = Code::kOk;
  std::string message_;
};

inline Status NotFoundError(std::string m) { return {Code::kNotFound, std::move(m)}; }
inline Status InvalidArgumentError(std::string m) { return {Code::kInvalidArgument, std::move(m)}; }
inline Status UnavailableError(std::string m) { return {Code::kUnavailable, std::move(m)}; }
inline Status DataLossError(std::string m) { return {Code::kDataLoss, std::move(m)}; }
inline Status PermissionDeniedError(std::string m) { return {Code::kPermissionDenied, std::move(m)}; }
inline Status InternalError(std::string m) { return {Code::kInternal, std::move(m)}; }
inline Status ResourceExhaustedError(std::string m) { return {Code::kResourceExhausted, std::move(m)}; }
inline Status UnimplementedError(std::string m) { return {Code::kUnimplemented, std::move(m)}; }
inline Status CancelledError(std::string m) { return {Code::kCancelled, std::move(m)}; }
inline Status OutOfRangeError(std::string m) { return {Code::kOutOfRange, std::move(m)}; }
inline Status FailedPreconditionError(std::string m) { return {Code::kFailedPrecondition, std::move(m)}; }
inline Status DeadlineExceededError(std::string m) { return {Code::kDeadlineExceeded, std::move(m)}; }
inline Status UnauthenticatedError(std::string m) { return {Code::kUnauthenticated, std::move(m)}; }
inline Status OtherProcessError(std::string m) { return {Code::kOtherProcess, std::move(m)}; }

// The error of a failed system call on a file: "<path>: <what>: <strerror(err)>", its code
// from errno (ENOENT/ENOTDIR not found, EACCES/EPERM/EROFS permission denied, ENOSPC,
// EDQUOT, EFBIG, EMFILE, ENFILE, ENOMEM resource exhausted, EIO data loss, EINTR/EAGAIN
// unavailable, EISDIR/EEXIST/ENAMETOOLONG/EINVAL failed precondition, anything else
// internal).
Status ErrnoError(int err, std::string_view what, std::string_view path);

// A value or an error Status. Construct from T (success) or from a non-OK Status.
template <typename T>
class [[nodiscard]] Result {
 public:
  Result(T value) : v_(std::move(value)) {}  // NOLINT: implicit by design
  Result(Status status) : v_(std::move(status)) {  // NOLINT: implicit by design
    assert(!std::get<Status>(v_).ok() && "Result constructed from an OK status");
  }

  bool ok() const { return std::holds_alternative<T>(v_); }
  Status status() const { return ok() ? Status() : std::get<Status>(v_); }

  T& value() & { assert(ok()); return std::get<T>(v_); }
  const T& value() const& { assert(ok()); return std::get<T>(v_); }
  T&& value() && { assert(ok()); return std::get<T>(std::move(v_)); }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }
  T& operator*() & { return value(); }
  const T& operator*() const& { return value(); }

 private:
  std::variant<T, Status> v_;
};

}  // namespace ddp

// Propagate a non-OK Status from an expression returning Status.
#define DDP_RETURN_IF_ERROR(expr)                 \
  do {                                            \
    ::ddp::Status ddp_status_ = (expr);           \
    if (!ddp_status_.ok()) return ddp_status_;   \
  } while (0)

#define DDP_CONCAT_INNER_(a, b) a##b
#define DDP_CONCAT_(a, b) DDP_CONCAT_INNER_(a, b)
// DDP_ASSIGN_OR_RETURN(auto x, MakeX()); declares x from a Result or returns its error.
#define DDP_ASSIGN_OR_RETURN(lhs, expr) \
  DDP_ASSIGN_OR_RETURN_IMPL_(DDP_CONCAT_(ddp_result_, __LINE__), lhs, expr)
#define DDP_ASSIGN_OR_RETURN_IMPL_(tmp, lhs, expr) \
  auto tmp = (expr);                               \
  if (!tmp.ok()) return tmp.status();              \
  lhs = std::move(tmp).value()
