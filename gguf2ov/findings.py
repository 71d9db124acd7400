"""One row of a check's verdict: what was checked, in which group, its status and why."""

from dataclasses import dataclass


@dataclass(frozen=True)
class Finding:
    name: str
    group: str  # interface | behaviour | target | ...
    status: str  # pass | fail | warn | skip
    reason: str
