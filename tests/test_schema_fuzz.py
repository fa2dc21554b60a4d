"""Every well-formed but wrong message generated from the schema is refused at decode, with an
error that names the field; every valid example passes."""
from __future__ import annotations

import pytest

from fednet.protocol import MsgKind, ProtocolError, decode, encode
from fednet.protocol.schema import BODIES, parse_client
from tests.fuzz_schema import header, schema_attacks, wrong_bodies, _raw
from tests.schema_examples import msg


@pytest.mark.parametrize("kind", list(MsgKind))
def test_every_kind_has_a_schema_and_its_example_passes(kind):
    assert kind in BODIES
    out = decode(encode(msg(kind)))
    assert out.body == msg(kind).body


@pytest.mark.parametrize("kind", list(MsgKind))
def test_every_wrong_field_of_every_kind_is_refused_naming_it(kind):
    n = 0
    for what, body in wrong_bodies(kind):
        frames = _raw(header(kind, "c0000", "r", body), [])
        if frames is None:
            continue
        with pytest.raises(ProtocolError) as e:
            decode(frames)
        n += 1
        assert kind.name in str(e.value) or "key" in str(e.value), (what, str(e.value))
    assert n >= 4


def test_generated_attacks_are_all_refused_and_many():
    attacks = list(schema_attacks())
    assert len(attacks) > 300
    for what, frames in attacks:
        with pytest.raises(ProtocolError):
            decode(frames)
            pytest.fail(f"accepted: {what}")


@pytest.mark.parametrize("name, cid", [("c0007", 7), ("c1234567", 1234567), ("c0000", 0)])
def test_client_names_parse(name, cid):
    assert parse_client(name) == cid


@pytest.mark.parametrize("name", ["c٠٠٠١", "c00001", "c-001", "c 001", "c001", "C0001", "c0001 ",
                                  "c²²²²", "server", "", "c12345678"])
def test_client_names_are_strict(name):
    assert parse_client(name) is None
