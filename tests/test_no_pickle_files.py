"""The state files fednet writes hold numbers only: an array that only a pickle could store is
refused when it is written (np.savez pickles object arrays unless told not to), instead of being
written and then refused by the reader at --resume."""
import numpy as np
import pytest

from fednet.core import state_files


def test_a_state_file_refuses_an_object_array(tmp_path):
    objects = np.array([{"a": 1}, None], dtype=object)
    with pytest.raises(ValueError, match="allow_pickle"):
        state_files.write(tmp_path / "c0000.npz", {"field": objects}, {"round": 0})


def test_a_state_file_of_numbers_is_written(tmp_path):
    path = tmp_path / "c0000.npz"
    state_files.write(path, {"field": np.arange(3.0)}, {"round": 0})
    with np.load(path, allow_pickle=False) as z:
        assert z["field"].tolist() == [0.0, 1.0, 2.0]
