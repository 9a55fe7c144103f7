"""CLI verbs: every module here with a ``register(subparsers, common)`` function is a verb."""
