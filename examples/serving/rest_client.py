"""Translate through TF Serving's REST API (port 8501), with the standard library.

    python examples/serving/rest_client.py [--url URL] [--n-best] TEXT [TEXT ...]
"""

import argparse
import json
import urllib.request


def predict_request(texts, signature="serving_default"):
    """The JSON body of a columnar `predict` request for `texts`."""
    return {"signature_name": signature, "inputs": {"text": list(texts)}}


def translate(texts, url="http://localhost:8501/v1/models/multi30k:predict", n_best=False, timeout=30):
    """POST `texts` and return the server's `outputs` dict.

    With `n_best`, uses the `translate_n_best` signature (`translations` and
    `scores` per sentence); otherwise `translation` and `score`.
    """
    body = predict_request(texts, "translate_n_best" if n_best else "serving_default")
    request = urllib.request.Request(
        url, data=json.dumps(body).encode("utf-8"), headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=timeout) as response:
        return json.load(response)["outputs"]


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("text", nargs="+")
    parser.add_argument("--url", default="http://localhost:8501/v1/models/multi30k:predict")
    parser.add_argument("--n-best", action="store_true")
    args = parser.parse_args()
    try:
        outputs = translate(args.text, args.url, args.n_best)
    except OSError as error:  # urllib's URLError and HTTPError, a timeout
        parser.exit(1, f"rest_client.py: no answer from {args.url}: {error}. Is TF Serving running with "
                       "--rest_api_port, and the model name in the URL its --model_name?\n")
    key = "translations" if args.n_best else "translation"
    for text, translation in zip(args.text, outputs[key]):
        print(f"{text}\n  -> {translation}")


if __name__ == "__main__":
    main()
