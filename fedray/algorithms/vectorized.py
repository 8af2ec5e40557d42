"""Vectorised local training: a worker's clients that share an architecture trained as one batched
computation (``train.vectorize``), with :mod:`torch.func` (``functional_call`` and ``vmap``; one
backward pass of autograd through the sum of the clients' losses gives each client its own gradient)
on parameters and SGD state stacked over the group's clients.

The maths is the loop's (:func:`fedray.algorithms.local.local_train` with
:class:`~fedray.algorithms.local.ClientSGD`), client by client:

- **Batches.** Each client draws its batches from its own seeded generator, in the loop's order:
  ``ClientContext.batches`` itself is iterated for every client, one batch a step (with the
  ``none`` augmentation, which draws nothing, the same ``torch.randperm`` draws are made up front
  and the group's batches gathered and normalised in one indexing operation a step).
- **Lockstep.** Step ``t`` trains every client that has a ``t``-th batch; a client with fewer
  batches is masked after its last one: the group is ordered by step count, longest first, so the
  clients still training are a prefix of the stacked tensors, and a step computes and writes that
  prefix only (the others' parameters, momentum and loss sums stop changing, at no cost).
- **Partial batches.** Batches are padded to ``train.batch_size``. A step where some client's batch
  is partial computes each sample's loss (``task.loss`` of that sample alone, under an inner
  ``vmap``) and their sum weighted by ``1/n_real`` (0 for padding): the mean over the real samples,
  so its gradient is the loop's. Steps where every trained client has a full batch call
  ``task.loss`` on the batch, as the loop does. This needs a task whose loss is the mean of its
  samples' losses (classification, regression, multilabel; not language modelling, whose mean is
  over counted tokens).
- **BatchNorm.** Each client's running statistics (``running_mean`` and ``running_var``, in the flat
  layout) are stacked ``[group, C]`` beside its parameters. During the group's training a BatchNorm
  layer runs :func:`masked_batch_norm` instead of its ``forward`` (shadowed on the instance, restored
  after): a pure function that normalises each client's batch by the mean and biased variance of
  its real samples only (the step's sample weights as the mask, so padding weighs nothing) and
  returns, through ``vmap``, the batch mean and the unbiased variance (``n/(n−1)``, n the real values
  per channel: real samples × spatial positions). :func:`train_group` then updates the statistics of
  the clients trained at that step, ``r ← (1 − momentum)·r + momentum·s``, as ``F.batch_norm`` does;
  nothing is written in place under ``vmap``, and a client that has stopped keeps its statistics, as
  its parameters. The worker's model's ``num_batches_tracked`` (an integer outside the flat layout,
  read only with ``momentum=None``) advances by the group's steps, as the loop advances it. A batch
  with one value per channel raises torch's ``ValueError``, as the loop's does.
- **SGD.** ``g ← clip(g)`` (per client: the norm over all of that client's gradients, as
  ``clip_grad_norm_``), ``g ← g + λw``, ``b ← g`` at the first step then ``b ← μb + g``,
  ``w ← w − η b``: ``torch.optim.SGD``'s single-tensor update on stacked tensors.

Equivalence: the same maths, not the same bits. Batched kernels (``bmm`` for a stack of
``Linear`` layers, grouped convolutions for a stack of ``Conv2d``) sum in another order than the
loop's per-client kernels, so weights differ from the loop's by float32 rounding, which SGD carries
from step to step: ``tests/runtime/test_vectorized.py`` checks one round's uploads against the loop
with ``rtol=1e-5, atol=1e-6``. A BatchNorm network can amplify that rounding far more, in the loop
itself (a batch of one real sample, many activations at ReLU's kink): its float32 test trains at a
stable learning rate, and a float64 test shows the maths where float32 cannot. A vectorised run is
itself deterministic.

What runs as a loop instead (:func:`loop_reason`; ``train.vectorize: on`` refuses the run with that
reason, ``auto`` trains with the loop and says so once): an algorithm that does not declare
``vectorizable`` (or a subclass that overrides its client step), ``train.optimizer=adam``, a task
whose loss is not a mean over samples, and models with float buffers other than BatchNorm's running
statistics, BatchNorm with ``momentum=None`` (a cumulative average over ``num_batches_tracked``,
which the flat weights do not carry), dropout (the loop draws its masks from torch's global RNG,
seeded per client), recurrent layers (``vmap`` does not batch them) or frozen parameters.

**An algorithm opts in** with ``vectorizable = True`` and four pure hooks (FedAvg's are the
defaults; FedProx overrides :meth:`vectorized_loss`):

- ``vectorized_start(broadcast) -> flat``: the flat weights every client starts from;
- ``vectorized_inputs(ctx, broadcast) -> dict[str, Tensor]``: per-client tensors the loss reads
  (stacked over the group: SCAFFOLD's ``c − c_i``, FedDyn's gradient of its linear term);
- ``vectorized_loss(base, params, start, inputs) -> (loss, terms)``: one client's objective of a
  batch from its mean base loss ``base``, its parameters (a dict of tensors), the start parameters
  and its inputs; a pure tensor function (it runs under ``vmap`` and ``grad``); ``terms`` are the
  loss terms reported beside ``train_loss``, as the loop's ``loss_fn`` returns them;
- ``vectorized_update(ctx, broadcast, flat, metrics, inputs) -> ClientUpdate``: the client's update
  from its trained flat weights (then the worker's upload path, as for the loop).

The declaration is checked per class: a subclass that overrides ``client_update``, ``local_loss``,
``model_key``, ``build_model`` or one of the hooks is not vectorised unless it declares
``vectorizable`` itself.

Group size: ``resources.vectorize_group``, or :func:`automatic_group_size`, a memory estimate (per
client: the parameters stacked five times, for weights, gradients, momentum and the update's
temporaries, plus ``train.batch_size`` × (the model's per-sample activations four times, for the
forward pass, the saved activations, their gradients and the per-sample loss, plus the input))
against :func:`memory_budget` (an eighth of the machine's memory on CPU, half of the worker's share
of the GPU's), capped at :data:`MAX_AUTOMATIC_GROUP`. A group that still runs out of memory is
halved and trained again from fresh contexts (the same seeded draws).

Which clients share a group (the group size, the worker count) can change a CNN's weights within
the tolerance above: a grouped convolution's kernel depends on its number of groups. An MLP's
client gives the same bits in any group. A run with the same config on the same machine groups its
clients the same way and repeats bit for bit (unless a group ran out of memory and was halved).
"""

