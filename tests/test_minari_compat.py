"""Minari compatibility with the real minari package: our HDF5 reads in Minari, and Minari
datasets (both backends) import into our format with identical arrays."""

from __future__ import annotations

import json
from pathlib import Path

import gymnasium as gym
import minari
import numpy as np
import pytest
from minari.data_collector import EpisodeBuffer

import tests.nested_env  # noqa: F401  (registers NestedDict-v0)
from rlpipe.datasets.loader import load_dataset
from rlpipe.datasets.schema import map_columnar
from rlpipe.errors import RlpipeError
from tests.test_collector import collect_dataset


def stack(values: list):
    """Stack per-step values into arrays, leaf by leaf for (nested) Dict values."""
    if isinstance(values[0], dict):
        return {key: stack([value[key] for value in values]) for key in values[0]}
    return np.stack(values)


def concat(parts: list):
    """Concatenate episodes' arrays, leaf by leaf for (nested) Dict values."""
    if isinstance(parts[0], dict):
        return {key: concat([part[key] for part in parts]) for key in parts[0]}
    return np.concatenate(parts)


def assert_same(ours, theirs, name: str) -> None:
    if isinstance(theirs, dict):
        assert set(ours) == set(theirs), name
        for key in theirs:
            assert_same(ours[key], theirs[key], f"{name}.{key}")
    else:
        np.testing.assert_allclose(ours, theirs, rtol=1e-6, err_msg=name)


def minari_arrays(dataset) -> dict[str, np.ndarray]:
    episodes = list(dataset.iterate_episodes())
    pick = lambda values, part: map_columnar(values, lambda a: a[part])  # noqa: E731
    return {
        "obs": concat([pick(e.observations, slice(None, -1)) for e in episodes]),
        "next_obs": concat([pick(e.observations, slice(1, None)) for e in episodes]),
        "action": np.concatenate([e.actions for e in episodes]),
        "reward": np.concatenate([e.rewards for e in episodes]),
        "terminated": np.concatenate([e.terminations for e in episodes]),
        "truncated": np.concatenate([e.truncations for e in episodes]),
    }


@pytest.mark.parametrize("env_id", ["CartPole-v1", "Pendulum-v1"])
def test_arrow_and_hdf5_decode_to_identical_arrays(store: Path, env_id: str) -> None:
    collect_dataset(store, env_id, "data", episodes=6, num_envs=3)
    in_store = minari.MinariDataset(store / "data" / "data")  # Minari reads the store's copy in place
    ours = load_dataset("data", store)
    for name, values in minari_arrays(in_store).items():
        np.testing.assert_array_equal(values, getattr(ours, name), err_msg=name)
        assert values.dtype == getattr(ours, name).dtype, name
    assert in_store.recover_environment().spec.id == env_id
    assert in_store.spec.dataset_id == "rlpipe/data-v0"


def test_export_command(store: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, cli) -> None:
    collect_dataset(store, "CartPole-v1", "data", episodes=4, num_envs=2)
    monkeypatch.setenv("MINARI_DATASETS_PATH", str(tmp_path / "minari"))
    result = cli("datasets", "export", "data", "--to", "minari", "--id", "rlpipe/cartpole-v0", "--store", store)
    assert result.code == 0, result.err
    dataset = minari.load_dataset("rlpipe/cartpole-v0")
    assert dataset.total_episodes == 4
    np.testing.assert_array_equal(minari_arrays(dataset)["obs"], load_dataset("data", store).obs)
    again = cli("datasets", "export", "data", "--id", "rlpipe/cartpole-v0", "--store", store)
    assert again.code == 2 and "already exists" in again.err


