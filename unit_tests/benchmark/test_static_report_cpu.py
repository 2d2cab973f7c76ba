"""static_inference's --plot and floor name: without matplotlib --plot is refused before any work (exit 2, naming the
bench extra); the floor is named after the device that measured the bandwidth, on CPU a host memory copy, in the
JSON, on the terminal and in the plot."""

import sys
import types

import pytest

from benchmark import static_inference
from benchmark.timing import floor_label


class Recorder:
    """Stands for a matplotlib figure or axes: records every method call."""

    def __init__(self):
        self.calls = []

    def __getattr__(self, name):
        def call(*args, **kwargs):
            self.calls.append((name, args, kwargs))
            return self

        return call


@pytest.fixture
def fake_matplotlib(monkeypatch):
    """A matplotlib whose figure and axes record what the plot draws (matplotlib is not a test dependency)."""
    fig, ax = Recorder(), Recorder()
    pyplot = types.ModuleType("matplotlib.pyplot")
    pyplot.subplots = lambda *args, **kwargs: (fig, ax)
    pyplot.close = lambda figure: None
    matplotlib = types.ModuleType("matplotlib")
    matplotlib.use = lambda backend: None
    matplotlib.pyplot = pyplot
    monkeypatch.setitem(sys.modules, "matplotlib", matplotlib)
    monkeypatch.setitem(sys.modules, "matplotlib.pyplot", pyplot)
    return fig, ax


def test_plot_without_matplotlib_is_refused_before_any_work(monkeypatch, tmp_path, capsys):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib raises ImportError

    def no_work(*args, **kwargs):
        raise AssertionError("the benchmark started before refusing --plot")

    monkeypatch.setattr(static_inference, "resolve_source", no_work)
    monkeypatch.setattr(static_inference, "measure_copy_bandwidth", no_work)
    out = tmp_path / "x.json"
    with pytest.raises(SystemExit) as e:
        static_inference.main(["--model_shape", "qwen3.5-27b", "--device", "cpu", "--plot", "--out", str(out)])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert "--plot needs matplotlib" in err and 'pip install -e ".[bench]"' in err
    assert not out.exists()


def test_floor_is_named_after_its_device():
    assert floor_label({"type": "cpu", "name": "x86_64", "threads": 1}) == "host memory-copy floor (cpu)"
    assert floor_label({"type": "cuda", "name": "NVIDIA H200"}) == "H200 HBM floor"
    assert floor_label({"type": "cuda", "name": "NVIDIA H100 80GB HBM3"}) == "H100 HBM floor"
    assert floor_label({"type": "cuda", "name": "NVIDIA GeForce RTX 4090"}) == "GeForce RTX 4090 device-memory floor"


def test_cpu_floor_label_in_json_terminal_and_plot(fake_matplotlib, tiny_dense_dir, tmp_path, capsys):
    fig, ax = fake_matplotlib
    out = tmp_path / "x.json"
    r = static_inference.main(["--model_dir", str(tiny_dense_dir), "--device", "cpu", "--batch_sizes", "1,2",
                               "--input_len", "8", "--output_len", "6", "--bw_repeats", "3", "--plot",
                               "--out", str(out)])  # fmt: skip
    label = "host memory-copy floor (cpu)"
    assert r["bandwidth"]["floor_label"] == label
    assert all(x["floor"]["label"] == label for x in r["results"])
    printed = capsys.readouterr().out
    assert f"floor = {label}" in printed and "HBM" not in printed
    labels = [kwargs.get("label") for name, _, kwargs in ax.calls if name in ("plot", "errorbar")]
    assert label in labels and not any("HBM" in (x or "") for x in labels)
    assert ("savefig", (out.with_suffix(".png"),), {"dpi": 120}) in fig.calls and r["plot"] == str(out.with_suffix(".png"))
