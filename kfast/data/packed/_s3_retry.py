"""How an `S3Store` tries again: which failures pass, how long it waits, and what it says when it gives up.

botocore retries each request itself (standard mode, with backoff: `botocore_config`); on top of that, a whole read
that came back short or broke off midway is tried again here, since botocore has already returned by then. A
failure that trying again cannot mend (no such key, access denied) is raised at once as the matching built-in
error. Messages name the object and the attempts; they are built from S3's error codes and botocore's messages,
which hold no credentials.
"""

from __future__ import annotations

import logging
import random
import time
from typing import Any
from typing import Callable
from typing import TypeVar

_log = logging.getLogger("kfast.data.packed.s3_store")
_T = TypeVar("_T")

# Test seams: how hard to try. Worst case with these, an unreachable endpoint fails in about 25 s.
ATTEMPTS = 3  # kfast's, each with up to BOTOCORE_ATTEMPTS requests
BOTOCORE_ATTEMPTS = 4
BACKOFF_S = 1.0
_TRANSIENT_CODES = frozenset({"SlowDown", "Throttling", "RequestTimeout", "InternalError", "ServiceUnavailable"})


class Incomplete(Exception):
    """A read that ended before the object's size: tried again."""


def botocore_config() -> Any:
    """botocore's retries (standard mode: connection errors, throttling and 5xx, with backoff)."""
    from botocore.config import Config

    return Config(retries={"max_attempts": BOTOCORE_ATTEMPTS, "mode": "standard"})


def retrying(attempt: Callable[[], _T], where: str, what: str, on_retry: Callable[[], None]) -> _T:
    """`attempt()`, tried up to ATTEMPTS times while it fails in a way that may pass; `where` is the object's uri."""
    tried = 0
    while True:
        tried += 1
        try:
            return attempt()
        except Exception as error:
            if not _transient(error):
                raise _lasting(error, where, what) from error
            reason = f"{type(error).__name__}: {error}"
            if tried >= ATTEMPTS:
                raise OSError(f"S3Store could not {what} {where} in {tried} attempts, each of up to "
                              f"{BOTOCORE_ATTEMPTS} requests; the last failed with {reason}. Check that the S3 "
                              "endpoint (AWS_ENDPOINT_URL, or the AWS config) is reachable from here.") from error
            on_retry()
            _log.debug("S3Store: %s %s failed (%s); trying again", what, where, reason)
            time.sleep(BACKOFF_S * 2 ** (tried - 1) * random.uniform(0.5, 1.0))


def _transient(error: Exception) -> bool:
    from botocore import exceptions

    if isinstance(error, exceptions.ClientError):
        status = error.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0)
        return status >= 500 or error.response.get("Error", {}).get("Code") in _TRANSIENT_CODES
    return isinstance(error, (Incomplete, exceptions.HTTPClientError, exceptions.ConnectionError,
                              exceptions.IncompleteReadError, exceptions.ResponseStreamingError))


def _lasting(error: Exception, where: str, what: str) -> Exception:
    """The error to raise for a failure that trying again would not mend."""
    from botocore import exceptions

    if not isinstance(error, exceptions.ClientError):
        return error
    code = error.response.get("Error", {}).get("Code", "")
    status = error.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0)
    answer = f"S3Store could not {what} {where}: S3 answered {code or status}"
    if code in ("NoSuchKey", "NoSuchBucket", "NotFound", "404") or status == 404:
        return FileNotFoundError(f"{answer} (no such object or bucket). Check the uri, and that the pack was copied "
                                 "there whole.")
    if code in ("AccessDenied", "Forbidden", "InvalidAccessKeyId", "SignatureDoesNotMatch", "403") or status == 403:
        return PermissionError(f"{answer}. Check the credentials boto3 finds (AWS_ACCESS_KEY_ID and "
                               "AWS_SECRET_ACCESS_KEY, AWS_PROFILE, or ~/.aws/credentials) and that they may read "
                               "this bucket.")
    return OSError(f"{answer}: {error}")