def test_arrow_only_dataset_exports_the_same_minari_dataset(store: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, cli) -> None:
    """`collect` with its defaults (Arrow only), then `export`: Minari's layout is written from
    the shards, and holds what the HDF5 copy of a `--format both` collection holds."""
    monkeypatch.setenv("MINARI_DATASETS_PATH", str(tmp_path / "minari"))
    for fmt, name in (("arrow", "plain"), ("both", "copied")):
        assert (
            cli(
                "collect",
                "--env",
                "CartPole-v1",
                "--episodes",
                "5",
                "--num-envs",
                "2",
                "--seed",
                "3",
                "--format",
                fmt,
                "--name",
                name,
                "--store",
                store,
                "--quiet",
            ).code
            == 0
        )
        result = cli("datasets", "export", name, "--store", store)
        assert result.code == 0, result.err
    plain, copied = minari.load_dataset("rlpipe/plain-v0"), minari.load_dataset("rlpipe/copied-v0")
    assert plain.total_episodes == copied.total_episodes == 5
    for key, values in minari_arrays(plain).items():
        np.testing.assert_array_equal(values, minari_arrays(copied)[key], err_msg=key)
    assert plain.recover_environment().spec.id == "CartPole-v1"
    assert not (store / "plain" / "data").exists()  # the store's dataset is left as it was


def make_minari_dataset(
    dataset_id: str,
    env_id: str,
    data_format: str,
    episodes: int,
    make_kwargs: dict | None = None,
    with_infos: bool = False,
    seeds: list[int] | None = None,
    **metadata,
) -> None:
    """Write a real Minari dataset of random episodes, seeded 0, 1, 2, ... (or `seeds`, which
    Minari records as given; `make_kwargs` go to `gym.make`, `metadata` to
    `minari.create_dataset_from_buffers`). With `with_infos`, the episodes keep the env's
    infos as DataCollector does (the reset info, then one per step) plus a nested `debug.t` entry.

    `minari.DataCollector` needs jax (the `minari[create]` extra); buffers built from arrays do not.
    """
    env = gym.make(env_id, **(make_kwargs or {}))
    env.action_space.seed(0)
    buffers = []
    seeds = seeds or list(range(episodes))
    for episode in range(episodes):
        obs, info = env.reset(seed=seeds[episode])
        observations, actions, rewards, terminations, truncations, infos = [obs], [], [], [], [], [info]
        while True:
            action = env.action_space.sample()
            obs, reward, terminated, truncated, info = env.step(action)
            infos.append(info)
            observations.append(obs)
            actions.append(action)
            rewards.append(float(reward))
            terminations.append(terminated)
            truncations.append(truncated)
            if terminated or truncated:
                break
        buffers.append(
            EpisodeBuffer(
                id=episode,
                seed=seeds[episode],
                observations=stack(observations),
                actions=np.stack(actions),
                rewards=rewards,
                terminations=terminations,
                truncations=truncations,
                infos={**stack(infos), "debug": {"t": np.arange(len(infos))}} if with_infos else None,
            )
        )
    minari.create_dataset_from_buffers(dataset_id, buffers, env=env, algorithm_name="random", data_format=data_format, **metadata)


@pytest.mark.filterwarnings("ignore::UserWarning")
@pytest.mark.parametrize("data_format", ["hdf5", "arrow"])
def test_import_minari_dataset(store: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, cli, data_format: str) -> None:
    monkeypatch.setenv("MINARI_DATASETS_PATH", str(tmp_path / "minari"))
    make_minari_dataset(f"test/pendulum-{data_format}-v0", "Pendulum-v1", data_format, episodes=3)
    result = cli("datasets", "import", f"test/pendulum-{data_format}-v0", "--name", "imported", "--store", store)
    assert result.code == 0, result.err
    ours = load_dataset("imported", store)
    for name, values in minari_arrays(minari.load_dataset(f"test/pendulum-{data_format}-v0")).items():
        np.testing.assert_allclose(getattr(ours, name), values, rtol=1e-6, err_msg=name)
    assert len(ours.episode_starts()) == 3
    missing = cli("datasets", "import", "test/nothing-v0", "--store", store)
    assert missing.code == 2 and "cannot open Minari dataset" in missing.err


# What Minari's DataCollector draws for an episode reset without a seed (secrets.randbits(64)).
UNSIGNED_SEED = 15198835472784071208


