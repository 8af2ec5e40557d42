"""Vectorised local training (``train.vectorize``, :mod:`fedray.algorithms.vectorized`) against the loop.

Tolerance: the vectorised path does the loop's maths, not its bits. Its batched kernels (``bmm`` for
a stack of ``Linear`` layers, grouped convolutions for a stack of ``Conv2d``, a weighted sum of
per-sample losses for a partial batch) add in another order than the loop's per-client kernels, and
SGD carries those float32 roundings from step to step. One round's uploads (each client's flat
weights and its loss terms) are therefore compared with ``torch.testing.assert_close(rtol=1e-5,
atol=1e-6)``: a few float32 ulps (2⁻²³ ≈ 1.2e-7) times the handful of steps of a tiny client, and
well below any change of the maths (a step more or less, a wrong batch, a missed mask, a gradient
not divided by the real batch size all move weights by more than 1e-3). A vectorised run is itself
deterministic (bit for bit), and ``train.vectorize: off`` is the loop, unchanged.
"""

from __future__ import annotations

import copy
import math
from itertools import combinations

import pytest
import torch
from torch import nn
from torch.func import functional_call, vmap

import fedray.runtime.worker as worker_module
from fedray import load_config
from fedray.algorithms import get_algorithm_class
from fedray.algorithms.vectorized import (
    VECTORIZED,
    BatchNormRecorder,
    functional_batch_norms,
    loop_reason,
    num_steps,
    train_group,
    update_running_stats,
    vectorized_path,
)
from fedray.config import ConfigError
from fedray.data import DatasetInfo, build_federated_dataset
from fedray.models import build_model, get_flat_weights
from fedray.models.weights import parameter_mask
from fedray.runtime.worker import ClientWorker
from fedray.runtime.reduction import tensors_to
from fedray.testing import Federation

RTOL, ATOL = 1e-5, 1e-6

#: Ragged clients: Dirichlet sizes, batch 8, two epochs: partial last batches and different step counts.
RAGGED = [
    "data.num_clients=12",
    "data.partition=dirichlet",
    "data.alpha=0.5",
    "train.clients_per_round=6",
    "train.local_epochs=2",
    "train.batch_size=8",
    "train.lr=0.1",
    "resources.num_workers=1",
    "resources.backend=local",
]
#: SGD with every option the vectorised step implements.
FULL_SGD = ["train.momentum=0.9", "train.weight_decay=0.001", "train.grad_clip=0.5", "train.lr_decay=0.9"]

CASES = {
    "fedavg-mlp-features": ["algorithm.name=fedavg", "data.name=breast_cancer", "model.name=mlp", "model.width=16"],
    "fedprox-mlp-features": ["algorithm.name=fedprox", "algorithm.mu=0.5", "data.name=breast_cancer", "model.name=mlp", "model.width=16"],
    "fedavg-mlp-digits": ["algorithm.name=fedavg", "model.name=mlp", "model.width=32"],
    "fedavg-cnn": ["algorithm.name=fedavg", "model.name=cnn_small", "model.width=4"],
    "fedprox-cnn-crop-flip": [
        "algorithm.name=fedprox",
        "algorithm.mu=0.5",
        "model.name=cnn_small",
        "model.width=4",
        "data.augmentation=crop_flip",
    ],
    "fedadam-cnn": ["algorithm.name=fedadam", "model.name=cnn_small", "model.width=4"],
}


def make_worker(tmp_path, overrides: list[str]) -> ClientWorker:
    config = load_config(None, [*RAGGED, *overrides])
    data = build_federated_dataset(config.data, config.seed)
    return ClientWorker(config.to_dict(), data, str(tmp_path), use_gpu=False)


@pytest.fixture
def float64(monkeypatch) -> torch.dtype:
    """Models, inputs and broadcasts in float64 for the test (the per-sample weights 1/n stay float32).
    Where a trajectory branches on comparisons (ReLU's kink, max-pooling's largest value, BatchNorm's
    small batches), float32 rounding can take another branch and grow over the steps; on an AVX-512
    CPU a start moved by 1e-6 moved SCAFFOLD's ``cnn_small`` clients by up to 5e-3 and the loop's own
    result moved by 0.14 from its AVX2 one. In float64 the branches are the same, so the vectorised
    maths must equal the loop's to float32 precision."""
    normalize = DatasetInfo.normalize
    monkeypatch.setattr(DatasetInfo, "normalize", lambda self, x: normalize(self, x).double())
    default = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    yield torch.float64
    torch.set_default_dtype(default)