from __future__ import annotations

import math
import os
from contextlib import contextmanager
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING, Any, Callable, Iterator

import torch
from torch import nn
from torch.func import functional_call, vmap
from torch.nn.modules.batchnorm import _BatchNorm
from torch.nn.modules.dropout import _DropoutNd

from fedray.algorithms.base import ClientContext, ClientUpdate, Tensor
from fedray.config import ConfigError, RunConfig
from fedray.data import get_augmentation
from fedray.models.weights import state_keys
from fedray.tasks import Classification, Multilabel, Regression

if TYPE_CHECKING:
    from fedray.algorithms.base import Algorithm, Broadcast

#: What :func:`vectorized_path` returns for a run that trains its clients vectorised.
VECTORIZED = "vectorized"
#: The methods a subclass of a ``vectorizable`` class must not override without declaring ``vectorizable`` itself.
CLIENT_METHODS = (
    "client_update",
    "local_loss",
    "model_key",
    "build_model",
    "vectorized_start",
    "vectorized_inputs",
    "vectorized_loss",
    "vectorized_update",
)
#: Task losses that are the mean of their samples' losses (what padding a partial batch needs).
PER_SAMPLE_MEAN_LOSSES = (Classification.loss, Regression.loss, Multilabel.loss)
#: The largest group :func:`automatic_group_size` chooses (``resources.vectorize_group`` may set more).
MAX_AUTOMATIC_GROUP = 256
#: Copies of the parameters each client of a group holds at once (weights, gradients, momentum,
#: the update's temporaries), and of its activations (forward, saved, gradients, per-sample loss).
PARAMETER_COPIES, ACTIVATION_COPIES = 5, 4


