"""What a training step keeps for its backward pass, read from the model's own layers.

`trace` (kfast.planning.layer_calls) runs the model forward once on symbolic tensors (no memory, no compute)
and records every layer call, nested ones included: what went in, what came out. `steps` turns the calls into
what each keeps for the backward pass; kfast.planning.backward_pass then replays the forward and backward passes
over them and finds the most activation memory live at once.

NOTE [ What the backward pass keeps ]
A layer's backward pass needs some of its forward tensors; those stay in memory from the forward pass until
that layer's backward has run (gradients of activations are produced and freed as the backward walks back).
The rules, per layer call (a functional model's operations between layers, such as a residual's add, are
steps too: an add keeps nothing, but its inputs' gradients flow from its backward):
  - the backward pass runs only between a trainable weight and the loss: a tensor gets a gradient when a step
    with trainable weights, or one whose inputs get one, made it. A step whose inputs get no gradient keeps only
    what its own weights' gradient needs, and a frozen one nothing (a frozen base under a trained head; `layer.
    trainable = False` leaves a layer no trainable weights);
  - a layer with trainable weights (Dense, Conv, EinsumDense...) keeps its floating inputs: the kernel's
    gradient is a product with them (Embedding's input is integer ids: nothing kept); frozen, a layer linear in
    its input (Dense, Conv, Embedding...) keeps nothing of it (its input's gradient needs the kernel alone).
    LoRA (`enable_lora`) keeps the input: Keras multiplies it by the kernel plus the low-rank product, and that
    merged kernel is kept for the input's gradient, whose own kernel-sized gradient (float32) is made during the
    layer's backward before the low-rank factors';
  - a convolution (Conv1D/2D/3D) also keeps a second copy of its input, the batch included, re-laid-out with
    the batch as the contracted axis (XLA makes it in the forward pass for the kernel's gradient), and its
    backward holds its output's gradient re-laid-out the same way while that gradient is computed;
  - a normalisation layer keeps the centred input and the normalised values (two tensors of its output's
    size; the per-row statistics are small), not its input; layer normalisation also keeps its inverse
    deviation and its scale broadcast to the input's whole shape (four tensors in all); on a GPU one tensor (its
    fusions recompute the rest from it); batch normalisation in
    inference mode (Keras's for a frozen one, `trainable=False`) is an affine map of its moving statistics and
    keeps nothing;
  - an activation computed from its output (relu, sigmoid, tanh, softmax, elu) keeps the output; one that
    needs its input keeps that, plus the factors autodiff saves (gelu: 3 tensors, silu/swish and mish: 2,
    others 1), each the output's size; on a GPU an activation layer of its own (not a Dense's or Conv's
    `activation=`) is fused with the elementwise code before it and recomputed: its output alone;
  - max pooling keeps its input and output, and on a GPU its backward holds the window selection and the scattered
    gradient, each its input's size; dropout (rate > 0, training) keeps a mask of one byte per value;
  - a recurrent layer (LSTM, GRU, SimpleRNN; Bidirectional holds two) loops over time on the backend, so its
    call() is not read; autodiff keeps its loop's tensors for every time step, counted per sample and step as
    measured in XLA's buffer assignment of Keras's JAX loop (jax 0.10.2, Keras 3.15): LSTM 13 x units (4 gate
    pre-activations, 4 gate values, the cell state and its tanh, the previous hidden state, the new state and
    the stacked output) plus its input's features (a transposed copy); GRU, whose input projection runs on the
    whole sequence at once and so keeps the input (a reversed copy when go_backwards), 9 x units kept and 6 x
    units more during its backward; SimpleRNN 3 x units plus the input's features, and 1 x units during its
    backward. Bidirectional's own code (reverse, join) keeps nothing. With recurrent dropout or unrolled (and a
    GRU with reset_after=False) no rule was measured: the layer stays `unread`;
  - views and reductions whose gradient needs nothing (Flatten, Reshape, Add, Concatenate, average
    pooling, cropping and padding, an inactive Dropout) keep nothing, and a view shares its input's memory;
  - a layer that calls sublayers keeps the sublayers' outputs that its own code uses (attention's query,
    key and value); MultiHeadAttention also keeps its attention probabilities, batch x heads x queries x
    keys float32 values (softmax runs in float32), and, on its fused path (no dropout), the scores (XLA
    keeps them and recomputes softmax in the backward) and the softmax denominator broadcast to the same
    shape: three such tensors; its backward holds two more (the gradients of the probabilities and of the
    scores); flash attention keeps none of them. With dropout, the probabilities and a one-byte mask, and on a
    GPU the scores too. A MultiHeadAttention whose call() is not read (a causal mask, Keras 3.16) is counted by
    these rules, with its inputs and its four projections (query, key, value, the heads' output) kept;
  - the loss is a step after the model's outputs: a cross-entropy keeps the logits and their log-softmax in
    float32 until its backward, which makes the logits' gradient (a language model's vocabulary-sized tensors
    are the step's peak there);
  - any other layer keeps its floating inputs (the safe guess).
Two compilers: the rules were measured in XLA's buffer assignment (jax 0.10.2) for this CPU and, without the
device, for an H100 (benchmarks/memory_zoo.py). Layout copies: the convolution's re-laid-out input and output
gradient, and the broadcasts kept whole (layer normalisation's two, attention's denominator), are copies XLA's
CPU backend makes; its GPU backend reads the original layouts. What one compiler holds and the other does not
is tagged (`Tensor.only`, `Step.cpu_kept`) and counted for its target alone (kfast.planning.backward_pass).
The forward pass can hold the most: every tensor lives until its last consumer has run (or its backward, if
kept), so a frozen base's largest block (a residual's two branches and their sum) may exceed the whole backward
pass; that is the peak then, its weight gradients not made yet.
At each step of the backward pass the live activation memory is: the kept tensors of that layer and of every
layer before it, the gradients in flight (each activation's gradient lives from the backward of its last
consumer to the backward of its producer: the residual stream's while a branch runs), and that layer's
temporaries (for a layer with an activation, the pre-activation's gradient: XLA gives it a buffer of its own
beside the output's). A layer with an activation runs its backward in two phases, and the more of the two
counts: the activation's (output, its gradient, the pre-activation's gradient), then the weights' (the output
and its gradient released; the pre-activation's gradient and the input's gradient). The peak is the step where
that and the weight gradients made so far (every gradient is held until the optimizer applies it) add up to
the most. An Embedding's gradient is a table-sized buffer its lookups' gradients are scattered into, held from
the backward pass's start. The model's inputs are the batch, counted apart. Checked against XLA's own analysis of the compiled
step in benchmarks/RESULTS.md.
"""