@pytest.mark.filterwarnings("ignore::UserWarning")
@pytest.mark.parametrize("data_format", ["hdf5", "arrow"])
def test_unsigned_64_bit_seeds_round_trip_exactly(
    store: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, cli, data_format: str
) -> None:
    """Seeds of 2**63 and above (DataCollector's automatic seeds) import, validate and export
    exactly; the HDF5 attribute is uint64 for them and int64 for the others, as h5py stores
    Minari's own."""
    import h5py

    monkeypatch.setenv("MINARI_DATASETS_PATH", str(tmp_path / "minari"))
    seeds = [3, UNSIGNED_SEED, 2**64 - 1]
    make_minari_dataset("test/seeds-v0", "CartPole-v1", data_format, episodes=3, seeds=seeds)
    result = cli("datasets", "import", "test/seeds-v0", "--name", "seeded", "--store", store)
    assert result.code == 0, result.err
    assert json.loads((store / "seeded" / "metadata.json").read_text())["episode_seeds"] == {str(i): seed for i, seed in enumerate(seeds)}
    assert cli("datasets", "validate", "seeded", "--store", store).code == 0
    assert cli("datasets", "export", "seeded", "--id", "test/seeds-back-v0", "--store", store).code == 0
    back = minari.load_dataset("test/seeds-back-v0")
    assert [episode["seed"] for episode in back.storage.get_episode_metadata(range(3))] == seeds
    with h5py.File(store / "seeded" / "data" / "main_data.hdf5") as ours:
        assert [ours[f"episode_{i}"].attrs["seed"].dtype for i in range(3)] == [np.int64, np.uint64, np.uint64]


def minari_cli(*args: str):
    """Run Minari's own command line (`minari ARGS...`) in-process."""
    from minari.cli import app
    from typer.testing import CliRunner

    return CliRunner().invoke(app, list(args))


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_export_keeps_minari_listing_working(store: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, cli) -> None:
    """An export beside a real Minari dataset: both are listed, by the API and by `minari list local`."""
    monkeypatch.setenv("MINARI_DATASETS_PATH", str(tmp_path / "minari"))
    make_minari_dataset("test/pendulum-v0", "Pendulum-v1", "hdf5", episodes=2)
    collect_dataset(store, "CartPole-v1", "data", episodes=3, num_envs=1)
    assert cli("datasets", "export", "data", "--id", "rlpipe/cartpole-v0", "--store", store).code == 0
    listed = minari.list_local_datasets()
    assert set(listed) == {"test/pendulum-v0", "rlpipe/cartpole-v0"}
    assert listed["rlpipe/cartpole-v0"]["dataset_size"] >= 0.0
    shown = minari_cli("list", "local")
    assert shown.exit_code == 0, shown.output
    assert "pendulum-v0" in shown.output and "cartpole-v0" in shown.output


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_export_without_id_works_everywhere_in_minari(store: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, cli) -> None:
    """A name without -vN exports as rlpipe/<name>-v0: load, .spec, `minari show` and `list local` work."""
    monkeypatch.setenv("MINARI_DATASETS_PATH", str(tmp_path / "minari"))
    collect_dataset(store, "CartPole-v1", "cp", episodes=3, num_envs=1)
    result = cli("datasets", "export", "cp", "--to", "minari", "--store", store)
    assert result.code == 0, result.err
    assert "rlpipe/cp-v0" in result.out
    dataset = minari.load_dataset("rlpipe/cp-v0")
    assert dataset.spec.dataset_id == "rlpipe/cp-v0" and dataset.spec.version == 0
    assert dataset.spec.total_episodes == 3
    for args in (["show", "rlpipe/cp-v0"], ["list", "local"]):
        shown = minari_cli(*args)
        assert shown.exit_code == 0, shown.output
        assert "cp-v0" in shown.output


