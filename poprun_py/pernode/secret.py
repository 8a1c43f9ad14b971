"""The shared secret that per-node mode's nodes prove to each other (never in argv): from
``--secret-file PATH``, else the file named by ``POPRUN_SECRET_FILE``, else the value of
``POPRUN_SECRET``.

A file is refused, as ssh refuses a private key, when it is the user's own and others may
read or write it (``chmod 600``; a Kubernetes Secret volume: ``defaultMode: 0400``). One
trailing newline is not part of the secret (``echo`` writes one, ``kubectl create secret``
does not). A secret shorter than :data:`MIN_BYTES` is refused. Every fault is one line,
exit 2, and never shows the secret.

Example:

    >>> read_secret(None, {"POPRUN_SECRET": "correct horse battery staple"})
    b'correct horse battery staple'
    >>> try:
    ...     read_secret(None, {"POPRUN_SECRET": "short"})
    ... except UsageError as err:
    ...     print(err.exit_code, err)
    2 per-node: the secret from POPRUN_SECRET is 5 bytes: it must be at least 16
"""

from __future__ import annotations

import os
import stat
from collections.abc import Mapping

from poprun_py.errors import UsageError

MIN_BYTES = 16
"""The shortest secret taken (``openssl rand -hex 32`` makes 64 bytes)."""
MAX_BYTES = 65536
"""The longest secret file read: a larger file is not a secret but a mistake."""


def read_secret(secret_file: str | None, environ: Mapping[str, str]) -> bytes:
    """The secret: ``secret_file``, else ``POPRUN_SECRET_FILE``'s file, else
    ``POPRUN_SECRET``. UsageError (one line, exit 2) when there is none, or it is empty, too
    short, unreadable, or a file others may read."""
    if secret_file is not None:
        return _checked(_from_file(secret_file, "--secret-file"), "--secret-file")
    path = environ.get("POPRUN_SECRET_FILE", "")
    if path:
        return _checked(_from_file(path, "POPRUN_SECRET_FILE"), "POPRUN_SECRET_FILE")
    if "POPRUN_SECRET" in environ:
        return _checked(os.fsencode(environ["POPRUN_SECRET"]), "POPRUN_SECRET")
    raise _fault(
        "no secret: give --secret-file PATH, or set POPRUN_SECRET_FILE or POPRUN_SECRET "
        "(the same on every node)"
    )


def _from_file(path: str, source: str) -> bytes:
    try:
        _check_mode(os.stat(path), path, source)  # before open: a FIFO would block it
        with open(path, "rb") as handle:
            data = handle.read(MAX_BYTES + 1)
    except FileNotFoundError:
        raise _fault(f"secret file {path!r} ({source}) does not exist") from None
    except OSError as exc:
        raise _fault(f"cannot read secret file {path!r} ({source}): {exc.strerror}") from None
    if len(data) > MAX_BYTES:
        raise _fault(f"secret file {path!r} ({source}) is over {MAX_BYTES} bytes: not a secret")
    return data


def _check_mode(st: os.stat_result, path: str, source: str) -> None:
    """ssh's rule for private keys: the user's own file must not be open to others."""
    if not stat.S_ISREG(st.st_mode):
        raise _fault(f"secret file {path!r} ({source}) is not a regular file")
    if st.st_uid == os.geteuid() and st.st_mode & 0o077:
        raise _fault(
            f"secret file {path!r} ({source}) is open to others (mode "
            f"{stat.S_IMODE(st.st_mode):04o}): chmod 600 it (Kubernetes: defaultMode: 0400)"
        )


def _checked(secret: bytes, source: str) -> bytes:
    secret = secret.removesuffix(b"\n").removesuffix(b"\r")
    if not secret:
        raise _fault(f"the secret from {source} is empty")
    if len(secret) < MIN_BYTES:
        raise _fault(
            f"the secret from {source} is {len(secret)} bytes: it must be at least {MIN_BYTES}"
        )
    return secret


def _fault(message: str) -> UsageError:
    return UsageError(f"per-node: {message}")
