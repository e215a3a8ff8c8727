"""Every error the server answers: its type, the one status table, and the exceptions that carry them; and the
one error that keeps it from starting."""
from __future__ import annotations

from enum import Enum


class ErrorType(str, Enum):
    """The `error_type` (or `code`) an error body names, and the failure metric's label."""
    BAD_REQUEST = "bad_request"  # not valid HTTP/1.1 or refused on its head (the refusal names its status)
    EMPTY = "empty"
    UNAUTHORIZED = "unauthorized"
    NOT_FOUND = "not_found"
    METHOD_NOT_ALLOWED = "method_not_allowed"
    REQUEST_TIMEOUT = "request_timeout"  # the request did not arrive in time
    PAYLOAD_TOO_LARGE = "payload_too_large"
    HEADER_TOO_LARGE = "header_too_large"
    VALIDATION = "validation"
    OVERLOADED = "overloaded"  # the queue is full: retry after Retry-After
    CLIENT_CLOSED = "client_closed"  # no answer is written: the client is gone
    INTERNAL = "internal"
    BACKEND = "backend"
    UNHEALTHY = "unhealthy"
    TOO_MANY_CONNECTIONS = "too_many_connections"
    TIMEOUT = "timeout"  # the answer was not ready in time
    HTTP = "http"  # any other status the framework raises (it names the status)

    def __str__(self) -> str:
        return self.value

    @property
    def status(self) -> int:
        return STATUS[self]


STATUS: dict[ErrorType, int] = {
    ErrorType.BAD_REQUEST: 400,
    ErrorType.EMPTY: 400,
    ErrorType.UNAUTHORIZED: 401,
    ErrorType.NOT_FOUND: 404,
    ErrorType.METHOD_NOT_ALLOWED: 405,
    ErrorType.REQUEST_TIMEOUT: 408,
    ErrorType.PAYLOAD_TOO_LARGE: 413,
    ErrorType.HEADER_TOO_LARGE: 431,
    ErrorType.VALIDATION: 422,
    ErrorType.OVERLOADED: 429,
    ErrorType.CLIENT_CLOSED: 499,  # nginx's code for "the client closed the request": nobody reads it
    ErrorType.INTERNAL: 500,
    ErrorType.BACKEND: 500,
    ErrorType.UNHEALTHY: 503,
    ErrorType.TOO_MANY_CONNECTIONS: 503,
    ErrorType.TIMEOUT: 504,
    ErrorType.HTTP: 500,
}


class InfinityError(Exception):
    error_type = ErrorType.INTERNAL

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message

    @property
    def status_code(self) -> int:
        return self.error_type.status


class ValidationError(InfinityError):
    error_type = ErrorType.VALIDATION


class EmptyInput(InfinityError):
    error_type = ErrorType.EMPTY


class TooLong(ValidationError):
    """An input longer than the model takes, where it is not to be cut. `cuttable`: texts, which the route's own
    truncation switch would cut (token ids run as given); the API layer names that switch (advising)."""

    def __init__(self, message: str, cuttable: bool) -> None:
        super().__init__(message)
        self.cuttable = cuttable

    def advising(self, switch: str) -> ValidationError:
        """The error in a route's words: `switch` is the body field that turns its truncation on ("" for none)."""
        if not switch or not self.cuttable:
            return self
        return ValidationError(f"{self.message} or set {switch}")


class PayloadTooLarge(InfinityError):
    error_type = ErrorType.PAYLOAD_TOO_LARGE


class Overloaded(InfinityError):
    error_type = ErrorType.OVERLOADED


class NotReady(InfinityError):
    error_type = ErrorType.UNHEALTHY


class TimedOut(InfinityError):
    error_type = ErrorType.TIMEOUT


class BackendError(InfinityError):
    error_type = ErrorType.BACKEND


class StartupError(Exception):
    """The server must not start; the message is the one line the operator sees."""
