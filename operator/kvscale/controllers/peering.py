"""Who is active among several operators sharing a kopf peering (pure).

kopf pauses an operator's watch handlers while a live peer in the peering object has a higher or the
same priority (kopf/_core/engines/peering.py, `process_peering_event`). kvscale's own resync loop is
not a kopf handler, so kopf cannot pause it: it asks this function, with the same rule, before each
pass. Otherwise a standby replica would autoscale and write status beside the active one.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

KOPF_DEFAULT_LIFETIME_S = 60  # what kopf assumes for a peer that does not say
# A peer whose keep-alive is older than this is dead, and a standby takes over: the failover bound.
# kopf's default is 60 s; its keep-alives come every lifetime minus 5-10 s.
DEFAULT_PEERING_LIFETIME_S = 30


@dataclass(frozen=True)
class PeerIdentity:
    """This operator as it registers in the peering object."""

    identity: str
    priority: int


def _parse_time(value: Any) -> datetime | None:
    try:
        return datetime.fromisoformat(str(value).replace("Z", "+00:00"))
    except ValueError:
        return None


def is_active(peers: Mapping[str, Any] | None, me: PeerIdentity, now: datetime) -> bool:
    """Whether `me` is the one active operator, given the peering object's `status` (identity ->
    {priority, lifetime, lastseen}): no live peer has a priority at least as high."""
    for identity, info in (peers or {}).items():
        if identity == me.identity or not isinstance(info, Mapping):
            continue
        seen = _parse_time(info.get("lastseen"))
        lifetime = timedelta(seconds=int(info.get("lifetime", KOPF_DEFAULT_LIFETIME_S)))
        if seen is not None and seen + lifetime <= now:
            continue  # dead: its keep-alive lapsed (kopf counts a peer without lastseen as alive)
        if int(info.get("priority", 0)) >= me.priority:
            return False
    return True
