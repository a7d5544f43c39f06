"""kfast.planning.layer_calls reads which layers a forward pass calls, nested ones included, from the graph Keras
records of calls on KerasTensors: nothing of Keras is wrapped or replaced, and the shapes are the backend's."""

import keras
import numpy as np
import pytest

from kfast._core import keras_private
from kfast.planning.layer_calls import trace

L = keras.layers


def _attention(length=16, width=32):
    x = tokens = keras.Input((length,), dtype="int32")
    x = L.Embedding(100, width, name="embed")(x)
    x = L.LayerNormalization(name="norm")(x + L.MultiHeadAttention(2, 8, name="attention")(x, x))
    return keras.Model(tokens, L.Dense(3, name="head")(L.GlobalAveragePooling1D(name="pool")(x)))


def _tree(calls):
    children = {id(child) for call in calls for child in call.children}

    def show(call):  # a layer by its name, an operation (named in sequence by Keras) by its class
        name = call.layer.name if isinstance(call.layer, L.Layer) else type(call.layer).__name__
        return (name, [tuple(t.shape) for t in call.outputs], [show(c) for c in call.children])
    return [show(call) for call in calls if id(call) not in children]


class _Block(L.Layer):
    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.inner = L.Dense(8, activation="relu", name="inner")
        self.drop = L.Dropout(0.5, name="drop")

    def call(self, x):  # the Dropout takes `training` from the caller, as Keras passes it down
        return x + self.drop(self.inner(x))


class _Model(keras.Model):
    def __init__(self):
        super().__init__(name="sub")
        self.block = _Block(name="block")
        self.out = L.Dense(2, name="out")

    def call(self, x, training=None):
        return self.out(self.block(x, training=training))


def test_a_layer_s_own_calls_are_its_children_with_the_shapes_the_backend_infers():
    model = _attention()
    calls, inputs = trace(model, keras.KerasTensor((4, 16), "int32"))
    tree = _tree(calls)
    attention = [call for call in tree if call[0] == "attention"][0]
    # EinsumDense's own compute_output_shape leaves the sequence unknown: the backend knows it.
    assert attention == ("attention", [(4, 16, 32)], [("query", [(4, 16, 2, 8)], []), ("key", [(4, 16, 2, 8)], []),
                                                      ("value", [(4, 16, 2, 8)], []),
                                                      ("attention_output", [(4, 16, 32)], [])])
    assert [call[0] for call in tree] == ["embed", "attention", "Add", "norm", "pool", "head"]
    assert calls[0].inputs == inputs  # the traced inputs themselves


def test_nothing_is_set_on_the_layers_and_the_summary_reads_as_before():
    model = _attention()
    lines_before = []
    model.summary(print_fn=lambda line, **_: lines_before.append(line))
    layers = keras_private.sublayers(model, recursive=True)
    before = {id(layer): (dict(vars(layer)), type(layer).call, type(layer).__call__) for layer in layers}
    trace(model, keras.KerasTensor((4, 16), "int32"))
    for layer in layers:
        attributes, call, dunder_call = before[id(layer)]
        assert (type(layer).call, type(layer).__call__) == (call, dunder_call), layer.name
        # Every attribute is the object it was (Keras's own lists of calls grow in place); Keras marks a layer
        # called when it is, as any call does.
        changed = {k for k, v in vars(layer).items() if attributes.get(k, object()) is not v} - {"_called"}
        assert not changed, (layer.name, changed)
    lines_after = []
    model.summary(print_fn=lambda line, **_: lines_after.append(line))
    assert lines_after == lines_before


def test_a_subclassed_model_is_read_through_its_blocks_in_training_mode():
    model = _Model()
    model(np.zeros((2, 8), "float32"))
    calls, _ = trace(model, keras.KerasTensor((4, 8)))
    assert _tree(calls) == [("block", [(4, 8)], [("inner", [(4, 8)], []), ("drop", [(4, 8)], [])]),
                            ("out", [(4, 2)], [])]


def test_a_layer_whose_call_does_not_run_on_keras_tensors_counts_as_one():
    # An LSTM with recurrent dropout: no rule for it was measured (an LSTM without has one, read in activations).
    model = keras.Sequential([keras.Input((10, 4)), L.LSTM(8, recurrent_dropout=0.1, name="lstm"),
                              L.Dense(1, name="head")])
    calls, _ = trace(model, keras.KerasTensor((4, 10, 4)))
    assert _tree(calls) == [("lstm", [(4, 8)], []), ("head", [(4, 1)], [])]


class _Concrete(keras.Model):
    def __init__(self):
        super().__init__(name="concrete")
        self.dense = L.Dense(2)

    def call(self, x):
        return self.dense(x) * float(np.asarray(x).sum())


def test_a_model_whose_call_does_not_run_on_keras_tensors_says_so():
    model = _Concrete()
    model(np.ones((2, 3), "float32"))
    with pytest.raises(ValueError, match=r"'concrete''s call\(\) does not run on KerasTensors.*use keras.ops"):
        trace(model, keras.KerasTensor((4, 3)))


def test_a_memory_estimate_names_the_layers_it_could_not_read_inside():
    from kfast.planning.memory import plan_memory

    # An LSTM with recurrent dropout: no rule for it was measured (an LSTM without has one, read in activations).
    model = keras.Sequential([keras.Input((10, 4)), L.LSTM(8, recurrent_dropout=0.1, name="lstm"),
                              L.Dense(1, name="head")])
    model.compile("adam", "mse")
    with pytest.warns(UserWarning, match=r"counts LSTM 'lstm' as one layer each"):
        plan_memory(model, batch_size=4, device_memory="1GB", compiled=False)
