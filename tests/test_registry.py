"""The algorithm registry and the typed run config: what the CLI and pipeline read from them."""

from __future__ import annotations

import inspect
import re
from dataclasses import fields

import pytest
import torch

from rlpipe.algos import OFFLINE, ONLINE, SPECS, get_algo
from rlpipe.envs.spaces import BOX, DISCRETE, GOAL, IMAGE
from rlpipe.errors import RlpipeError
from rlpipe.training.config import DatasetFields, OfflineConfig, OnlineConfig, RunConfig, parse_settings
from rlpipe.training.onpolicy import RolloutStorage


def test_every_spec_resolves_its_lazy_entries() -> None:
    """The registry names each algorithm's module and attributes as strings; a typo there
    would surface only when that algorithm is used, so read every one here."""
    for spec in SPECS:
        base = OnlineConfig if spec.online else DatasetFields  # GAIL: a dataset, and PPO's env-steps config
        assert issubclass(spec.config_class, RunConfig) and issubclass(spec.config_class, base), spec.name
        assert spec.config_class.__module__ == spec.module == spec.train.__module__, spec.name
        assert spec.tuned and all(isinstance(values, dict) for values in spec.tuned.values()), spec.name
        assert spec.action_kinds and set(spec.action_kinds) <= {BOX, DISCRETE}, spec.name
        assert spec.observation_kinds and set(spec.observation_kinds) <= {BOX, GOAL, IMAGE}, spec.name
        assert callable(spec.load_policy) and spec.budget in ("env_steps", "updates"), spec.name


def test_every_spec_builds_its_own_config_with_the_run_fields() -> None:
    run_fields = {f.name for f in fields(RunConfig)}
    for spec in SPECS:
        env_id = next(iter(spec.tuned)) if spec.multi_agent else "Pendulum-v1" if spec.online else "CartPole-v1"
        config = spec.make_config(env_id)
        assert type(config) is spec.config_class and run_fields <= {f.name for f in fields(config)}
        budget_base = OnlineConfig if spec.budget == "env_steps" else OfflineConfig
        assert isinstance(config, budget_base), spec.name
        # records_training is what train() accepts, not a guess
        assert spec.records_training == ("step_sink" in inspect.signature(spec.train).parameters), spec.name
    assert set(ONLINE) | set(OFFLINE) == {spec.name for spec in SPECS} and not set(ONLINE) & set(OFFLINE)
    assert get_algo("gail").budget == "env_steps" and not get_algo("gail").online  # learns from a dataset, trains in the env
    # offline learners take goal datasets (flattened when loaded); GAIL's generator acts in a flat-Box env
    assert all("goal" in get_algo(name).observation_kinds for name in ("bc", "cql", "bcq", "td3bc", "iql"))
    assert get_algo("gail").observation_kinds == ("box",)


def test_her_variants_are_three_specs_on_their_base_configs() -> None:
    her = [get_algo(f"{base}-her") for base in ("ddpg", "td3", "sac")]
    assert len({spec.config_class for spec in her}) == 3
    for spec, base in zip(her, ("ddpg", "td3", "sac")):
        config = spec.make_config("GoalWorld-v0")
        assert isinstance(config, get_algo(base).config_class) and config.her and config.base == base
        assert spec.observation_kinds == ("goal",)


def test_cli_help_lists_the_registry(cli) -> None:
    result = cli("train", "--help")
    assert result.code == 0
    text = " ".join(result.out.split())
    for spec in SPECS:
        assert spec.name in text


def test_settings_are_parsed_against_declared_types() -> None:
    ppo, cql = get_algo("ppo").config_class, get_algo("cql").config_class
    parsed = parse_settings(["hidden=[32, 16]", "target_kl=null", "anneal=false", "learning-rate=3e-4", "stop_at_return=500"], ppo)
    assert parsed == {"hidden": (32, 16), "target_kl": None, "anneal": False, "learning_rate": 3e-4, "stop_at_return": 500.0}
    assert parse_settings(["target_kl=0.02", "hidden=64"], ppo) == {"target_kl": 0.02, "hidden": (64,)}
    assert parse_settings(["td_loss=huber", "max_samples=30"], cql) == {"td_loss": "huber", "max_samples": 30}
    for bad, message in [
        ("num_steps=true", "setting num_steps=True: expected int"),
        ("gamma=inf", "setting gamma='inf': expected float"),
        ("ent_coef=[1]", "setting ent_coef=[1]: expected float"),
        ("hidden=null", "setting hidden=None: expected list of int"),
    ]:
        with pytest.raises(RlpipeError, match=f"^{re.escape(message)}$"):
            parse_settings([bad], ppo)
    with pytest.raises(RlpipeError, match=r"^setting td_loss='l2': expected 'mse' or 'huber'$"):
        get_algo("cql").make_config("CartPole-v1", td_loss="l2")  # library callers get the same checks


def test_rollout_storage_trains_on_valid_rows_only() -> None:
    storage = RolloutStorage(num_steps=3, num_rows=2, obs_dim=1, act_dim=2, discrete=True, device=torch.device("cpu"))
    storage.obs[:, :, 0] = torch.arange(6.0).reshape(3, 2)
    storage.valid[:] = torch.tensor([[True, True], [False, True], [True, True]])
    storage.terminated[0, 0] = True
    batch = storage.batch(torch.ones(3, 2), gamma=0.9, gae_lambda=0.95)
    assert batch.obs[:, 0].tolist() == [0.0, 1.0, 3.0, 4.0, 5.0]  # the reset step (row 0, t=1) is dropped
    assert batch.advantages[0] == pytest.approx(1.0)  # terminated: no bootstrap, no carry-over


def test_layer_widths_and_buffer_rows_are_bounded_at_the_limits() -> None:
    from rlpipe.limits import MAX_BUFFER_SIZE, MAX_LAYER_WIDTH

    sac = get_algo("sac")
    config = sac.make_config("Pendulum-v1", hidden=(MAX_LAYER_WIDTH, 1), buffer_size=MAX_BUFFER_SIZE)  # the edges are accepted
    assert config.hidden == (MAX_LAYER_WIDTH, 1) and config.buffer_size == MAX_BUFFER_SIZE
    with pytest.raises(RlpipeError, match=rf"^setting hidden=\(1, {MAX_LAYER_WIDTH + 1}\): expected at most {MAX_LAYER_WIDTH} per layer$"):
        sac.make_config("Pendulum-v1", hidden=(1, MAX_LAYER_WIDTH + 1))
    with pytest.raises(RlpipeError, match=rf"^setting buffer_size={MAX_BUFFER_SIZE + 1}: expected at most {MAX_BUFFER_SIZE}$"):
        sac.make_config("Pendulum-v1", buffer_size=MAX_BUFFER_SIZE + 1)
