"""Host-side sources of an engine process: process-exporter CPU time (``process_cpu``).

May import: mixdiag.schema, mixdiag.errors, mixdiag.collectors.prometheus (process-exporter speaks
Prometheus: parsing and the scrape reader)."""
