#include "ddp/status.h"

#include <cerrno>
#include <cstring>

namespace ddp {

std::string_view CodeName(Code code) {
  switch (code) {
    case Code::kOk: return "OK";
    case Code::kCancelled: return "CANCELLED";
    case Code::kInvalidArgument: return "INVALID_ARGUMENT";
    case Code::kDeadlineExceeded: return "DEADLINE_EXCEEDED";
    case Code::kNotFound: return "NOT_FOUND";
    case Code::kAlreadyExists: return "ALREADY_EXISTS";
    case Code::kPermissionDenied: return "PERMISSION_DENIED";
    case Code::kResourceExhausted: return "RESOURCE_EXHAUSTED";
    case Code::kFailedPrecondition: return "FAILED_PRECONDITION";
    case Code::kOutOfRange: return "OUT_OF_RANGE";
    case Code::kUnimplemented: return "UNIMPLEMENTED";
    case Code::kInternal: return "INTERNAL";
    case Code::kUnavailable: return "UNAVAILABLE";
    case Code::kDataLoss: return "DATA_LOSS";
    case Code::kUnauthenticated: return "UNAUTHENTICATED";
    case Code::kOtherProcess: return "OTHER_PROCESS";
  }
  return "UNKNOWN";
}

std::string Status::ToString() const {
  if (ok()) return "OK";
  std::string out(CodeName(code_));
  out += ": ";
  out += message_;
  return out;
}

Status ErrnoError(int err, std::string_view what, std::string_view path) {
  std::string m = std::string(path) + ": " + std::string(what) + ": " + std::strerror(err);
  switch (err) {
    case ENOENT:
    case ENOTDIR: return NotFoundError(std::move(m));
    case EACCES:
    case EPERM:
    case EROFS: return PermissionDeniedError(std::move(m));
    case ENOSPC:
    case EDQUOT:
    case EFBIG:
    case EMFILE:
    case ENFILE:
    case ENOMEM: return ResourceExhaustedError(std::move(m));
    case EISDIR:
    case EEXIST:
    case ENAMETOOLONG:
    case EINVAL: return FailedPreconditionError(std::move(m));
    case EIO: return DataLossError(std::move(m));
    case EINTR:
    case EAGAIN: return UnavailableError(std::move(m));
    default: return InternalError(std::move(m));
  }
}

Status Status::WithContext(std::string_view context) const {
  if (ok()) return *this;
  std::string m(context);
  m += ": ";
  m += message_;
  return {code_, std::move(m)};
}

}  // namespace ddp