def uploads(updates) -> list[tuple[torch.Tensor, dict[str, float]]]:
    """Each client's flat weights (n·w / n: exact for these sizes) and metrics."""
    return [((update.sums["weights"] / update.sums["num_samples"]).float(), update.metrics) for update in updates]


def assert_same_uploads(vectorised, loop) -> None:
    assert len(vectorised) == len(loop)
    for (weights, metrics), (loop_weights, loop_metrics) in zip(vectorised, loop, strict=True):
        torch.testing.assert_close(weights, loop_weights, rtol=RTOL, atol=ATOL)
        assert list(metrics) == list(loop_metrics)  # the same terms, in the same order
        torch.testing.assert_close(torch.tensor(list(metrics.values())), torch.tensor(list(loop_metrics.values())), rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize("case", list(CASES), ids=list(CASES))
@pytest.mark.parametrize("sgd", ["plain", "momentum-decay-clip"])
def test_one_rounds_uploads_equal_the_loops(tmp_path, case, sgd):
    overrides = CASES[case] + (FULL_SGD if sgd != "plain" else []) + ["train.vectorize=on"]
    worker = make_worker(tmp_path, overrides)
    torch.manual_seed(0)
    broadcast = {"weights": get_flat_weights(worker.model_for(None)) + 0.01 * torch.randn(1)}  # not the fresh model
    clients, round = [0, 3, 4, 7, 9, 11], 2  # round 2: train.lr_decay applies
    contexts = [worker.client_context(round, client, -1) for client in clients]
    steps = [num_steps(ctx) for ctx in contexts]
    assert len(set(steps)) > 1, steps  # clients stop at different steps
    assert any(ctx.num_samples % ctx.train.batch_size for ctx in contexts)  # and have partial batches
    vectorised = uploads(train_group(worker.algorithm, contexts, broadcast))
    loop = uploads([worker.algorithm.client_update(worker.client_context(round, client, -1), broadcast) for client in clients])
    assert_same_uploads(vectorised, loop)
    assert all(not torch.equal(weights, broadcast["weights"]) for weights, _ in vectorised)


#: A BatchNorm ResNet on synthetic images, at a learning rate where training is stable. A BatchNorm
#: network can amplify float32 rounding beyond any fixed tolerance, and then the loop does it to
#: itself: on digits (whose constant backgrounds put many of the stem's outputs near ReLU's kink) a
#: client's loop moved its weights by 0.3 when its start moved by 1e-7 (relative), and at
#: ``train.lr=0.1`` here some clients' losses climb to 3–7 and the loop moved by 7e-3 under the
#: same nudge; even at 0.02 the loop's float32 result differs between AVX2 and AVX-512 CPUs. So the
#: BatchNorm tests compare in float64 (:func:`float64`).
BATCH_NORM = [
    "algorithm.name=fedavg",
    "model.name=resnet8",
    "model.norm=batch",
    "data.name=synthetic",
    "data.synthetic.num_train=500",
    "data.synthetic.num_test=50",
    "data.synthetic.noise=0.1",
    "train.local_epochs=1",
    "train.lr=0.02",
]
#: 27 to 67 samples, batch 8: 4 to 9 steps, every last batch partial (2 to 5 real samples).
BATCH_NORM_CLIENTS = [0, 2, 3, 7, 8, 11]


def batch_norm_round(worker: ClientWorker, clients: list[int], dtype: torch.dtype = torch.float32):
    """One round (round 2: ``train.lr_decay`` applies) of ``clients`` from a broadcast that is not
    the fresh model: the vectorised updates, the loop's and the broadcast. The model's initial weights
    are seeded: from about one initialisation in ten (2 of 20 tried), one client's loop moves by ~1e-3
    when its start moves by 1e-7, the BatchNorm sensitivity above, which no float32 tolerance holds."""
    torch.manual_seed(0)
    model = worker.model_for(None)
    assert vectorized_path(worker.config, worker.algorithm, model) == VECTORIZED
    torch.manual_seed(0)
    flat = torch.cat([value.reshape(-1) for value in model.state_dict().values() if value.is_floating_point()])
    broadcast = {"weights": (flat + 0.01 * torch.randn(1)).to(dtype)}
    contexts = [worker.client_context(2, client, -1) for client in clients]
    steps = [num_steps(ctx) for ctx in contexts]
    assert len(set(steps)) > 1, steps  # clients stop at different steps
    assert all(ctx.num_samples % ctx.train.batch_size for ctx in contexts)  # and end with partial batches
    vectorised = train_group(worker.algorithm, contexts, broadcast)
    loop = [worker.algorithm.client_update(worker.client_context(2, client, -1), broadcast) for client in clients]
    return vectorised, loop, broadcast


@pytest.mark.parametrize("sgd", ["plain", "momentum-decay-clip"])
def test_a_batch_norm_models_uploads_equal_the_loops(tmp_path, sgd, float64):
    """Each client's BatchNorm running statistics are its own (normalised by its own batch's
    statistics over its real samples, updated with its unbiased variance, unchanged once it has
    stopped): one round's uploads, running statistics included, equal the loop's within the
    tolerance (in float64: see :func:`float64`); they differ between clients and from the broadcast;
    the run repeats bit for bit."""
    worker = make_worker(tmp_path, [*BATCH_NORM, *(FULL_SGD if sgd != "plain" else []), "train.vectorize=on"])
    vectorised, loop, broadcast = batch_norm_round(worker, BATCH_NORM_CLIENTS, float64)
    assert_same_uploads(uploads(vectorised), uploads(loop))
    running = ~parameter_mask(worker.model_for(None))
    assert int(running.sum()) == 2 * (64 + 64 + 64 + 128 + 128 + 128 + 256 + 256 + 256)  # every BatchNorm's mean and variance
    statistics = [weights[running] for weights, _ in uploads(vectorised)]
    assert all(not torch.allclose(own, broadcast["weights"][running].float(), rtol=1e-3, atol=1e-4) for own in statistics)
    assert all(not torch.allclose(a, b, rtol=1e-3, atol=1e-4) for a, b in combinations(statistics, 2))  # not shared
    if sgd == "plain":
        contexts = [worker.client_context(2, client, -1) for client in BATCH_NORM_CLIENTS]
        again = uploads(train_group(worker.algorithm, contexts, broadcast))
        assert all(torch.equal(a, b) and m == n for (a, m), (b, n) in zip(again, uploads(vectorised), strict=True))


def test_a_batch_norm_models_vectorised_maths_is_the_loops_in_float64(tmp_path, float64):
    """The same maths where float32 rounding could hide a difference: ``train.lr=0.1``, SGD with
    momentum, weight decay, clipping and decay, and two clients whose last batch has one real
    sample (4 values per channel in the 2×2 last stage). In float64 (model, inputs and broadcast;
    the per-sample weights 1/n stay float32) the uploads equal the loop's to float32 precision (the
    loop uploads float32)."""
    worker = make_worker(tmp_path, [*BATCH_NORM, *FULL_SGD, "train.lr=0.1", "train.vectorize=on"])
    clients = [0, 3, 5, 9, 11]  # 29, 67, 25, 25 and 44 samples: last batches of 5, 3, 1, 1 and 4
    vectorised, loop, _ = batch_norm_round(worker, clients, float64)
    assert next(worker.model_for(None).parameters()).dtype == torch.float64
    for (weights, metrics), (loop_weights, loop_metrics) in zip(uploads(vectorised), uploads(loop), strict=True):
        torch.testing.assert_close(weights, loop_weights, rtol=1e-6, atol=1e-7)
        torch.testing.assert_close(torch.tensor(list(metrics.values())), torch.tensor(list(loop_metrics.values())), rtol=1e-7, atol=0)


@pytest.mark.parametrize("shape", [(3,), (3, 2, 2)], ids=["1d", "2d"])
@pytest.mark.parametrize("sizes", [[5, 2, 4], [5, 5, 5]], ids=["partial", "full"])
def test_the_vectorised_batch_norm_is_torchs_over_each_clients_real_samples(shape, sizes):
    """Three clients' batches, padded to 5: each client's output at its real samples and its
    running statistics equal ``nn.BatchNorm`` on those samples alone (biased variance to normalise,
    unbiased n/(n−1) for the running variance, ``momentum``); padding changes nothing."""
    torch.manual_seed(0)
    layer = (nn.BatchNorm1d if len(shape) == 1 else nn.BatchNorm2d)(3, momentum=0.3)
    with torch.no_grad():
        layer.weight.uniform_(0.5, 1.5), layer.bias.normal_(), layer.running_mean.normal_(), layer.running_var.uniform_(0.5, 2.0)
    group = len(sizes)
    x = 3 * torch.randn(group, 5, *shape) + 1
    real = (torch.arange(5)[None, :] < torch.tensor(sizes)[:, None]).float()
    x = torch.where(real.view(group, 5, *[1] * len(shape)) > 0, x, 1e3)  # padding far from the data: it would show
    recorder = BatchNormRecorder()
    recorder.smallest = min(sizes)
    params = {name: value.detach().unsqueeze(0).repeat(group, 1).requires_grad_() for name, value in layer.named_parameters()}

    def forward(params, x, mask):
        recorder.mask = None if min(sizes) == 5 else mask
        recorder.layers, recorder.stats = [], []
        out = functional_call(layer, params, (x,))
        stats, recorder.stats = recorder.stats, []
        return out, stats

    with functional_batch_norms(layer, recorder) as layers:
        out, stats = vmap(forward)(params, x, real)
    assert "forward" not in vars(layer)  # restored
    running = {key: getattr(layer, key).detach().unsqueeze(0).repeat(group, 1) for key in ("running_mean", "running_var")}
    update_running_stats(running, recorder.layers, stats, layers, group)
    for k, n in enumerate(sizes):
        reference = copy.deepcopy(layer).train()
        torch.testing.assert_close(out[k, :n], reference(x[k, :n]), rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(running["running_mean"][k], reference.running_mean, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(running["running_var"][k], reference.running_var, rtol=1e-5, atol=1e-6)
    if len(shape) == 1 and min(sizes) < 5:  # one real sample: one value per channel, which torch refuses too
        recorder.smallest = 1
        with pytest.raises(ValueError, match="Expected more than 1 value per channel"), functional_batch_norms(layer, recorder):
            vmap(forward)(params, x, real)


#: Algorithms with client state (SCAFFOLD's c_i, FedDyn's λ_k) and per-client maths (SCAFFOLD's K
#: in its control variate, FedDyn's α_k with ``alpha_scaling: size``).
STATEFUL_CASES = {
    "scaffold-mlp-features": ["algorithm.name=scaffold", "data.name=breast_cancer", "model.name=mlp", "model.width=16"],
    "scaffold-cnn-crop-flip-uniform": [
        "algorithm.name=scaffold",
        "algorithm.weighting=uniform",
        "model.name=cnn_small",
        "model.width=4",
        "data.augmentation=crop_flip",
    ],
    "feddyn-mlp-features": [
        "algorithm.name=feddyn",
        "algorithm.dyn_alpha=0.1",
        "data.name=breast_cancer",
        "model.name=mlp",
        "model.width=16",
    ],
    "feddyn-cnn-samples": [
        "algorithm.name=feddyn",
        "algorithm.dyn_alpha=0.1",
        "algorithm.weighting=samples",
        "model.name=cnn_small",
        "model.width=4",
    ],
}


def assert_same_updates(vectorised, loop) -> None:
    """:func:`assert_same_uploads`, and every sum (SCAFFOLD's ``delta_control``, FedDyn's
    ``weights_sum``) and every tensor of the new client state, within the same tolerance."""
    assert_same_uploads(uploads(vectorised), uploads(loop))
    for update, loop_update in zip(vectorised, loop, strict=True):
        assert list(update.sums) == list(loop_update.sums)
        assert torch.equal(update.sums["num_samples"], loop_update.sums["num_samples"])
        for name, value in update.sums.items():  # n·w and n: compared as w above
            assert value.dtype == loop_update.sums[name].dtype, name
            if name not in ("weights", "num_samples"):
                torch.testing.assert_close(value, loop_update.sums[name], rtol=RTOL, atol=ATOL, msg=lambda m, name=name: f"{name}: {m}")
        assert loop_update.state is not None and list(update.state) == list(loop_update.state)
        for name, value in update.state.items():
            assert value.dtype == loop_update.state[name].dtype, name
            torch.testing.assert_close(value, loop_update.state[name], rtol=RTOL, atol=ATOL, msg=lambda m, name=name: f"{name}: {m}")


def stateful_broadcast(algorithm, worker: ClientWorker, round: int):
    """A broadcast of ``round`` from a server state that is not the fresh one: shifted weights and,
    for SCAFFOLD, a non-zero server control variate c (so that c − c_i ≠ 0 from round 1 on)."""
    torch.manual_seed(round)
    state = algorithm.init_server_state(worker.model_for(None))
    state["weights"] = state["weights"] + 0.01 * torch.randn(1)
    if "control" in state:
        state["control"] = 0.05 * torch.randn_like(state["control"])
    return algorithm.broadcast(state, round)


@pytest.mark.parametrize("case", list(STATEFUL_CASES), ids=list(STATEFUL_CASES))
@pytest.mark.parametrize("sgd", ["plain", "momentum-decay-clip"])
def test_two_rounds_of_stateful_clients_equal_the_loop(tmp_path, case, sgd, request):
    """Round 1: clients without state; round 2: four of them with the state the vectorised round 1
    stored (c_i, λ_k) and two without, on ragged clients (different K, α_k). Each round's updates
    (weights, loss terms, every sum, the new state) equal the loop's on the same contexts; the
    convolutional cases in float64 (:func:`float64`: SCAFFOLD's correction drives ``cnn_small``
    where float32 rounding takes other max-pooling and ReLU branches)."""
    if "-cnn" in case:
        request.getfixturevalue("float64")
    overrides = STATEFUL_CASES[case] + (FULL_SGD if sgd != "plain" else []) + ["train.vectorize=on"]
    worker = make_worker(tmp_path, overrides)
    algorithm = worker.algorithm
    first, second = [0, 3, 4, 7, 9, 11], [0, 2, 3, 7, 10, 11]
    for round, clients in ((1, first), (2, second)):
        broadcast = tensors_to(stateful_broadcast(algorithm, worker, round), worker.device)
        version = {client: (1 if round == 2 and client in first else -1) for client in clients}
        contexts = [worker.client_context(round, client, version[client]) for client in clients]
        steps = [num_steps(ctx) for ctx in contexts]
        assert len(set(steps)) > 1, steps  # clients stop at different steps (and differ in K)
        assert any(ctx.num_samples % ctx.train.batch_size for ctx in contexts)  # and have partial batches
        stateful = [ctx.state is not None for ctx in contexts]
        assert stateful == [round == 2 and client in first for client in clients]
        assert all(bool(next(iter(ctx.state.values())).abs().sum() > 0) for ctx in contexts if ctx.state is not None)
        vectorised = train_group(algorithm, contexts, broadcast)
        loop = [algorithm.client_update(worker.client_context(round, client, version[client]), broadcast) for client in clients]
        assert_same_updates(vectorised, loop)
        for client, update in zip(clients, vectorised, strict=True):  # round 2 loads the vectorised round 1's state
            worker.state_store.save(client, round, update.state, keep=())


@pytest.mark.parametrize("algorithm", ["scaffold", "feddyn"])
def test_a_stateful_run_through_the_worker_equals_the_loop(tmp_path, algorithm):
    """Three rounds through the worker's vectorised path (groups of 3, states stored and loaded by
    the worker, clients joining in later rounds) against the loop: the server state (weights and
    SCAFFOLD's c or FedDyn's Σλ) within the tolerance."""
    overrides = [f"algorithm.name={algorithm}", "model.name=mlp", "model.width=16", "train.momentum=0.9"]
    overrides += [
        "data.num_clients=8",
        "data.partition=dirichlet",
        "data.alpha=0.5",
        *(["algorithm.dyn_alpha=0.1"] if algorithm == "feddyn" else []),
    ]
    vectorised = Federation(tmp_path / "on", [*overrides, "train.vectorize=on", "resources.vectorize_group=3"])
    loop = Federation(tmp_path / "off", overrides)
    for round, clients in ((1, [0, 1, 2, 3]), (2, [1, 2, 4, 5]), (3, [0, 2, 5, 6])):
        row, loop_row = vectorised.run_round(round, clients), loop.run_round(round, clients)
        assert math.isclose(row["train_loss"], loop_row["train_loss"], rel_tol=RTOL)
        assert list(vectorised.state) == list(loop.state)
        for name, value in vectorised.state.items():
            torch.testing.assert_close(value, loop.state[name], rtol=RTOL, atol=ATOL)
    second = "control" if algorithm == "scaffold" else "lambda_sum"
    assert bool(vectorised.state[second].abs().sum() > 0)
    assert vectorised.worker.training_path == VECTORIZED and loop.worker.training_path is None


def partial_of(worker: ClientWorker, tasks, broadcast):
    partial = worker.run_clients(1, tasks, broadcast)
    return partial.sums["weights"] / partial.sums["num_samples"], partial.client_metrics


@pytest.mark.parametrize(("algorithm", "model"), [("fedavg", "cnn_small"), ("fedprox", "mlp")])
@pytest.mark.slow
def test_a_workers_round_in_groups_equals_the_loop(tmp_path, algorithm, model):
    """Groups of any size give the loop's result. An MLP's client gives the same bits in any group (a
    stack of matrix products computes each client's alone); a CNN's within the tolerance (a grouped
    convolution's kernel depends on the number of groups)."""
    overrides = [f"model.name={model}", "model.width=4", f"algorithm.name={algorithm}", *FULL_SGD]
    loop = make_worker(tmp_path / "loop", overrides)
    torch.manual_seed(0)
    broadcast = {"weights": get_flat_weights(loop.model_for(None))}
    tasks = [(client, -1, ()) for client in range(12)]
    loop_mean, loop_metrics = partial_of(loop, tasks, broadcast)
    assert loop.training_path is None  # off: never decided, the loop as before
    for group in (12, 5, 1):
        worker = make_worker(tmp_path / str(group), overrides + ["train.vectorize=on", f"resources.vectorize_group={group}"])
        mean, metrics = partial_of(worker, tasks, broadcast)
        assert worker.training_path == VECTORIZED
        torch.testing.assert_close(mean, loop_mean, rtol=RTOL, atol=ATOL)
        assert list(metrics) == list(loop_metrics)
        for client, values in loop_metrics.items():
            assert list(metrics[client]) == list(values)
            torch.testing.assert_close(
                torch.tensor(list(metrics[client].values())), torch.tensor(list(values.values())), rtol=RTOL, atol=ATOL
            )
        if group == 12:
            whole = mean
        elif model == "mlp":
            assert torch.equal(mean, whole)


def test_a_group_that_runs_out_of_memory_is_halved_with_the_same_result(tmp_path, monkeypatch):
    overrides = ["model.name=mlp", "model.width=16", "train.vectorize=on", "resources.vectorize_group=12"]
    reference, worker = make_worker(tmp_path / "a", overrides), make_worker(tmp_path / "b", overrides)
    broadcast = {"weights": get_flat_weights(reference.model_for(None))}
    tasks = [(client, -1, ()) for client in range(12)]
    expected = partial_of(reference, tasks, broadcast)
    real = worker_module.train_group
    sizes = []

    def small_memory(algorithm, contexts, broadcast):
        sizes.append(len(contexts))
        if len(contexts) > 4:
            raise torch.OutOfMemoryError("CUDA out of memory (simulated)")
        return real(algorithm, contexts, broadcast)

    monkeypatch.setattr(worker_module, "train_group", small_memory)
    result = partial_of(worker, tasks, broadcast)
    assert sizes == [12, 6, 3, 3, 3, 3]
    assert worker.vectorize_group == 3
    assert torch.equal(result[0], expected[0]) and result[1] == expected[1]


def test_a_vectorised_run_is_deterministic_and_off_is_the_loop(tmp_path):
    overrides = ["model.name=cnn_small", "model.width=4", "train.local_epochs=1", "train.momentum=0.5"]
    first = Federation(tmp_path / "first", [*overrides, "train.vectorize=on"])
    second = Federation(tmp_path / "second", [*overrides, "train.vectorize=on"])
    loop = Federation(tmp_path / "loop", [*overrides, "train.vectorize=off"])
    for round in (1, 2):
        rows = [federation.run_round(round) for federation in (first, second, loop)]
        assert rows[0] == rows[1]
        assert math.isclose(rows[0]["train_loss"], rows[2]["train_loss"], rel_tol=1e-5)
    assert torch.equal(first.state["weights"], second.state["weights"])
    torch.testing.assert_close(first.state["weights"], loop.state["weights"], rtol=RTOL, atol=ATOL)
    assert first.worker.training_path == VECTORIZED and loop.worker.training_path is None


def test_auto_trains_what_cannot_be_vectorised_as_the_loop(tmp_path):
    overrides = ["model.name=cnn_small", "model.width=4", "algorithm.name=moon", "model.projection_dim=8"]
    auto = Federation(tmp_path / "auto", [*overrides, "train.vectorize=auto"])
    off = Federation(tmp_path / "off", [*overrides, "train.vectorize=off"])
    assert auto.run_round(1) == off.run_round(1)
    assert torch.equal(auto.state["weights"], off.state["weights"])
    assert (
        auto.worker.training_path
        == "loop: algorithm moon does not declare vectorizable (its client update is not written as pure batched functions)"
    )


def config_and_model(overrides: list[str]):
    config = load_config(None, ["train.vectorize=auto", *overrides])
    info = build_federated_dataset(config.data, config.seed).info
    algorithm = get_algorithm_class(config.algorithm.name)(config, info)
    return config, algorithm, build_model(config.model, info)


@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        (["algorithm.name=fedavg"], VECTORIZED),
        (["algorithm.name=fedprox", "model.name=mlp"], VECTORIZED),
        (["algorithm.name=fedavgm"], VECTORIZED),  # FedAvg's client step, inherited
        (["algorithm.name=fedyogi"], VECTORIZED),
        (["algorithm.name=scaffold"], VECTORIZED),
        (["algorithm.name=feddyn", "model.name=mlp"], VECTORIZED),
        (["algorithm.name=fedlc"], "loop: algorithm fedlc overrides local_loss of FedAvg"),
        (["algorithm.name=moon", "model.projection_dim=8"], "loop: algorithm moon does not declare vectorizable"),
        (["train.optimizer=adam"], "loop: train.optimizer=adam"),
        (["model.name=resnet8"], VECTORIZED),  # BatchNorm: running statistics per client
        (["model.name=resnet8", "model.norm=group"], VECTORIZED),
        (["train.vectorize=off"], "loop: train.vectorize=off"),
    ],
)
def test_which_path_a_run_takes(overrides, expected):
    config, algorithm, model = config_and_model(overrides)
    assert vectorized_path(config, algorithm, model).startswith(expected)


def test_dropout_frozen_and_buffered_models_train_as_the_loop():
    config, algorithm, model = config_and_model([])
    assert loop_reason(config, algorithm, model) is None
    assert "dropout" in loop_reason(config, algorithm, torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Dropout(0.5)))
    assert loop_reason(config, algorithm, torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Dropout(0.0))) is None
    assert "recurrent" in loop_reason(config, algorithm, torch.nn.LSTM(2, 2))
    frozen = torch.nn.Linear(2, 2)
    frozen.bias.requires_grad_(False)
    assert "frozen" in loop_reason(config, algorithm, frozen)
    buffered = torch.nn.Linear(2, 2)
    buffered.register_buffer("scale", torch.ones(1))
    assert "float buffers (scale)" in loop_reason(config, algorithm, buffered)
    assert loop_reason(config, algorithm, torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.BatchNorm1d(2))) is None
    assert (
        loop_reason(config, algorithm, torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.BatchNorm1d(2, track_running_stats=False)))
        is None
    )
    cumulative = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.BatchNorm1d(2, momentum=None))
    assert "BatchNorm (1) with momentum=None" in loop_reason(config, algorithm, cumulative)
    normed = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.BatchNorm1d(2))
    normed.register_buffer("scale", torch.ones(1))
    assert "float buffers (scale)" in loop_reason(config, algorithm, normed)


