"""Reads TensorBoard event files back the way TensorBoard itself does, for tests."""


def scalars(run_dir):
    """Returns {tag: [value per step]} of the `epoch_*` scalars Keras's TensorBoard callback wrote to `run_dir`
    (a log directory's `train` or `validation` folder)."""
    from tensorboard.backend.event_processing import event_accumulator
    from tensorboard.util import tensor_util

    acc = event_accumulator.EventAccumulator(str(run_dir), size_guidance={event_accumulator.TENSORS: 0})
    acc.Reload()
    return {tag: [float(tensor_util.make_ndarray(e.tensor_proto)) for e in acc.Tensors(tag)]
            for tag in acc.Tags()["tensors"] if tag.startswith("epoch_")}