# --------------------------------------------------------------------- which path


def algorithm_reason(cls: type[Algorithm]) -> str | None:
    """Why ``cls`` cannot be vectorised (None: it can)."""
    label = cls.name or cls.__name__
    owner = next((klass for klass in cls.__mro__ if "vectorizable" in vars(klass)), None)
    if owner is None or not owner.vectorizable:  # type: ignore[attr-defined]
        return f"algorithm {label} does not declare vectorizable (its client update is not written as pure batched functions)"
    for method in CLIENT_METHODS:
        if getattr(cls, method, None) is not getattr(owner, method, None):
            return (
                f"algorithm {label} overrides {method} of {owner.__name__} and does not declare vectorizable itself "
                "(its client step may differ from the vectorised one)"
            )
    return None


def config_reason(config: RunConfig, algorithm: Algorithm) -> str | None:
    """Why ``config``'s training cannot be vectorised (None: it can)."""
    if config.train.optimizer != "sgd":
        return f"train.optimizer={config.train.optimizer} (the vectorised loop steps SGD only)"
    loss = getattr(type(algorithm.task), "loss", None)
    if loss not in PER_SAMPLE_MEAN_LOSSES:
        return f"data.task={config.data.task}: its loss is not a mean over samples, which padding a partial batch needs"
    return None


def model_reason(model: nn.Module) -> str | None:
    """Why ``model`` cannot be trained under ``vmap`` with the loop's maths (None: it can)."""
    label = type(model).__name__
    for name, module in model.named_modules():
        where = f" ({name})" if name else ""
        if isinstance(module, _BatchNorm) and module.track_running_stats and module.momentum is None:
            return (
                f"model {label} has BatchNorm{where} with momentum=None, a cumulative average over num_batches_tracked, "
                "which the flat weights do not carry"
            )
        if isinstance(module, _DropoutNd) and module.p > 0:
            return f"model {label} has dropout{where}, whose masks the loop draws from torch's global RNG, seeded per client"
        if isinstance(module, nn.RNNBase):
            return f"model {label} has a recurrent layer{where}, which torch.func.vmap does not batch"
    running = set(running_keys(model))
    buffers = [name for name, buffer in model.named_buffers() if buffer.is_floating_point() and name not in running]
    if buffers:
        return f"model {label} has float buffers ({buffers[0]}), which the vectorised loop does not keep per client"
    if getattr(model, "frozen_keys", None) or not all(p.requires_grad for p in model.parameters()):
        return f"model {label} has frozen parameters (model.freeze / model.adapters)"
    keys = state_keys(model)
    if len(keys) != len(set(keys)) or set(keys) != {name for name, _ in model.named_parameters()} | running:
        return f"model {label}'s flat weights are not its parameters and BatchNorm running statistics"
    return None


def loop_reason(config: RunConfig, algorithm: Algorithm, model: nn.Module | None = None) -> str | None:
    """Why a run trains its clients as a loop (None: vectorised): ``train.vectorize=off``, or the
    algorithm's, the config's or (when given) the model's reason."""
    if config.train.vectorize == "off":
        return "train.vectorize=off"
    reason = algorithm_reason(type(algorithm)) or config_reason(config, algorithm)
    if reason is None and model is not None:
        reason = model_reason(model)
    return reason


def vectorized_path(config: RunConfig, algorithm: Algorithm, model: nn.Module) -> str:
    """``"vectorized"``, or ``"loop: <reason>"``: how the workers of a run train its clients
    (``model``: the algorithm's built model, e.g. for ``run_info.json``)."""
    reason = loop_reason(config, algorithm, model)
    return VECTORIZED if reason is None else f"loop: {reason}"


