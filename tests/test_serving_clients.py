"""The serving clients build the requests TF Serving expects."""

import importlib.util
import json

import pytest

from conftest import REPO


def load(name):
    spec = importlib.util.spec_from_file_location(name, REPO / "examples" / "serving" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_rest_request_is_columnar_predict_json():
    body = load("rest_client").predict_request(["A dog.", "Zwei Männer."], "translate_n_best")
    assert json.loads(json.dumps(body)) == {
        "signature_name": "translate_n_best",
        "inputs": {"text": ["A dog.", "Zwei Männer."]},
    }


def test_grpc_request_carries_a_string_tensor():
    pytest.importorskip("tensorflow_serving")
    import tensorflow as tf

    request = load("grpc_client").predict_request(["A dog.", "Zwei Männer."], "multi30k")
    assert request.model_spec.name == "multi30k"
    assert request.model_spec.signature_name == "serving_default"
    values = tf.make_ndarray(request.inputs["text"])
    assert values.shape == (2,) and values[1].decode("utf-8") == "Zwei Männer."
