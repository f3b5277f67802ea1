"""Translate through TF Serving's gRPC API (port 8500) with tensorflow-serving-api.

    pip install tensorflow-serving-api
    python examples/serving/grpc_client.py [--target HOST:PORT] TEXT [TEXT ...]
"""

import argparse


def predict_request(texts, model_name="multi30k", signature="serving_default"):
    """A `PredictRequest` proto carrying `texts` as the `text` input."""
    import tensorflow as tf
    from tensorflow_serving.apis import predict_pb2

    request = predict_pb2.PredictRequest()
    request.model_spec.name = model_name
    request.model_spec.signature_name = signature
    request.inputs["text"].CopyFrom(tf.make_tensor_proto(list(texts), dtype=tf.string))
    return request


def translate(texts, target="localhost:8500", model_name="multi30k", timeout=30.0):
    """Send `texts`; return `(translations, scores)` as Python lists."""
    import grpc
    import tensorflow as tf
    from tensorflow_serving.apis import prediction_service_pb2_grpc

    with grpc.insecure_channel(target) as channel:
        stub = prediction_service_pb2_grpc.PredictionServiceStub(channel)
        response = stub.Predict(predict_request(texts, model_name), timeout=timeout)
    translations = [t.decode("utf-8") for t in tf.make_ndarray(response.outputs["translation"])]
    scores = tf.make_ndarray(response.outputs["score"]).tolist()
    return translations, scores


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("text", nargs="+")
    parser.add_argument("--target", default="localhost:8500")
    parser.add_argument("--model-name", default="multi30k")
    args = parser.parse_args()
    import grpc

    try:
        translations, scores = translate(args.text, args.target, args.model_name)
    except grpc.RpcError as error:
        parser.exit(1, f"grpc_client.py: {args.target} answered {error.code().name}: {error.details()}. "
                       "Is TF Serving running with --port, and --model-name its --model_name?\n")
    for text, translation, score in zip(args.text, translations, scores):
        print(f"{text}\n  -> {translation}   (score {score:.3f})")


if __name__ == "__main__":
    main()
