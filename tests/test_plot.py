import io
import math
import os
import re

import matplotlib.colors
import numpy as np
import pytest

from keras_posenc import plot
from tests import references

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize("pairing", ["interleaved", "half"])
def test_heatmap_shows_the_paper_encoding(pairing):
    figure = plot.encoding_heatmap(
        length=200, dim=16, max_wavelength=500.0, pairing=pairing
    )
    axes, colorbar_axes = figure.axes
    image = np.asarray(axes.images[0].get_array())
    assert image.shape == (200, 16)
    expected = references.sinusoidal(np.arange(200), 16, 500.0, pairing)
    np.testing.assert_allclose(image, expected, atol=1e-4)
    assert axes.get_ylabel() == "position"
    assert axes.get_xlabel() == "feature"
    assert pairing in axes.get_title()
    assert colorbar_axes.get_label() == "<colorbar>"


@pytest.mark.parametrize("reference_position", [None, 0, 37, 99])
def test_similarity_curve_peaks_at_the_reference_position(reference_position):
    figure = plot.similarity_curve(
        length=100, dim=32, reference_position=reference_position
    )
    expected_position = 50 if reference_position is None else reference_position
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
        ({"reference_position": 100}, "reference_position=100"),
        ({"reference_position": -1}, "reference_position=-1"),
        ({"reference_position": 2.0}, "reference_position=2.0"),
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
        ({"dim": 7, "pairing": "half"}, "dim=7"),
        ({"pairing": "stacked"}, "pairing='stacked'"),
    ],
)
def test_heatmap_bad_arguments(arguments, message):
    with pytest.raises(ValueError, match=message):
        plot.encoding_heatmap(**arguments)


SCHEDULES = ("default", "linear", "yarn", "llama3", "dynamic")


def expected_scalings(factor, original):
    """The schedules `rope_wavelengths` draws, as Hugging Face configs."""
    return {
        "default": None,
        "linear": {"rope_type": "linear", "factor": factor},
        "yarn": {
            "rope_type": "yarn",
            "factor": factor,
            "original_max_position_embeddings": original,
        },
        "llama3": {
            "rope_type": "llama3",
            "factor": factor,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": original,
        },
        "dynamic": {
            "rope_type": "dynamic",
            "factor": factor,
            "original_max_position_embeddings": original,
        },
    }