@pytest.mark.parametrize("bad_id", ["cp", "team/cp", "a b-v0"])
def test_minari_ids_without_version_are_one_line_errors(
    store: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, cli, bad_id: str
) -> None:
    monkeypatch.setenv("MINARI_DATASETS_PATH", str(tmp_path / "minari"))
    collect_dataset(store, "CartPole-v1", "cp", episodes=1, num_envs=1)
    for args in (["datasets", "export", "cp", "--id", bad_id], ["datasets", "import", bad_id, "--name", "back"]):
        result = cli(*args, "--store", store)
        assert result.code == 2, result.err
        assert result.err.count("\n") == 1 and "invalid Minari dataset id" in result.err
    assert not (tmp_path / "minari").exists() or not any((tmp_path / "minari").iterdir())


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_nested_dict_observations_collect_and_import_with_hdf5(store: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, cli) -> None:
    """A Dict inside a Dict: collected and imported with the default formats (Arrow + HDF5),
    and Minari reads back what we read."""
    result = cli(
        "collect",
        "--env",
        "NestedDict-v0",
        "--episodes",
        "6",
        "--num-envs",
        "2",
        "--name",
        "nested",
        "--format",
        "both",
        "--quiet",
        "--store",
        store,
    )
    assert result.code == 0, result.err
    ours = load_dataset("nested", store)
    assert set(ours.obs) == {"pos", "inner"} and set(ours.obs["inner"]) == {"vel", "count"}
    in_store = minari_arrays(minari.MinariDataset(store / "nested" / "data"))
    for name, values in in_store.items():
        assert_same(getattr(ours, name), values, name)

    monkeypatch.setenv("MINARI_DATASETS_PATH", str(tmp_path / "minari"))
    make_minari_dataset("test/nested-v0", "NestedDict-v0", "hdf5", episodes=4)
    result = cli("datasets", "import", "test/nested-v0", "--name", "imported", "--store", store)
    assert result.code == 0, result.err
    imported = load_dataset("imported", store)
    for name, values in minari_arrays(minari.load_dataset("test/nested-v0")).items():
        assert_same(getattr(imported, name), values, name)
    for name, values in minari_arrays(minari.MinariDataset(store / "imported" / "data")).items():
        assert_same(getattr(imported, name), values, name)


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_import_keeps_the_source_env_spec(store: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, cli) -> None:
    """A Minari dataset collected with max_episode_steps=37 keeps 37 through import, re-export
    and offline training (whose evaluation env and saved run use the dataset's spec)."""
    from rlpipe.algos import load_policy
    from rlpipe.training.offline import dataset_env_id

    monkeypatch.setenv("MINARI_DATASETS_PATH", str(tmp_path / "minari"))
    make_minari_dataset(
        "test/short-v0",
        "Pendulum-v1",
        "hdf5",
        episodes=2,
        make_kwargs={"max_episode_steps": 37},
        ref_min_score=-400.0,
        ref_max_score=-100.0,
    )
    assert cli("datasets", "import", "test/short-v0", "--name", "short", "--store", store).code == 0
    meta = json.loads((store / "short" / "metadata.json").read_text())
    assert json.loads(meta["env_spec"])["max_episode_steps"] == 37 and meta["env_id"] == "Pendulum-v1"
    assert cli("datasets", "export", "short", "--id", "test/back-v0", "--store", store).code == 0
    back = minari.load_dataset("test/back-v0")
    assert back.recover_environment().spec.max_episode_steps == 37
    assert all(len(e.rewards) == 37 and e.truncations[-1] and not e.terminations.any() for e in back.iterate_episodes())

    env_id = dataset_env_id("short", store)
    assert env_id != "Pendulum-v1" and env_id.endswith("/Pendulum-v1")
    assert gym.spec(env_id).max_episode_steps == 37 and gym.spec("Pendulum-v1").max_episode_steps == 200
    envs = gym.make_vec(env_id, num_envs=1)
    envs.reset(seed=0)
    truncated_at = next(t for t in range(1, 201) if envs.step(envs.action_space.sample())[3][0])
    assert truncated_at == 37
    run = tmp_path / "run"
    result = cli(
        "train",
        "bc",
        "--dataset",
        "short",
        "--updates",
        "4",
        "--set",
        "eval_every=4",
        "--set",
        "eval_episodes=1",
        "--store",
        store,
        "--out",
        run,
        "--no-progress",
    )
    assert result.code == 0, result.err
    assert json.loads((run / "metrics.json").read_text())["env_id"] == env_id
    assert gym.spec(load_policy(run).env_id).max_episode_steps == 37
    evaluated = cli("eval", run, "--episodes", "2", "--json")
    assert evaluated.code == 0, evaluated.err
    report = json.loads(evaluated.out)
    assert report["normalized_score"] == pytest.approx((report["return_mean"] + 400.0) / 300.0)
    assert report["return_mean"] > -37 * 16.3  # 37-step episodes (Pendulum's reward is at least -16.3 a step)


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_import_keeps_the_spec_of_an_env_not_registered_here(store: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, cli) -> None:
    """The spec of an env unknown here is kept, and built only once it is trusted."""
    from rlpipe.envs import TRUST_ENV_SPEC_VAR
    from rlpipe.training.offline import dataset_env_id

    monkeypatch.setenv("MINARI_DATASETS_PATH", str(tmp_path / "minari"))
    gym.register("Unlisted-v3", entry_point="tests.nested_env:NestedDictEnv", max_episode_steps=9)
    try:
        make_minari_dataset("test/unlisted-v0", "Unlisted-v3", "hdf5", episodes=2)
    finally:
        del gym.registry["Unlisted-v3"]
    assert cli("datasets", "import", "test/unlisted-v0", "--name", "unlisted", "--store", store).code == 0
    spec = json.loads(json.loads((store / "unlisted" / "metadata.json").read_text())["env_spec"])
    assert (spec["id"], spec["max_episode_steps"], spec["entry_point"]) == ("Unlisted-v3", 9, "tests.nested_env:NestedDictEnv")
    monkeypatch.setenv(TRUST_ENV_SPEC_VAR, "0")
    with pytest.raises(RlpipeError, match="untrusted env spec: 'Unlisted-v3' is not registered here .* --trust-env-spec"):
        dataset_env_id("unlisted", store)
    assert "Unlisted-v3" not in gym.registry
    monkeypatch.setenv(TRUST_ENV_SPEC_VAR, "1")
    try:
        assert dataset_env_id("unlisted", store) == "Unlisted-v3"
        assert gym.spec("Unlisted-v3").max_episode_steps == 9
    finally:
        gym.registry.pop("Unlisted-v3", None)


