"""Who is active among operators sharing a kopf peering: kopf's own rule, applied to kvscale's resync loop."""

from datetime import UTC, datetime, timedelta

from kvscale.controllers.peering import PeerIdentity, is_active

NOW = datetime(2026, 1, 5, 9, 0, 0, tzinfo=UTC)
ME = PeerIdentity(identity="kvscale-0", priority=500)


def peer(priority: int, seen_s_ago: float, lifetime_s: int = 30) -> dict[str, object]:
    return {"priority": priority, "lifetime": lifetime_s,
            "lastseen": (NOW - timedelta(seconds=seen_s_ago)).isoformat()}


def test_alone_or_highest_is_active() -> None:
    assert is_active(None, ME, NOW)
    assert is_active({ME.identity: peer(500, 1)}, ME, NOW)  # itself does not count
    assert is_active({ME.identity: peer(500, 1), "kvscale-1": peer(499, 1)}, ME, NOW)


def test_a_live_peer_with_a_higher_or_equal_priority_makes_it_standby() -> None:
    assert not is_active({"kvscale-1": peer(501, 1)}, ME, NOW)
    assert not is_active({"kvscale-1": peer(500, 1)}, ME, NOW)  # kopf pauses both on a tie
    assert not is_active({"kvscale-1": {"priority": 900}}, ME, NOW)  # no lastseen: kopf counts it alive


def test_a_dead_peer_hands_over() -> None:
    """A peer is dead once lastseen + lifetime has passed: a SIGKILLed active's last keep-alive."""
    assert not is_active({"kvscale-1": peer(900, seen_s_ago=29, lifetime_s=30)}, ME, NOW)
    assert is_active({"kvscale-1": peer(900, seen_s_ago=30, lifetime_s=30)}, ME, NOW)
    assert is_active({"kvscale-1": peer(900, seen_s_ago=1, lifetime_s=0)}, ME, NOW)  # left cleanly
    assert is_active({"kvscale-1": "garbage"}, ME, NOW)
