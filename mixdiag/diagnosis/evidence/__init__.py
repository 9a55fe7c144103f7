"""Evidence, the second stage: one engine seen through several views (log steps, scrape intervals,
EP ranks) - each view's rows get the other views' evidence as columns (:mod:`.fusion`). Evidence
names no cause either.

May import: base, mixdiag.diagnosis.config, mixdiag.diagnosis.detection."""
