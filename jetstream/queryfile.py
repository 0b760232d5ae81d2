"""Query files: a Python module that defines ``query``, read from a path or from its text."""

from __future__ import annotations

from pathlib import Path

from jetstream.dsl import Query
from jetstream.errors import JetstreamError, PlanError

__all__ = ["load_query", "query_from_source"]


def load_query(path: str | Path) -> Query:
    """The ``query`` the module at ``path`` defines; raises PlanError naming what is wrong."""
    p = Path(path)
    if not p.is_file():
        msg = f"{p}: no such query file"
        raise PlanError(msg)
    return query_from_source(p.read_text(encoding="utf-8"), str(p))


def query_from_source(source: str, origin: str = "<query>") -> Query:
    """The ``query`` that the module text ``source`` defines (``origin`` names it in errors).

    The text is run as Python, so it is trusted code: the controller runs only what its
    authenticated users submit.
    """
    namespace: dict[str, object] = {"__name__": "jetstream_query", "__file__": origin}
    try:
        exec(compile(source, origin, "exec"), namespace)
    except JetstreamError as e:
        msg = f"{origin}: {e}"
        raise PlanError(msg) from None
    except SyntaxError as e:
        msg = f"{origin}:{e.lineno}: syntax error: {e.msg}"
        raise PlanError(msg) from None
    except Exception as e:
        msg = f"{origin}: running the query file raised {type(e).__name__}: {e}"
        raise PlanError(msg) from None
    query = namespace.get("query")
    if not isinstance(query, Query):
        found = "nothing" if query is None else f"a {type(query).__name__}"
        msg = f"{origin}: the module must assign a js.Query to the name `query`, found {found}"
        raise PlanError(msg)
    return query
