"""Hetero-SSFL, its SSL pieces and the FedAvg+BYOL baseline, without Ray (docs/algorithms_hetero_ssfl.md)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from fedray.algorithms import ClientContext, get_algorithm_class
from fedray.algorithms.base import RoundResults
from fedray.algorithms.cka import cka, consensus, gram
from fedray.algorithms.hetero_ssfl import architecture_keys, assign_architectures, rad_batches
from fedray.algorithms.ssl import ONLINE_PREFIXES, TARGET_PREFIXES, embed, ema_update, linear_probe, pair_loss, represent, two_views
from fedray import load_config
from fedray.config import ConfigError, ModelConfig
from fedray.data import build_federated_dataset, get_augmentation
from fedray.models import ResNet, get_flat_weights
from fedray.seeding import seed_client

TWO_CNNS = "[{name: cnn_small, width: 8}, {name: cnn_small, width: 16, projection_dim: 16}]"
SIAMESE = [
    "data.num_clients=12",  # ~120 images each; the tests train clients 0-3
    "train.clients_per_round=4",
    "train.local_epochs=1",
    "train.momentum=0.9",
    "algorithm.projection_dim=32",
    "algorithm.hidden_dim=64",
    "algorithm.probe_epochs=5",
]
TINY = SIAMESE + [
    "algorithm.name=hetero_ssfl",
    "algorithm.rad_size=96",
    "algorithm.rad_batch_size=32",
    f"algorithm.architectures={TWO_CNNS}",
]


class Federation:
    """An algorithm plus everything a worker would give it, for calling client code directly."""

    def __init__(self, *overrides: str, base: list[str] = TINY) -> None:
        self.config = load_config(None, base + list(overrides))
        self.data = build_federated_dataset(self.config.data, self.config.seed)
        self.algorithm = get_algorithm_class(self.config.algorithm.name)(self.config, self.data.info)
        self.x, self.y = torch.as_tensor(self.data.train.x), torch.as_tensor(self.data.train.y)
        public = self.algorithm.public_indices(self.data)
        self.x_public = None if public is None else self.x[torch.as_tensor(public)]
        self.models: dict = {}
        self.states: dict = {}

    def context(self, client_id: int, round: int, state=None, **changes) -> ClientContext:
        key = self.algorithm.model_key(client_id)
        if key not in self.models:
            self.models[key] = self.algorithm.build_model(key)
        index = torch.as_tensor(self.data.clients.client(client_id))
        fields = dict(
            client_id=client_id,
            round=round,
            model=self.models[key],
            x=self.x[index],
            y=self.y[index],
            info=self.data.info,
            train=self.config.train,
            lr=self.config.train.lr,
            device=torch.device("cpu"),
            generator=seed_client(self.config.seed, round, client_id),
            augment=get_augmentation("none"),
            state=self.states.get(client_id) if state is None else state,
            x_public=self.x_public,
        )
        return ClientContext(**{**fields, **changes})

    def run_round(self, round: int, server_state: dict, clients=None, **changes):
        """Train ``clients`` (default all) as the runtime would; returns the new server state and updates."""
        broadcast = self.algorithm.broadcast(server_state, round)
        updates = {}
        for cid in range(4) if clients is None else clients:
            updates[cid] = self.algorithm.client_update(self.context(cid, round, **changes), broadcast)
            self.states[cid] = updates[cid].state
        results = RoundResults(
            sums={},
            payloads={c: u.payload for c, u in updates.items() if u.payload},
            client_metrics={c: u.metrics for c, u in updates.items()},
            num_clients=len(updates),
            excluded_clients=[],
        )
        new_state, _ = self.algorithm.aggregate(server_state, round, results)
        return new_state, updates


def parameters_and_buffers(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.clone() for k, v in model.state_dict().items()}


@pytest.fixture(scope="module")
def trained():
    """Two rounds of a four-client, two-architecture federation."""
    federation = Federation()
    state = federation.algorithm.init_server_state(None)
    state, _ = federation.run_round(1, state)
    state, updates = federation.run_round(2, state)
    return federation, state, updates


# --------------------------------------------------------------------- configuration, models


def test_architectures_are_validated_as_model_sections():
    with pytest.raises(ConfigError, match=r"algorithm\.architectures\.1\.name"):
        load_config(None, TINY + ["algorithm.architectures=[{name: cnn_small}, {name: vgg}]"])
    with pytest.raises(ConfigError, match=r"algorithm\.arch_assignment"):
        load_config(None, TINY + ["algorithm.arch_assignment=alphabetical"])
    with pytest.raises(ConfigError, match=r"algorithm\.rad_batch_size"):
        load_config(None, TINY + ["algorithm.rad_batch_size=2"])
    with pytest.raises(ConfigError, match=r"algorithm\.tau: unknown key"):
        load_config(None, TINY + ["algorithm.tau=0.99"])  # the BYOL decay is ema_decay (docs/architecture.md)


def test_architecture_assignment_rules():
    assert assign_architectures(5, 2, "round_robin", 0).tolist() == [0, 1, 0, 1, 0]
    assert assign_architectures(5, 2, "blocks", 0).tolist() == [0, 0, 0, 1, 1]
    random = assign_architectures(6, 3, "random", seed=4)
    assert sorted(set(random.tolist())) == [0, 1, 2]  # at least one of each architecture
    assert np.array_equal(random, assign_architectures(6, 3, "random", seed=4))
    keys = architecture_keys([ModelConfig(width=8), ModelConfig(width=8), ModelConfig(name="resnet8"), ModelConfig(projection_dim=4)])
    assert keys == ["cnn_small_w8_0", "cnn_small_w8_1", "resnet8", "cnn_small_w16_p4"]


def test_probe_clients_is_a_seeded_sample_fixed_for_the_run_and_spread_over_architectures():
    every = Federation("algorithm.arch_assignment=blocks").algorithm  # clients 0-5: w8, 6-11: w16
    assert every.evaluation_clients(12) == list(range(12))  # the paper's protocol by default
    sampled = Federation("algorithm.arch_assignment=blocks", "algorithm.probe_clients=4").algorithm
    chosen = sampled.evaluation_clients(12)
    assert len(chosen) == 4 and len(set(chosen)) == 4 and chosen == sorted(chosen)
    assert chosen == sampled.evaluation_clients(12)  # the same clients at every evaluation
    assert sum(c < 6 for c in chosen) == 2  # two of each architecture, although blocks put them apart
    other_seed = Federation("algorithm.arch_assignment=blocks", "algorithm.probe_clients=4", "seed=1").algorithm
    assert other_seed.evaluation_clients(12) != chosen
    assert Federation("algorithm.probe_clients=40").algorithm.evaluation_clients(12) == list(range(12))
    with pytest.raises(ConfigError, match=r"algorithm\.probe_clients"):
        load_config(None, TINY + ["algorithm.probe_clients=0"])


def test_p17_clients_of_different_architectures_federate_in_one_round():
    archs = "[{name: cnn_small, width: 8}, {name: cnn_small, width: 16, projection_dim: 16}, {name: resnet8}]"
    federation = Federation(f"algorithm.architectures={archs}", "train.batch_size=64")
    algorithm = federation.algorithm
    assert [algorithm.model_key(c) for c in range(3)] == ["cnn_small_w8", "cnn_small_w16_p16", "resnet8"]
    assert isinstance(federation.context(2, 1).model, ResNet)
    state, _ = federation.run_round(1, algorithm.init_server_state(None), clients=[0, 1, 2])
    state, updates = federation.run_round(2, state, clients=[0, 1, 2])
    widths = {c: u.payload["representations"].shape for c, u in updates.items()}
    assert widths == {0: (96, 32), 1: (96, 16), 2: (96, 32)}
    assert state["consensus"].shape == (96, 96)
    assert all(0 < u.metrics["cka"] <= 1 for u in updates.values())  # round 2 aligned every client


# --------------------------------------------------------------------- what travels


def test_p18_only_representations_leave_a_client_and_the_server_holds_no_model(trained):
    federation, state, updates = trained
    for cid, update in updates.items():
        model = federation.models[federation.algorithm.model_key(cid)]
        assert update.sums == {}
        assert set(update.payload) == {"representations", "num_samples"}
        assert update.payload["representations"].shape == (96, model.projection_dim)
        assert isinstance(update.payload["num_samples"], float)
        assert set(update.state) == {"online", "target"}  # stays with the client (its state store)
    assert set(state) == {"representations", "num_samples", "consensus"}
    assert set(state["representations"]) == {"0", "1", "2", "3"}


def test_p19_mu_zero_sends_nothing_and_nothing_sent_changes_training():
    federation = Federation("algorithm.mu=0")
    assert federation.algorithm.public_indices(federation.data) is None  # no RAD at all
    state = federation.algorithm.init_server_state(None)
    state, updates = federation.run_round(1, state)
    assert all(u.payload == {} and u.sums == {} for u in updates.values())
    assert state["consensus"] is None
    # A consensus kernel in the broadcast (as a μ > 0 federation would send) changes nothing.
    plain = federation.algorithm.client_update(federation.context(1, 2), {"consensus": None})
    noisy = federation.algorithm.client_update(federation.context(1, 2), {"consensus": gram(torch.randn(96, 5))})
    assert torch.equal(plain.state["online"], noisy.state["online"])
    assert "cka" not in plain.metrics


def test_round_one_has_no_alignment_so_mu_only_acts_from_align_start_round():
    aligned, local = Federation(), Federation("algorithm.mu=0")
    first = aligned.algorithm.client_update(aligned.context(0, 1), {"consensus": None})
    alone = local.algorithm.client_update(local.context(0, 1), {"consensus": None})
    assert torch.equal(first.state["online"], alone.state["online"])
    late = Federation("algorithm.align_start_round=3")
    update = late.algorithm.client_update(late.context(0, 2), {"consensus": gram(torch.randn(96, 5))})
    assert "cka" not in update.metrics


def test_labels_are_never_used():
    federation = Federation()
    ctx = federation.context(0, 1)
    shuffled = federation.context(0, 1, y=ctx.y[torch.randperm(ctx.y.shape[0])])
    first = federation.algorithm.client_update(ctx, {"consensus": None})
    second = federation.algorithm.client_update(shuffled, {"consensus": None})
    assert torch.equal(first.state["online"], second.state["online"])


# --------------------------------------------------------------------- client side


def test_initial_model_depends_on_seed_and_client_only():
    federation = Federation()
    algorithm = federation.algorithm
    weights = []
    for client_id, round in [(0, 1), (0, 7), (2, 1)]:
        ctx = federation.context(client_id, round)
        algorithm.load_client(ctx, target=None)
        weights.append(get_flat_weights(ctx.model, ONLINE_PREFIXES))
    assert torch.equal(weights[0], weights[1])
    assert not torch.equal(weights[0], weights[2])  # same architecture, another client


def test_state_round_trip_restores_online_and_target(trained):
    federation, _, updates = trained
    algorithm = federation.algorithm
    ctx = federation.context(1, 3, state=updates[1].state)
    target = algorithm.target_model(algorithm.model_key(1), ctx.device)
    algorithm.load_client(ctx, target)
    assert torch.equal(get_flat_weights(ctx.model, ONLINE_PREFIXES), updates[1].state["online"])
    assert torch.equal(get_flat_weights(target, TARGET_PREFIXES), updates[1].state["target"])
    assert not torch.equal(updates[1].state["target"], get_flat_weights(ctx.model, TARGET_PREFIXES))  # EMA lags


def test_p11_alignment_gradient_reaches_online_networks_but_not_the_target(trained):
    federation, state, _ = trained
    algorithm = federation.algorithm
    ctx = federation.context(0, 3)
    target = algorithm.target_model(algorithm.model_key(0), ctx.device)
    algorithm.load_client(ctx, target)
    term = algorithm.alignment_term(ctx, algorithm.broadcast(state, 3))
    loss, terms = term()
    ctx.model.zero_grad(set_to_none=True)
    loss.backward()
    for prefix in ONLINE_PREFIXES:
        grads = [p.grad for n, p in ctx.model.named_parameters() if n.startswith(prefix)]
        assert grads and all(g is not None for g in grads), prefix
        assert sum(float(g.abs().sum()) for g in grads) > 0, prefix
    assert all(not p.requires_grad and p.grad is None for p in target.parameters())
    assert loss.item() == pytest.approx(0.5 * (1 - terms["cka"].item()), abs=1e-6)  # μ (1 - CKA), μ = 0.5


def test_p10_training_with_mu_raises_cka_to_the_consensus():
    """The same client, seed and steps: μ > 0 ends closer (in CKA, eval mode, whole RAD) to the
    broadcast K̄ than μ = 0. K̄ is the RAD's pixel kernel: structured, so a small CNN can match it."""
    rad = Federation().x_public
    target_kernel = gram(Federation().data.info.normalize(rad).flatten(1))
    final_cka = {}
    for mu in (0, 1):
        federation = Federation(f"algorithm.mu={mu}")
        update = federation.algorithm.client_update(federation.context(0, 2), {"consensus": target_kernel})
        ctx = federation.context(0, 3, state=update.state)
        federation.algorithm.load_client(ctx, None)
        representation = embed(ctx.model, lambda x: represent(ctx.model, x), rad, ctx.info, 512)
        final_cka[mu] = cka(gram(representation), target_kernel).item()
    assert final_cka[1] > final_cka[0] + 0.1


