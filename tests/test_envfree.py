"""Training on a dataset that names no environment (rlpipe.training.validation): held-out
episodes score the policy, FQE estimates each kept copy's value, ``--select-by`` keeps one,
and every command that would play the policy refuses in one line."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

import rlpipe
from rlpipe.commands.report import read_diagnostics
from rlpipe.datasets.d4rl import d4rl_arrays
from rlpipe.datasets.loader import TransitionArrays, load_dataset
from rlpipe.errors import RlpipeError
from rlpipe.training.validation import Snapshots, ValidationSet, split_episodes
from tests.test_collector import collect_dataset

BRIEF = ("--updates", "1500", "--set", "eval_every=300", "--set", "fqe_updates=600", "--no-progress")


def logging_policy(obs: np.ndarray) -> np.ndarray:
    """The deterministic controller whose actions the test data logs (Pendulum's torque)."""
    return np.clip(2.0 * np.tanh(obs @ np.array([1.5, -0.8, -0.6])), -2.0, 2.0)[:, None].astype(np.float32)


@pytest.fixture(scope="module")
def logs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """npz files of Pendulum observations with the logging policy's actions (``controller``)
    and the same actions shuffled across rows (``shuffled``: no observation says anything
    about its action), for import with no environment."""
    folder = tmp_path_factory.mktemp("logs")
    collect_dataset(folder / "store", "Pendulum-v1", "random", fmt="arrow", episodes=12)
    arrays = d4rl_arrays(load_dataset("random", folder / "store"))
    actions = logging_policy(arrays["observations"])
    shuffled = actions[np.random.default_rng(0).permutation(len(actions))]
    for name, column in (("controller", actions), ("shuffled", shuffled)):
        np.savez(folder / f"{name}.npz", **{**arrays, "actions": column})
    return {name: folder / f"{name}.npz" for name in ("controller", "shuffled")}


def import_logs(cli, store: Path, path: Path, name: str) -> None:
    result = cli("datasets", "import", path, "--from", "npz", "--name", name, "--store", store, "--action-space", "box:-2,2")
    assert result.code == 0, result.err


def train(cli, store: Path, out: Path, dataset: str, *args: str) -> dict:
    result = cli("train", "bc", "--dataset", dataset, "--store", store, "--out", out, *BRIEF, *args)
    assert result.code == 0, result.err
    return json.loads((out / "metrics.json").read_text())


def test_split_holds_out_whole_episodes() -> None:
    episodes = np.repeat(np.arange(10), 5)
    data = TransitionArrays(
        obs=np.zeros((50, 1)),
        action=np.zeros((50, 1)),
        reward=np.zeros(50),
        next_obs=np.zeros((50, 1)),
        terminated=np.zeros(50, bool),
        truncated=np.zeros(50, bool),
        episode_id=episodes,
        step=np.tile(np.arange(5), 10),
    )
    train_rows, held_out = split_episodes(data, 0.2, seed=3, name="d")
    assert len(held_out) == 10 and len(train_rows) == 40
    assert not set(episodes[held_out]) & set(episodes[train_rows])
    assert np.array_equal(split_episodes(data, 0.2, seed=3, name="d")[1], held_out), "the run's seed draws them"
    assert len(split_episodes(data, 0.01, seed=3, name="d")[1]) == 5, "at least one episode"
    with pytest.raises(RlpipeError, match="needs two"):
        split_episodes(TransitionArrays(**{k: v[:5] for k, v in vars(data).items() if v is not None}), 0.5, 0, "d")


def test_selection_rules_pick_their_checkpoint() -> None:
    import torch

    snapshots = Snapshots(torch.nn.Linear(1, 1))
    for updates, error in ((100, 0.3), (200, 0.1), (300, 0.2)):
        snapshots.take(updates, error)
    snapshots.score_fqe([(-5.0, 1.0), (-9.0, 1.0), (-1.0, 1.0)])
    assert [snapshots.select(rule).updates for rule in ("last", "val_loss", "fqe")] == [300, 200, 300]
    snapshots.score_fqe([(2.0, 1.0), (-9.0, 1.0), (-1.0, 1.0)])
    assert snapshots.select("fqe").updates == 100


@pytest.mark.slow
def test_bc_learns_the_logging_policy_on_held_out_episodes_and_not_from_shuffled_actions(
    cli, store: Path, tmp_path: Path, logs, learning_seed: int, record_property
) -> None:
    """The held-out action error is the run's score: BC drives it far below where it starts on
    the controller's logs; on the same actions shuffled across rows (the control: no
    observation tells its action) it cannot. Seeds 0-9: learned at most 2e-4, control at least 0.59."""
    import_logs(cli, store, logs["controller"], "controller")
    import_logs(cli, store, logs["shuffled"], "shuffled")
    seed = ("--seed", str(learning_seed))
    learned = train(cli, store, tmp_path / "learned", "controller", "--select-by", "val_loss", *seed)
    control = train(cli, store, tmp_path / "control", "shuffled", "--select-by", "val_loss", *seed)
    errors = [row["val_action_error"] for row in learned["checkpoints"]]
    record_property("learned_error", min(errors))
    record_property("control_error", control["val_action_error"])
    assert learned["env_id"] == "" and "heldout_return_mean" not in learned and "eval_return_mean" not in learned
    assert learned["validation_episodes"] == 1 and learned["validation_transitions"] == 200  # 10% of 12 episodes
    assert min(errors) < 0.05 < 0.2 < control["val_action_error"], (errors, control["val_action_error"])
    assert (tmp_path / "learned" / "dvclive" / "plots" / "metrics" / "val" / "action_error.tsv").is_file()


def test_the_run_keeps_the_selected_checkpoint(cli, store: Path, tmp_path: Path, logs) -> None:
    import_logs(cli, store, logs["controller"], "controller")
    for rule in ("val_loss", "fqe"):
        m = train(cli, store, tmp_path / rule, "controller", "--select-by", rule)
        rows = m["checkpoints"]
        assert [row["updates"] for row in rows] == [300, 600, 900, 1200, 1500]
        pick = min(rows, key=lambda r: r["val_action_error"]) if rule == "val_loss" else max(rows, key=lambda r: r["fqe_estimate"])
        assert m["selected_updates"] == pick["updates"] and m["val_action_error"] == pick["val_action_error"]
        # The saved policy is that copy: it scores the recorded error on the held-out rows.
        data = load_dataset("controller", store)
        held_out = split_episodes(data, 0.1, seed=0, name="controller")[1]
        validation = ValidationSet(TransitionArrays(**{k: None if v is None else v[held_out] for k, v in vars(data).items()}), data_space())
        assert validation.action_error(rlpipe.load_policy(tmp_path / rule)) == pytest.approx(pick["val_action_error"], abs=1e-6)
    # The report draws the held-out error and the FQE estimates, and tables the kept checkpoints.
    result = cli("report", tmp_path / "val_loss", tmp_path / "fqe", "--out", tmp_path / "report")
    assert result.code == 0, result.err
    assert {"curves-controller-updates-action-error.png", "fqe-controller.png"} <= {p.name for p in (tmp_path / "report").iterdir()}
    assert "select_by fqe" in (tmp_path / "report" / "index.html").read_text()


@pytest.mark.slow
def test_a_killed_run_resumes_with_every_copy_it_took(cli, store: Path, tmp_path: Path, logs, monkeypatch: pytest.MonkeyPatch) -> None:
    """SIGKILLed after its third copy and resumed, a run selects among all five copies and ends
    as an uninterrupted one does; control: resumed without the saved copies, it cannot."""
    from tests.test_resume import _final, _killed_and_resumed

    import_logs(cli, store, logs["controller"], "controller")
    args = ["bc", "--dataset", "controller", "--store", str(store), *BRIEF, "--select-by", "fqe", "--checkpoint-every", "300"]
    whole = tmp_path / "whole"
    assert cli("train", *args, "--out", whole).code == 0
    _killed_and_resumed(cli, "bc", args, tmp_path / "killed", kill_at=1000)
    assert _final(tmp_path / "killed") == _final(whole)
    assert [row["updates"] for row in _final(whole)[0]["checkpoints"]] == [300, 600, 900, 1200, 1500]
    # control: the copy of the state _killed_and_resumed kept, resumed without its snapshots
    monkeypatch.setattr(Snapshots, "load_state_dict", lambda self, state: None)
    assert cli("train", "bc", "--resume", tmp_path / "copy", "--no-progress").code == 0
    assert [row["updates"] for row in _final(tmp_path / "copy")[0]["checkpoints"]] == [1200, 1500]


def data_space():
    from gymnasium import spaces

    return spaces.Box(-2.0, 2.0, (1,), np.float32)


def test_commands_that_play_the_policy_refuse_and_export_works(cli, store: Path, tmp_path: Path, logs) -> None:
    import_logs(cli, store, logs["controller"], "controller")
    train(cli, store, tmp_path / "run", "controller", "--set", "fqe_updates=0")
    for args in (("eval", tmp_path / "run"), ("eval", tmp_path / "run", "--video", tmp_path / "v.gif")):
        result = cli(*args)
        assert result.code == 2 and "no environment" in result.err and len(result.err.strip().splitlines()) == 1, result.err
    assert not (tmp_path / "v.gif").exists()
    assert cli("export", tmp_path / "run", "--onnx", tmp_path / "p.onnx").code == 0
    assert rlpipe.evaluate(tmp_path / "run", episodes=1, env_id="Pendulum-v1").lengths == [200], "an env the user names plays it"
    refusals = {
        "mopo": ("train", "mopo", "--dataset", "controller"),
        "finetune_env_steps needs one": ("train", "iql", "--dataset", "controller", "--finetune-env-steps", "100"),
        "episode histories": ("train", "dt", "--dataset", "controller"),
        "select_by=fqe needs fqe_updates": ("train", "bc", "--dataset", "controller", "--select-by", "fqe", "--set", "fqe_updates=0"),
    }
    for expected, args in refusals.items():
        result = cli(*args, "--store", store, "--out", tmp_path / "refused")
        assert result.code == 2 and expected in result.err and len(result.err.strip().splitlines()) == 1, result.err
        assert not (tmp_path / "refused").exists()


def test_td_error_averages_every_held_out_row_and_leaves_the_training_rng_alone(logs) -> None:
    import torch

    data = load_dataset("random", logs["controller"].parent / "store")
    validation = ValidationSet(data, data_space())

    def noisy_errors(batch) -> torch.Tensor:  # a target that samples, as SAC's and TD3's do
        return batch.rewards.square() + 0.0 * torch.randn(len(batch.rewards))

    torch.manual_seed(3)
    state = torch.get_rng_state()
    measured = validation.td_error(noisy_errors)
    assert torch.equal(torch.get_rng_state(), state)
    assert measured == pytest.approx(float(np.mean(np.square(np.asarray(data.reward, np.float64)))), rel=1e-5)


def _brief_run(cli, store: Path, out: Path, algo: str) -> dict:
    small = ("--set", "hidden=[32, 32]", "--set", "batch_size=64") + (("--set", "vae_hidden=[32, 32]") if algo == "bcq" else ())
    args = ("--updates", "600", "--set", "eval_every=300", "--set", "fqe_updates=0", "--no-progress", *small)
    result = cli("train", algo, "--dataset", "controller", "--store", store, "--out", out, *args)
    assert result.code == 0, result.err
    return json.loads((out / "metrics.json").read_text())


@pytest.mark.parametrize("algo", ["td3bc", "iql", "cql", "bcq"])
def test_value_methods_measure_their_critics_on_held_out_episodes(cli, store: Path, tmp_path: Path, logs, algo: str) -> None:
    import_logs(cli, store, logs["controller"], "controller")
    out = tmp_path / algo
    metrics = _brief_run(cli, store, out, algo)
    errors = [row["val_td_error"] for row in metrics["checkpoints"]]
    assert len(errors) == 2 and all(np.isfinite(errors)) and min(errors) >= 0.0
    assert metrics["val_td_error"] == errors[-1]
    curve = (out / "dvclive" / "plots" / "metrics" / "val" / "td_error.tsv").read_text().splitlines()[1:]
    assert [float(row.split("\t")[1]) for row in curve] == pytest.approx(errors)
    assert read_diagnostics(out)["val/td_error"][1] == pytest.approx(errors)  # what the report draws


def test_imitation_has_no_td_error(cli, store: Path, tmp_path: Path, logs) -> None:
    import_logs(cli, store, logs["controller"], "controller")
    metrics = _brief_run(cli, store, tmp_path / "bc", "bc")
    assert "val_td_error" not in metrics and all("val_td_error" not in row for row in metrics["checkpoints"])
