"""The send processor stores the producer's own properties text (WAIT removed, the broker's
entries appended) instead of re-encoding the decoded dict: byte-identical to the dict path
whenever it is used, and not used when it could differ."""

from __future__ import annotations

import pytest

from broker.processors.send import reuse_properties
from common.message import PROPERTY_WAIT, decode_properties, encode_properties

SUFFIX = "CLUSTER\x01DefaultCluster"
ADDED = {"CLUSTER": "DefaultCluster"}


def reference(raw: str) -> str:
    """What the dict path stores: decode, add the broker's entries, drop WAIT, encode."""
    props = decode_properties(raw)
    props.update(ADDED)
    return encode_properties({k: v for k, v in props.items() if k != PROPERTY_WAIT})


CASES = [
    "",
    "WAIT\x01true",
    "UNIQ_KEY\x01AB12\x02WAIT\x01true\x02TAGS\x01TagA",
    "WAIT\x01true\x02UNIQ_KEY\x01AB12",
    "UNIQ_KEY\x01AB12\x02WAIT\x01false",
    "KEYS\x01k1 k2\x02TAGS\x01t",
    "KEYS\x01a\x01WAIT\x01true\x02TAGS\x01t",  # a value holding \x01 and the text "WAIT\x01true"
    "KEYS\x01xWAIT\x01true\x02WAIT\x01true",
    "A\x011\x02A\x012",  # duplicate name: the dict decides
    "A\x011\x02\x02B\x012",  # empty segment
    "A\x011\x02",  # trailing separator (Java's encoder writes one)
    "\x01x\x02B\x012",  # empty name
    "A\x01\x02B\x012",  # empty value
    "WAIT\x01true\x02WAIT\x01false",
    "UNIQ_KEY\x01é\x02TAGS\x01ü",
]


@pytest.mark.parametrize("raw", CASES)
def test_reused_text_equals_the_dict_encoding_or_is_refused(raw: str) -> None:
    props = decode_properties(raw)
    got = reuse_properties(raw, props, SUFFIX)
    if got is not None:
        assert got == reference(raw)


def test_the_usual_producer_text_is_reused() -> None:
    for raw in CASES[:8]:
        assert reuse_properties(raw, decode_properties(raw), SUFFIX) is not None, raw
    for raw in CASES[8:14]:
        assert reuse_properties(raw, decode_properties(raw), SUFFIX) is None, raw