def assert_infos_match(ours, source) -> None:
    """Our info/next_info columns are Minari's infos without each episode's last / first entry."""
    infos = concat([episode.infos for episode in source.iterate_episodes()])
    starts = np.r_[0, np.cumsum([len(e.rewards) + 1 for e in source.iterate_episodes()])]
    last = np.zeros(len(infos["is_success"]), bool)
    last[starts[1:] - 1] = True
    first = np.zeros_like(last)
    first[starts[:-1]] = True
    np.testing.assert_array_equal(ours.next_info["is_success"], infos["is_success"][~first])
    np.testing.assert_array_equal(ours.info["debug"]["t"], infos["debug"]["t"][~last])
    np.testing.assert_array_equal(ours.next_info["is_success"], ours.terminated)  # GoalWorld ends on success


@pytest.mark.filterwarnings("ignore::UserWarning")
@pytest.mark.parametrize("data_format", ["hdf5", "arrow"])
def test_metadata_round_trips_both_ways(store: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, cli, data_format: str) -> None:
    """Minari -> rlpipe -> Minari keeps the optional metadata, eval env spec, reference
    scores, episode seeds, reward statistics and infos (GoalWorld's is_success, a nested key)."""
    monkeypatch.setenv("MINARI_DATASETS_PATH", str(tmp_path / "minari"))
    given = {
        "author": "Ada",
        "author_email": "ada@example.org",
        "description": "goal reaching, random",
        "code_permalink": "https://example.org/code",
        "eval_env": "GoalWorld-v0",
        "ref_min_score": -50.0,
        "ref_max_score": -4.0,
        "num_episodes_average_score": 7,
        "requirements": ["gymnasium>=1.0"],
    }
    # Minari 0.5.4's Arrow backend cannot read back the scalar infos it writes (`int(b'')` in
    # its `_decode_info`), so the Arrow source carries none.
    with_infos = data_format == "hdf5"
    make_minari_dataset("test/goal-v0", "GoalWorld-v0", data_format, episodes=5, with_infos=with_infos, **given)
    source = minari.load_dataset("test/goal-v0")
    assert cli("datasets", "import", "test/goal-v0", "--name", "goal", "--store", store).code == 0
    meta = json.loads((store / "goal" / "metadata.json").read_text())
    assert (meta["author"], meta["author_email"], meta["description"]) == (["Ada"], ["ada@example.org"], given["description"])
    assert (meta["ref_min_score"], meta["ref_max_score"], meta["num_episodes_average_score"]) == (-50.0, -4.0, 7)
    assert meta["eval_env_spec"] == source.storage.metadata["eval_env_spec"] and meta["requirements"] == ["gymnasium>=1.0"]
    assert meta["episode_seeds"] == {str(i): i for i in range(5)}
    ours = load_dataset("goal", store)
    if not with_infos:
        assert ours.info is None and "info_space" not in meta
    else:
        assert_infos_match(ours, source)

    assert cli("datasets", "export", "goal", "--id", "test/goal-back-v0", "--store", store).code == 0
    back = minari.load_dataset("test/goal-back-v0")
    for key in (
        "author",
        "author_email",
        "description",
        "code_permalink",
        "eval_env_spec",
        "ref_min_score",
        "ref_max_score",
        "num_episodes_average_score",
        "requirements",
        "algorithm_name",
    ):
        assert back.storage.metadata[key] == source.storage.metadata[key], key
    assert back.storage.metadata["dataset_size"] == round(
        (tmp_path / "minari" / "test" / "goal-back-v0" / "data" / "main_data.hdf5").stat().st_size / 1e6, 1
    )
    for theirs, mine in zip(source.iterate_episodes(), back.iterate_episodes()):
        assert_same(mine.infos, theirs.infos, "infos")
    episodes = list(back.storage.get_episode_metadata(range(5)))
    assert [episode["seed"] for episode in episodes] == list(range(5))
    for episode, data in zip(episodes, back.iterate_episodes()):
        assert episode["rewards_sum"] == pytest.approx(float(np.sum(data.rewards)))
    assert minari.get_normalized_score(back, np.array([-27.0])) == pytest.approx([0.5])
    shown = minari_cli("show", "test/goal-back-v0")
    assert shown.exit_code == 0 and "goal reaching" in shown.output
    # and the round trip closes: importing the export gives the same rows, infos and metadata
    assert cli("datasets", "import", "test/goal-back-v0", "--name", "again", "--store", store).code == 0
    again = json.loads((store / "again" / "metadata.json").read_text())
    assert again["content_hash"] == meta["content_hash"]
    assert {k: again[k] for k in given if k in again} == {k: meta[k] for k in given if k in meta}


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_collect_stores_is_success_and_reference_scores(store: Path, cli) -> None:
    from rlpipe.datasets.scores import random_policy_return

    result = cli(
        "collect",
        "--env",
        "GoalWorld-v0",
        "--episodes",
        "4",
        "--num-envs",
        "2",
        "--name",
        "goal",
        "--format",
        "both",
        "--quiet",
        "--store",
        store,
    )
    assert result.code == 0, result.err
    meta = json.loads((store / "goal" / "metadata.json").read_text())
    assert meta["ref_min_score"] == random_policy_return("GoalWorld-v0") and "ref_max_score" not in meta
    data = load_dataset("goal", store)
    np.testing.assert_array_equal(data.next_info["is_success"], data.terminated)
    assert not data.info["is_success"][data.step == 0].any()
    in_store = minari.MinariDataset(store / "goal" / "data")
    np.testing.assert_array_equal(concat([e.infos["is_success"][1:] for e in in_store.iterate_episodes()]), data.terminated)
    assert (
        cli("collect", "--env", "CartPole-v1", "--episodes", "2", "--name", "cp", "--format", "both", "--quiet", "--store", store).code == 0
    )
    assert "info_space" not in json.loads((store / "cp" / "metadata.json").read_text())  # CartPole reports no is_success
    assert cli("datasets", "validate", "goal", "--store", store).code == 0


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_import_refuses_tuple_spaces_in_one_line(store: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, cli) -> None:
    monkeypatch.setenv("MINARI_DATASETS_PATH", str(tmp_path / "minari"))
    space = gym.spaces.Tuple((gym.spaces.Discrete(3), gym.spaces.Box(-1.0, 1.0, (2,), np.float32)))
    observations = (np.array([0, 1, 2]), np.zeros((3, 2), np.float32))
    episode = EpisodeBuffer(
        id=0,
        observations=observations,
        actions=np.array([0, 1]),
        rewards=[0.0, 1.0],
        terminations=[False, True],
        truncations=[False, False],
    )
    minari.create_dataset_from_buffers("test/tuple-v0", [episode], observation_space=space, action_space=gym.spaces.Discrete(2))
    result = cli("datasets", "import", "test/tuple-v0", "--name", "tuple", "--store", store)
    assert result.code == 2 and result.err.count("\n") == 1 and "unsupported space" in result.err
    assert list(store.iterdir()) == []


