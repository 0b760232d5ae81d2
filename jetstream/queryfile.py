"""Query files: a Python module that defines ``query``, read from a path or from its text.

Only the user's side runs one (``submit``, ``run``, ``explain``, ``local``...): what travels
is the query's plan."""

from __future__ import annotations

from pathlib import Path

from jetstream.dsl import Query
from jetstream.errors import JetstreamError, PlanError
from jetstream.tables import relative_to

__all__ = ["load_query", "query_from_source"]


def load_query(path: str | Path) -> Query:
    """The ``query`` the module at ``path`` defines; raises PlanError naming what is wrong."""
    p = Path(path)
    if not p.is_file():
        msg = f"{p}: no such query file"
        raise PlanError(msg)
    try:
        source = p.read_text(encoding="utf-8")
    except OSError as e:
        msg = f"{p}: cannot read the query file: {e.strerror or e}"
        raise PlanError(msg) from None
    except UnicodeDecodeError as e:
        msg = f"{p}: cannot read the query file: not UTF-8 ({e.reason} at byte {e.start})"
        raise PlanError(msg) from None
    with relative_to(p.resolve().parent):  # its tables' paths start next to it
        return query_from_source(source, str(p))


def query_from_source(source: str, origin: str = "<query>") -> Query:
    """The ``query`` that the module text ``source`` defines (``origin`` names it in errors).

    The text is run as Python, here: the CLI runs a query file once, on the user's side, and
    sends its plan (see :mod:`jetstream.planwire`); the controller and the sites never run it.
    Whatever it raises (an exit too) becomes a PlanError; only KeyboardInterrupt goes
    through.
    """
    namespace: dict[str, object] = {"__name__": "jetstream_query", "__file__": origin}
    try:
        code = compile(source, origin, "exec")
    except ValueError as e:  # a NUL byte: SyntaxError since 3.11.4 (and 3.12), before that this
        msg = f"{origin}: syntax error: {e}"
        raise PlanError(msg) from None
    except SyntaxError as e:
        line = f":{e.lineno}" if e.lineno else ""
        msg = f"{origin}{line}: syntax error: {e.msg}"
        raise PlanError(msg) from None
    try:
        exec(code, namespace)
    except JetstreamError as e:
        msg = f"{origin}: {_text(e)}"
        raise PlanError(msg) from None
    except SyntaxError as e:  # one the file raises itself, e.g. from its own compile()
        line = f":{e.lineno}" if e.lineno else ""
        msg = f"{origin}{line}: syntax error: {e.msg}"
        raise PlanError(msg) from None
    except SystemExit as e:  # e.g. a script's sys.exit() must not end the controller
        msg = f"{origin}: the query file called exit({_text(e)}) instead of defining `query`"
        raise PlanError(msg) from None
    except KeyboardInterrupt:
        raise
    except BaseException as e:
        msg = f"{origin}: running the query file raised {type(e).__name__}: {_text(e)}"
        raise PlanError(msg) from None
    query = namespace.get("query")
    if not isinstance(query, Query):
        found = "nothing" if query is None else f"a {type(query).__name__}"
        msg = f"{origin}: the module must assign a js.Query to the name `query`, found {found}"
        raise PlanError(msg)
    return query


def _text(error: BaseException) -> str:
    """What ``error`` says, even when its ``__str__`` is broken (the query file defined it)."""
    try:
        return str(error)
    except Exception:
        return f"<{type(error).__name__} that cannot say what it is>"
