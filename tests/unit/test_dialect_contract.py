"""The declared engine contract (``sqlrl/db/dialects/contract.py``): registration refuses an
adapter that lacks a required method or implements half of an optional capability, naming what
is missing; a storage layout is held to what the adapter and admin implement; every registered
engine conforms; and the executor uses only the capabilities an adapter class declares."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from sqlrl.db import ErrorKind, Limits
from sqlrl.db.dialects import get_dialect, register_dialect
from sqlrl.db.dialects import base
from sqlrl.db.dialects.contract import (CAPABILITIES, AdapterContractError, AgentLogin, BulkLoad,
                                        Cancellable, CloneSource, DialectAdapter, ExactLexer,
                                        ReadOnlyAttestation, ServerAdmin, admin_class,
                                        check_adapter, check_admin, contract_of, methods_of)
from sqlrl.db.dialects.descriptor import (Dialect, FileCopy, ServerClone, ServerTransaction,
                                          dialects, registered)
from sqlrl.db.dialects.engines import POSTGRESQL, SQLITE
from sqlrl.db.provisioning import admin as provisioning_admin
from sqlrl.db.provisioning.scratch import SCRATCH
from sqlrl.db.url import parse_url
from sqlrl.db.sessions.executor import run_call
from sqlrl.db.types import SessionError


class _Whole:
    """Every required method; no capability."""

    isolation = "none"
    sqlglot_dialect = "sqlite"

    def connect(self, url: Any, limits: Any) -> Any:
        return None

    def begin(self, conn: Any, url: Any) -> Any:
        return None

    def end(self, conn: Any, state: Any) -> bool:
        return False

    def run(self, conn: Any, state: Any, statement: str, deadline: float) -> Any:
        return _Cursor()

    def ping(self, conn: Any) -> bool:
        return True

    def classify(self, exc: BaseException) -> ErrorKind:
        return ErrorKind.RUNTIME

    def denied(self, statement: Any) -> str | None:
        return None

    def close(self, conn: Any) -> None:
        pass


class _Cursor:
    description = (("x",),)

    def __init__(self) -> None:
        self.rows = [(1,)]

    def fetchmany(self, n: int) -> list[tuple[int]]:
        rows, self.rows = self.rows[:n], self.rows[n:]
        return rows

    def close(self) -> None:
        pass


@pytest.mark.parametrize("method", methods_of(DialectAdapter))
def test_an_adapter_missing_a_required_method_does_not_register(method: str) -> None:
    lacking = type("Lacking", (), {k: v for k, v in vars(_Whole).items() if k != method})
    with pytest.raises(AdapterContractError, match=rf"Lacking lacks required method\(s\) {method}\b"):
        register_dialect("contract_test")(lacking)


def test_an_adapter_without_an_isolation_name_does_not_register() -> None:
    nameless = type("Nameless", (_Whole,), {"isolation": None})
    with pytest.raises(AdapterContractError, match="Nameless must name its isolation"):
        register_dialect("contract_test")(nameless)


@pytest.mark.parametrize("capability", [c for c in CAPABILITIES if len(methods_of(c)) > 1],
                         ids=lambda c: c.__name__)
def test_half_a_capability_does_not_register(capability: type) -> None:
    first, *rest = methods_of(capability)
    half = type("Half", (_Whole,), {first: lambda self, *a: None})
    with pytest.raises(AdapterContractError,
                       match=rf"Half implements half of the capability {capability.__name__}: "
                             rf"it lacks {', '.join(rest)}"):
        register_dialect("contract_test")(half)


def test_a_hook_offered_by_getattr_is_no_capability() -> None:
    """Capabilities are read off the class: a ``__getattr__`` that answers every name declares
    nothing, so the executor never calls what the class does not define."""
    called: list[str] = []

    class Dynamic(_Whole):
        def __getattr__(self, name: str) -> Any:
            return lambda *a: called.append(name)

    assert contract_of(Dynamic).capabilities == frozenset()
    r = run_call(Dynamic(), None, None, "SELECT 1", Limits(attest=True))
    assert r.ok and r.rows == ((1,),) and r.read_only is None and called == []


def test_the_executor_calls_the_declared_capabilities() -> None:
    seen: list[str] = []

    class Attesting(_Whole):
        def observe(self, conn: Any, state: Any) -> None:
            seen.append("observe")

        def read_only(self, conn: Any, state: Any, cursor: Any) -> bool:
            seen.append("read_only")
            return True

    assert contract_of(Attesting).capabilities == {ReadOnlyAttestation}
    r = run_call(Attesting(), None, None, "SELECT 1; SELECT 2", Limits(attest=True))
    assert r.ok and r.read_only is True and seen == ["observe", "read_only"] * 2
    seen.clear()
    assert run_call(Attesting(), None, None, "SELECT 1", Limits()).read_only is None and seen == []


def test_a_storage_layout_needs_its_parts() -> None:
    with pytest.raises(ValueError, match="storage server-clone needs an admin class"):
        Dialect(name="x", display_name="X", sqlglot="postgres", adapter="m", storage=ServerClone())
    with pytest.raises(ValueError, match="storage must be one of FileCopy"):
        Dialect(name="x", display_name="X", sqlglot="postgres", adapter="m", storage="file")
    with pytest.raises(ValueError, match="at least one file name suffix"):
        FileCopy(suffixes=())


class _SqliteOnAServer(_Whole):
    """A server-clone engine's adapter that cannot log agents in."""


