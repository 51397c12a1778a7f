"""``privzo audit``: test a run's (ε, δ) claim empirically with one training run and canaries
(Steinke, Nasr and Jagielski 2023); the statistics live in ``privzo.privacy.audit``."""

from privzo.audit.config import AuditConfig
from privzo.audit.pipeline import VIOLATED_EXIT_CODE, check_audit, run_audit
from privzo.audit.record import AUDIT_FILE, AuditBrief, AuditRecord

__all__ = [
    "AUDIT_FILE",
    "VIOLATED_EXIT_CODE",
    "AuditBrief",
    "AuditConfig",
    "AuditRecord",
    "check_audit",
    "run_audit",
]