from __future__ import annotations

import math
from typing import Any

import keras

from kfast._core import keras_private
from kfast.planning.layer_calls import LayerCall
from kfast.planning.layer_calls import trace  # noqa: F401 - memory_model reads the calls through this module
from kfast.planning.steps import Step
from kfast.planning.steps import Tensor

# Activations whose gradient is computed from their output alone.
_FROM_OUTPUT = {"relu", "relu6", "sigmoid", "tanh", "softmax", "log_softmax", "elu", "exponential", "hard_sigmoid",
                "linear"}
# Extra tensors of the output's size that autodiff keeps for activations computed from their input.
_SAVED_FACTORS = {"gelu": 3, "silu": 2, "swish": 2, "mish": 2}
_L = keras.layers
_VIEWS = (_L.Flatten, _L.Reshape, _L.Identity, _L.InputLayer)
_FREE = (_L.Add, _L.Subtract, _L.Average, _L.Concatenate, _L.GlobalAveragePooling1D, _L.GlobalAveragePooling2D,
         _L.GlobalAveragePooling3D, _L.AveragePooling1D, _L.AveragePooling2D, _L.AveragePooling3D, _L.Cropping1D,
         _L.Cropping2D, _L.Cropping3D, _L.ZeroPadding1D, _L.ZeroPadding2D, _L.ZeroPadding3D, _L.RepeatVector,
         _L.Permute, _L.UpSampling1D, _L.UpSampling2D, _L.UpSampling3D)
