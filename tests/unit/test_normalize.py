import datetime as dt
import decimal
import json
import uuid

from sqlrl.db.sessions.normalize import normalize_rows, normalize_value


def test_documented_conversions():
    assert normalize_value(decimal.Decimal("10.00")) == 10 and isinstance(normalize_value(decimal.Decimal("10.00")), int)
    assert normalize_value(decimal.Decimal("2.5")) == 2.5
    assert normalize_value(dt.datetime(2020, 1, 31, 12, 0)) == "2020-01-31 12:00:00"
    assert normalize_value(dt.date(2020, 1, 31)) == "2020-01-31"
    assert normalize_value(dt.time(7, 5)) == "07:05:00"
    assert normalize_value(dt.timedelta(minutes=1, seconds=3)) == 63.0
    assert normalize_value(b"\x00\xff") == "0x00ff"
    assert normalize_value(memoryview(b"ab")) == "0x6162"
    u = uuid.UUID(int=5)
    assert normalize_value(u) == str(u)
    assert normalize_value({"b": 1, "a": [1, 2]}) == '{"a":[1,2],"b":1}'
    assert normalize_value([1, None]) == "[1,null]"
    for plain in (None, True, 3, 1.5, "x"):
        assert normalize_value(plain) is plain


def test_rows_are_hashable_json_tuples():
    rows = normalize_rows([[decimal.Decimal("1.5"), dt.date(2021, 1, 1), b"x"], (1, "a", None)])
    assert rows == [(1.5, "2021-01-01", "0x78"), (1, "a", None)]
    assert len(set(rows)) == 2
    json.dumps(rows)
