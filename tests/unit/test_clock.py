"""builder.core.clock: the one UTC timestamp format."""

import re

from builder.core.clock import utc_stamp


def test_utc_stamp_of_an_epoch_drops_the_fraction():
    assert utc_stamp(1_800_000_000.7) == "2027-01-15T08:00:00Z"


def test_utc_stamp_of_now_is_whole_seconds_in_utc():
    assert re.fullmatch(r"20\d\d-\d\d-\d\dT\d\d:\d\d:\d\dZ", utc_stamp())