def test_on_refuses_before_the_run_and_auto_does_not():
    config = load_config(None, ["train.vectorize=on", "algorithm.name=moon", "model.projection_dim=8"])
    data = build_federated_dataset(config.data, config.seed)
    with pytest.raises(ConfigError, match="train.vectorize: on, but algorithm moon does not declare vectorizable"):
        worker_module.build_algorithm(config, data)
    words = load_config(None, ["train.vectorize=on", "model.name=char_lstm", "data.name=pystdlib_chars"])
    with pytest.raises(ConfigError, match="model CharLSTM has a recurrent layer"):  # found on the meta device
        worker_module.build_algorithm(words, build_federated_dataset(words.data, words.seed))
    worker_module.build_algorithm(load_config(None, ["train.vectorize=auto", "algorithm.name=moon", "model.projection_dim=8"]), data)


def test_on_with_an_unsupported_algorithm_exits_2_with_one_line(tmp_path):
    from test_bad_inputs import assert_rejected, run_fedray

    args = ["run", "--set", "train.vectorize=on", "--set", "algorithm.name=moon", "--set", "model.projection_dim=8"]
    result = run_fedray([*args, "--set", f"output.dir={tmp_path / 'runs'}"], tmp_path)
    assert_rejected(result, "train.vectorize: on, but algorithm moon does not declare vectorizable")
    assert not (tmp_path / "runs").exists()


