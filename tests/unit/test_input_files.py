"""A user's input files: read by name, checked against the model's inputs, and every
problem named in one line (services/runtime/input_files.py)."""

import numpy as np
import pytest

from services.runtime.input_files import InputFileError, read_arrays, read_inputs
from services.runtime.manifest import TensorSpec

IMAGE = [TensorSpec("image", "<f4", [3, 4, 4])]
TEXT = [TensorSpec("ids", "<i8", [-1]), TensorSpec("mask", "<i8", [-1])]


def test_an_npy_is_named_and_an_npz_keeps_its_names(tmp_path):
    np.save(tmp_path / "one.npy", np.zeros((2, 3, 4, 4), np.float64))
    np.savez(tmp_path / "two.npz", ids=np.ones((2, 5)), mask=np.ones((2, 5)))
    assert list(read_arrays(tmp_path / "one.npy", "image")) == ["image"]
    assert sorted(read_arrays(tmp_path / "two.npz", "unused")) == ["ids", "mask"]
    image = read_inputs(tmp_path / "one.npy", IMAGE)["image"]
    assert image.dtype == np.float32 and image.shape == (2, 3, 4, 4)  # cast to the model's
    assert read_inputs(tmp_path / "two.npz", TEXT)["ids"].dtype == np.int64


def test_missing_and_unreadable_files_are_named(tmp_path):
    with pytest.raises(InputFileError, match="input file .*gone.npy does not exist"):
        read_arrays(tmp_path / "gone.npy", "x")
    (tmp_path / "notes.npz").write_text("not arrays")
    with pytest.raises(InputFileError, match="notes.npz is not a readable .npy or .npz") as err:
        read_arrays(tmp_path / "notes.npz", "x")
    assert "pickle" not in str(err.value)  # numpy's guess at a text file, not the user's fault
    np.save(tmp_path / "objects.npy", np.array([{"a": 1}], dtype=object), allow_pickle=True)
    with pytest.raises(InputFileError, match="objects.npy is not a readable"):
        read_arrays(tmp_path / "objects.npy", "x")


def test_files_that_do_not_fit_the_model_say_how(tmp_path):
    np.save(tmp_path / "one.npy", np.zeros((2, 5)))
    with pytest.raises(InputFileError, match=r"holds one array but the model takes \['ids', "
                                             r"'mask'\]: use an .npz"):
        read_inputs(tmp_path / "one.npy", TEXT)
    np.savez(tmp_path / "half.npz", ids=np.ones((2, 5)))
    with pytest.raises(InputFileError, match=r"lacks arrays for inputs \['mask'\]"):
        read_inputs(tmp_path / "half.npz", TEXT)
    np.savez(tmp_path / "uneven.npz", ids=np.ones((2, 5)), mask=np.ones((3, 5)))
    with pytest.raises(InputFileError, match="same number of samples"):
        read_inputs(tmp_path / "uneven.npz", TEXT)
    with pytest.raises(InputFileError, match=r"per-sample shape \[5\], the model wants "
                                             r"\[3, 4, 4\]"):
        read_inputs(tmp_path / "one.npy", IMAGE)
