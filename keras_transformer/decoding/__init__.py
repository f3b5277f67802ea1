"""Decoding strategies: greedy and beam search, both with a key/value cache."""

from keras_transformer.decoding.beam_search import beam_search
from keras_transformer.decoding.beam_search import length_penalty_factor
from keras_transformer.decoding.ensemble import EnsembleParts
from keras_transformer.decoding.greedy import greedy_search
from keras_transformer.decoding.limits import decode_limits
from keras_transformer.decoding.model_parts import TransformerParts
from keras_transformer.decoding.model_parts import transposed_output_table
