"""The article's shape ledger (bytes and rows of a mixed vs a pure-decode step, for any model) and the
roofline device model that turns it into predicted step times. Pure arithmetic.

May import: the standard library and mixdiag.errors."""
