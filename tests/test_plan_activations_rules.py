"""The rules of NOTE [ What the backward pass keeps ] (kfast/planning/activations.py) that follow the gradient:
a frozen part keeps nothing, a recurrent layer keeps its loop's tensors for every time step, a layer in inference
mode keeps what its inference needs, and a frozen part can make the forward pass the peak.

Each test reads the steps of a traced model (nothing runs); the counts are exact arithmetic of the rules. The
measured agreement with XLA's compiled step is in tests/test_plan_memory_xla.py and benchmarks/RESULTS.md."""

import keras
import pytest

from kfast.planning import activations
from kfast.planning import backward_pass

L = keras.layers


def _steps(model, shape, dtype="float32"):
    calls, inputs = activations.trace(model, keras.KerasTensor(shape, dtype))
    return activations.steps(calls, inputs), calls


def _base():
    return keras.Sequential([keras.Input((16, 16, 3)), L.Conv2D(8, 3, padding="same", name="c1"),
                             L.BatchNormalization(name="bn"), L.ReLU(name="r"),
                             L.Conv2D(8, 3, padding="same", name="c2")], name="base")


def _head(inputs, x):
    return keras.Model(inputs, L.Dense(2, name="out")(L.GlobalAveragePooling2D(name="pool")(x)))


def test_a_frozen_base_keeps_nothing_and_its_backward_is_the_heads_alone():
    base = _base()
    base.trainable = False
    tokens = keras.Input((16, 16, 3))
    frozen, _ = _steps(_head(tokens, base(tokens)), (4, 16, 16, 3))
    features = keras.Input((16, 16, 8))
    head, _ = _steps(_head(features, features), (4, 16, 16, 8))
    for step in frozen:
        if step.name in {"c1", "bn", "r", "c2"}:  # no gradient reaches it: its backward does not run
            assert not (step.gradient or step.kept or step.saved or step.temporary), step.name
    backward = [entry for entry in backward_pass.step_bytes(frozen, 4) if not entry[0].endswith("(forward)")]
    assert backward == [e for e in backward_pass.step_bytes(head, 4) if not e[0].endswith("(forward)")]


def test_a_frozen_base_peaks_in_its_forward_pass_at_its_largest_live_set():
    base = _base()
    base.trainable = False
    model = keras.Sequential([keras.Input((16, 16, 3)), base, L.GlobalAveragePooling2D(), L.Dense(2)])
    forward, _ = _steps(model, (4, 16, 16, 3))
    # c1's output is read by bn, bn's by the relu: at most two (4, 16, 16, 8) float32 maps live at once.
    # The breakdown adds the weight gradients apart; the forward pass holds none yet: given less.
    assert backward_pass.peak_bytes(forward, 4) == (2 * 4 * 16 * 16 * 8 * 4 - (8 * 2 + 2) * 4, "bn (forward)")


def test_a_frozen_dense_between_trained_ones_keeps_nothing_of_its_input_and_lora_keeps_it():
    model = keras.Sequential([keras.Input((32,)), L.Dense(64, name="a"), L.Dense(64, name="frozen"),
                              L.Dense(64, name="lora"), L.Dense(1, name="o")])
    model.get_layer("frozen").trainable = False
    model.get_layer("lora").enable_lora(4)  # its kernel frozen, lora_kernel_a and _b trained
    forward, _ = _steps(model, (8, 32))
    step = {s.name: s for s in forward}
    assert step["frozen"].gradient and step["frozen"].kept == [] and step["frozen"].weights == 0
    # Keras adds the low-rank product to the kernel and multiplies the input by the sum: the input is kept.
    assert [t.values for t in step["lora"].kept] == [8 * 64] and step["lora"].weights == 4 * 64 * 2 + 64


@pytest.mark.parametrize("length", [10, 20])
def test_an_lstm_keeps_thirteen_values_per_unit_and_its_input_for_each_time_step(length):
    model = keras.Sequential([keras.Input((length, 6)), L.LSTM(5, name="lstm"), L.Dense(1)])
    forward, calls = _steps(model, (3, length, 6))
    lstm = next(s for s in forward if s.name == "lstm")
    # The gates' pre-activations and activations (4 + 4 units), the cell state and its tanh, the previous hidden
    # state, the output stacked over time, the new state; and the step's input (6).
    assert [t.values for t in lstm.saved] == [3 * length * (13 * 5 + 6)]
    assert lstm.kept == [] and not any(call.unread for call in calls)  # read by its rule


def test_a_gru_and_a_simple_rnn_keep_their_measured_counts_per_time_step():
    gru = keras.Sequential([keras.Input((7, 6)), L.Dense(6, name="d"), L.GRU(5, name="gru"), L.Dense(1)])
    step = {s.name: s for s in _steps(gru, (3, 7, 6))[0]}["gru"]
    # Nine units kept per step, six more while its backward runs; the input projection for the whole sequence
    # at once keeps the input.
    assert ([t.values for t in step.saved], [t.values for t in step.temporary]) == ([3 * 7 * 9 * 5], [3 * 7 * 6 * 5])
    assert [t.values for t in step.kept] == [3 * 7 * 6]
    rnn = keras.Sequential([keras.Input((7, 6)), L.SimpleRNN(5, name="rnn"), L.Dense(1)])
    step = {s.name: s for s in _steps(rnn, (3, 7, 6))[0]}["rnn"]
    assert ([t.values for t in step.saved], [t.values for t in step.temporary]) == ([3 * 7 * (3 * 5 + 6)], [3 * 7 * 5])


