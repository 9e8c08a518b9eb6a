"""A 0-byte SQLite file is a valid empty database: sessions open on it, work in scratch, and leave
the file untouched."""

from sqlrl.db import SessionPool, open_session


def test_sessions_on_an_empty_sqlite_file(tmp_path) -> None:
    path = tmp_path / "empty.sqlite"
    path.write_bytes(b"")
    url = f"sqlite:///{path}"
    with open_session(url) as s:
        assert s.execute("SELECT COUNT(*) FROM sqlite_master").rows == ((0,),)
        assert s.execute("CREATE TABLE t(x); INSERT INTO t VALUES (1); SELECT x FROM t").rows == ((1,),)
    with SessionPool() as pool:  # a reused pooled connection reloads the (empty) base
        for _ in range(2):
            s = pool.session(url)
            assert s.execute("SELECT COUNT(*) FROM sqlite_master").rows == ((0,),)
            s.execute("CREATE TABLE t(x)")
            s.close()
    assert path.stat().st_size == 0
