"""Train a Transformer with `model.fit` in your own code.

Run: python examples/fit_in_user_code.py  (about a minute on two CPU cores)

Uses the generated toy corpus so that it runs anywhere; point `train_en` /
`train_de` at your own aligned files (plain or .gz) for real data.
"""

import keras_transformer as kt
from keras_transformer import fast_path
from keras_transformer.data import make_synthetic_corpus

train_en, train_de = make_synthetic_corpus(4000, seed=0)
val_en, val_de = make_synthetic_corpus(4200, seed=0)
val_en, val_de = val_en[4000:], val_de[4000:]  # sentences not in training

# 1. Subword tokenizers (SentencePiece), trained on the training side only.
src_tok = kt.train_subword_tokenizer(train_en, 400)
tgt_tok = kt.train_subword_tokenizer(train_de, 500)

# 2. tf.data pipelines: tokenize, add start/end, shift, bucket by length.
train_ds = kt.make_dataset(train_en, train_de, src_tok, tgt_tok, sequence_length=32, tokens_per_batch=2048)
val_ds = kt.make_dataset(val_en, val_de, src_tok, tgt_tok, sequence_length=32, shuffle=False)

# 3. The model, the paper's schedule, masked loss with label smoothing.
model = kt.build_from_preset("tiny", src_tok.vocab_size, tgt_tok.vocab_size, sequence_length=32)
model.compile(
    optimizer=kt.Adam(kt.WarmupSchedule(d_model=128, warmup_steps=300), beta_2=0.98, epsilon=1e-9),
    loss=kt.MaskedSparseCategoricalCrossentropy(label_smoothing=0.1),
    metrics=[kt.MaskedAccuracy()],
)
# Optional, tensorflow: the faster training step that `keras-transformer train`
# uses (position-wise work on real tokens only, fused CPU kernels).
fast_path.attach(model)
model.fit(train_ds, validation_data=val_ds, epochs=6)

# 4. Translate with beam search, then export a SavedModel for TF Serving.
translator = kt.Translator(model, src_tok, tgt_tok, beam_size=4)
print(translator(["A small dog runs in the park.", "The old woman reads a book."]).numpy())
kt.export_translator(translator, "runs/example_saved_model")
