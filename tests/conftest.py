"""Shared fixtures: the bundled model pair (loaded once) and explicit generators."""

import pytest
import torch

from specdec_lab.models import load_pair

torch.set_num_threads(max(1, torch.get_num_threads()))


@pytest.fixture(scope="session")
def pair():
    return load_pair("bundled")


@pytest.fixture(scope="session")
def prompt(pair):
    return pair.encode("ROMEO:\n")
