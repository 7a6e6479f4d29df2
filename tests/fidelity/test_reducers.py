"""The reducer registry: one test per entry, through the checkpoint's own pickler."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from jupyter_pause.checkpoint import reducers
from jupyter_pause.checkpoint.pickling import (
    StaleObject,
    dump_group,
    load_group,
)
from jupyter_pause.checkpoint.reducers.files import SourceChanged

TESTED: set[str] = set()


def covers(*names: str) -> Any:
    TESTED.update(names)
    return lambda fn: fn


def roundtrip_noted(values: dict[str, Any]) -> tuple[dict[str, Any], dict[str, list[str]]]:
    """The values back, and what did not come back with each (the load's notes)."""
    stream, pickler, ctx = dump_group(values)
    bufs = [bytes(b) for b in ctx.buffers]
    return load_group(stream, pickler, bufs, lambda i: ctx.storages[i].clone())


def roundtrip(values: dict[str, Any]) -> dict[str, Any]:
    return roundtrip_noted(values)[0]


@pytest.fixture
def text_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.chdir(tmp_path)
    p = tmp_path / "lines.txt"
    p.write_text("one\ntwo\nthree\n")
    return p


@covers("_io.TextIOWrapper")
def test_text_file_reopened_at_its_position_and_refused_when_changed(text_file: Path) -> None:
    f = open("lines.txt")  # noqa: SIM115 - the open handle is the point
    assert f.readline() == "one\n"
    stream, pickler, _ = dump_group({"f": f})
    got = load_group(stream, pickler, [], None)[0]["f"]
    assert (got.name, got.mode, got.readline()) == ("lines.txt", "r", "two\n")
    got.close()
    text_file.write_text("one\ntwo\nTHREE\n")  # same size, other content
    with pytest.raises(SourceChanged, match="same size, other content"):
        load_group(stream, pickler, [], None)
    text_file.write_text("one\n")
    with pytest.raises(SourceChanged, match=r"size 14 -> 4 bytes"):
        load_group(stream, pickler, [], None)
    text_file.unlink()
    with pytest.raises(SourceChanged, match="is gone since the checkpoint"):
        load_group(stream, pickler, [], None)
    f.close()


def test_closed_files_come_back_closed_with_name_and_mode(text_file: Path) -> None:
    with open("lines.txt", "a") as t, open("lines.txt", "rb") as b:
        pass
    r = open("lines.txt", "rb", buffering=0)  # noqa: SIM115
    r.close()
    text_file.unlink()  # a closed file needs no file
    got = roundtrip({"t": t, "b": b, "r": r})
    assert [(type(v), v.name, v.mode, v.closed) for v in got.values()] == [
        (type(t), "lines.txt", "a", True),
        (type(b), "lines.txt", "rb", True),
        (type(r), "lines.txt", "rb", True),
    ]


@covers("_io.BufferedWriter", "_io.BufferedRandom")
@pytest.mark.parametrize("mode", ["w", "a", "r+", "wb", "ab", "rb+"])
def test_files_open_for_writing_are_never_reopened(text_file: Path, mode: str) -> None:
    f = open("lines.txt", mode)  # noqa: SIM115
    try:
        with pytest.raises(StaleObject, match=r"open for writing .*truncate it or write the same"):
            dump_group({"f": f})
    finally:
        f.close()


@covers("_io.BufferedReader", "_io.FileIO")
def test_binary_files_reopened(text_file: Path) -> None:
    buffered = open("lines.txt", "rb")  # noqa: SIM115
    raw = open("lines.txt", "rb", buffering=0)  # noqa: SIM115
    buffered.read(4)
    raw.read(8)
    got = roundtrip({"b": buffered, "r": raw})
    assert (got["b"].mode, got["b"].read(3)) == ("rb", b"two")
    assert (type(got["r"]).__name__, got["r"].read()) == ("FileIO", b"three\n")
    for f in (buffered, raw, got["b"], got["r"]):
        f.close()


@covers("astropy.io.fits.file._File")
def test_fits_file_of_an_hdu_list(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    np = pytest.importorskip("numpy")
    fits = pytest.importorskip("astropy.io.fits")
    monkeypatch.chdir(tmp_path)
    fits.PrimaryHDU(np.arange(12.0).reshape(3, 4)).writeto("img.fits")
    hdul = fits.open("img.fits")
    data = hdul[0].data
    got = roundtrip({"hdul": hdul, "data": data})
    assert got["hdul"][0].data is got["data"]
    assert np.array_equal(got["data"], data)
    assert got["hdul"].filename() == hdul.filename()
    assert got["hdul"][0].header == hdul[0].header
    got["hdul"].close()
    stream, pickler, ctx = dump_group({"hdul": hdul})
    hdul.close()
    with open("img.fits", "r+b") as f:  # same size, other bytes
        f.seek(os.path.getsize("img.fits") - 8)
        f.write(b"\x01" * 8)
    with pytest.raises(SourceChanged, match="img.fits changed since the checkpoint"):
        load_group(stream, pickler, [bytes(b) for b in ctx.buffers], None)
    update = fits.open("img.fits", mode="update")
    with pytest.raises(StaleObject, match="mode 'update'"):
        dump_group({"u": update})
    update.close()


@covers("torch.Tensor")
def test_autograd_views_rebuilt_and_lost_graphs_noted() -> None:
    torch = pytest.importorskip("torch")
    w = torch.nn.Parameter(torch.arange(6.0).reshape(2, 3))
    row = w[1]
    loss = (w * 2).sum()
    got, notes = roundtrip_noted({"w": w, "row": row, "loss": loss})
    # the view of a leaf is the same view again: gradients reach the parameter
    assert got["row"].grad_fn is not None and got["row"]._base is got["w"]
    got["row"].sum().backward()
    assert got["w"].grad.tolist() == [[0, 0, 0], [1, 1, 1]]
    # a graph cannot travel: the value does, marked, and backward() fails loudly
    assert got["loss"].item() == loss.item() and not got["loss"].requires_grad
    assert list(notes) == ["loss"]
    assert "without its autograd graph (grad_fn=SumBackward0)" in notes["loss"][0]
    assert roundtrip_noted({"w": w})[1] == {}  # notes belong to their own load only


@covers("ipywidgets.widgets.widget.Widget")
def test_widgets_and_interactive() -> None:
    widgets = pytest.importorskip("ipywidgets")
    slider = widgets.IntSlider(value=7, min=2, max=9, description="n")
    slider.add_class("big")
    calls: list[int] = []

    def square(x: int = 3) -> int:
        calls.append(x)
        return x * x

    box = widgets.interactive(square, x=slider)
    got = roundtrip({"slider": slider, "box": box})
    s = got["slider"]
    assert (type(s), s.value, s.min, s.max, s.description) == (type(slider), 7, 2, 9, "n")
    assert "big" in s._dom_classes and s.model_id != slider.model_id  # a new comm
    b = got["box"]
    assert b.kwargs_widgets == [s] and b.result == 49 and b.f.__name__ == "square"
    s.value = 3
    assert b.result == 9  # the rebuilt interactive still follows its control


@covers(
    "bokeh.model.model.Model",
    "bokeh.core.property.wrappers.PropertyValueList",
    "bokeh.core.property.wrappers.PropertyValueDict",
)
def test_bokeh_figure() -> None:
    pytest.importorskip("bokeh")
    from bokeh.models import ColumnDataSource
    from bokeh.plotting import figure

    src = ColumnDataSource(data={"x": [1, 2], "y": [3, 4]})
    fig = figure(title="t", width=300)
    r = fig.line("x", "y", source=src)
    got = roundtrip({"fig": fig, "src": src, "r": r})
    f = got["fig"]
    assert f.id == fig.id and f.title.text == "t" and f.width == 300
    assert len(f.renderers) == 1 and f.renderers[0] is got["r"]
    assert got["r"].data_source is got["src"] and dict(got["src"].data) == dict(src.data)
    assert len(f.xaxis) == len(fig.xaxis) and len(f.tools) == len(fig.tools)
    assert got["src"].data.__class__.__name__ == "PropertyValueColumnData"


@covers(
    "_thread.lock",
    "_thread.RLock",
    "threading.Condition",
    "threading.Event",
    "threading.Semaphore",
)
def test_free_locks_and_what_is_built_on_them_come_back_held_ones_stay_stale() -> None:
    import queue
    import threading

    q: queue.Queue = queue.Queue()
    q.put("item")
    event, sem, cond = threading.Event(), threading.BoundedSemaphore(3), threading.Condition()
    event.set()
    sem.acquire()
    ns = {"lock": threading.Lock(), "rlock": threading.RLock(), "q": q, "e": event, "s": sem}
    got = roundtrip({**ns, "c": cond})
    assert not got["lock"].locked() and got["rlock"].acquire(blocking=False)
    assert (got["q"].get_nowait(), got["e"].is_set(), got["s"]._value) == ("item", True, 2)
    with got["c"]:
        got["c"].notify_all()
    held, rheld = threading.Lock(), threading.RLock()
    held.acquire()
    rheld.acquire()
    for obj in (held, rheld):
        with pytest.raises(StaleObject, match="held when the checkpoint was taken"):
            dump_group({"x": obj})


@covers("weakref.ReferenceType", "weakref.ProxyType", "weakref.CallableProxyType",
        "weakref.WeakValueDictionary", "weakref.WeakKeyDictionary", "_weakrefset.WeakSet",
        "weakref.finalize")
def test_weak_links_point_at_the_objects_restored_with_them() -> None:
    import weakref

    class Box:
        def get(self) -> str:
            return "got"

    a, b = Box(), Box()
    ns = {"items": [a, b], "r": weakref.ref(a), "m": weakref.WeakMethod(a.get),
          "p": weakref.proxy(b), "cp": weakref.proxy(a.get.__func__),
          "vd": weakref.WeakValueDictionary({"a": a}), "kd": weakref.WeakKeyDictionary({b: 1}),
          "ws": weakref.WeakSet([a, b]), "fin": weakref.finalize(b, print, "bye"),
          "f": Box.get}
    got, notes = roundtrip_noted(ns)
    ns["fin"].detach()
    ra, rb = got["items"]
    assert got["r"]() is ra and got["m"]().__self__ is ra and got["p"].get() == "got"
    assert got["cp"](ra) == "got" and got["vd"]["a"] is ra and got["kd"][rb] == 1
    assert set(got["ws"]) == {ra, rb} and got["fin"].peek()[0] is rb
    got["fin"].detach()
    assert not notes


@covers("torch.utils.hooks.RemovableHandle",
        "torch.utils.data.dataloader._SingleProcessDataLoaderIter",
        "torch.utils.data.dataloader._MultiProcessingDataLoaderIter")
def test_hook_handles_and_dataloader_iterators() -> None:
    torch = pytest.importorskip("torch")
    from jupyter_pause.checkpoint.pickling import SkipVariable

    m = torch.nn.Linear(1, 1)
    loader = torch.utils.data.DataLoader(list(range(6)), batch_size=2)
    it = iter(loader)
    next(it)
    got = roundtrip({"m": m, "h": m.register_forward_hook(print), "it": it})
    got["h"].remove()
    assert not got["m"]._forward_hooks
    assert [b.tolist() for b in got["it"]] == [[2, 3], [4, 5]]
    multi = iter(torch.utils.data.DataLoader(list(range(4)), num_workers=1))
    try:
        with pytest.raises(SkipVariable, match="num_workers=1"):
            dump_group({"it": multi})
    finally:
        multi._shutdown_workers()


def test_every_registry_entry_has_a_test() -> None:
    assert set(reducers.registered()) == TESTED


def test_lookup_goes_by_mro_nearest_first() -> None:
    import io

    class Mine(io.TextIOWrapper):
        pass

    assert reducers.lookup(Mine) is reducers.lookup(io.TextIOWrapper) is not None
    assert reducers.lookup(int) is None