_FREE_OPS = {"Add", "Subtract", "Concatenate", "Reshape", "Transpose", "ExpandDims", "Squeeze"}  # keras.ops
_NORMS = (_L.LayerNormalization, _L.BatchNormalization, _L.GroupNormalization, _L.RMSNormalization)
_CONVS = (_L.Conv1D, _L.Conv2D, _L.Conv3D)
# Layers whose input's gradient needs their kernel alone: frozen, they keep nothing of their input.
_LINEAR = (_L.Dense, _L.EinsumDense, _L.Embedding, *_CONVS, _L.Conv1DTranspose, _L.Conv2DTranspose,
           _L.Conv3DTranspose, _L.DepthwiseConv1D, _L.DepthwiseConv2D, _L.SeparableConv1D, _L.SeparableConv2D)
# Floats per sample and time step a recurrent layer's loop keeps (per unit, per input feature) and holds during
# its backward alone (per unit); see the NOTE.
_RECURRENT = {_L.LSTM: (13, 1, 0), _L.GRU: (9, 0, 6), _L.SimpleRNN: (3, 1, 1)}
_MAX_POOLS = (_L.MaxPooling1D, _L.MaxPooling2D, _L.MaxPooling3D, _L.GlobalMaxPooling1D, _L.GlobalMaxPooling2D,
              _L.GlobalMaxPooling3D)


def _kind(t: Any) -> str:
    dtype = keras.backend.standardize_dtype(t.dtype)
    return "float" if keras.backend.is_float_dtype(dtype) else dtype


def _values(t: Any) -> int:
    return int(math.prod(int(d) for d in t.shape))


def _activation_name(layer: Any) -> str | None:
    if isinstance(layer, (_L.ReLU, _L.Softmax, _L.ELU)):
        return "relu"  # computed from their output, like relu
    fn = getattr(layer, "activation", None)
    return getattr(fn, "__name__", None) if callable(fn) else None


