"""Every `>>>` example in the package's docstrings runs and gives what it
shows (tensorflow backend: some examples use the tokenizers)."""

import doctest
import importlib
import pkgutil

import keras
import numpy as np
import pytest

import keras_transformer

if keras.backend.backend() != "tensorflow":
    pytest.skip("the examples use the tensorflow-only parts too", allow_module_level=True)


def _examples():
    for info in pkgutil.walk_packages(keras_transformer.__path__, "keras_transformer."):
        module = importlib.import_module(info.name)
        names = {**vars(module), "np": np, "keras": keras}
        for test in doctest.DocTestFinder().find(module, globs=names):
            if test.examples:
                yield pytest.param(test, id=test.name)


EXAMPLES = list(_examples())


def test_the_package_has_examples():
    assert len(EXAMPLES) >= 10, [t.values[0].name for t in EXAMPLES]


@pytest.mark.parametrize("test", EXAMPLES)
def test_docstring_example(test):
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    messages = []
    result = runner.run(test, out=messages.append)
    assert result.failed == 0, "".join(messages)