def test_a_bidirectional_layer_keeps_both_directions_and_nothing_to_join_them():
    model = keras.Sequential([keras.Input((9, 4)), L.Bidirectional(L.LSTM(5, return_sequences=True), name="bi"),
                              L.Dense(1)])
    forward, calls = _steps(model, (2, 9, 4))
    loops = [s for s in forward if s.saved]
    assert [t.values for s in loops for t in s.saved] == [2 * 9 * (13 * 5 + 4)] * 2
    assert next(s for s in forward if s.name == "bi/own").kept == []
    assert not any(call.unread for call in calls)


class _Inference(keras.layers.Layer):
    """Calls its dropout in inference mode whatever the model's `training` (a functional model's call passes its
    own `training` to every layer, overriding one given when the graph was built)."""

    def __init__(self):
        super().__init__(name="block")
        self.drop = L.Dropout(0.5, name="drop")

    def call(self, x):
        return self.drop(x, training=False)


def test_batch_normalization_and_dropout_in_inference_mode_keep_nothing():
    frozen_bn = L.BatchNormalization(name="bn")
    frozen_bn.trainable = False  # Keras runs a frozen BatchNormalization in inference mode
    model = keras.Sequential([keras.Input((16,)), L.Dense(16, name="a"), frozen_bn, _Inference(), L.Dense(1)])
    step = {s.name: s for s in _steps(model, (4, 16))[0]}
    assert step["bn"].gradient and not (step["bn"].kept or step["bn"].saved)
    assert "drop" not in step  # inactive: a view of its input


def test_a_cross_entropy_loss_keeps_the_logits_and_their_log_softmax_until_its_backward():
    model = keras.Sequential([keras.Input((8,)), L.Dense(100, name="logits")])
    model.compile("sgd", keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    assert activations.loss_keeps(model)
    calls, inputs = activations.trace(model, keras.KerasTensor((4, 8)))
    forward = activations.steps(calls, inputs, activations.loss_keeps(model))
    loss = forward[-1]
    assert loss.name == "loss" and [t.values for t in loss.kept] == [400]
    assert [(t.values, t.kind) for t in loss.saved] == [(400, "float32")]
    # The loss's backward holds the logits, their log-softmax and the logits' gradient: 3 x 4 x 100 floats, net of
    # the 8 x 100 + 100 weight gradients not made yet.
    assert backward_pass.step_bytes(forward, 4)[-2] == ("loss", 3 * 400 * 4 - 900 * 4, 900 * 4)
    model.compile("sgd", "mse")
    assert not activations.loss_keeps(model)


def test_lora_keeps_the_merged_kernel_and_makes_its_gradient_in_its_backward():
    dense = L.Dense(32, name="d")
    model = keras.Sequential([keras.Input((16,)), dense])
    dense.enable_lora(4)
    (step, _), _ = _steps(model, (8, 16))
    assert [(t.values, t.kind) for t in step.saved] == [(16 * 32, "float")]
    assert [(t.values, t.kind) for t in step.temporary] == [(16 * 32, "float32")]
    assert step.weights == 16 * 4 + 4 * 32 + 32  # the low-rank factors and the bias train; the kernel is frozen


def test_a_gpu_counts_what_its_compiler_keeps_and_the_cpu_its_own_copies():
    # Conv -> BatchNormalization -> swish: XLA's CPU backend keeps a convolution's input re-laid-out, two tensors
    # of the normalisation and the swish's input and factors; its GPU backend fuses them: one of the
    # normalisation's, the swish's output (measured on the device-less H100 compile, benchmarks/memory_zoo.py).
    model = keras.Sequential([keras.Input((8, 8, 4)), L.Conv2D(4, 3, padding="same", name="c"),
                              L.BatchNormalization(name="bn"), L.Activation("swish", name="s"),
                              L.Conv2D(4, 3, padding="same", name="c2")])
    forward, _ = _steps(model, (2, 8, 8, 4))
    by_name = {step.name: step for step in forward}
    assert [t.only for t in by_name["bn"].saved] == [None, "cpu"]
    assert [t.only for t in by_name["s"].saved] == ["cpu", "cpu"] and by_name["s"].cpu_kept
    assert [t.only for t in by_name["c2"].saved] == ["cpu"]
    size = 2 * 8 * 8 * 4 * 4
    cpu, gpu = (dict((n, a) for n, a, _ in backward_pass.step_bytes(forward, 4, target=t)) for t in ("cpu", "gpu"))
    # At the last convolution's backward the CPU's alone: both convolutions' inputs re-laid-out, the second one's
    # output gradient re-laid-out, the normalisation's second tensor, the swish's input and its two factors.
    assert cpu["c2"] - gpu["c2"] == 7 * size