def test_p16_embedding_the_rad_is_deterministic_and_changes_nothing(trained):
    federation, _, _ = trained
    ctx = federation.context(0, 3)
    federation.algorithm.load_client(ctx, None)
    model = ctx.model.train()
    before = parameters_and_buffers(model)
    first = embed(model, lambda x: represent(model, x), ctx.x_public, ctx.info, 40)
    second = embed(model, lambda x: represent(model, x), ctx.x_public, ctx.info, 17)
    assert torch.equal(first, second) and first.dtype == torch.float32
    after = model.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)
    assert model.training  # the mode is restored


def test_p21_rad_is_fixed_and_disjoint_when_a_public_split_is_held_out():
    federation = Federation()
    rad = federation.algorithm.public_indices(federation.data)
    assert len(rad) == 96 and np.array_equal(rad, Federation().algorithm.public_indices(federation.data))
    assert np.intersect1d(rad, federation.data.clients.indices).size > 0  # overlap allowed by default
    disjoint = Federation("data.public_fraction=0.2")
    public = disjoint.data.public
    assert np.intersect1d(public, disjoint.data.clients.indices).size == 0
    assert np.array_equal(np.union1d(public, disjoint.data.clients.indices), np.arange(len(disjoint.data.train)))
    assert np.isin(disjoint.algorithm.public_indices(disjoint.data), public).all()
    small = Federation("data.public_fraction=0.02", "algorithm.rad_size=5000")
    assert np.array_equal(small.algorithm.public_indices(small.data), small.data.public)  # L = min(rad_size, pool)