@pytest.mark.slow
def test_expert_dataset_export_is_scored_by_minari(store: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, cli) -> None:
    """An expert collection records ref_max_score (its rollouts' mean return) beside the random
    ref_min_score, so Minari normalises returns on the export: expert 1, random 0."""
    from rlpipe.datasets.scores import random_policy_return

    monkeypatch.setenv("MINARI_DATASETS_PATH", str(tmp_path / "minari"))
    result = cli(
        "collect",
        "--env",
        "CartPole-v1",
        "--expert",
        "ppo",
        "--expert-run",
        tmp_path / "ppo",
        "--expert-steps",
        "2048",
        "--episodes",
        "4",
        "--num-envs",
        "2",
        "--name",
        "expert",
        "--format",
        "both",
        "--quiet",
        "--store",
        store,
    )
    assert result.code == 0, result.err
    meta = json.loads((store / "expert" / "metadata.json").read_text())
    assert meta["ref_max_score"] == pytest.approx(meta["episode_return"]["mean"])
    assert meta["ref_min_score"] == random_policy_return("CartPole-v1")
    assert cli("datasets", "export", "expert", "--store", store).code == 0
    exported = minari.load_dataset("rlpipe/expert-v0")
    scores = minari.get_normalized_score(exported, np.array([meta["ref_max_score"], meta["ref_min_score"]]))
    np.testing.assert_allclose(scores, [1.0, 0.0])
    assert exported.storage.metadata["algorithm_name"] == "ppo"


