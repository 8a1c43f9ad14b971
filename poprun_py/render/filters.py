"""The render filters: every value reaches a command or a file through one of these.

``quote`` (one shell word), ``quoted`` (a list of them, optionally each after a flag),
``word``/``words`` (the same for whitespace-separated files such as a hostfile or an Open MPI
appfile: unchanged, or a RenderError), ``fits`` (a line a launcher reads into a fixed buffer),
and the tests of what a launcher's syntax can carry.

Example:

    >>> print(quote("it's"), quoted(["a b", "c"], "-x"), words(["h1", "slots=2"]))
    'it'"'"'s' -x 'a b' -x c h1 slots=2
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Iterable

from poprun_py.errors import RenderError

NOT_A_WORD = re.compile(r"[\s#]")  # appfile/hostfile lines: whitespace splits, '#' comments


def quote(value: object) -> str:
    """The ``quote`` filter: one shell word (shlex.quote); a NUL byte is a RenderError."""
    text = str(value)
    if "\0" in text:
        raise RenderError(f"value {text!r} contains a NUL byte")
    return shlex.quote(text)


def word(value: object) -> str:
    """The ``word`` filter: ``value`` unchanged if it is one token of a whitespace-separated
    file (hostfile, Open MPI appfile), else RenderError."""
    text = value if isinstance(value, str) else str(value)
    if not is_word(text):
        raise RenderError(f"{text!r} cannot be one word of a hostfile or appfile")
    return text


def quoted(values: Iterable[object], flag: str | None = None) -> str:
    """The ``quoted`` filter: every value as a shell word, each after ``flag`` when given
    (``env | quoted('-x')`` gives ``-x 'A=1' -x B``)."""
    lead = f"{flag} " if flag else ""
    return " ".join(lead + quote(v) for v in values)


def words(values: Iterable[object], flag: str | None = None) -> str:
    """The ``words`` filter: ``quoted`` for whitespace-separated files (every value a ``word``)."""
    texts = [v if isinstance(v, str) else str(v) for v in values]
    if NOT_A_WORD.search("\0".join(texts)) or "" in texts or ":" in texts:
        for text in texts:
            word(text)
    lead = f"{flag} " if flag else ""
    return lead + f" {lead}".join(texts) if texts else ""


def fits(line: str, limit: int, reader: str) -> str:
    """The ``fits`` filter: ``line`` unchanged when it has at most ``limit`` bytes, else
    RenderError naming ``reader``, the program that would cut it (Open MPI 4.1 reads an appfile
    line into an 8 KiB buffer and runs the rest of a longer one as another app context)."""
    size = len(line.encode())
    if size > limit:
        raise RenderError(
            f"a line of {size} bytes is too long for {reader} (at most {limit}): shorten the "
            "program's arguments or the environment values"
        )
    return line


def is_word(text: str) -> bool:
    return bool(text) and text != ":" and not NOT_A_WORD.search(text)


def carriable(text: str, appfile: bool) -> bool:
    """True when ``text`` survives as one argument in the launcher's syntax."""
    return is_word(text) if appfile else text != ":"


def carriable_value(text: str, appfile: bool) -> bool:
    """True when an environment value survives inside ``NAME=VALUE`` (or as ``-env N VALUE``)."""
    return text != ":" and not (appfile and NOT_A_WORD.search(text))
