"""Stable error codes carried in ``{"error": {"code", "message"}}`` replies."""

from __future__ import annotations

BAD_REQUEST = "bad_request"
UNKNOWN_MODEL = "unknown_model"
OVERLOADED = "overloaded"
DEADLINE_EXCEEDED = "deadline_exceeded"
NO_WORKERS = "no_workers"
INTERNAL = "internal"
PAYLOAD_TOO_LARGE = "payload_too_large"

CODES = (BAD_REQUEST, UNKNOWN_MODEL, OVERLOADED, DEADLINE_EXCEEDED, NO_WORKERS, INTERNAL,
         PAYLOAD_TOO_LARGE)


class ServingError(Exception):
    """An error that becomes an error reply with a stable code."""

    def __init__(self, code: str, message: str, **extra: object) -> None:
        assert code in CODES, code
        super().__init__(message)
        self.code = code
        self.message = message
        self.extra = extra