def check_vectorizable(config: RunConfig, algorithm: Algorithm, model: nn.Module | None = None) -> None:
    """``train.vectorize=on`` for a run that cannot be vectorised: a :class:`ConfigError` naming why."""
    if config.train.vectorize != "on":
        return
    reason = loop_reason(config, algorithm, model)
    if reason is not None:
        raise refusal(reason)


def refusal(reason: str) -> ConfigError:
    """The error of ``train.vectorize=on`` for a run that trains as a loop because of ``reason``."""
    return ConfigError("train.vectorize", f"on, but {reason}; use train.vectorize=auto (the loop where it cannot) or off")


# --------------------------------------------------------------------- group size


def activation_floats(model: nn.Module, sample: Tensor) -> int:
    """Floats of the outputs of every leaf module of ``model`` on one ``sample`` (a batch of 1)."""
    total = 0

    def count(module: nn.Module, inputs: Any, output: Any) -> None:
        nonlocal total
        if isinstance(output, torch.Tensor):
            total += output.numel()

    hooks = [module.register_forward_hook(count) for module in model.modules() if not list(module.children())]
    was_training = model.training
    try:
        with torch.no_grad():
            model.eval()(sample)  # eval: no running statistics move
    finally:
        model.train(was_training)
        for hook in hooks:
            hook.remove()
    return max(total, 1)


def memory_budget(device: torch.device, gpu_share: float) -> int:
    """Bytes a group may use: half of the worker's share of the GPU's memory (``gpu_share``:
    ``resources.gpus_per_worker``), an eighth of the machine's memory on CPU (its workers share it).
    Total memory, not free memory: the same config on the same machine groups its clients the same
    way, so that a run repeats bit for bit."""
    if device.type == "cuda":
        total = torch.cuda.get_device_properties(device).total_memory
        return int(total * (gpu_share if gpu_share > 0 else 1.0)) // 2
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // 8
    except (ValueError, OSError, AttributeError):
        return 1 << 30


def client_bytes(model: nn.Module, sample: Tensor, batch_size: int) -> int:
    """The estimated bytes one client of a group needs (see the module's docstring)."""
    parameters = sum(p.numel() for p in model.parameters())
    activations = activation_floats(model, sample)
    inputs = sample.numel()
    return 4 * (PARAMETER_COPIES * parameters + batch_size * (ACTIVATION_COPIES * activations + inputs))


