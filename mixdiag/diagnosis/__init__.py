"""The diagnosis, by stage: detection (spikes, signals: :mod:`.detection`), evidence (fusion of the
views of one engine: :mod:`.evidence`), rules (attribution, the one place evidence becomes a cause and
a confidence: :mod:`.rules`), the result (:mod:`.result`, :mod:`.budget`); :mod:`.config` holds every
threshold, :mod:`.part` runs the stages for a group of instances, :mod:`.pipeline` is ``diagnose``.

May import: mixdiag.schema, mixdiag.causes, mixdiag.errors, mixdiag.wire, mixdiag.fmt, numpy, pandas.
Never collectors, engine, dashboard or torch: it reads Timeline columns and signal qualities, never a
source's names."""

from mixdiag.diagnosis.config import DiagnosisConfig
from mixdiag.diagnosis.pipeline import diagnose
from mixdiag.diagnosis.result import Diagnosis

__all__ = ["Diagnosis", "DiagnosisConfig", "diagnose"]
