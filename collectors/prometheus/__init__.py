"""Prometheus sources: text exposition (one scrape or a directory of timed scrapes), the HTTP API of a
Prometheus server, an engine's ``/metrics`` URL sampled or followed live.

Layers, one direction (a module imports only those before it): ``prom_common`` (shared types,
metric names, counter/histogram/gauge arithmetic) -> ``prom_text`` (parsing) -> ``prom_http``
(HTTP fetching, ``url_kind``) -> ``dialect_columns`` (per-engine evidence columns of one interval)
-> ``prom_intervals``, ``prom_aggregate`` (interval rows) -> readers ``scrape_reader``
(``prom-text``), ``server_reader`` (``prom-http``), ``endpoint`` (``prom-endpoint``), ``live``.

May import: mixdiag.schema, mixdiag.errors, mixdiag.wire, mixdiag.collectors (text_input;
``live`` calls ``collectors.load``). Never collectors.gpu or collectors.logs (GPU filling is
``collectors.load``'s)."""