class _Steps:
    """Turns recorded calls into `Step`s with tensors keyed by identity (a view shares its input's key)."""

    def __init__(self, model_inputs: list[Any]) -> None:
        self.alias: dict[int, int] = {}
        self.inputs = {id(t) for t in model_inputs}
        self.objects: list[Any] = list(model_inputs)  # keeps traced tensors alive, so ids stay unique

    def tensor(self, t: Any, kind: str | None = None) -> Tensor:
        self.objects.append(t)
        key = id(t)
        while key in self.alias:
            key = self.alias[key]
        return Tensor(key, _values(t), kind or _kind(t))

    def floats(self, ts: list[Any]) -> list[Tensor]:
        out = [self.tensor(t) for t in ts]
        return [t for t in out if t.kind == "float" and t.key not in self.inputs]

    def recurrent(self, call: LayerCall, step: Step) -> Step:
        """A recurrent layer's loop over time, by its cell's rule; read so, it is no longer `unread`."""
        layer = call.layer
        per_unit, per_feature, during = next(v for k, v in _RECURRENT.items() if isinstance(layer, k))
        batch, length, features = (int(d) for d in call.inputs[0].shape)
        step.saved = [Tensor(-1, batch * length * (per_unit * layer.units + per_feature * features), "float")]
        step.temporary = [Tensor(-1, batch * length * during * layer.units, "float")]
        if isinstance(layer, _L.GRU):  # its input projection, for the whole sequence at once, keeps the input
            if layer.go_backwards:  # ... reversed: a copy
                step.saved.append(Tensor(-1, batch * length * features, "float"))
            else:
                step.kept = self.floats(call.inputs[:1])
        call.unread = False
        return step

    def attention(self, call: LayerCall, step: Step) -> Step:
        """MultiHeadAttention whose call() was not read (Keras 3.16's, or with a causal mask): by the rule for its
        parts, what its sublayers keep (its inputs, the query, key and value projections and the heads' combined
        output, each batch x tokens x heads x key_dim) and its scores."""
        layer = call.layer
        step.kept = self.floats(call.inputs)
        query, value = call.inputs[0].shape, (call.inputs[1] if len(call.inputs) > 1 else call.inputs[0]).shape
        width = layer.num_heads * layer.key_dim
        tokens = int(query[0]) * math.prod(int(d) for d in query[1:-1])
        step.saved = [Tensor(-1, tokens * width, "float"),  # the query projection and the heads' output
                      Tensor(-1, tokens * width, "float")]
        keys = int(value[0]) * math.prod(int(d) for d in value[1:-1])
        step.saved += [Tensor(-1, keys * width, "float")] * 2  # the key and value projections
        scores, temporary = _attention_scores(call)
        step.saved += scores
        step.temporary = temporary
        call.unread = False
        return step

    def leaf(self, call: LayerCall) -> Step | None:
        layer = call.layer
        idle = isinstance(layer, _L.Dropout) and (call.training is False or not 0 < getattr(layer, "rate", 0) < 1)
        if (isinstance(layer, _VIEWS) or idle) and len(call.inputs) == 1 and len(call.outputs) == 1:
            self.alias[id(call.outputs[0])] = self.tensor(call.inputs[0]).key
            self.objects.append(call.outputs[0])
            return None
        step = Step(layer.name, [self.tensor(t) for t in call.inputs], [self.tensor(t) for t in call.outputs])
        step.weights = _trainable_values(layer) if call.unread else _values_of(getattr(layer, "trainable_weights", []))
        step.scattered = isinstance(layer, _L.Embedding)
        if isinstance(layer, _FREE) or type(layer).__name__ in _FREE_OPS:
            return step
        if isinstance(layer, _L.BatchNormalization) and (call.training is False or not layer.trainable):
            return step  # inference mode (Keras's for a frozen one): an affine map with its moving statistics
        if _read_by_rule(layer) and len(call.inputs[0].shape) == 3:
            return self.recurrent(call, step)
        if isinstance(layer, _L.MultiHeadAttention):
            return self.attention(call, step)
        if isinstance(layer, _L.Dropout):
            step.saved = [Tensor(-1, t.values, "bool") for t in step.outputs]
            return step
        if isinstance(layer, _NORMS):
            # (x - mean) and the normalised values, each the output's size; the statistics are small. Layer
            # normalisation also keeps its inverse deviation and its scale broadcast whole (layout copies).
            copies = 2 if isinstance(layer, _L.LayerNormalization) else 0
            step.saved = [Tensor(-1, t.values, t.kind, "cpu" if i else None) for t in step.outputs if t.kind == "float"
                          for i in range(2 + copies)]
            return step
        if isinstance(layer, _MAX_POOLS):
            step.kept = self.floats(call.inputs) + step.outputs
            # Its backward scatters the output's gradient back over each window: XLA holds the selection and the
            # scattered gradient, each the input's size (measured on the H100 compile).
            step.temporary = [Tensor(-1, t.values, t.kind, "gpu") for t in step.kept[:1] for _ in range(2)]
            return step
        activation = _activation_name(layer)
        weighted = bool(getattr(layer, "trainable_weights", []))
        if not weighted and not isinstance(layer, (_L.Activation, *_LINEAR)) and activation is None:
            step.kept = self.floats(call.inputs)  # an unknown layer: its inputs, the safe guess
            return step
        step.kept = self.floats(call.inputs) if weighted else []
        if getattr(layer, "lora_enabled", False):
            # Keras adds the low-rank product to the frozen kernel: the merged kernel is kept for the input's
            # gradient, and the kernel-sized gradient of it is made before lora_a's and lora_b's.
            a, b = layer.lora_kernel_a.shape, layer.lora_kernel_b.shape
            kernel = math.prod(int(d) for d in a[:-1]) * int(b[-1])
            step.saved.append(Tensor(-1, kernel, "float"))
            step.temporary.append(Tensor(-1, kernel, "float32"))
        # An activation layer of its own is fused on a GPU with the elementwise code before it and recomputed
        # from there; a (frozen) Dense's or Conv's `activation=` follows a product that is stored.
        fused = not weighted and not isinstance(layer, _LINEAR)
        if activation not in (None, "linear"):
            # The gradient of the pre-activation: XLA gives it a buffer of its own beside the output's (on a GPU,
            # not when fused).
            step.temporary += [Tensor(-1, t.values, t.kind, "cpu" if fused else None) for t in step.outputs
                               if t.kind == "float"]
            step.activation = True
        if activation in _FROM_OUTPUT and activation != "linear":
            step.kept += [t for t in step.outputs if t.kind == "float"]
        elif activation not in (None, "linear"):
            step.kept += [t for t in step.outputs if t.kind == "float"]
            if not weighted:  # a GPU recomputes a fused activation's input from what came before
                step.cpu_kept = self.floats(call.inputs)
                if not fused:
                    step.kept += step.cpu_kept
                    step.cpu_kept = []
            step.saved = [Tensor(-1, t.values, t.kind, "cpu" if fused else None) for t in step.outputs
                          if t.kind == "float"
                          for _ in range(_SAVED_FACTORS.get(activation, 1))]
        if isinstance(layer, _CONVS) and weighted:
            # The kernel's gradient convolves the input re-laid-out (batch as the contracted axis): that copy is
            # made in the forward pass and held until the kernel gradient (a layout copy), the batch's too.
            step.saved += [Tensor(-1, t.values, t.kind, "cpu") for t in map(self.tensor, call.inputs)
                           if t.kind == "float"]
            # ... and the output's gradient re-laid-out the same way, while the kernel's gradient is computed.
            step.temporary += [Tensor(-1, t.values, t.kind, "cpu") for t in step.outputs if t.kind == "float"]
        return step

    def own(self, call: LayerCall, made: set[int]) -> Step:
        """The composite layer's own code: it uses what its sublayers made and no sublayer took, and makes
        what sublayers take that no one made."""
        taken = {id(t) for child in call.children for t in child.inputs}
        finals = {id(t) for t in call.outputs}
        used = [t for child in call.children for t in child.outputs if id(t) not in taken and id(t) not in finals]
        step = Step(call.layer.name + "/own", [self.tensor(t) for t in used])
        outside = {id(t) for t in call.inputs} | made
        step.outputs = [self.tensor(t) for child in call.children for t in child.inputs if id(t) not in outside]
        step.outputs += [self.tensor(t) for t in call.outputs if id(t) not in made]
        layer = call.layer
        # Bidirectional's own code reverses and joins its layers' outputs: nothing kept.
        step.kept = [] if isinstance(layer, _L.Bidirectional) else self.floats(used)
        if isinstance(layer, _L.MultiHeadAttention):
            step.saved, step.temporary = _attention_scores(call)
        return step

    def steps(self, call: LayerCall) -> list[Step]:
        if not call.children:
            step = self.leaf(call)
            return [step] if step else []
        out: list[Step] = []
        made: set[int] = set()
        own_at = None
        for child in call.children:
            if own_at is None and any(id(t) not in made and id(t) not in {id(i) for i in call.inputs}
                                      for t in child.inputs):
                own_at = len(out)
            out += self.steps(child)
            made |= {id(t) for t in child.outputs}
        own = self.own(call, made)
        out.insert(len(out) if own_at is None else own_at, own)
        return out


