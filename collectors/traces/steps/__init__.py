"""Step reconstruction shared by the trace readers, independent of the trace format:
``reconstruct`` (mixdiag's own ``step`` messages, graph mode, gap splitting), ``ranges`` (the table
of foreign engines' range and kernel names), ``foreign`` (steps of engines we did not write, from an
``Activity``), ``token_inference`` (their token allocation from copy sizes), ``evidence`` (KV
transfer, rank skew: raw measurements; the diagnosis judges them), ``frame`` (steps-frame columns
and signal levels).

May import: numpy, pandas, mixdiag.schema, mixdiag.errors, mixdiag.wire; nothing else in collectors."""
