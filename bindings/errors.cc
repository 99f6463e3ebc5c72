#include "errors.h"

#include <nanobind/stl/string.h>

namespace nb = nanobind;

namespace ddp::py {
namespace {

// Python exception type for each code. Built-in types, so users catch what they know:
// a missing object is FileNotFoundError, a refused one PermissionError, and so on.
PyObject* ExceptionFor(Code code) {
  switch (code) {
    case Code::kNotFound: return PyExc_FileNotFoundError;
    case Code::kAlreadyExists: return PyExc_FileExistsError;
    case Code::kPermissionDenied:
    case Code::kUnauthenticated: return PyExc_PermissionError;
    case Code::kInvalidArgument:
    case Code::kOutOfRange:
    case Code::kFailedPrecondition: return PyExc_ValueError;
    case Code::kDeadlineExceeded: return PyExc_TimeoutError;
    case Code::kUnavailable: return PyExc_ConnectionError;
    case Code::kDataLoss:
    case Code::kResourceExhausted: return PyExc_OSError;
    case Code::kUnimplemented: return PyExc_NotImplementedError;
    case Code::kCancelled: return PyExc_InterruptedError;
    case Code::kOk:
    case Code::kInternal:
    case Code::kOtherProcess: break;  // a fork()ed child using its parent's object
  }
  return PyExc_RuntimeError;
}

}  // namespace

void RegisterStatusTranslator() {
  nb::register_exception_translator([](const std::exception_ptr& p, void*) {
    try {
      std::rethrow_exception(p);
    } catch (const StatusError& e) {
      PyErr_SetString(ExceptionFor(e.status().code()), e.what());
    }
  });
}

void init_errors(nb::module_& m) {
  RegisterStatusTranslator();
  m.def(
      "_raise_status",
      [](int code, const std::string& message) {
        ThrowIfError(Status(static_cast<Code>(code), message));
      },
      nb::arg("code"), nb::arg("message"),
      "Raise the Python exception for an engine status code (for tests of the mapping).");
}

}  // namespace ddp::py
