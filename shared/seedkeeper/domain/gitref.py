"""Validation of git branch names, mirroring ``git check-ref-format --branch``."""

from __future__ import annotations

import re

__all__ = ["is_valid_branch_name"]

# Characters and sequences forbidden anywhere in a ref name (git-check-ref-format(1)):
# ASCII control characters (< 0x20, including NUL and tab), space, DEL (0x7f),
# any of ``~ ^ : ? * [ \``, the sequences ``..`` and ``@{``.  Lone surrogates are
# also rejected: they have no UTF-8 encoding, so git could never see such a name.
_FORBIDDEN = re.compile(r"[\x00-\x20\x7f~^:?*\[\\\ud800-\udfff]|\.\.|@\{")


def is_valid_branch_name(name: str) -> bool:
    """Return True iff ``git check-ref-format --branch name`` accepts ``name``.

    This is the behaviour outside a repository (git 2.39), where ``--branch``
    performs no ``@{-N}`` expansion and checks ``refs/heads/<name>`` literally.
    A name is valid iff:

    * it is not ``HEAD`` and does not start with ``-``;
    * it contains no ASCII control character (< 0x20 or 0x7f), space, any of
      ``~ ^ : ? * [ \\``, ``..`` or ``@{`` (non-ASCII characters are fine);
    * split on ``/``, every component is non-empty (so no leading, trailing or
      doubled ``/``), does not start with ``.`` and does not end with ``.lock``;
    * it does not end with ``.``.

    ``@`` on its own is valid here: git only forbids a whole ref named ``@``, and
    the ref being checked is ``refs/heads/@``.
    """
    if name == "HEAD" or name.startswith("-") or name.endswith("."):
        return False
    if _FORBIDDEN.search(name):
        return False
    return all(
        part and not part.startswith(".") and not part.endswith(".lock") for part in name.split("/")
    )
