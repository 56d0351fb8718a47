"""The CA rotation's states (laminar_operator.ca_rotation): what the Secret holds at each step,
what is trusted and what signs, and what each step waits for."""

from __future__ import annotations

import datetime

import pytest

from laminar import certs
from laminar.client import NodeTls
from laminar_operator import ca_rotation
from laminar_operator.ca_rotation import IDLE, RETIRING, TRUSTING, CaState


@pytest.fixture(scope="module")
def idle() -> CaState:
    return CaState.new(certs.make_ca("old"))


def test_a_rotation_trusts_the_new_ca_then_signs_with_it_then_drops_the_old(
    idle: CaState,
) -> None:
    old = certs.fingerprint(idle.signer.cert_pem)
    assert idle.phase == IDLE and idle.fingerprints == [old]

    trusting = idle.begin("new")
    assert trusting.phase == TRUSTING
    assert trusting.next is not None
    new = certs.fingerprint(trusting.next.cert_pem)
    assert trusting.signer == idle.signer  # the old CA still signs
    assert trusting.fingerprints == [old, new]  # both are published

    retiring = trusting.promote()
    assert retiring.phase == RETIRING
    assert retiring.signer == trusting.next and retiring.fingerprints == [new, old]

    done = retiring.retire()
    assert done.phase == IDLE and done.signer == trusting.next and done.fingerprints == [new]
    with pytest.raises(ValueError, match="no CA to promote"):
        done.promote()


def test_every_state_survives_its_secret(idle: CaState) -> None:
    """The Secret is the state: an operator that restarts reads back the same step."""
    trusting = idle.begin("new")
    for state in (idle, trusting, trusting.promote(), trusting.promote().retire()):
        data = state.to_data()
        assert ("next.crt" in data) == (state.phase == TRUSTING)
        assert CaState.from_data(data) == state
    with pytest.raises(ValueError):
        CaState.from_data({"ca.crt": idle.to_data()["ca.crt"]})  # no key
    with pytest.raises(ValueError):
        CaState.from_data({"ca.crt": "bm90IGEgY2VydGlmaWNhdGU=", "ca.key": "a2V5"})


def test_a_rotation_is_asked_for_once_per_value_or_when_the_ca_nears_its_end(
    idle: CaState,
) -> None:
    assert ca_rotation.rotation_reason(idle, None, None) is None
    assert "asked for" in (ca_rotation.rotation_reason(idle, "2026-11-24", None) or "")
    assert ca_rotation.rotation_reason(idle, "2026-11-24", "2026-11-24") is None  # done once
    assert ca_rotation.rotation_reason(idle.begin("new"), "again", "2026-11-24") is None  # busy
    short = CaState.new(certs.make_ca("short", datetime.timedelta(days=30)))
    assert ca_rotation.rotation_reason(short, None, None) is None
    later = datetime.datetime.now(datetime.UTC) + datetime.timedelta(days=21)
    assert "expires" in (ca_rotation.rotation_reason(short, None, None, later) or "")


def _report(node: str, fingerprint: str = "", trusted: tuple[str, ...] = ()) -> NodeTls:
    return NodeTls(node, True, fingerprint=fingerprint, trusted_cas=trusted)


def test_each_step_waits_for_every_alive_broker(idle: CaState) -> None:
    trusting = idle.begin("new")
    assert trusting.next is not None
    old, new = certs.fingerprint(idle.signer.cert_pem), certs.fingerprint(trusting.next.cert_pem)
    reports: list[NodeTls | str] = [_report("n1", "c1", (old, new)), _report("n2", "c1", (old,))]
    assert ca_rotation.waiting_for(trusting, reports, "c1") == ["n2: does not trust the new CA yet"]
    assert ca_rotation.waiting_for(trusting, [*reports[:1], "n3: unreachable"], "c1") == [
        "n3: unreachable"
    ]
    assert ca_rotation.waiting_for(trusting, [NodeTls("n4", False)], "c1") == ["n4: TLS off"]
    assert ca_rotation.waiting_for(trusting, reports[:1], "c1") == []

    retiring = trusting.promote()
    serving = [_report("n1", "c2", (new, old)), _report("n2", "c1", (new, old))]
    assert ca_rotation.waiting_for(retiring, serving, "c2") == [
        "n2: not serving the new CA's certificate yet"
    ]
    assert len(ca_rotation.waiting_for(retiring, serving[:1], None)) == 1  # not issued yet
    assert ca_rotation.waiting_for(retiring, serving[:1], "c2") == []
