"""ipywidgets: widgets and ``interact``/``interactive``.

A widget is a Python object plus a model in the browser, linked by a comm of this process; the
comm cannot travel, so a widget is saved as its class and its user-settable synced traits and
restored as a new widget with those values (a new comm; the frontend shows it once displayed
again). ``interactive`` (what ``@interact`` hangs on the function it wraps, as ``f.widget``) is
rebuilt from its function and its controls, as the notebook built it: it runs the function once,
as it did then. Python callbacks registered with ``observe`` on plain widgets are not kept.
"""

from __future__ import annotations

from typing import Any

from . import register

_KEEP_PRIVATE = frozenset({"_dom_classes"})  # set by add_class(): user state despite the "_"


def _widget_state(w: Any) -> dict[str, Any]:
    traits = w.traits()
    state = {}
    for name in w.keys:
        if name.startswith("_") and name not in _KEEP_PRIVATE:
            continue
        t = traits.get(name)
        if t is None or t.read_only:
            continue
        state[name] = getattr(w, name)
    return state


def _rebuild_widget(cls: type, state: dict[str, Any]) -> Any:
    return cls(**state)


def _rebuild_interactive(
    cls: type, f: Any, options: dict[str, Any], controls: dict[str, Any]
) -> Any:
    return cls(f, options, **controls)


@register("ipywidgets.widgets.widget.Widget")
def reduce_widget(w: Any) -> Any:
    from ipywidgets.widgets.interaction import interactive

    if isinstance(w, interactive):
        options = {"manual": w.manual, "auto_display": w.auto_display}
        if w.manual:
            options["manual_name"] = w.manual_name
        controls = {c._kwarg: c for c in w.kwargs_widgets}
        return (_rebuild_interactive, (type(w), w.f, options, controls))
    return (_rebuild_widget, (type(w), _widget_state(w)))
