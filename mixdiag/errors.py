"""Errors the CLI turns into a one-line ``error: ...`` and exit status 2."""


class UserError(Exception):
    """Bad input from the user: missing file, unreadable format, bad flag value.

    Raised anywhere below the CLI; ``mixdiag`` prints ``error: <message>`` on stderr and exits 2.
    """
