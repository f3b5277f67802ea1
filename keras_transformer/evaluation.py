"""Corpus-level translation scores (BLEU, chrF) computed with sacreBLEU."""

import unicodedata
import warnings

from sacrebleu.metrics import BLEU
from sacrebleu.metrics import CHRF


def _check_corpus(name, sentences):
    if isinstance(sentences, (str, bytes)):
        raise ValueError(
            f"`{name}` must be a list of sentences, one per segment, not a "
            "single string. Received a string of length "
            f"{len(sentences)}; wrap it in a list."
        )
    sentences = list(sentences)
    for index, sentence in enumerate(sentences):
        if not isinstance(sentence, str):
            raise ValueError(
                f"`{name}` must hold detokenized strings. Received "
                f"{type(sentence).__name__} at index {index}: {sentence!r}."
            )
    return sentences


def _warn_about_normalization(hypotheses, references):
    """sacreBLEU compares code points: a reference in Unicode NFD (an `o` and
    a combining diaeresis) does not match the NFC `ö` of a translation (this
    library's output is NFC), and scores drop without a word."""
    decomposed = sum(not unicodedata.is_normalized("NFC", r) for r in references)
    if decomposed and not any(not unicodedata.is_normalized("NFC", h) for h in hypotheses):
        warnings.warn(
            f"{decomposed} of {len(references)} references are not in Unicode NFC (composed "
            "characters) while the translations are: BLEU and chrF count such characters as "
            "mismatches. Normalize the references to NFC first (unicodedata.normalize('NFC', line)).",
            stacklevel=3,
        )


def corpus_scores(hypotheses, references):
    """Corpus BLEU (cased and lowercased) and chrF of detokenized outputs.

    Scores with sacreBLEU's default settings (Post, 2018), so the numbers
    can be compared with published ones: BLEU with the `13a` tokenizer and
    exponential smoothing, cased (`bleu`) and case-insensitive
    (`bleu_lowercase`), and chrF (character 6-grams, beta 2). Each score
    comes with its sacreBLEU signature string, which records these settings
    and should be reported next to the number. One reference per segment.
    Texts are scored as given; references that are not in Unicode NFC
    beside translations that are get a `UserWarning` (their composed and
    decomposed characters would count as mismatches).

    Args:
        hypotheses: list of str. Detokenized system outputs, one per segment.
        references: list of str. Detokenized references, aligned with
            `hypotheses`.

    Returns:
        A dict with float scores in [0, 100] under `"bleu"`,
        `"bleu_lowercase"` and `"chrf"`, their signature strings under
        `"bleu_signature"`, `"bleu_lowercase_signature"` and
        `"chrf_signature"`, and `"num_segments"`.

    Raises:
        ValueError: if the two lists differ in length, are empty, are given
            as a single string, or hold something other than strings.

    Example:

    ```python
    scores = corpus_scores(["the cat sat on the mat"],
                           ["the cat sat on the mat"])
    scores["bleu"]  # 100.0
    scores["bleu_signature"]  # 'nrefs:1|case:mixed|eff:no|tok:13a|...'
    ```

    References:
        - [Papineni et al., 2002](https://aclanthology.org/P02-1040/), BLEU.
        - [Popović, 2015](https://aclanthology.org/W15-3049/), chrF.
        - [Post, 2018](https://aclanthology.org/W18-6319/), sacreBLEU.
        - [Vaswani et al., 2017](https://arxiv.org/abs/1706.03762),
          section 6.1 (BLEU on WMT 2014).
    """
    hypotheses = _check_corpus("hypotheses", hypotheses)
    references = _check_corpus("references", references)
    if len(hypotheses) != len(references):
        raise ValueError(
            "`hypotheses` and `references` must have one entry per segment. "
            f"Received {len(hypotheses)} hypotheses and {len(references)} "
            "references."
        )
    if not hypotheses:
        raise ValueError("Cannot score an empty corpus: received 0 segments.")

    _warn_about_normalization(hypotheses, references)
    bleu = BLEU()
    bleu_lowercase = BLEU(lowercase=True)
    chrf = CHRF()
    refs = [references]
    return {
        "bleu": float(bleu.corpus_score(hypotheses, refs).score),
        "bleu_lowercase": float(
            bleu_lowercase.corpus_score(hypotheses, refs).score
        ),
        "chrf": float(chrf.corpus_score(hypotheses, refs).score),
        "bleu_signature": str(bleu.get_signature()),
        "bleu_lowercase_signature": str(bleu_lowercase.get_signature()),
        "chrf_signature": str(chrf.get_signature()),
        "num_segments": len(hypotheses),
    }
