import os

import numpy as np
import pytest

from keras_posenc import plot
from tests import references

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize("layout", ["interleaved", "concat"])
def test_heatmap_shows_the_paper_encoding(layout):
    figure = plot.encoding_heatmap(
        length=200, dim=16, max_wavelength=500.0, layout=layout
    )
    axes, colorbar_axes = figure.axes
    image = np.asarray(axes.images[0].get_array())
    assert image.shape == (200, 16)
    expected = references.sinusoidal(np.arange(200), 16, 500.0, layout)
    np.testing.assert_allclose(image, expected, atol=1e-4)
    assert axes.get_ylabel() == "position"
    assert axes.get_xlabel() == "feature"
    assert layout in axes.get_title()
    assert colorbar_axes.get_label() == "<colorbar>"


@pytest.mark.parametrize("position", [None, 0, 37, 99])
def test_similarity_curve_peaks_at_position(position):
    figure = plot.similarity_curve(length=100, dim=32, position=position)
    expected_position = 50 if position is None else position
    curve, marker = figure.axes[0].lines
    similarity = np.asarray(curve.get_ydata())
    assert list(curve.get_xdata()) == list(range(100))
    assert int(np.argmax(similarity)) == expected_position
    assert list(marker.get_xdata()) == [expected_position] * 2
    table = references.sinusoidal(np.arange(100), 32)
    np.testing.assert_allclose(
        similarity, table @ table[expected_position], atol=1e-3
    )
    # Each (sin, cos) pair contributes cos(0) = 1 at the peak.
    assert similarity[expected_position] == pytest.approx(16.0, abs=1e-4)


@pytest.mark.parametrize(
    "arguments, message",
    [
        ({"position": 100}, "position=100"),
        ({"position": -1}, "position=-1"),
        ({"position": 2.0}, "position=2.0"),
        ({"length": 0}, "length=0"),
        ({"dim": 0}, "dim=0"),
        ({"max_wavelength": 1.0}, "max_wavelength=1.0"),
    ],
)
def test_similarity_curve_bad_arguments(arguments, message):
    arguments = {"length": 100, "dim": 8, **arguments}
    with pytest.raises(ValueError, match=message):
        plot.similarity_curve(**arguments)


@pytest.mark.parametrize(
    "arguments, message",
    [
        ({"length": -5}, "length=-5"),
        ({"dim": 7, "layout": "concat"}, "dim=7"),
        ({"layout": "stacked"}, "layout='stacked'"),
    ],
)
def test_heatmap_bad_arguments(arguments, message):
    with pytest.raises(ValueError, match=message):
        plot.encoding_heatmap(**arguments)


def test_save_plots_writes_two_pngs(tmp_path):
    out_dir = tmp_path / "nested" / "plots"
    paths = plot.save_plots(out_dir, length=64, dim=32)
    assert [os.path.basename(path) for path in paths] == [
        "encoding_heatmap.png",
        "similarity.png",
    ]
    for path in paths:
        with open(path, "rb") as file:
            content = file.read()
        assert content.startswith(PNG_SIGNATURE)
        assert len(content) > 10_000
