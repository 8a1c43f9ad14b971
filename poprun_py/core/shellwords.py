"""Split shell words exactly as :func:`shlex.split` does, at regular-expression speed.

Rendered templates are split into argv lists on every launch and dry run; ``shlex`` reads them
one character at a time in Python (~15 ms for a 16-host job here). :func:`split` scans whole
runs of plain characters and quoted strings with one regular expression instead, and gives the
same words as ``shlex.split(text)`` (POSIX mode, no comments) for every input: unquoted
backslashes escape the next character, single quotes keep everything, double quotes keep a
backslash unless it precedes ``"`` or ``\\``, and only space, tab, CR and newline separate
words. Text ``shlex`` rejects (an open quote, a trailing backslash) goes to ``shlex`` itself,
so the error is the same ``ValueError``.

Example:

    >>> split("numactl --physcpubind=0-3 python 'train 1.py' \\"a \\\\\\"b\\\\\\"\\" c\\\\ d ''")
    ['numactl', '--physcpubind=0-3', 'python', 'train 1.py', 'a "b"', 'c d', '']
"""

from __future__ import annotations

import re
import shlex

_SPACE = " \t\r\n"
_WORD = re.compile(r"""(?:[^ \t\r\n'"\\]+|'[^']*'|"(?:[^"\\]|\\.)*"|\\.)+""", re.DOTALL)
_PIECE = re.compile(r"""([^'"\\]+)|'([^']*)'|"((?:[^"\\]|\\.)*)"|\\(.)""", re.DOTALL)
_IN_DOUBLE = re.compile(r"""\\(["\\])""")


def split(text: str) -> list[str]:
    """The words of ``text``, as ``shlex.split(text)`` gives them (same ``ValueError`` too)."""
    words: list[str] = []
    pos, end = 0, len(text)
    while True:
        while pos < end and text[pos] in _SPACE:
            pos += 1
        if pos == end:
            return words
        match = _WORD.match(text, pos)
        if match is None or (match.end() < end and text[match.end()] not in _SPACE):
            return shlex.split(text)  # an open quote or a trailing backslash: shlex's error
        words.append(_unquote(match.group()))
        pos = match.end()


def _unquote(word: str) -> str:
    if not any(c in word for c in "'\"\\"):
        return word
    parts = []
    for plain, single, double, escaped in _PIECE.findall(word):
        if plain or single:
            parts.append(plain or single)
        elif escaped:
            parts.append(escaped)
        else:
            parts.append(_IN_DOUBLE.sub(r"\1", double))
    return "".join(parts)
