"""The fleet's rules (ADR 0012), written once over the store port: each host's lease, the fleet's lead, drains,
forget, the fleet's settings, the pause of promotion (fleet-wide: one row, which a promotion reads); and the reads of
them. Leases are written and judged at the registry's lease clock
(``Store.lease_now``), read once the leases' lock is held (INV-LEASE-ON-REGISTRY-CLOCK).
"""

from __future__ import annotations

from dataclasses import asdict, replace
from datetime import datetime, timedelta

from ..domain import Conflict, HostForgotten, HostNotFound, to_iso
from . import _tables as tables
from ._tables import Store, host_of
from ._vocabulary import (
    PAUSED_BY_OPERATOR,
    WAKE_FREED,
    WAKE_PAUSE,
    WAKE_QUEUED,
    FleetSetting,
    Host,
    Lease,
    PauseState,
    Wakeup,
)


async def renew_lease(
    store: Store,
    host_id: str,
    boot_id: str,
    *,
    lease_s: float,
    lead: bool,
    succeeds: str | None = None,
    release: tuple[str, int] | None = None,
) -> Lease:
    """Register or renew host ``host_id`` as run by boot ``boot_id`` until now + ``lease_s`` at the registry's
    clock (a new boot of the same host id replaces the old one's row); with ``lead``, also take the fleet's lead
    when nobody holds it or its holder's lease expired, or keep it when this boot holds it. One atomic step: two
    hosts never both lead. A boot an operator forgot is refused: ``HostForgotten`` (INV-FORGET-IS-FENCED).
    ``succeeds``: a boot of this host id that is proved gone (``core._succession``): its lead is taken at once.
    ``release``: this code's release and contract level, recorded with the row. A drained host neither takes nor
    keeps the lead (``Lease.drained``)."""
    # One step for the host row and the lead, under the leases' lock: two hosts asking at once take turns and
    # never both lead (INV-ONE-LEADER).
    await store.lock(tables.LEASES)
    now = await store.lease_now()  # INV-LEASE-ON-REGISTRY-CLOCK: read once the lock is held
    expires = now + timedelta(seconds=lease_s)
    fence = (("host_id", "=", host_id), ("boot_id", "=", boot_id))
    if await store.count(tables.FORGOTTEN, fence):
        raise HostForgotten(host_id, boot_id)  # INV-FORGET-IS-FENCED: never a lease again
    before = await host_at(store, host_id, now)
    replaced = before if before is not None and before.boot_id != boot_id else None
    started = now if before is None or replaced is not None else before.started_at
    version, level = release if release is not None else (None, None)
    row = Host(host_id, boot_id, started, now, expires, now, release=version, contract_level=level)
    await store.put(tables.HOSTS, tables.host_row(row), ("host_id",))
    # INV-DRAINED-HANDS-OVER: a drained host neither takes nor keeps the lead; another takes it at its renewal.
    is_drained = host_id in await drained(store)
    await _pass_lead(store, host_id, boot_id, now, expires, lead=lead and not is_drained, succeeds=succeeds)
    host = await host_at(store, host_id, now)
    assert host is not None
    return Lease(host, await leader_at(store, now), replaced, drained=is_drained)


async def _pass_lead(
    store: Store, host_id: str, boot_id: str, now: datetime, expires: datetime, *, lead: bool, succeeds: str | None
) -> None:
    """The lead kept (renewed) or let go by its holder, or taken by this boot when its holder's lease expired or
    its holder is proved gone (``succeeds``: this host's own previous boot, by its data dir's lock)."""
    current = await leader_at(store, now)
    succeeded = current is not None and (current.host_id, current.boot_id) == (host_id, succeeds)
    if current is not None and (current.host_id, current.boot_id) == (host_id, boot_id):
        await put_leader(store, replace(current, last_seen_at=now, lease_expires_at=expires) if lead else None)
    elif lead and (current is None or not current.live or succeeded):
        # One row, replaced only once its holder's lease has expired or its holder is proved gone: two hosts never
        # both lead.
        await put_leader(store, Host(host_id, boot_id, now, now, expires, as_of=now))


async def put_leader(store: Store, host: Host | None) -> None:
    """The lead to ``host`` (None: to nobody)."""
    if host is None:
        await store.delete(tables.LEADER, ())
        return
    row = {**tables.host_row(host), "one": 1}
    row["since"] = row.pop("started_at")
    del row["release_version"], row["contract_level"]  # the hosts row keeps them
    await store.put(tables.LEADER, row, ("one",))


async def release_lease(store: Store, host_id: str, boot_id: str) -> None:
    """A clean shutdown: this boot's host lease and lead (if it holds them) end now."""
    now = await store.lease_now()
    mine = (("host_id", "=", host_id), ("boot_id", "=", boot_id))
    await store.update(tables.HOSTS, mine, {"lease_expires_at": now})
    await store.delete(tables.LEADER, mine)


async def forget_host(store: Store, host_id: str) -> Host | None:
    """The operator says host ``host_id`` will never come back. One atomic step (INV-FORGET-IS-FENCED): refused
    (``Conflict``) while its lease is live at the registry's clock; else its boot is fenced (a renewal by it is
    refused from now on), its row and its lead go. Its running rows are the caller's to end after this step
    (each guarded by its identity). The row removed, or None when there was none (nothing is fenced)."""
    await store.lock(tables.LEASES)  # INV-FORGET-IS-FENCED: no renewal lands between the check and the fence
    now = await store.lease_now()  # INV-LEASE-ON-REGISTRY-CLOCK
    host = await host_at(store, host_id, now)
    if host is not None and host.live:
        raise Conflict(
            f"host {host_id} holds a live lease until {to_iso(host.lease_expires_at)}: its jobs may be running; "
            "stop its supervisor first"
        )
    if host is not None:
        fenced = {"host_id": host_id, "boot_id": host.boot_id, "forgotten_at": now}
        await store.put(tables.FORGOTTEN, fenced, ("host_id", "boot_id"))
    for table in (tables.HOSTS, tables.LEADER, tables.DRAINS):
        await store.delete(table, (("host_id", "=", host_id),))
    # Its running rows are ended by the caller (ADR 0012): their slots are free for any host.
    await store.notify(Wakeup(WAKE_FREED, host_id=host_id))
    return host


