"""bokeh models (figures, glyph renderers, data sources, ...).

Their property containers keep back-references to their owners, which pickle cannot rebuild.
A model is saved as its class, its id and the properties set on it, and rebuilt with the model
base class's constructor: ``figure()``'s own would add a second set of axes, tools and ranges.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from . import register

if TYPE_CHECKING:
    from bokeh.core.types import ID
    from bokeh.model import Model


def _model_init(cls: type[Any]) -> Any:
    """The nearest constructor that only sets properties (bokeh.models / bokeh.model)."""
    c: type[Any]
    for c in cls.__mro__:
        if c.__module__.startswith(("bokeh.models", "bokeh.model")) and "__init__" in c.__dict__:
            return c.__init__
    return cls.__init__


def _rebuild_model(cls: type[Model], model_id: ID, props: dict[str, Any]) -> Any:
    obj = cls.__new__(cls, id=model_id)  # bokeh takes the id in __new__ only
    _model_init(cls)(obj, **props)
    return obj


@register("bokeh.model.model.Model")
def reduce_model(m: Any) -> Any:
    props = m.properties_with_values(include_defaults=False)
    return (_rebuild_model, (type(m), m.id, props))


@register("bokeh.core.property.wrappers.PropertyValueList")
def reduce_list(v: Any) -> Any:
    return (list, (list(v),))


@register("bokeh.core.property.wrappers.PropertyValueDict")
def reduce_dict(v: Any) -> Any:
    return (dict, (dict(v),))
