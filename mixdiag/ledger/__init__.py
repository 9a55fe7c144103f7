"""The article's shape ledger (bytes and rows of a mixed vs a pure-decode step, for any model), the
roofline device model that turns it into predicted step times, and a spike's predicted height from
its evidence (:mod:`.spike_height`, shown by the HTML report and the dashboard). Pure arithmetic.

May import: the standard library and mixdiag.errors."""
