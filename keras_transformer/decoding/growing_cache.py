"""TensorFlow fast path of incremental decoding: self-attention caches that
grow by one position per step.

The backend-neutral caches have fixed sizes, as JAX and XLA need static
shapes: 16, 32, then 64 slots in turn (`TransformerParts.cache_phases`), and
every step rewrites, attends over and, in beam search, reorders every slot
of its phase. On TensorFlow without XLA a
`tf.while_loop` can carry a cache whose length grows, so a step at position
`t` appends one slot and reads and reorders `t + 1`: the same values with a
fraction of the memory traffic (outputs are the same; only the float
summation order of the attention can differ in the last bits).

With the same switch, `beam_search` drops each sentence from the batch
once its `n_best` hypotheses are final, instead of carrying it until the
slowest sentence is done: later steps run on fewer rows (`relax_batch`
lets the loop's tensors shrink).

`TransformerParts(model, growing_cache=True)` switches both on;
`Translator` does on the tensorflow backend unless `jit_compile` is set.
"""

import keras


def available(jit_compile=False):
    """Whether growing caches can run: tensorflow backend, no XLA."""
    return keras.backend.backend() == "tensorflow" and not jit_compile


def empty_growing_cache(batch_size, num_heads, key_dim, dtype):
    """Zero-length `(key (batch, heads, 0, key_dim), value (batch, heads, 0,
    key_dim))` whose length axis is unknown to the graph, so a
    `tf.while_loop` accepts it growing.

    Unlike the fixed-size caches, the keys are not transposed: a step
    appends one row of `key_dim` values to each head's block instead of one
    value to each of `key_dim` rows, a copy several times cheaper, and the
    attention multiplies by their transpose within the product
    (`single_query_attention(..., keys_transposed=False)`)."""
    import tensorflow as tf

    key = tf.zeros((batch_size, num_heads, 0, key_dim), dtype)
    value = tf.zeros((batch_size, num_heads, 0, key_dim), dtype)
    return (
        tf.raw_ops.PlaceholderWithDefault(input=key, shape=[None, num_heads, None, key_dim]),
        tf.raw_ops.PlaceholderWithDefault(input=value, shape=[None, num_heads, None, key_dim]),
    )


def relax_batch(tensor):
    """`tensor` with its first axis unknown to the graph, so a
    `tf.while_loop` accepts it shrinking (beam search drops the sentences
    that are done)."""
    import tensorflow as tf

    shape = [None] + list(tensor.shape[1:])
    return tf.raw_ops.PlaceholderWithDefault(input=tensor, shape=shape)