def test_rad_batches_cycle_through_permutations():
    batches = rad_batches(10, 4, seed=0, device=torch.device("cpu"))
    first_pass = torch.cat([next(batches) for _ in range(2)])
    assert len(set(first_pass.tolist())) == 8  # two full batches of one permutation, no repeats
    assert all(next(batches).shape == (4,) for _ in range(5))


# --------------------------------------------------------------------- server side


def test_p15_p20_partial_participation_keeps_the_last_upload_of_absent_clients(trained):
    federation, state, _ = trained
    before = {c: a.clone() for c, a in state["representations"].items()}
    new_state, updates = federation.run_round(3, state, clients=[1, 2])
    reps = new_state["representations"]
    assert torch.equal(reps["0"], before["0"]) and torch.equal(reps["3"], before["3"])
    assert not torch.equal(reps["1"], before["1"])
    # Rebuilt from the cache = rebuilt from every client's current model (re-embedded).
    current = []
    for cid in range(4):
        ctx = federation.context(cid, 4)
        federation.algorithm.load_client(ctx, None)
        current.append(embed(ctx.model, lambda x, m=ctx.model: represent(m, x), ctx.x_public, ctx.info, 512))
    torch.testing.assert_close(new_state["consensus"], consensus(current, torch.full((4,), 0.25)), atol=1e-3, rtol=1e-4)


