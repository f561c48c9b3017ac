"""The one-line form of an error's message, as the command line and the fallbacks report it."""

from __future__ import annotations


def first_line(err: BaseException, limit: int | None = None) -> str:
    """The first line of ``err``'s message (torch's messages go on with advice), cut to
    ``limit`` characters where given; ``""`` for an error without a message
    (``RuntimeError()``, a bare ``assert``)."""
    text = str(err).strip()
    line = text.splitlines()[0] if text else ""
    return line if limit is None else line[:limit]
