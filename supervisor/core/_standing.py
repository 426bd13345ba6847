"""``Standing``: what this host may do in the fleet now, as its last lease renewal left it (ADR 0012).

Written by the fleet task alone (``Fleet``: ``renewed``, ``settle_limit``); read by every part that promotes, leads
or shows the limit. Made before them all, so that none needs the fleet task to exist to be built.
"""

from __future__ import annotations

import math

import trio


class Standing:
    """Whether this host may promote (its lease is fresh: INV-NO-PROMOTION-WITHOUT-LEASE) and lead (INV-ONE-LEADER)
    now, and under which limit (the fleet's recorded one when it differs from this host's setting). A gate refuses
    until a renewal opens it, never "yes" by default, unless ``standalone``: no fleet task runs (an embedder, a test
    driving a Supervisor by hand) and the host holds its registry alone."""

    def __init__(self, max_concurrent: int, *, standalone: bool) -> None:
        self.standalone = standalone
        self._own_limit = max_concurrent
        self._fleet_limit: int | None = None
        # monotonic: when this host must stop promoting / acting as leader unless renewed
        self.fresh_until = -math.inf
        self.lead_until = -math.inf
        # An operator drained this host (as of its last renewal): the registry refuses its promotions
        # (INV-DRAIN-STOPS-PROMOTION); this is what the queue's watch says it is held by.
        self.drained = False

    def renewed(self, fresh_until: float, *, leading: bool) -> None:
        """A renewal landed: fresh until ``fresh_until`` (monotonic, counted from its request), leading as long if
        it kept the lead."""
        self.fresh_until = fresh_until
        self.lead_until = fresh_until if leading else -math.inf

    def settle_limit(self, fleet_limit: int | None) -> None:
        """The fleet-wide limit recorded in the registry, when it differs from this host's (None: this host's)."""
        self._fleet_limit = fleet_limit

    @property
    def max_concurrent(self) -> int:
        """The fleet-wide limit this host promotes under."""
        return self._fleet_limit if self._fleet_limit is not None else self._own_limit

    @property
    def fresh(self) -> bool:
        """This host's last renewal is recent enough that its lease cannot have expired yet."""
        return trio.current_time() < self.fresh_until

    @property
    def leading(self) -> bool:
        """Its last renewal made it the leader, and is still fresh enough that its lease cannot have expired."""
        return trio.current_time() < self.lead_until

    def may_promote(self) -> bool:
        return self.standalone or self.fresh

    def may_lead(self) -> bool:
        """Whether the fleet's once-only duties (the webhook sender, retention) may run here."""
        return self.standalone or self.leading