register_dialect("contract_noagent")(_SqliteOnAServer)


def test_a_server_clone_engine_needs_agent_login_and_a_whole_admin() -> None:
    engine = replace(POSTGRESQL, name="contract_noagent", aliases=(), adapter=__name__)
    with registered(engine):
        with pytest.raises(AdapterContractError, match=r"storage server-clone needs its adapter "
                           r".*_SqliteOnAServer to implement AgentLogin \(open_agent, close_agent\)"):
            get_dialect("contract_noagent")

    class HalfAdmin:
        def connect(self, url: Any, database: Any = None) -> Any: ...

    with pytest.raises(AdapterContractError, match="HalfAdmin lacks prepare_server, create_database"):
        check_admin(HalfAdmin, load=False)


class _Lexing(_Whole):
    """Every required method and an exact lexer."""

    def lex(self, conn: Any, sql: str) -> list[Any]:
        return []


class _LoggingIn(_Whole):
    """Every required method and AgentLogin, which a file engine never uses."""

    def open_agent(self, *args: Any) -> Any: ...

    def close_agent(self, *args: Any) -> Any: ...


register_dialect("contract_lexnone")(_Lexing)
register_dialect("contract_nolex")(type("_NoLex", (_Whole,), {}))  # a subclass: registering sets its name
register_dialect("contract_filelogin")(_LoggingIn)


@pytest.mark.parametrize("name, adapter_lexes, named", [
    ("contract_lexnone", True, "implements ExactLexer \\(lex\\) but its descriptor names no lexer"),
    ("contract_nolex", False, "does not implement ExactLexer \\(lex\\) but its descriptor names the lexer "
                              "'sqlrl.db.dialects.sqlite_lex'"),
])
def test_an_exact_lexer_and_the_descriptors_lexer_come_together(name: str, adapter_lexes: bool, named: str) -> None:
    engine = replace(SQLITE, name=name, aliases=(), adapter=__name__,
                     lexer=None if adapter_lexes else SQLITE.lexer)
    with registered(engine):
        with pytest.raises(AdapterContractError, match=f"{name}: its adapter .* {named}"):
            get_dialect(name)


def test_a_file_engine_adapter_that_logs_agents_in_is_refused() -> None:
    with registered(replace(SQLITE, name="contract_filelogin", aliases=(), adapter=__name__, lexer=None)):
        with pytest.raises(AdapterContractError, match="implements AgentLogin, which only a server-clone engine"):
            get_dialect("contract_filelogin")


def test_an_admin_missing_a_method_is_refused_before_the_first_session() -> None:
    engine = replace(POSTGRESQL, name="contract_badadmin", aliases=(),
                     admin=f"{__name__}:_NoSeal")
    with registered(engine):
        with pytest.raises(AdapterContractError, match=r"_NoSeal lacks seal \(ServerAdmin"):
            admin_class(engine)
        with pytest.raises(AdapterContractError, match=r"_NoSeal lacks seal \(ServerAdmin"):
            provisioning_admin.admin_ops("contract_badadmin")  # provisioning's one way to it
    with pytest.raises(ValueError, match="'sqlite' has no admin class"):
        admin_class(SQLITE)
    with pytest.raises(ValueError, match="names no class"):
        admin_class(replace(POSTGRESQL, admin=f"{__name__}:methods_of"))


class _NoSeal:
    pass


for _name in set(methods_of(ServerAdmin)) | set(methods_of(BulkLoad)):
    if _name != "seal":
        setattr(_NoSeal, _name, lambda self, *a: None)


# --- conformance: every registered engine ------------------------------------------------------

@pytest.mark.parametrize("engine", dialects(), ids=lambda d: d.name)
def test_every_registered_engine_conforms(engine: Dialect) -> None:
    adapter = get_dialect(engine.name)  # checks the storage layout against adapter and admin
    contract = check_adapter(type(adapter))
    assert contract == contract_of(adapter) and isinstance(adapter, DialectAdapter)
    assert isinstance(adapter.isolation, str) and adapter.isolation
    for capability in contract.capabilities:  # whole, and callable on the instance
        assert all(callable(getattr(adapter, m)) for m in methods_of(capability))
    assert isinstance(engine.storage, (FileCopy, ServerClone, ServerTransaction))
    if isinstance(engine.storage, ServerClone):
        assert contract.has(AgentLogin)
        admin = admin_class(engine)
        check_admin(admin, load=engine.load is not None)
    else:
        assert not contract.has(AgentLogin)
    if isinstance(engine.storage, FileCopy):
        assert engine.file_based and engine.file_url("/d/x").startswith(f"{engine.name}:///")
        assert engine.storage.path_in("/r", "db").name.startswith("db")
    else:
        assert not engine.file_based
        with pytest.raises(ValueError, match="are not files"):
            engine.file_url("/d/x")
    # the exact lexer a descriptor names is what the adapter lexes with, and vice versa
    assert contract.has(ExactLexer) == (engine.lexer is not None)


