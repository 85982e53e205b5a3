"""The waiting line of a full deployment (gateway/slots.py ``SlotQueue``), in-process."""
from __future__ import annotations

import pytest

from sequence_ai_server.common.errors import ApiError
from sequence_ai_server.gateway.slots import SlotQueue

FULL = dict(capacity=1, held=1, on_full="queue", queue_timeout_s=300.0, mean_session_s=10.0)


def _queued(q: SlotQueue, holder: str, ticket=None, now=0.0, **kw) -> dict:
    with pytest.raises(ApiError) as err:
        q.admit("one", holder, ticket, now=now, **{**FULL, **kw})
    assert err.value.code == "queued", err.value.detail
    return err.value.details


def test_a_ticket_keeps_its_place_only_for_the_robot_that_queued_it():
    q = SlotQueue()
    a = _queued(q, "key-a")
    assert a["position"] == 1
    b = _queued(q, "key-b", ticket=a["ticket"], now=1.0)       # B presents A's ticket
    assert b["position"] == 2 and b["ticket"] != a["ticket"]    # a place of its own, behind A
    assert _queued(q, "key-b", ticket=a["ticket"], now=1.5)["ticket"] == b["ticket"]   # and only one
    # the slot frees: A, first in line, gets it; B with A's ticket number does not
    with pytest.raises(ApiError) as err:
        q.admit("one", "key-b", a["ticket"], now=2.0, **{**FULL, "held": 0})
    assert err.value.code == "queued"
    q.admit("one", "key-a", a["ticket"], now=2.0, **{**FULL, "held": 0})
    assert q.leave(b["ticket"], "key-a") is False               # nor can A drop B's place
    assert q.leave(b["ticket"], "key-b") is True


def test_a_refusal_for_another_reason_than_slots_says_it_and_carries_its_numbers():
    q = SlotQueue()
    why, numbers = "another robot would make the robots of worker one late", {"admission": {"worst_ms": 474.0}}
    with pytest.raises(ApiError) as err:
        q.admit("one", "key-a", None, **{**FULL, "on_full": "reject", "capacity": 5, "held": 5}, reason=why,
                extra=numbers)
    assert err.value.code == "deployment_full" and why in err.value.detail and "every slot" not in err.value.detail
    assert err.value.details == {"slots": 5, "held": 5, "admission": {"worst_ms": 474.0}}
    queued = _queued(q, "key-a", reason=why, extra=numbers)
    assert queued["admission"] == {"worst_ms": 474.0} and queued["position"] == 1
