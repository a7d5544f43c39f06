"""Every name kfast takes from Keras's private tree (`keras.src`), in one place.

Keras brings a foreign loader into `fit`, `evaluate` and `predict` through a data adapter: `get_data_adapter`
passes an instance of its `DataAdapter` through as is ("Allow passing a custom data adapter"), as Keras's own
`GrainDatasetAdapter` and `TorchDataLoaderAdapter` bring Grain and PyTorch loaders in. `DataAdapter` and the
helpers that turn an adapter's batches into each backend's form live under `keras.src` only, so they are
imported here and nowhere else; tests/test_keras_private.py fails when a Keras release moves or renames one.
"""

from __future__ import annotations

from keras.src.trainers.data_adapters import data_adapter_utils
from keras.src.trainers.data_adapters.data_adapter import DataAdapter

__all__ = ["DataAdapter", "class_weight_to_sample_weights", "jax_iterator", "numpy_iterator", "tensor_spec",
           "torch_dataloader", "SPEC_BATCHES"]

# Batches Keras looks at to find the tf.data signature of a PyDataset (its own adapter's number).
SPEC_BATCHES: int = data_adapter_utils.NUM_BATCHES_FOR_TENSOR_SPEC
numpy_iterator = data_adapter_utils.get_numpy_iterator
jax_iterator = data_adapter_utils.get_jax_iterator
torch_dataloader = data_adapter_utils.get_torch_dataloader
tensor_spec = data_adapter_utils.get_tensor_spec
class_weight_to_sample_weights = data_adapter_utils.class_weight_to_sample_weights
