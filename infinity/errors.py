"""One error type per failure kind, each with its HTTP status and error_type."""
from __future__ import annotations


class InfinityError(Exception):
    status_code = 500
    error_type = "internal"

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class ValidationError(InfinityError):
    status_code = 422
    error_type = "validation"


class EmptyInput(InfinityError):
    status_code = 400
    error_type = "empty"


class PayloadTooLarge(InfinityError):
    status_code = 413
    error_type = "payload_too_large"


class Overloaded(InfinityError):
    status_code = 429
    error_type = "overloaded"


class NotReady(InfinityError):
    status_code = 503
    error_type = "unhealthy"


class TimedOut(InfinityError):
    status_code = 504
    error_type = "timeout"


class BackendError(InfinityError):
    status_code = 500
    error_type = "backend"
