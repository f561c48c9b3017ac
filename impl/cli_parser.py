"""The argument parser of pdtbench's commands (a usage error is one line, not the usage),
the hint for a mistyped name, and a value written as a flag takes it."""

from __future__ import annotations

import argparse
import difflib
from collections.abc import Sequence
from typing import Any, NoReturn


class OneLineParser(argparse.ArgumentParser):
    """An :class:`argparse.ArgumentParser` whose usage errors print one line,
    ``<prog>: error: <message> (see <help_command> --help)``, and exit with status 2, instead
    of the whole usage block before it; ``--help`` prints the usage as ever.
    ``help_command`` is ``prog`` unless set: the command whose help lists the options given
    (``pdtbench train --method sdgp`` for SDGP's own options)."""

    help_command: str | None = None

    def error(self, message: str) -> NoReturn:
        """Print ``message`` as one line on standard error and exit with status 2."""
        where = self.help_command or self.prog
        self.exit(2, f"{self.prog}: error: {message} (see {where} --help)\n")


def directory(text: str) -> str:
    """An argparse type for a directory option: refuses an empty (or blank) value, which
    would write into the current directory (an unset ``"$OUT"``, say)."""
    if not text.strip():
        raise argparse.ArgumentTypeError("needs a directory; got an empty one")
    return text


def did_you_mean(name: str, valid: Sequence[str]) -> str:
    """A hint for an unknown ``name`` among ``valid``: ``" (did you mean 'x'?)"`` for a name
    that differs in case or by a typo (:func:`difflib.get_close_matches`), ``" (its items:
    a.x, a.y)"`` for ``a``, the first part of dotted names; ``""`` when nothing is close."""
    folded = [v for v in valid if v.casefold() == name.casefold()]
    if folded:
        return f" (did you mean {folded[0]!r}?)"
    # A paper's name before a fuzzy match: 'clicktrain' is close to 'clicktrain.fig9' too.
    items = [v for v in valid if v.casefold().startswith(f"{name.casefold()}.")]
    if items:
        return f" (its items: {', '.join(items)})"
    close = difflib.get_close_matches(name, valid, n=1, cutoff=0.75)
    if close:
        return f" (did you mean {close[0]!r}?)"
    return ""


def flag_text(value: Any) -> str:
    """A value as ``pdtbench train``'s flags take it: true/false, none, a number in its
    shortest form (6 significant digits), a list space-separated."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return "none"
    if isinstance(value, float):
        return f"{value:.6g}"
    if isinstance(value, (list, tuple)):
        return " ".join(flag_text(v) for v in value)
    return str(value)
