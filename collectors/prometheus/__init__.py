"""Prometheus sources: text exposition (one scrape or a directory of timed scrapes), the HTTP API of a
Prometheus server, scrapes -> interval rows, and live following of an endpoint.

May import: mixdiag.schema, mixdiag.errors, mixdiag.wire, mixdiag.collectors (provenance, text_input)."""