def test_client_weights_by_samples_and_clients_not_yet_uploaded():
    federation = Federation("algorithm.client_weights=by_samples")
    a = {0: torch.randn(96, 3), 2: torch.randn(96, 5)}
    results = RoundResults(
        sums={},
        payloads={0: {"representations": a[0], "num_samples": 30.0}, 2: {"representations": a[2], "num_samples": 10.0}},
        client_metrics={0: {"cka": 0.5}, 2: {"cka": 0.7}},
        num_clients=2,
        excluded_clients=[],
    )
    state, metrics = federation.algorithm.aggregate(federation.algorithm.init_server_state(None), 2, results)
    torch.testing.assert_close(state["consensus"], 0.75 * a[0] @ a[0].T + 0.25 * a[2] @ a[2].T, atol=1e-4, rtol=1e-5)
    assert metrics == {"clients_in_consensus": 2.0, "mean_cka": pytest.approx(0.6)}


def test_factor_form_broadcasts_a_factor_with_the_same_kernel():
    kernel_form, factor_form = Federation(), Federation("algorithm.consensus_form=factor")
    for federation in (kernel_form, factor_form):
        federation.state, _ = federation.run_round(1, federation.algorithm.init_server_state(None))
    factor = factor_form.state["consensus"]
    assert factor.shape == (96, 32 + 16 + 32 + 16)
    torch.testing.assert_close(factor @ factor.T, kernel_form.state["consensus"], atol=1e-3, rtol=1e-4)