def _values_of(variables: list[Any]) -> int:
    return sum(math.prod(int(d) for d in v.shape) for v in variables)


def _trainable_values(layer: Any) -> int:
    """The trainable values inside a layer read as one: its innermost layers' that train, as Keras's own list of a
    model's trainable variables counts them (a frozen block with LoRA: its low-rank factors, though the block's
    own `trainable_weights` is empty)."""
    inner = [sub for sub in keras_private.sublayers(layer, recursive=True) if not keras_private.sublayers(sub)]
    return _values_of([v for sub in inner if sub.trainable for v in sub.trainable_weights]) if inner else _values_of(
        getattr(layer, "trainable_weights", []))


def _attention_scores(call: LayerCall) -> tuple[list[Tensor], list[Tensor]]:
    """What MultiHeadAttention's own code keeps of its scores (saved) and holds during its backward (temporary):
    see the NOTE; flash attention keeps none of them."""
    layer = call.layer
    if getattr(layer, "_flash_attention", False):
        return [], []
    query = call.inputs[0].shape
    value = call.inputs[1].shape if len(call.inputs) > 1 else query
    scores = int(query[0]) * layer.num_heads * math.prod(int(d) for d in query[1:-1]) * math.prod(
        int(d) for d in value[1:-1])
    saved = [Tensor(-1, scores, "float32")]  # the attention probabilities
    if getattr(layer, "dropout", 0) > 0:  # the mask; a GPU's step keeps the scores as on the fused path
        saved += [Tensor(-1, scores, "bool"), Tensor(-1, scores, "float32", "gpu")]
    else:  # the fused product: its scores, kept to recompute softmax, and the denominator broadcast whole
        saved += [Tensor(-1, scores, "float32"), Tensor(-1, scores, "float32", "cpu")]
    return saved, [Tensor(-1, scores, "float32")] * 2  # gradients of the probabilities and scores


