"""Every `>>>` example in the package's docstrings runs and gives what it
shows (tensorflow backend: some examples use the tokenizers)."""

import doctest
import importlib
import pkgutil
import types

import keras
import pytest

import keras_transformer

if keras.backend.backend() != "tensorflow":
    pytest.skip("the examples use the tensorflow-only parts too", allow_module_level=True)


def _examples():
    for info in pkgutil.walk_packages(keras_transformer.__path__, "keras_transformer."):
        module = importlib.import_module(info.name)
        # The module's own names, without the modules it imports: an
        # example imports what it uses (numpy, keras), so that it runs
        # where a reader pastes it.
        names = {k: v for k, v in vars(module).items() if not isinstance(v, types.ModuleType)}
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