async def set_drained(store: Store, host_id: str, drained: bool, *, by: str | None = None) -> bool:
    """Drain ``host_id`` (it promotes nothing from this step's commit on, and hands the lead over at its next
    renewal) or undrain it; whether anything changed. ``HostNotFound`` for a host that never registered (a typo)."""
    # INV-DRAIN-STOPS-PROMOTION: under the promotion's lock, so a promotion of that host's either committed
    # before this step or reads the drain after it: none starts on it once the drain is answered.
    await store.lock(tables.PROMOTION)
    here = (("host_id", "=", host_id),)
    known = await store.count(tables.HOSTS, here)
    is_drained = await store.count(tables.DRAINS, here) > 0
    if not known and not is_drained:
        raise HostNotFound(host_id)
    if drained == is_drained:
        return False
    if drained:
        await store.insert(tables.DRAINS, [{"host_id": host_id, "drained_at": store.now(), "drained_by": by}])
    else:
        await store.delete(tables.DRAINS, here)
        await store.notify(Wakeup(WAKE_QUEUED))  # its drainer (wherever the undrain came through) looks again
    return True


async def record_setting(store: Store, name: str, value: str, host_id: str, *, replace: bool) -> FleetSetting:
    """The fleet's value of setting ``name``: the one recorded first (``value``, by ``host_id``, when none was);
    with ``replace``, this one whatever was recorded (a host that starts alone)."""
    current = await setting(store, name)
    if replace or current is None:
        current = FleetSetting(name, value, host_id, store.now())
        await store.put(tables.SETTINGS, asdict(current), ("name",))  # a setting's fields are its row's columns
    return current


async def drop_settings(store: Store, prefix: str, recorded_before: datetime) -> int:
    """Remove the fleet settings named ``prefix...`` recorded before then (an expired bulk selection); how many."""
    # Names from ``prefix`` up to the next prefix (its last character + 1): a range, no pattern match needed.
    end = prefix[:-1] + chr(ord(prefix[-1]) + 1)
    span = (("name", ">=", prefix), ("name", "<", end), ("recorded_at", "<", recorded_before))
    return await store.delete(tables.SETTINGS, span)


# -- the pause of promotion, fleet-wide ---------------------------------------------------------------------


async def pause_state(store: Store) -> PauseState:
    """Whether promotion is paused, by whom and since when."""
    return await pause(store, lock=False)


async def pause(store: Store, *, lock: bool) -> PauseState:
    """``pause_state``, the queue's row held where a change is to follow (``lock``)."""
    return tables.pause_of(await store.select(tables.QUEUE, (), tables.Read(lock=lock)))


async def set_paused(store: Store, paused: bool, *, by: str) -> PauseState:
    """Pause or resume promotion (``by``: who asked); the state after it."""
    current = await pause(store, lock=True)
    # The operator's pause outranks a file's: paused already by a file, an operator's pause takes it over (since
    # when kept), so that only a resume ends it, never the file's removal (docs/operations.md, "Pausing").
    takes_over = paused and current.paused and by == PAUSED_BY_OPERATOR and current.by != PAUSED_BY_OPERATOR
    if current.paused == paused and not takes_over:
        return current
    if takes_over:
        state = PauseState(True, by, current.since)
    else:
        state = PauseState(True, by, store.now()) if paused else PauseState(False)
    await store.update(tables.QUEUE, (), {"paused": state.paused, "paused_by": state.by, "paused_at": state.since})
    await store.notify(Wakeup(WAKE_PAUSE))
    return state


# -- the reads ---------------------------------------------------------------------------------------------------


async def setting(store: Store, name: str) -> FleetSetting | None:
    """The recorded value of ``name`` (None: none), read only."""
    rows = await store.select(tables.SETTINGS, (("name", "=", name),))
    return FleetSetting(**rows[0]) if rows else None


async def host_at(store: Store, host_id: str, now: datetime) -> Host | None:
    rows = await store.select(tables.HOSTS, (("host_id", "=", host_id),))
    return host_of(rows[0], now) if rows else None


async def leader_at(store: Store, now: datetime) -> Host | None:
    """The lead's holder as of ``now`` (its ``started_at``: since when it leads)."""
    rows = await store.select(tables.LEADER)
    return host_of(rows[0], now) if rows else None


async def drained(store: Store) -> dict[str, datetime]:
    """The drained hosts, and since when."""
    return {row["host_id"]: row["drained_at"] for row in await store.select(tables.DRAINS)}


async def hosts(store: Store) -> list[Host]:
    """Every registered host, by host id, each with ``as_of`` the registry's clock at this read (read first in the
    same snapshot: each lease judged as of the moment the rows are as of, INV-LEASE-ON-REGISTRY-CLOCK)."""
    now = await store.lease_now()
    return [host_of(row, now) for row in await store.select(tables.HOSTS, (), tables.Read(order=("host_id",)))]


async def leader(store: Store) -> Host | None:
    """The host that holds the lead now (its lease may have expired: ``Host.live`` says, as of this read, at the
    registry's clock)."""
    return await leader_at(store, await store.lease_now())