def random_episodes(rng: np.random.Generator, first_id: int, lengths: list[int]) -> dict:
    """Whole episodes with nested Dict observations, Box actions, float rewards and a bool info
    key, as DatasetWriter.write takes them (next_obs / next_info follow obs / info)."""
    rows: dict = {
        key: [] for key in ("episode_id", "step", "obs", "next_obs", "action", "reward", "terminated", "truncated", "info", "next_info")
    }
    for number, length in enumerate(lengths, start=first_id):
        pos = rng.standard_normal((length + 1, 2)).astype(np.float32)
        count = rng.integers(0, 5, length + 1)
        success = rng.random(length + 1) < 0.5
        rows["episode_id"].append(np.full(length, number))
        rows["step"].append(np.arange(length))
        rows["obs"].append({"pos": pos[:-1], "inner": {"count": count[:-1]}})
        rows["next_obs"].append({"pos": pos[1:], "inner": {"count": count[1:]}})
        rows["info"].append({"is_success": success[:-1]})
        rows["next_info"].append({"is_success": success[1:]})
        rows["action"].append(rng.uniform(-1, 1, (length, 3)).astype(np.float32))
        rows["reward"].append(rng.standard_normal(length).astype(np.float32) * 7)
        rows["terminated"].append(np.arange(length) == length - 1)
        rows["truncated"].append(np.zeros(length, dtype=bool))
    return {key: concat(parts) for key, parts in rows.items()}


def leaf_paths(values, prefix: str) -> dict:
    """The leaf arrays of a (nested) Dict column by HDF5 path under `prefix`."""
    if isinstance(values, dict):
        return {path: leaf for key, child in values.items() for path, leaf in leaf_paths(child, f"{prefix}/{key}").items()}
    return {prefix: values}


def hdf5_objects(path: Path) -> dict:
    """Every group and dataset of an HDF5 file by path: a dataset's dtype and values (bool
    only where the file holds h5py's bool enum), and each object's attributes with their dtypes."""
    import h5py

    objects = {}

    def record(name: str, item) -> None:
        attributes = {key: (value.dtype, value) for key, value in item.attrs.items()}
        objects[name] = (item.dtype, item[()], attributes) if isinstance(item, h5py.Dataset) else ("group", attributes)

    with h5py.File(path, "r") as file:
        file.visititems(record)
    return objects