@pytest.mark.parametrize(
    "head_dim, max_wavelength, factor, original",
    [(128, 10000.0, 8.0, 8192), (64, 500000.0, 4.0, 2048), (16, 10000.0, 2.5, 512)],
)
def test_rope_wavelengths_match_the_reference(
    head_dim, max_wavelength, factor, original
):
    figure = plot.rope_wavelengths(head_dim, max_wavelength, factor, original)
    axes = figure.axes[0]
    *curves, trained, extended = axes.lines
    assert len(curves) == len(SCHEDULES)
    scalings = expected_scalings(factor, original)
    for curve, schedule in zip(curves, SCHEDULES):
        assert curve.get_label().startswith(schedule)
        assert list(curve.get_xdata()) == list(range(head_dim // 2))
        inverse_frequencies, _ = references.rope_inverse_frequencies(
            head_dim,
            max_wavelength,
            scalings[schedule],
            # Dynamic scaling is drawn at the extended length.
            length=factor * original,
        )
        np.testing.assert_allclose(
            curve.get_ydata(), 2 * math.pi / inverse_frequencies, rtol=2e-5
        )
    assert list(trained.get_ydata()) == [original] * 2
    assert list(extended.get_ydata()) == [factor * original] * 2
    assert str(original) in trained.get_label()
    assert axes.get_yscale() == "log"
    assert axes.get_legend() is not None
    assert f"head_dim={head_dim}" in axes.get_title()


def test_rope_wavelengths_show_what_each_schedule_does():
    figure = plot.rope_wavelengths()
    default, linear, yarn, llama3, dynamic = (
        np.asarray(line.get_ydata()) for line in figure.axes[0].lines[:5]
    )
    # Su et al.: wavelength 2 pi * base^(2i / d), geometric in i.
    pairs = np.arange(64)
    np.testing.assert_allclose(
        default, 2 * math.pi * 10000.0 ** (2 * pairs / 128), rtol=2e-5
    )
    np.testing.assert_allclose(linear, 8.0 * default, rtol=2e-5)
    # YaRN and llama3 keep the short wavelengths and stretch the long ones
    # by the full factor; dynamic keeps only the first.
    for scaled in (yarn, llama3):
        np.testing.assert_allclose(scaled[:20], default[:20], rtol=2e-5)
        np.testing.assert_allclose(scaled[-10:], 8.0 * default[-10:], rtol=2e-5)
        assert np.all(scaled >= default * (1 - 1e-6))
        assert np.all(scaled <= 8.0 * default * (1 + 1e-6))
    assert dynamic[0] == pytest.approx(2 * math.pi, rel=1e-6)
    assert np.all(np.diff(dynamic / default) > 0)


@pytest.mark.parametrize(
    "arguments, message",
    [
        ({"head_dim": 7}, "head_dim=7"),
        ({"head_dim": 2}, "head_dim=2"),
        ({"head_dim": 64.0}, "head_dim=64.0"),
        ({"head_dim": True}, "head_dim=True"),
        ({"max_wavelength": 1.0}, "max_wavelength=1.0"),
        ({"factor": 1.0}, "factor=1.0"),
        ({"factor": -8.0}, "factor=-8.0"),
        ({"factor": "8"}, "factor='8'"),
        ({"factor": True}, "factor=True"),
        (
            {"original_max_position_embeddings": 0},
            "original_max_position_embeddings=0",
        ),
        (
            {"original_max_position_embeddings": 4096.0},
            "original_max_position_embeddings=4096.0",
        ),
    ],
)
def test_rope_wavelengths_bad_arguments(arguments, message):
    with pytest.raises(ValueError, match=message):
        plot.rope_wavelengths(**arguments)


LENGTHS = [64, 128, 256, 512, 1024]
NLL = {
    "none": [2.10, 2.11, 2.11, 2.12, 2.12],
    "learned": [1.80, 1.79, None, None, None],
    "rope": [1.78, 1.77, 2.60, 4.10, 5.90],
    "alibi": [1.78, 1.77, 1.77, 1.77, 1.77],
    "shaw": [None, 1.79, None, 1.85, 1.86],
}


def test_extrapolation_curves_draw_the_data():
    figure = plot.extrapolation_curves(LENGTHS, NLL, 1.70, 128)
    axes = figure.axes[0]
    *curves, floor, trained = axes.lines
    assert len(curves) == len(NLL)
    for curve, (name, values) in zip(curves, NLL.items()):
        assert curve.get_label().startswith(name)
        assert curve.get_marker() not in ("None", None, "")
        assert list(curve.get_xdata()) == LENGTHS
        drawn = np.asarray(curve.get_ydata(), "float64")
        expected = np.array([np.nan if v is None else v for v in values])
        # None points are not drawn: NaN, which matplotlib skips.
        np.testing.assert_array_equal(drawn, expected)
    assert floor.get_label() == "entropy rate (floor)"
    assert list(floor.get_ydata()) == [1.70] * 2
    assert floor.get_linestyle() == "--"
    assert trained.get_label() == "trained length"
    assert list(trained.get_xdata()) == [128] * 2
    assert trained.get_linestyle() == ":"
    assert axes.get_xscale() == "log"
    assert list(axes.get_xticks()) == LENGTHS
    assert [label.get_text() for label in axes.get_xticklabels()] == [
        str(length) for length in LENGTHS
    ]
    assert axes.get_title() == "Train short, test long"
    (legend,) = figure.legends
    assert [text.get_text() for text in legend.get_texts()][-2:] == [
        "entropy rate (floor)",
        "trained length",
    ]
    figure.savefig(io.BytesIO(), format="png")


def test_extrapolation_curves_keep_the_good_encodings_readable():
    figure = plot.extrapolation_curves(LENGTHS, NLL, 1.70, 128)
    axes = figure.axes[0]
    bottom, top = axes.get_ylim()
    # The axis stops at max(entropy_rate + 1.5, largest loss up to the
    # trained length + 1) = max(3.2, 2.11 + 1), plus a 5% margin: every
    # loss but RoPE's past the trained length stays on it.
    margin = 0.05 * (3.2 - 1.70)
    assert top == pytest.approx(3.2 + margin)
    assert bottom == pytest.approx(1.70 - margin)
    assert axes.lines[2].get_label() == "rope (off the axis, up to 5.90)"
    assert [line.get_label() for line in axes.lines[:5]] == [
        "none",
        "learned",
        "rope (off the axis, up to 5.90)",
        "alibi",
        "shaw",
    ]
    # Trained at 64, a loss of 3.0 there lifts the axis to 4.0.
    nll = {"t5": [3.0, 3.5, 9.0]}
    figure = plot.extrapolation_curves([64, 128, 256], nll, 1.70, 64)
    margin = 0.05 * (4.0 - 1.70)
    assert figure.axes[0].get_ylim()[1] == pytest.approx(4.0 + margin)
    assert figure.axes[0].lines[0].get_label() == "t5 (off the axis, up to 9.00)"


def test_extrapolation_curves_show_everything_when_it_fits():
    nll = {"alibi": [1.9, 1.95, 2.0], "t5": [1.8, 2.2, 2.6]}
    figure = plot.extrapolation_curves([32, 64, 128], nll, 1.5, 64)
    bottom, top = figure.axes[0].get_ylim()
    assert bottom < 1.5 and top > 2.6
    assert [line.get_label() for line in figure.axes[0].lines[:2]] == [
        "alibi",
        "t5",
    ]


def test_extrapolation_curves_shade_the_spread_over_seeds():
    spread = {"alibi": [0.01, 0.02, 0.01, 0.03, 0.02], "learned": [0.05] + [None] * 4}
    figure = plot.extrapolation_curves(LENGTHS, NLL, 1.70, 128, spread=spread)
    axes = figure.axes[0]
    # One band per encoding that spread names, in the lines' order, the
    # lines unchanged.
    assert len(axes.lines) == len(NLL) + 2
    learned_band, alibi_band = axes.collections
    for band, name in ((alibi_band, "alibi"), (learned_band, "learned")):
        (line,) = [line for line in axes.lines if line.get_label() == name]
        np.testing.assert_allclose(
            band.get_facecolor()[0][:3], matplotlib.colors.to_rgb(line.get_color())
        )
    corners = np.concatenate([path.vertices for path in alibi_band.get_paths()])
    upper = [value + deviation for value, deviation in zip(NLL["alibi"], spread["alibi"])]
    lower = [value - deviation for value, deviation in zip(NLL["alibi"], spread["alibi"])]
    for length, top, bottom in zip(LENGTHS, upper, lower):
        at_length = corners[np.isclose(corners[:, 0], length), 1]
        assert at_length.max() == pytest.approx(top)
        assert at_length.min() == pytest.approx(bottom)
    figure.savefig(io.BytesIO(), format="png")


@pytest.mark.parametrize(
    "spread, message",
    [
        ({"t5": [0.1] * 5}, "spread['t5']="),
        ({"rope": [0.1] * 4}, "spread['rope']=[0.1, 0.1, 0.1, 0.1]"),
        ({"rope": [0.1] * 4 + [-0.1]}, "spread['rope']=[0.1, 0.1, 0.1, 0.1, -0.1]"),
        ({"rope": [0.1] * 4 + [float("nan")]}, "spread['rope']="),
    ],
)
def test_extrapolation_curves_bad_spread(spread, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        plot.extrapolation_curves(LENGTHS, NLL, 1.70, 128, spread=spread)


def test_extrapolation_curves_single_length_and_undefined_lines():
    nll = {"learned": [None], "rope": [1.9]}
    figure = plot.extrapolation_curves([256], nll, 1.5, 128)
    learned, rope = figure.axes[0].lines[:2]
    assert np.isnan(learned.get_ydata()[0])
    assert list(rope.get_ydata()) == [1.9]
    figure.savefig(io.BytesIO(), format="png")


@pytest.mark.parametrize(
    "arguments, message",
    [
        ({"lengths": []}, "lengths=[]"),
        ({"lengths": [128, 64, 256]}, "lengths=[128, 64, 256]"),
        ({"lengths": [64, 64, 256]}, "lengths=[64, 64, 256]"),
        ({"lengths": [0, 128, 256]}, "lengths=[0, 128, 256]"),
        ({"lengths": [64.0, 128, 256]}, "lengths=[64.0, 128, 256]"),
        ({"lengths": 64}, "lengths=64"),
        ({"nll": {}}, "nll={}"),
        ({"nll": [1.0] * 5}, "nll=[1.0, 1.0"),
        ({"nll": {"rope": [1.0] * 4}}, "nll['rope']=[1.0, 1.0, 1.0, 1.0]"),
        ({"nll": {"rope": [1.0] * 4 + ["2"]}}, "nll['rope']=[1.0, 1.0, 1.0, 1.0, '2']"),
        ({"nll": {"rope": [1.0] * 4 + [float("nan")]}}, "nll['rope']="),
        ({"nll": {"rope": [1.0] * 4 + [True]}}, "nll['rope']="),
        ({"entropy_rate": -0.5}, "entropy_rate=-0.5"),
        ({"entropy_rate": float("inf")}, "entropy_rate=inf"),
        ({"entropy_rate": "1.7"}, "entropy_rate='1.7'"),
        ({"entropy_rate": float("nan")}, "entropy_rate=nan"),
        ({"train_length": 0}, "train_length=0"),
        ({"train_length": 128.0}, "train_length=128.0"),
    ],
)
def test_extrapolation_curves_bad_inputs(arguments, message):
    arguments = {
        "lengths": LENGTHS,
        "nll": NLL,
        "entropy_rate": 1.70,
        "train_length": 128,
        **arguments,
    }
    with pytest.raises(ValueError, match=re.escape(message)):
        plot.extrapolation_curves(**arguments)


def test_extrapolation_curves_without_a_floor():
    # Real text has no known entropy rate: no dashed line, and the axis is
    # set by the losses alone, max(largest loss up to the trained length + 1).
    figure = plot.extrapolation_curves(LENGTHS, NLL, None, 128)
    axes = figure.axes[0]
    *curves, trained = axes.lines
    assert len(curves) == len(NLL)
    assert trained.get_label() == "trained length"
    assert all(line.get_linestyle() != "--" for line in axes.lines)
    (legend,) = figure.legends
    labels = [text.get_text() for text in legend.get_texts()]
    assert "entropy rate (floor)" not in labels
    assert labels[-1] == "trained length"
    bottom, top = axes.get_ylim()
    margin = 0.05 * (3.11 - 1.77)
    assert top == pytest.approx(3.11 + margin)
    assert bottom == pytest.approx(1.77 - margin)
    figure.savefig(io.BytesIO(), format="png")


GRIDS = [8, 12, 16]
ACCURACY = {
    "none": [0.6, 0.4, 0.3],
    "axial RoPE": [0.9, 0.85, 0.8],
    "learned": [0.88, 0.5, 0.2],
}


def test_resolution_curves_draw_the_accuracies():
    figure = plot.resolution_curves(GRIDS, ACCURACY, 8)
    axes = figure.axes[0]
    *curves, chance, trained = axes.lines
    # Each encoding is an error-bar container around its line.
    assert len(curves) == len(axes.containers) == len(ACCURACY)
    for container, curve, (name, values) in zip(
        axes.containers, curves, ACCURACY.items()
    ):
        assert container.get_label() == name
        assert container.lines[0] is curve
        assert curve.get_marker() not in ("None", None, "")
        assert list(curve.get_xdata()) == GRIDS
        np.testing.assert_array_equal(curve.get_ydata(), values)
    assert chance.get_label() == "chance (1 in 10)"
    assert list(chance.get_ydata()) == [0.1] * 2
    assert chance.get_linestyle() == "--"
    assert trained.get_label() == "trained grid"
    assert list(trained.get_xdata()) == [8] * 2
    assert trained.get_linestyle() == ":"
    assert list(axes.get_xticks()) == GRIDS
    assert [label.get_text() for label in axes.get_xticklabels()] == [
        "8x8", "12x12", "16x16"
    ]
    assert axes.get_ylim() == pytest.approx((0.0, 1.02))
    # No error bars without a spread.
    for container in axes.containers:
        _, _, bar_lines = container.lines
        assert bar_lines == ()
    (legend,) = figure.legends
    # Matplotlib lists the plain lines before the error-bar containers.
    assert sorted(text.get_text() for text in legend.get_texts()) == sorted(
        list(ACCURACY) + ["chance (1 in 10)", "trained grid"]
    )
    figure.savefig(io.BytesIO(), format="png")


def test_resolution_curves_draw_the_spread_as_error_bars():
    spread = {"none": [0.01, 0.02, 0.03], "learned": [0.1, 0.05, 0.0]}
    figure = plot.resolution_curves(GRIDS, ACCURACY, 8, spread)
    containers = figure.axes[0].containers
    assert len(containers) == len(ACCURACY)
    for container, (name, values) in zip(containers, ACCURACY.items()):
        _, _, bar_lines = container.lines
        if name not in spread:
            assert bar_lines == ()
            continue
        (bars,) = bar_lines  # one vertical bar per grid
        segments = bars.get_segments()
        assert len(segments) == len(GRIDS)
        for segment, grid, value, deviation in zip(
            segments, GRIDS, values, spread[name]
        ):
            np.testing.assert_allclose(
                segment, [[grid, value - deviation], [grid, value + deviation]]
            )
    figure.savefig(io.BytesIO(), format="png")


@pytest.mark.parametrize(
    "arguments, message",
    [
        ({"grids": []}, "`grids` must be a non-empty list"),
        ({"grids": [12, 8, 16]}, "grids=[12, 8, 16]"),
        ({"grids": [8, 12, 12]}, "grids=[8, 12, 12]"),
        ({"grids": [0, 12, 16]}, "grids=[0, 12, 16]"),
        ({"grids": 8}, "grids=8"),
        ({"accuracy": {}}, "`accuracy` must be a non-empty dict"),
        ({"accuracy": [0.5] * 3}, "accuracy=[0.5, 0.5, 0.5]"),
        ({"accuracy": {"rope": [0.5, 0.5]}}, "one per entry of `grids`"),
        ({"accuracy": {"rope": [0.5, 0.5, None]}}, "accuracy['rope']=[0.5, 0.5, None]"),
        ({"accuracy": {"rope": [0.5, 0.5, 1.5]}}, "accuracy['rope']=[0.5, 0.5, 1.5]"),
        ({"accuracy": {"rope": [-0.1, 0.5, 0.5]}}, "accuracy['rope']=[-0.1, 0.5, 0.5]"),
        ({"accuracy": {"rope": [0.5, "0.5", 0.5]}}, "accuracy['rope']="),
        ({"train_grid": 0}, "train_grid=0"),
        ({"train_grid": 8.0}, "train_grid=8.0"),
    ],
)
def test_resolution_curves_bad_inputs(arguments, message):
    arguments = {"grids": GRIDS, "accuracy": ACCURACY, "train_grid": 8, **arguments}
    with pytest.raises(ValueError, match=re.escape(message)) as raised:
        plot.resolution_curves(**arguments)
    # The messages name this function's arguments, not extrapolation_curves'.
    assert "lengths" not in str(raised.value) and "nll" not in str(raised.value)


def test_save_plots_writes_three_pngs(tmp_path):
    out_dir = tmp_path / "nested" / "plots"
    paths = plot.save_plots(out_dir, length=64, dim=32)
    assert [os.path.basename(path) for path in paths] == [
        "encoding_heatmap.png",
        "similarity.png",
        "rope_wavelengths.png",
    ]
    for path in paths:
        with open(path, "rb") as file:
            content = file.read()
        assert content.startswith(PNG_SIGNATURE)
        assert len(content) > 10_000


def test_grid_similarity_shows_the_2d_encodings_cosine_similarity():
    anchors = [(0, 0), (2, 3)]
    figure = plot.grid_similarity(grid_shape=(5, 6), dim=16, anchors=anchors)
    panels = [axes for axes in figure.axes if axes.images]
    assert len(panels) == len(anchors)
    # Cells in row-major order, the row's encoding in the first half.
    cells = np.array([[r, c] for r in range(5) for c in range(6)])
    table = references.sinusoidal_on_axes(cells, 16, pairing="interleaved")
    table /= np.linalg.norm(table, axis=-1, keepdims=True)
    for panel, (row, column) in zip(panels, anchors):
        expected = (table @ table[row * 6 + column]).reshape(5, 6)
        image = np.asarray(panel.images[0].get_array())
        np.testing.assert_allclose(image, expected, atol=1e-5)
        assert image[row, column] == pytest.approx(1.0, abs=1e-5)
        assert f"({row}, {column})" in panel.get_title()


@pytest.mark.parametrize(
    "anchors", [[(5, 0)], [(0, -1)], [(1,)], "center"]
)
def test_grid_similarity_refuses_anchors_off_the_grid(anchors):
    with pytest.raises(ValueError, match="`anchors` must be"):
        plot.grid_similarity(grid_shape=(5, 6), dim=16, anchors=anchors)


def test_rope_axis_assignment_draws_each_pairs_axis_and_frequency():
    figure = plot.rope_axis_assignment(max_wavelength=1000.0)
    expected = {
        "axial": references.axial_rope_frequencies(128, 2, 1000.0),
        "alternating": references.pixtral_frequencies(128, 1000.0),
        "sections": references.mrope_frequencies(128, [16, 24, 24], 1000.0),
        "cyclic M-RoPE": references.interleaved_mrope_frequencies(
            128, [24, 20, 20], 1000.0
        ),
    }
    assert len(figure.axes) == len(expected)
    for panel, (name, theta) in zip(figure.axes, expected.items()):
        assert name in panel.get_title()
        assert panel.get_yscale() == "log"
        for axis, bars in enumerate(panel.containers):
            pairs = np.flatnonzero(theta[:, axis])
            centres = [bar.get_x() + bar.get_width() / 2 for bar in bars]
            np.testing.assert_allclose(centres, pairs)
            np.testing.assert_allclose(
                [bar.get_height() for bar in bars], theta[pairs, axis], rtol=1e-6
            )