def automatic_group_size(model: nn.Module, sample: Tensor, batch_size: int, device: torch.device, gpu_share: float = 0.0) -> int:
    """Clients per group when ``resources.vectorize_group`` is not set: what fits the memory
    estimate, at least 1 and at most :data:`MAX_AUTOMATIC_GROUP`."""
    return max(1, min(MAX_AUTOMATIC_GROUP, memory_budget(device, gpu_share) // client_bytes(model, sample, batch_size)))


def is_out_of_memory(error: BaseException) -> bool:
    """Whether ``error`` is an allocation failure (a GPU's, or the CPU allocator's)."""
    if isinstance(error, torch.OutOfMemoryError):
        return True
    return isinstance(error, RuntimeError) and "can't allocate memory" in str(error)


# --------------------------------------------------------------------- BatchNorm


def batch_norms(model: nn.Module) -> dict[str, _BatchNorm]:
    """The model's BatchNorm layers by qualified name."""
    return {name: module for name, module in model.named_modules() if isinstance(module, _BatchNorm)}


def running_keys(model: nn.Module) -> list[str]:
    """The flat-layout keys of the BatchNorm layers' running statistics (``running_mean``,
    ``running_var``; ``num_batches_tracked`` is an integer buffer outside the layout)."""
    return [
        _buffer_key(name, buffer)
        for name, module in batch_norms(model).items()
        if module.track_running_stats
        for buffer in ("running_mean", "running_var")
    ]


def _buffer_key(layer: str, buffer: str) -> str:
    """The state-dict key of ``layer``'s ``buffer`` (``layer``: a qualified name, ``""`` for the model itself)."""
    return f"{layer}.{buffer}" if layer else buffer


class BatchNormRecorder:
    """What the group's BatchNorm layers read and record during one client's forward pass (under
    ``vmap``): the step's sample mask and smallest batch, and each layer's batch statistics, in call
    order (a layer called twice updates its running statistics twice, as in the loop)."""

    def __init__(self) -> None:
        self.mask: Tensor | None = None  # [B] 1.0 at real samples, 0.0 at padding; None: every batch is full
        self.smallest = 0
        self.layers: list[str] = []  # the layers called, in order
        self.stats: list[tuple[Tensor, Tensor]] = []  # their batch means and unbiased batch variances


def masked_batch_norm(module: _BatchNorm, name: str, recorder: BatchNormRecorder, x: Tensor) -> Tensor:
    """``module``'s training-mode forward on one client's batch ``x`` ``[B, C, ...]``, as a pure
    function: normalised by the statistics of the real samples only (``recorder.mask``; padding has
    no weight in them and its outputs have no weight in the loss), with the biased variance, as
    ``F.batch_norm``; the batch mean and the unbiased variance (``n/(n−1)``, n the real values per
    channel) are recorded for the running statistics, which :func:`train_group` updates outside the
    forward pass. The module's own buffers are neither read nor written."""
    channels, spatial = x.shape[1], math.prod(x.shape[2:])
    dims = (0, *range(2, x.dim()))
    shape = (1, channels) + (1,) * (x.dim() - 2)
    if (x.shape[0] if recorder.mask is None else recorder.smallest) * spatial <= 1:
        raise ValueError(f"Expected more than 1 value per channel when training, got input size {torch.Size([1, *x.shape[1:]])}")
    if recorder.mask is None:
        count: Tensor | float = float(x.shape[0] * spatial)
        mean = x.mean(dims)
        centred = x - mean.view(shape)
        variance = (centred * centred).mean(dims)
    else:
        mask = recorder.mask.view(-1, *([1] * (x.dim() - 1)))
        count = recorder.mask.sum() * spatial
        mean = (x * mask).sum(dims) / count
        centred = x - mean.view(shape)
        variance = (centred * centred * mask).sum(dims) / count
    out = centred * torch.rsqrt(variance + module.eps).view(shape)
    if module.weight is not None:
        out = out * module.weight.view(shape) + module.bias.view(shape)
    if module.track_running_stats:
        recorder.layers.append(name)
        recorder.stats.append((mean.detach(), (variance * (count / (count - 1))).detach()))
    return out


@contextmanager
def functional_batch_norms(model: nn.Module, recorder: BatchNormRecorder) -> Iterator[dict[str, _BatchNorm]]:
    """Within the block, ``model``'s BatchNorm layers run :func:`masked_batch_norm` (their
    ``forward`` shadowed on the instance, restored after)."""
    modules = batch_norms(model)
    try:
        for name, module in modules.items():
            module.forward = partial(masked_batch_norm, module, name, recorder)  # type: ignore[method-assign]
        yield modules
    finally:
        for module in modules.values():
            vars(module).pop("forward", None)


def update_running_stats(
    running: dict[str, Tensor], layers: list[str], stats: list[tuple[Tensor, Tensor]], modules: dict[str, _BatchNorm], active: int
) -> None:
    """``r ← (1 − momentum)·r + momentum·s`` for the first ``active`` clients (the others have stopped),
    the mean and the unbiased variance of each recorded batch, as ``F.batch_norm`` updates them."""
    for name, (mean, variance) in zip(layers, stats, strict=True):
        momentum = modules[name].momentum
        for key, value in ((_buffer_key(name, "running_mean"), mean), (_buffer_key(name, "running_var"), variance)):
            running[key][:active] = momentum * value + (1 - momentum) * running[key][:active]


# --------------------------------------------------------------------- training


@dataclass
class Step:
    """One lockstep step of a group whose clients are ordered by descending step count: the first
    ``len(x)`` clients train (those that have a batch left), the others have stopped."""

    x: Tensor  # [A, B, ...] normalised, augmented, zero-padded (A: the clients still training)
    y: Tensor  # [A, B, ...]
    weights: Tensor  # [A, B] float32: 1/n_real at real samples, 0 at padding
    full: bool  # every batch of the step is full
    smallest: int = 0  # the smallest n_real of the step (BatchNorm needs more than 1 value per channel)


def _batch_sizes(contexts: list[ClientContext], counts: list[int], batch_size: int) -> Tensor:
    """``[group, steps]``: the real samples of each client's batch at each step (0 after its last),
    as ``ctx.batches()`` cuts each epoch: full batches, then the rest."""
    sizes = torch.zeros(len(contexts), counts[0], dtype=torch.long)
    for k, (ctx, count) in enumerate(zip(contexts, counts)):
        epoch = [min(batch_size, ctx.num_samples - start) for start in range(0, ctx.num_samples, batch_size)]
        sizes[k, :count] = torch.tensor(epoch * ctx.train.local_epochs)
    return sizes


class _StepWeights:
    """Every step's sample weights (1/n_real at real samples, 0 at padding), made on the host and
    moved to the device once for the whole group: a blocking host-to-device copy a step would wait
    for the GPU to finish the previous step before the next one could be queued."""

    def __init__(self, sizes: Tensor, batch_size: int, device: torch.device) -> None:
        self.sizes = sizes  # [group, steps] on the host: what the flags of a step read
        self.batch_size = batch_size
        sizes_f = sizes.to(torch.float32).unsqueeze(-1)  # [group, steps, 1]
        real = torch.arange(batch_size, dtype=torch.float32) < sizes_f
        self.weights = torch.where(real, 1.0 / sizes_f.clamp(min=1), 0.0).to(device)  # [group, steps, B]

    def step(self, x: Tensor, y: Tensor, step: int) -> Step:
        active = x.shape[0]
        sizes = self.sizes[:active, step]
        return Step(x, y, self.weights[:active, step], bool((sizes == self.batch_size).all()), int(sizes.min()))


def _steps_from_batches(contexts: list[ClientContext], counts: list[int], batch_size: int, device: torch.device) -> Iterator[Step]:
    """Each client's own ``ctx.batches()``, one batch a step, stacked and padded."""
    iterators = [ctx.batches() for ctx in contexts]
    weights = _StepWeights(_batch_sizes(contexts, counts, batch_size), batch_size, device)
    for step in range(counts[0]):
        active = sum(count > step for count in counts)
        batches = [next(iterator) for iterator in iterators[:active]]
        x0, y0 = batches[0]
        x = x0.new_zeros((active, batch_size, *x0.shape[1:]))
        y = y0.new_zeros((active, batch_size, *y0.shape[1:]))
        for k, (xb, yb) in enumerate(batches):
            x[k, : xb.shape[0]] = xb
            y[k, : yb.shape[0]] = yb
        yield weights.step(x, y, step)


def _steps_from_indices(contexts: list[ClientContext], counts: list[int], batch_size: int, device: torch.device) -> Iterator[Step]:
    """The same batches as :func:`_steps_from_batches` for the ``none`` augmentation, which draws
    nothing: each client's ``torch.randperm`` per epoch is drawn up front from its generator, in the
    loop's order, and every step gathers and normalises the whole group's batch at once."""
    group, epochs = len(contexts), contexts[0].train.local_epochs
    x_all = torch.cat([ctx.x for ctx in contexts])
    y_all = torch.cat([ctx.y for ctx in contexts])
    index = torch.zeros(group, counts[0], batch_size, dtype=torch.long)
    offset = 0
    for k, ctx in enumerate(contexts):
        n, step = ctx.num_samples, 0
        for _ in range(epochs):
            order = torch.randperm(n, generator=ctx.generator) + offset
            for start in range(0, n, batch_size):
                batch = order[start : start + batch_size]
                index[k, step, : batch.shape[0]] = batch
                index[k, step, batch.shape[0] :] = offset  # padding: the client's first sample, weighted 0
                step += 1
        offset += n
    index = index.to(device)
    weights = _StepWeights(_batch_sizes(contexts, counts, batch_size), batch_size, device)
    info = contexts[0].info
    for step in range(counts[0]):
        active = sum(count > step for count in counts)
        rows = index[:active, step].reshape(-1)
        x = info.normalize(x_all[rows]).reshape(active, batch_size, *x_all.shape[1:])
        y = y_all[rows].reshape(active, batch_size, *y_all.shape[1:])
        yield weights.step(x, y, step)


def _objective(algorithm: Algorithm, model: nn.Module, weighted: bool, recorder: BatchNormRecorder) -> Callable[..., Any]:
    """One client's ``(loss, terms, batch-norm statistics)`` of a batch as a function of its
    parameters, which ``vmap`` maps over the group."""
    task = algorithm.task

    def sample_loss(output: Tensor, target: Tensor) -> Tensor:
        return task.loss(output.unsqueeze(0), target.unsqueeze(0))

    def objective(params: dict[str, Tensor], x: Tensor, y: Tensor, w: Tensor, start: dict[str, Tensor], inputs: dict[str, Tensor]):
        recorder.mask = (w > 0).to(x.dtype) if weighted else None
        recorder.layers, recorder.stats = [], []
        output = functional_call(model, params, (x,))
        stats, recorder.stats = recorder.stats, []  # returned through vmap: [A, C] each
        base = (vmap(sample_loss)(output, y) * w).sum() if weighted else task.loss(output, y)
        loss, terms = algorithm.vectorized_loss(base, params, start, inputs)  # type: ignore[attr-defined]
        return loss, terms, stats

    return objective


def num_steps(ctx: ClientContext) -> int:
    """The batches ``ctx.batches()`` yields: ``train.local_epochs · ⌈n / train.batch_size⌉``."""
    return ctx.train.local_epochs * math.ceil(ctx.num_samples / ctx.train.batch_size)


def _per_client(values: Tensor, like: Tensor) -> Tensor:
    """``values`` ``[A]`` shaped to broadcast against ``like`` ``[A, ...]``."""
    return values.view(-1, *([1] * (like.dim() - 1)))


def train_group(algorithm: Algorithm, contexts: list[ClientContext], broadcast: Broadcast) -> list[ClientUpdate]:
    """Train ``contexts`` (clients of one round sharing ``contexts[0].model``'s architecture) in
    lockstep and return each client's :class:`ClientUpdate`, in order (see the module's docstring).

    The clients are trained in the order of their step counts, the longest first, so that the
    clients still training at any step are a prefix of the stacked tensors: a client that has
    stopped is left out of the step's computation (a slice, not a copy), and its parameters,
    momentum and loss sums are not written again."""
    order = sorted(range(len(contexts)), key=lambda k: -num_steps(contexts[k]))  # stable: ties keep their order
    ordered = [contexts[k] for k in order]
    first = ordered[0]
    model, train, device, lr = first.model, first.train, first.device, first.lr
    group, batch_size = len(ordered), train.batch_size
    model.train()
    names = [name for name, _ in model.named_parameters()]
    keys, state = state_keys(model), model.state_dict(keep_vars=True)
    start_flat = algorithm.vectorized_start(broadcast).to(device)  # type: ignore[attr-defined]
    offset, entries = 0, {}
    for key in keys:  # the flat layout: parameters and BatchNorm running statistics
        entries[key] = start_flat[offset : offset + state[key].numel()].view(state[key].shape)
        offset += state[key].numel()
    start = {name: entries[name] for name in names}
    params = {name: value.unsqueeze(0).repeat(group, *([1] * value.dim())) for name, value in start.items()}
    running = {key: entries[key].unsqueeze(0).repeat(group, 1) for key in running_keys(model)}  # [group, C] per client
    per_client = [algorithm.vectorized_inputs(ctx, broadcast) for ctx in ordered]  # type: ignore[attr-defined]
    inputs = {key: torch.stack([values[key] for values in per_client]) for key in per_client[0]}
    counts = [num_steps(ctx) for ctx in ordered]
    identity = first.augment is get_augmentation("none")
    steps = (_steps_from_indices if identity else _steps_from_batches)(ordered, counts, batch_size, device)
    recorder = BatchNormRecorder()
    functions = {
        weighted: vmap(_objective(algorithm, model, weighted, recorder), in_dims=(0, 0, 0, 0, None, 0)) for weighted in (False, True)
    }
    momentum: dict[str, Tensor] = {}
    totals: dict[str, Tensor] = {}
    with functional_batch_norms(model, recorder) as layers:
        for t, step in enumerate(steps):
            active = step.x.shape[0]
            current = {name: value[:active] for name, value in params.items()}
            leaves = {name: value.detach().requires_grad_() for name, value in current.items()}
            own = {key: value[:active] for key, value in inputs.items()}
            recorder.smallest = step.smallest
            loss, terms, stats = functions[not step.full](leaves, step.x, step.y, step.weights, start, own)
            # Σ_k loss_k: client k's loss depends on its own slice of the stacked parameters only, so
            # one backward pass gives every client its own gradient. Plain autograd, not torch.func.grad,
            # whose first call imports torch._dynamo (seconds per process; see ClientSGD).
            found = torch.autograd.grad(loss.sum(), [leaves[name] for name in names], allow_unused=True)
            grads = {name: grad for name, grad in zip(names, found) if grad is not None}  # the loop skips those without one
            loss, terms = loss.detach(), {term: value.detach() for term, value in terms.items()}
            with torch.no_grad():
                if train.grad_clip is not None and grads:  # clip_grad_norm_ per client
                    norms = torch.stack([torch.linalg.vector_norm(grad.reshape(active, -1), dim=1) for grad in grads.values()], dim=1)
                    coefficient = torch.clamp(train.grad_clip / (torch.linalg.vector_norm(norms, dim=1) + 1e-6), max=1.0)
                    grads = {name: grad * _per_client(coefficient, grad) for name, grad in grads.items()}
                for name, g in grads.items():  # torch.optim.SGD's single-tensor step (ClientSGD)
                    p = current[name]
                    if train.weight_decay != 0:
                        g = g.add(p, alpha=train.weight_decay)
                    if train.momentum != 0:
                        if name not in momentum:  # the first step with a gradient: the buffer is the gradient
                            momentum[name] = torch.zeros_like(params[name])
                            momentum[name][:active] = g
                        else:
                            momentum[name][:active].mul_(train.momentum).add_(g)
                        g = momentum[name][:active]
                    p.add_(g, alpha=-lr)  # in place: `current` holds views of `params`
                update_running_stats(running, recorder.layers, stats, layers, active)
                for term, value in {"train_loss": loss, **terms}.items():
                    if t == 0:
                        totals[term] = value.clone()
                    else:
                        totals[term][:active] += value
    for module in layers.values():  # the loop's side effect on the worker's model: one count a step of each client
        if module.num_batches_tracked is not None:
            module.num_batches_tracked.add_(sum(counts))
    flat = torch.cat([{**params, **running}[key].reshape(group, -1) for key in keys], dim=1)
    totals = {term: total.cpu() for term, total in totals.items()}  # one device sync a term, not one a client
    updates: list[ClientUpdate | None] = [None] * group
    for position, k in enumerate(order):
        metrics = {term: float(total[position]) / counts[position] for term, total in totals.items()}
        own_inputs = {key: value[position] for key, value in inputs.items()}
        updates[k] = algorithm.vectorized_update(contexts[k], broadcast, flat[position], metrics, own_inputs)  # type: ignore[attr-defined]
    return updates  # type: ignore[return-value]
