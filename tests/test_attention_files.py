"""Files saved before the attention's rooms load and predict the same.

`fixtures/generate_before_rooms.py` wrote `before_rooms.keras` with the code
before the split: the layers `attention_from_hf` builds for each family of
`hf_attention.npz`, and grouped heads with qk-norm and a gate, T5's bias at
explicit positions, CoPE and a sliding window, with their inputs and
outputs. The Hugging Face layers are also held against transformers' own
outputs in float64.
"""

import os
import pathlib

import keras
import numpy as np
import pytest

import keras_posenc  # noqa: F401  (registers the layers the file names)

FIXTURES = pathlib.Path(__file__).parent / "fixtures"
OLD_FILE = os.path.join(FIXTURES, "before_rooms")
HF = np.load(FIXTURES / "hf_attention.npz")
# float32 projections and logits against float64 (as in test_hf_attention).
HF_ATOL = 2e-5


def load():
    with np.load(f"{OLD_FILE}.npz") as arrays:
        saved = {name: arrays[name] for name in arrays.files}
    model = keras.saving.load_model(f"{OLD_FILE}.keras", safe_mode=True)
    return model, saved


# The file was saved by Keras 3.15, whose MultiHeadAttention config holds
# keys (`use_gate`, `sliding_window`) that older Keras does not take.
@pytest.mark.newest
def test_files_saved_before_the_rooms_predict_the_same():
    model, saved = load()
    assert [weight.path for weight in model.weights] == list(saved["paths"])
    outputs = model.predict(
        [saved["inputs/tokens"], saved["inputs/positions"]], verbose=0
    )
    names = sorted(name[len("outputs/"):] for name in saved if name.startswith("outputs/"))
    assert sorted(outputs) == names
    for name, output in outputs.items():
        np.testing.assert_allclose(
            output, saved[f"outputs/{name}"], rtol=1e-5, atol=1e-5, err_msg=name
        )


@pytest.mark.newest
def test_hugging_face_layers_loaded_from_a_file_equal_transformers():
    model, saved = load()
    outputs = model.predict(
        [saved["inputs/tokens"], saved["inputs/positions"]], verbose=0
    )
    families = [name[len("hf_"):] for name in outputs if name.startswith("hf_")]
    assert len(families) == 8
    for family in families:
        np.testing.assert_allclose(
            np.asarray(outputs[f"hf_{family}"], "float64"),
            HF[f"{family}/full/output"],
            rtol=0,
            atol=HF_ATOL,
            err_msg=family,
        )