# --------------------------------------------------------------------- SSL pieces


def test_ssl_losses_golden_values():
    p, z = torch.tensor([[1.0, 0.0]]), torch.tensor([[0.0, 3.0]])
    assert pair_loss("byol", p, z).item() == pytest.approx(2.0)  # 2 - 2 cos, cos = 0
    assert pair_loss("byol", p, 2 * p).item() == pytest.approx(0.0)
    assert pair_loss("byol", p, z, byol_form="mse").item() == pytest.approx(10.0)  # ‖(1, -3)‖²
    assert pair_loss("simsiam", p, 2 * p).item() == pytest.approx(-0.5)
    z.requires_grad_(True)
    pair_loss("byol", p.requires_grad_(True), z).backward()
    assert z.grad is None  # stop-gradient on the reference branch


def test_ema_update_moves_the_target_towards_the_online_weights():
    target, online = torch.zeros(3), torch.ones(3)
    ema_update([(target, online)], decay=0.99)
    torch.testing.assert_close(target, torch.full((3,), 0.01))


def test_two_views_draw_per_sample_and_per_view():
    federation = Federation()
    x = federation.data.info.normalize(federation.x[:1].expand(6, -1, -1, -1))  # six copies of one image
    views = two_views(federation.data.info)(x, torch.Generator().manual_seed(0))
    assert views.shape == (12, *x.shape[1:])
    assert not torch.allclose(views[0], views[1])  # two samples of one batch: different draws
    assert not torch.allclose(views[0], views[6])  # the two views of one sample differ


