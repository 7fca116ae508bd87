"""Fixtures shared by the tests of accel_kit.data."""
import pytest

from accel_kit.tokenizers import load_tokenizer


@pytest.fixture(scope="session")
def gpt2():
    """The GPT-2 tokenizer, loaded once for every data test."""
    return load_tokenizer("gpt2")
