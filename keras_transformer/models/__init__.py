"""Model assembly and named presets."""

from keras_transformer.models.conversion import as_transformer
from keras_transformer.models.conversion import copy_weights
from keras_transformer.models.presets import PRESETS
from keras_transformer.models.presets import get_preset
from keras_transformer.models.transformer import Transformer
from keras_transformer.models.transformer import build_from_preset
from keras_transformer.models.transformer import build_transformer