def _read_by_rule(layer: Any) -> bool:
    """Whether a recurrent layer runs the loop its rule was measured on (no recurrent dropout, not unrolled;
    a GRU on its fused path)."""
    if not isinstance(layer, tuple(_RECURRENT)) or getattr(layer, "unroll", False) or getattr(
            layer, "recurrent_dropout", 0):
        return False
    return not isinstance(layer, _L.GRU) or layer.reset_after


def _prune(forward: list[Step]) -> None:
    """Drops what no backward pass needs: a step that no trainable weight precedes gets no gradient; one whose
    inputs get none keeps only what its own weights' gradient needs (nothing, when frozen)."""
    carried: set[int] = set()  # tensors a gradient reaches
    for step in forward:
        reached = any(t.key in carried for t in step.inputs)
        step.gradient = reached or step.weights > 0
        if step.gradient:
            carried |= {t.key for t in step.outputs}
        if not reached and not step.weights:
            step.kept, step.cpu_kept, step.saved, step.temporary, step.activation = [], [], [], [], False


def steps(calls: list[LayerCall], model_inputs: list[Any], loss_keeps: bool = False) -> list[Step]:
    """The forward pass as `Step`s in execution order, from `trace`'s calls, then the loss's step over the
    model's outputs (`loss_keeps`: a cross-entropy, which keeps its log-probabilities). A recurrent layer read by
    its rule is marked read (`unread` False)."""
    builder = _Steps(model_inputs)
    children = {id(child) for call in calls for child in call.children}
    out: list[Step] = []
    for call in calls:
        if id(call) not in children:  # top-level calls, in the order they ran
            out += builder.steps(call)
    made = {t.key for step in out for t in step.outputs}
    used = {t.key for step in out for t in step.inputs}
    finals = [t for step in out for t in step.outputs if t.key in made - used and t.kind == "float"]
    loss = Step("loss", inputs=finals)
    if loss_keeps:  # the logits and their log-softmax in float32, until the loss's backward
        loss.kept = list(finals)
        loss.saved = [Tensor(-1, t.values, "float32") for t in finals]
    out.append(loss)
    _prune(out)
    return out


def loss_keeps(model: Any) -> bool:
    """Whether `model`'s compiled loss keeps a tensor of its outputs' size for its backward: the cross-entropies
    do (their log-probabilities).

    Example:

    >>> model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3)])
    >>> model.compile("sgd", keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    >>> loss_keeps(model)
    True
    """
    losses = keras.tree.flatten(getattr(model, "loss", None))
    names = [loss if isinstance(loss, str) else type(loss).__name__ for loss in losses if loss is not None]
    return any("crossentropy" in name.lower().replace("_", "") for name in names)
