"""The cost cap: reserve before spending, so two workers cannot both take the last dollar."""

from __future__ import annotations

import dataclasses
from decimal import Decimal


@dataclasses.dataclass(frozen=True, slots=True)
class Reservation:
    amount_usd: Decimal


class CostLedger:
    """Modelled spend against a cap, in exact decimal dollars.

    Reservation and check are one synchronous step (no await between them), which is what makes
    it atomic among Trio tasks: claim before run. Spending exactly up to the cap is allowed.
    A reservation is committed when the provider call succeeded and released when it failed,
    because a failed call is modelled as not billed.
    """

    def __init__(self, cap_usd: Decimal) -> None:
        self.cap_usd = cap_usd
        self.spent_usd = Decimal(0)
        self.reserved_usd = Decimal(0)

    def try_reserve(self, amount_usd: Decimal) -> Reservation | None:
        if self.spent_usd + self.reserved_usd + amount_usd > self.cap_usd:
            return None
        self.reserved_usd += amount_usd
        return Reservation(amount_usd)

    def commit(self, reservation: Reservation) -> None:
        self.reserved_usd -= reservation.amount_usd
        self.spent_usd += reservation.amount_usd

    def release(self, reservation: Reservation) -> None:
        self.reserved_usd -= reservation.amount_usd
