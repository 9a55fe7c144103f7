"""Step reconstruction shared by the trace readers, independent of the trace format:
``reconstruct`` (mixdiag's own ``step`` messages, graph mode, gap splitting), ``ranges`` (the table
of foreign engines' range names), ``kernel_names`` (the table of kernel-name patterns: attention phase,
collectives, EP exchange, transfer kernels, each with its basis), ``activity`` (the format-independent
input), ``boundaries`` (where a foreign engine's step ends: ranges, sampled-id copies, host bursts),
``foreign`` (steps of engines we did not write, from an ``Activity``), ``token_inference`` (their token
allocation from copy sizes and kernel families), ``evidence`` (KV
transfer, rank skew: raw measurements; the diagnosis judges them), ``frame`` (steps-frame columns
and signal levels).

May import: numpy, pandas, mixdiag.schema, mixdiag.errors, mixdiag.wire; nothing else in collectors."""
