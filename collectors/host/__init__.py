"""Host sources: the OS's view of an engine process (``proc_samples``: a sampler of ``/proc/PID/stat`` and
``/proc/PID/schedstat``, and the reader of the CSV it writes).

May import: mixdiag.schema, mixdiag.errors, mixdiag.collectors (text_input)."""