BUILTINS = ("sqlite", "postgresql", "mysql", "mssql", "oracle")  # engines.py's; an engine added there is not one


def test_the_builtins_declare_what_they_implement() -> None:
    builtins = [d for d in dialects() if d.name in BUILTINS]
    caps = {d.name: {c.__name__ for c in contract_of(get_dialect(d.name)).capabilities}
            for d in builtins}
    assert caps == {
        "sqlite": {"ExactLexer", "ReadOnlyAttestation"},
        "postgresql": {"ExactLexer", "Cancellable", "BatchBound", "ReadOnlyAttestation",
                       "AgentLogin"},
        "mysql": {"ExactLexer", "Cancellable", "Abandoning", "AgentLogin"},
        "mssql": {"ExactLexer"}, "oracle": {"ExactLexer"}}
    assert [d.storage.kind for d in builtins] == [
        "file-copy", "server-clone", "server-clone", "server-transaction", "server-transaction"]
    assert SQLITE.storage.sqlite_file and Cancellable in CAPABILITIES


def test_an_engine_whose_module_registers_no_adapter_is_a_clear_error() -> None:
    with registered(replace(SQLITE, name="contract_noclass", aliases=(), adapter="json")):
        with pytest.raises(SessionError, match="registers no adapter named 'contract_noclass'"):
            get_dialect("contract_noclass")


# --- a server-clone adapter's clones: provisioning registers itself, the adapter never imports it ---

class _Clones:
    """A clone source that records what it is asked for (no server)."""

    def __init__(self) -> None:
        self.calls: list[tuple[Any, ...]] = []

    def take(self, url: Any, limits: Any, adapter: Any) -> Any:
        self.calls.append(("take", url.database, limits, adapter))
        return "agent-connection"

    def give_back(self, conn: Any) -> bool:
        self.calls.append(("give_back", conn))
        return True


@pytest.fixture
def clones(monkeypatch: pytest.MonkeyPatch) -> _Clones:
    """A recording clone source for one test; the scratch manager's registration comes back."""
    monkeypatch.setattr(base, "_CLONES", [])
    source = _Clones()
    base.use_clone_source(source)
    return source


def test_provisioning_registers_the_scratch_manager_as_the_clone_source() -> None:
    assert base.clone_source() is SCRATCH
    assert all(callable(getattr(SCRATCH, m)) for m in methods_of(CloneSource))


@pytest.mark.parametrize("engine", [d for d in dialects() if isinstance(d.storage, ServerClone)],
                         ids=lambda d: d.name)
def test_a_server_clone_adapter_takes_and_gives_back_through_the_registered_source(
        engine: Dialect, clones: _Clones) -> None:
    adapter = get_dialect(engine.name)
    limits = Limits(timeout_s=3.0)
    conn = adapter.connect(parse_url(f"{engine.name}://admin:pw@127.0.0.1:1/base_db"), limits)
    adapter.close(conn)
    assert conn == "agent-connection"
    assert clones.calls == [("take", "base_db", limits, adapter), ("give_back", conn)]


def test_a_clone_source_missing_a_method_is_refused_and_none_is_a_clear_error(
        monkeypatch: pytest.MonkeyPatch) -> None:
    class TakeOnly:
        def take(self, url: Any, limits: Any, adapter: Any) -> Any: ...

    monkeypatch.setattr(base, "_CLONES", [])
    with pytest.raises(AdapterContractError, match=r"TakeOnly lacks give_back \(CloneSource"):
        base.use_clone_source(TakeOnly())  # type: ignore[arg-type]
    with pytest.raises(SessionError, match="no clone source for server-clone sessions"):
        get_dialect("postgresql").connect(parse_url("postgresql://a@127.0.0.1:1/b"), Limits())


def test_an_adapter_is_made_per_descriptor() -> None:
    """A descriptor replaced by name gets an adapter of its own; one unregistered is unknown."""
    engine = replace(SQLITE, name="contract_cache", aliases=(), lexer=None)  # _Whole has no lex
    register_dialect("contract_cache")(type("Cached", (_Whole,), {}))
    with registered(engine):
        first = get_dialect("contract_cache")
        assert get_dialect("contract_cache") is first
    with pytest.raises(SessionError, match="unknown dialect 'contract_cache'"):
        get_dialect("contract_cache")
    with registered(replace(engine)):
        assert get_dialect("contract_cache") is not first