def test_p23_linear_probe_leaves_the_encoder_alone_and_separates_a_separable_toy(trained):
    generator = torch.Generator().manual_seed(0)
    centres = torch.randn(3, 10, generator=generator) * 4
    labels = torch.randint(0, 3, (600,), generator=generator)
    features = centres[labels] + torch.randn(600, 10, generator=generator)
    result = linear_probe(features[:400], labels[:400], features[400:], labels[400:], 3, 50, 3e-3, 64, generator)
    assert result["accuracy"] > 0.95

    federation = Federation("algorithm.probe_epochs=50")
    ctx = federation.context(2, 3, state=trained[2][2].state)
    federation.algorithm.load_client(ctx, None)
    before = parameters_and_buffers(ctx.model)
    test = (torch.as_tensor(federation.data.test.x), torch.as_tensor(federation.data.test.y))
    metrics = federation.algorithm.evaluate_on_test_set(ctx, {"consensus": None}, (federation.x, federation.y), test)
    assert all(torch.equal(before[k], v) for k, v in ctx.model.state_dict().items())
    key = federation.algorithm.model_key(2)
    assert metrics["probe_accuracy"] == metrics[f"probe_accuracy_{key}"] == metrics["test_accuracy"] > 0.5
    assert federation.algorithm.evaluation_clients(4) == [0, 1, 2, 3]


# --------------------------------------------------------------------- FedAvg + BYOL


@pytest.mark.parametrize("ssl", ["byol", "simsiam"])
def test_fedavg_byol_averages_the_whole_siamese_model(ssl):
    federation = Federation("algorithm.name=fedavg_byol", f"algorithm.ssl={ssl}", base=SIAMESE)
    algorithm = federation.algorithm
    torch.manual_seed(0)
    model = algorithm.build_model(algorithm.model_key(None))
    state = algorithm.init_server_state(model)
    online = get_flat_weights(model, ONLINE_PREFIXES).numel()
    target = get_flat_weights(model, TARGET_PREFIXES).numel() if ssl == "byol" else 0
    assert state["weights"].numel() == online + target
    updates = [algorithm.client_update(federation.context(c, 1), algorithm.broadcast(state, 1)) for c in (0, 1)]
    assert all(u.state is None and u.payload == {} for u in updates)
    sums = {k: updates[0].sums[k] + updates[1].sums[k] for k in updates[0].sums}
    new_state, _ = algorithm.aggregate(
        state, 1, RoundResults(sums=sums, payloads={}, client_metrics={}, num_clients=2, excluded_clients=[])
    )
    n = [federation.context(c, 1).num_samples for c in (0, 1)]
    expected = (updates[0].sums["weights"] + updates[1].sums["weights"]) / sum(n)
    torch.testing.assert_close(new_state["weights"], expected.float())
    assert algorithm.evaluation_clients(4) == [0]


def test_p22_the_papers_partitions_are_fedray_shards_and_iid():
    """Non-IID: N clients with all images of K/N disjoint classes each (``partition: shards``); IID
    sizes differ by at most 1; 100 clients on 100 classes get one class each (the paper's K/N rule)."""
    from fedray.config import DataConfig
    from fedray.data import partition_labels

    labels = np.repeat(np.arange(10), 50)
    partition = partition_labels(labels, DataConfig(num_clients=5, partition="shards", classes_per_client=2), seed=3)
    label_sets = [set(labels[partition.client(k)].tolist()) for k in range(5)]
    assert all(len(s) == 2 for s in label_sets) and len(set().union(*label_sets)) == 10
    assert np.array_equal(np.sort(partition.indices), np.arange(500))
    iid = partition_labels(labels, DataConfig(num_clients=7, partition="iid"), seed=3)
    assert iid.sizes.max() - iid.sizes.min() <= 1
    hundred = np.repeat(np.arange(100), 5)
    one_each = partition_labels(hundred, DataConfig(num_clients=100, partition="shards", classes_per_client=1), seed=0)
    assert all(len(set(hundred[one_each.client(k)].tolist())) == 1 for k in range(100))


def test_settings_that_do_not_apply_fail_before_ray():
    from fedray.runtime import prepare_data

    overrides = TINY + ["data.client_test_fraction=0.2", "eval.personalized=true"]
    with pytest.raises(ConfigError, match="eval.personalized"):
        prepare_data(load_config(None, overrides))
    with pytest.raises(ConfigError, match="algorithm.probe_out_dim"):
        prepare_data(load_config(None, TINY + ["algorithm.probe_out_dim=5"]))