@pytest.mark.parametrize(
    "upload",
    [
        [
            "systems.enabled=true",
            "systems.compression.method=topk",
            "systems.compression.topk_fraction=0.2",
            "systems.compression.error_feedback=true",
        ],
        ["privacy.mechanism=local", "privacy.clip=0.5", "privacy.noise_multiplier=0.3"],
    ],
    ids=["topk-error-feedback", "local-dp"],
)
def test_each_clients_update_takes_the_upload_path(tmp_path, upload):
    """Top-k compression with error feedback (a residual stored per client) and local DP (clipping
    and seeded noise per client) apply to each client's vectorised update as to the loop's."""
    overrides = ["model.name=mlp", "model.width=16", *upload]
    vectorised = Federation(tmp_path / "on", [*overrides, "train.vectorize=on"])
    loop = Federation(tmp_path / "off", overrides)
    for round in (1, 2, 3):  # with error feedback, rounds 2 and 3 start from the residuals stored in round 1
        vectorised.run_round(round, [0, 1, 2, 3])
        loop.run_round(round, [0, 1, 2, 3])
        torch.testing.assert_close(vectorised.state["weights"], loop.state["weights"], rtol=RTOL, atol=ATOL)
    assert vectorised.worker.training_path == VECTORIZED


def test_the_automatic_group_size_follows_the_memory_estimate(tmp_path, monkeypatch):
    import fedray.algorithms.vectorized as vectorized

    worker = make_worker(tmp_path, ["model.name=cnn_small", "train.vectorize=on"])
    model, sample = worker.model_for(None), worker.data.info.dummy_input()
    per_client = vectorized.client_bytes(model, sample, batch_size=8)
    parameters = sum(p.numel() for p in model.parameters())
    assert per_client > 4 * vectorized.PARAMETER_COPIES * parameters
    monkeypatch.setattr(vectorized, "memory_budget", lambda device, share: 10 * per_client)
    assert vectorized.automatic_group_size(model, sample, 8, torch.device("cpu")) == 10
    monkeypatch.setattr(vectorized, "memory_budget", lambda device, share: per_client // 2)
    assert vectorized.automatic_group_size(model, sample, 8, torch.device("cpu")) == 1  # never 0
    monkeypatch.setattr(vectorized, "memory_budget", lambda device, share: 1 << 50)
    assert vectorized.automatic_group_size(model, sample, 8, torch.device("cpu")) == vectorized.MAX_AUTOMATIC_GROUP
    assert worker.vectorize_group is None
    assert worker.group_size() == vectorized.MAX_AUTOMATIC_GROUP and worker.vectorize_group == vectorized.MAX_AUTOMATIC_GROUP


@pytest.mark.parametrize("mode", ["auto", "on"])
def test_a_model_vmap_cannot_batch_trains_as_the_loop_under_auto_and_fails_under_on(tmp_path, monkeypatch, mode):
    overrides = ["model.name=mlp", "model.width=16"]

    def unbatchable(algorithm, contexts, broadcast):
        raise RuntimeError("vmap: It looks like you're calling .item() on a Tensor (simulated)")

    monkeypatch.setattr(worker_module, "train_group", unbatchable)
    vectorised = Federation(tmp_path / "vectorised", [*overrides, f"train.vectorize={mode}"])
    if mode == "on":
        with pytest.raises(Exception, match="calling .item"):
            vectorised.run_round(1)
        return
    loop = Federation(tmp_path / "loop", overrides)
    assert vectorised.run_round(1) == loop.run_round(1)
    assert vectorised.run_round(2) == loop.run_round(2)  # the loop from then on, without trying again
    assert torch.equal(vectorised.state["weights"], loop.state["weights"])
    assert (
        vectorised.worker.training_path
        == "loop: vectorised training failed (RuntimeError: vmap: It looks like you're calling .item() on a Tensor (simulated))"
    )