def assert_same_objects(ours: dict, expected: dict) -> None:
    assert sorted(ours) == sorted(expected)
    for name, theirs in expected.items():
        mine = ours[name]
        assert mine[0] == theirs[0], name
        if theirs[0] != "group":
            np.testing.assert_array_equal(mine[1], theirs[1], err_msg=name)
        assert mine[-1].keys() == theirs[-1].keys(), name
        for key, (dtype, value) in theirs[-1].items():
            assert mine[-1][key][0] == dtype and mine[-1][key][1] == value, f"{name}.{key}"


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_hdf5_copy_holds_exactly_minari_episode_objects(store: Path) -> None:
    """The HDF5 copy's episode groups hold exactly what Minari's writer puts there, checked
    object by object on nested Dict observations with infos, float rewards, three shards and
    seeds known for some episodes only: `id` and `total_steps` (int64), `seed` where known,
    Minari's EpisodeMetadataCallback statistics of the rewards (float64, bit for bit), and
    datasets equal to the Arrow rows with the final observation and info appended."""
    from minari.data_collector.callbacks import EpisodeMetadataCallback

    from rlpipe.datasets.writer import write_rows

    rng = np.random.default_rng(3)
    obs_space = gym.spaces.Dict({"pos": gym.spaces.Box(-np.inf, np.inf, (2,)), "inner": gym.spaces.Dict({"count": gym.spaces.Discrete(5)})})
    info_space = gym.spaces.Dict({"is_success": gym.spaces.Box(0, 1, (), bool)})
    lengths = [1, 9, 17, 9, 130, 4, *rng.integers(1, 300, 24).tolist()]  # equal lengths reduce together
    batches = [random_episodes(rng, 0, lengths[:3]), random_episodes(rng, 3, lengths[3:5]), random_episodes(rng, 5, lengths[5:])]
    seeds = {"1": 11, "4": 15198835472784071208, "6": -5}  # int64, uint64 (DataCollector's own draws) and negative attributes
    write_rows(
        "mixed",
        batches,
        obs_space,
        gym.spaces.Box(-1, 1, (3,)),
        env_id=None,
        producer={"algorithm": "test"},
        extra={"episode_seeds": seeds},
        store=store,
        fmt="both",
        info_space=info_space,
        shard_bytes=1,
    )
    assert len(list((store / "mixed" / "steps").iterdir())) == 3

    rows = {key: concat([batch[key] for batch in batches]) for key in batches[0]}
    expected = {}
    bounds = np.r_[np.flatnonzero(np.diff(rows["episode_id"], prepend=-1)), len(rows["reward"])]
    for number, (begin, end) in enumerate(zip(bounds[:-1], bounds[1:])):
        group = f"episode_{number}"
        statistics = EpisodeMetadataCallback()({"rewards": rows["reward"][begin:end].astype(np.float64)})
        attributes = {
            "id": number,
            "total_steps": end - begin,
            **statistics,
            **({"seed": seeds[str(number)]} if str(number) in seeds else {}),
        }
        expected[group] = ("group", {key: (np.asarray(value).dtype, value) for key, value in attributes.items()})
        for column, now, following in (("observations", rows["obs"], rows["next_obs"]), ("infos", rows["info"], rows["next_info"])):
            last = leaf_paths(following, f"{group}/{column}")
            for path, values in leaf_paths(now, f"{group}/{column}").items():
                expected[path] = (values.dtype, np.concatenate([values[begin:end], last[path][end - 1 : end]]), {})
        for subgroup in ("observations", "observations/inner", "infos"):
            expected[f"{group}/{subgroup}"] = ("group", {})
        for column, key in (("actions", "action"), ("rewards", "reward"), ("terminations", "terminated"), ("truncations", "truncated")):
            expected[f"{group}/{column}"] = (rows[key].dtype, rows[key][begin:end], {})

    ours = hdf5_objects(store / "mixed" / "data" / "main_data.hdf5")
    assert_same_objects(ours, expected)
    # control: the check sees a single missing per-episode attribute
    unseeded = {**expected, "episode_4": ("group", {k: v for k, v in expected["episode_4"][1].items() if k != "seed"})}
    with pytest.raises(AssertionError):
        assert_same_objects(ours, unseeded)
    # and Minari reads the rows back
    for name, values in minari_arrays(minari.MinariDataset(store / "mixed" / "data")).items():
        assert_same(rows[name], values, name)
