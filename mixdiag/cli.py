"""The ``mixdiag`` command line: one entry point, one verb per module in :mod:`mixdiag.commands`.

A verb module defines ``register(subparsers, common)`` that adds its sub-parser (with ``common``
as a parent, which carries ``--json``, ``-v``, ``-q``, ``--debug``) and sets ``func`` to a
handler ``func(args, console) -> int``. Conventions live here, once: bad input
(:class:`~mixdiag.errors.UserError`, a missing file, a bad flag value) prints a one-line
``error: ...`` on stderr and exits 2; ``--debug`` shows the traceback instead.
"""
from __future__ import annotations

import argparse
import importlib
import os
import pkgutil
import sys
import traceback

import mixdiag
from mixdiag.commands.flags import common_parser
from mixdiag.console import Console
from mixdiag.errors import UserError


class _Parser(argparse.ArgumentParser):
    """argparse that exits 2 with one line (no usage dump) on a bad flag."""

    def error(self, message):  # noqa: D401
        self.exit(2, f"error: {message} (see '{self.prog} --help')\n")


def build_parser() -> argparse.ArgumentParser:
    """The full parser, with every verb found in mixdiag.commands registered."""
    common = common_parser()
    parser = _Parser(prog="mixdiag", parents=[common],
                     description="Tell why time-per-output-token spiked: mixed batching, EP hotspots, "
                                 "PD KV transfer, CUDA-graph fallback, KV pressure, host stalls.")
    parser.add_argument("--version", action="version", version=f"mixdiag {mixdiag.__version__}")
    sub = parser.add_subparsers(dest="verb", metavar="VERB", parser_class=_Parser)
    import mixdiag.commands as commands

    for mod in sorted(pkgutil.iter_modules(commands.__path__), key=lambda m: m.name):
        if mod.name.startswith("_"):
            continue
        module = importlib.import_module(f"mixdiag.commands.{mod.name}")
        if hasattr(module, "register"):
            module.register(sub, common)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``mixdiag`` console script; returns the exit status."""
    argv = sys.argv[1:] if argv is None else argv
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help(sys.stderr if args.json else sys.stdout)
        return 0 if not argv or argv == ["--help"] else 2
    console = Console(json_mode=args.json, verbosity=-1 if args.quiet else args.verbose)
    try:
        return int(args.func(args, console) or 0)
    except KeyboardInterrupt:
        sys.stderr.write("error: interrupted\n")
        return 130
    except BrokenPipeError:
        # the reader went away (`mixdiag ... | head`): stop quietly like other CLI tools; point
        # stdout at /dev/null so the interpreter's final flush does not raise again
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141
    except (UserError, ValueError, FileNotFoundError, FileExistsError, IsADirectoryError,
            NotADirectoryError, PermissionError) as e:
        if isinstance(e, ValueError) and not _is_schema_error(e):
            return _internal_error(e, args)
        if args.debug:
            traceback.print_exc()
        msg = str(e).splitlines()[0] if str(e) else type(e).__name__
        if isinstance(e, OSError) and e.filename and str(e.filename) not in msg:
            msg = f"{msg}: {e.filename}"
        sys.stderr.write(f"error: {msg}\n")
        return 2
    except Exception as e:  # an internal bug: still one line unless --debug
        return _internal_error(e, args)


def _is_schema_error(e: BaseException) -> bool:
    """A :class:`~mixdiag.schema.SchemaError` (bad input), looked up without importing pandas:
    if the schema module was never imported, nothing can have raised one."""
    schema = sys.modules.get("mixdiag.schema")
    return schema is not None and isinstance(e, schema.SchemaError)


def _internal_error(e: BaseException, args) -> int:
    if args.debug:
        traceback.print_exc()
    else:
        sys.stderr.write(f"error: internal error: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
                         " (rerun with --debug for the traceback)\n")
    return 1


if __name__ == "__main__":
    sys.exit(main())
