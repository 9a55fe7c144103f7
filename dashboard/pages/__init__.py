"""The dashboard's pages (Dash pages): one module per page, each owning its layout, callbacks and page data.

Every page module has ``PATH``, ``NAME``, ``layout(**query)`` and ``register(app, store, live)``
(its callbacks, bound to one app's data store). Pages are registered by explicit module name
(:func:`register_pages`), so they work when installed and no folder is scanned. Layouts run
per request and read the serving app's :class:`AppState` (:func:`state`), never a global app.
Component ids are prefixed by page (``overview-…``, ``timeline-…``); the frame's by ``app-``.
Pages may import the store, stats, page data, figures and components; never each other.
"""
from __future__ import annotations

import importlib
from dataclasses import dataclass

#: Page modules in navigation order.
PAGES = ("overview", "timeline", "spike", "frontier", "sources")
#: Flask ``extensions`` key under which the app keeps its :class:`AppState`.
STATE_KEY = "mixdiag"


@dataclass(frozen=True)
class AppState:
    """What a page layout may read while serving: the config, the data store and the live follower."""

    config: object
    store: object
    live: object | None


def state() -> AppState:
    """The :class:`AppState` of the app serving the current request."""
    import flask

    return flask.current_app.extensions[STATE_KEY]


def modules() -> list:
    """The page modules, in navigation order."""
    return [importlib.import_module(f"{__name__}.{p}") for p in PAGES]


def register_pages(app, store, live) -> None:
    """Register every page with Dash (``use_pages=True`` app) and bind its callbacks to ``app``."""
    import dash

    app.server.extensions[STATE_KEY] = AppState(store.config, store, live)
    for order, mod in enumerate(modules()):
        dash.register_page(mod.__name__, path=mod.PATH, name=mod.NAME, order=order, layout=mod.layout,
                           title="mixdiag")
        mod.register(app, store, live)
