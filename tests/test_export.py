"""`rlpipe export RUN --onnx/--torchscript/--program`: the file reproduces the run's actions and names its origin."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from rlpipe.algos import load_policy
from rlpipe.datasets.loader import load_dataset

ort = pytest.importorskip("onnxruntime")
onnx = pytest.importorskip("onnx")

RUNS = {  # name -> training command: squashed Gaussian, deterministic, PPO with normalised observations, discrete PPO
    "sac": ["train", "sac", "--env", "Pendulum-v1", "--env-steps", "300", "--set", "learning_starts=100"],
    "td3": ["train", "td3", "--env", "Pendulum-v1", "--env-steps", "300", "--set", "learning_starts=100"],
    "ppo-pendulum": ["train", "ppo", "--env", "Pendulum-v1", "--env-steps", "2048"],
    "ppo-cartpole": ["train", "ppo", "--env", "CartPole-v1", "--env-steps", "1024"],
}


@pytest.fixture(scope="module")
def export_store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Random-policy collections of Pendulum (5 episodes) and CartPole (60), named by their env."""
    from rlpipe.commands.collect import collect_dataset

    store = tmp_path_factory.mktemp("export-data")
    for env_id, episodes in (("Pendulum-v1", 5), ("CartPole-v1", 60)):
        collect_dataset(env_id, episodes=episodes, num_envs=2, name=env_id.lower(), store=store, progress=False)
    return store


@pytest.fixture(scope="module")
def observations(export_store: Path) -> dict[str, np.ndarray]:
    """1000 dataset observations of each env."""
    return {
        env_id: np.ascontiguousarray(load_dataset(env_id.lower(), export_store).obs[:1000], np.float32)
        for env_id in ("Pendulum-v1", "CartPole-v1")
    }


@pytest.mark.parametrize("run", sorted(RUNS))
def test_onnx_torchscript_and_program_reproduce_the_torch_actions(cli, tmp_path: Path, observations, run: str) -> None:
    out = tmp_path / run
    assert cli(*RUNS[run], "--out", out, "--no-progress", "--device", "cpu", "--set", "eval_episodes=1").code == 0
    assert_exports_reproduce(cli, out, observations, tmp_path)


def test_discrete_bcq_exports_its_supported_greedy_choice(cli, tmp_path: Path, export_store: Path, observations) -> None:
    """Discrete BCQ acts deterministically (greedy on Q among the actions its imitation head
    supports), so its graph exports; the three files choose the torch policy's actions."""
    out = tmp_path / "bcq"
    train = ["train", "bcq", "--dataset", "cartpole-v1", "--store", export_store, "--out", out, "--no-progress", "--device", "cpu"]
    assert cli(*train, "--set", "updates=200", "--set", "eval_every=200", "--set", "eval_episodes=1").code == 0
    assert_exports_reproduce(cli, out, observations, tmp_path)


def test_iql_normal_actor_exports_its_mean_action(cli, tmp_path: Path, export_store: Path, observations) -> None:
    """IQL with ``actor=normal`` (a Gaussian on a tanh mean) acts on its mean: the three files
    give the torch policy's actions."""
    out = tmp_path / "iql"
    train = ["train", "iql", "--dataset", "pendulum-v1", "--store", export_store, "--out", out, "--no-progress", "--device", "cpu"]
    settings = ("updates=100", "eval_every=100", "eval_episodes=1", "heldout_eval_episodes=0", "actor=normal")
    assert cli(*train, *(arg for setting in settings for arg in ("--set", setting))).code == 0
    assert_exports_reproduce(cli, out, observations, tmp_path)


def assert_exports_reproduce(cli, out: Path, observations: dict[str, np.ndarray], tmp_path: Path) -> None:
    """ONNX, TorchScript and torch.export files of the run in ``out`` give its torch actions
    on 1000 observations and carry its checkpoint's hash."""
    policy = load_policy(out)
    obs = observations[policy.env_id]
    assert len(obs) == 1000
    expected = policy(obs)

    result = cli("export", out, "--onnx", tmp_path / "p.onnx", "--torchscript", tmp_path / "p.pt", "--program", tmp_path / "p.pt2")
    assert result.code == 0, result.err
    session = ort.InferenceSession(str(tmp_path / "p.onnx"), providers=["CPUExecutionProvider"])
    actions = session.run(["action"], {"obs": obs})[0]
    scripted = torch.jit.load(str(tmp_path / "p.pt"))(torch.as_tensor(obs)).numpy()
    program_files = {"rlpipe.json": ""}
    program = torch.export.load(str(tmp_path / "p.pt2"), extra_files=program_files).module()
    exported = program(torch.as_tensor(obs)).numpy()
    assert json.loads(program_files["rlpipe.json"])["checkpoint_sha256"] == policy.checkpoint_sha256
    for got in (actions, scripted, exported):
        assert got.shape == expected.shape
        if np.issubdtype(expected.dtype, np.integer):
            np.testing.assert_array_equal(got, expected)
        else:
            np.testing.assert_allclose(got, expected, atol=1e-5, rtol=0)

    props = {p.key: p.value for p in onnx.load(str(tmp_path / "p.onnx")).metadata_props}
    assert props["checkpoint_sha256"] == policy.checkpoint_sha256 and props["env_id"] == policy.env_id
    assert json.loads(props["action_space"])["type"] in ("Box", "Discrete") and "observation_space" in props
    extra = {"rlpipe.json": ""}
    torch.jit.load(str(tmp_path / "p.pt"), _extra_files=extra)
    assert json.loads(extra["rlpipe.json"])["checkpoint_sha256"] == policy.checkpoint_sha256


def test_export_refusals_are_one_line(cli, tmp_path: Path) -> None:
    out = tmp_path / "run"
    assert cli(*RUNS["td3"], "--out", out, "--no-progress", "--device", "cpu", "--set", "eval_episodes=1").code == 0
    for args, message in (
        ([out], "nothing to export"),
        ([tmp_path / "missing", "--onnx", tmp_path / "x.onnx"], "missing"),
        ([out, "--onnx", tmp_path / "no-dir" / "x.onnx"], "does not exist"),
    ):
        result = cli("export", *args)
        assert result.code == 2 and message in result.err and len(result.err.strip().splitlines()) == 1, result.err
    assert cli("export", out, "--onnx", tmp_path / "x.onnx").code == 0
    again = cli("export", out, "--onnx", tmp_path / "x.onnx")
    assert again.code == 2 and "already exists" in again.err
    assert cli("export", out, "--onnx", tmp_path / "x.onnx", "--force").code == 0
    assert sorted(p.name for p in tmp_path.iterdir() if not p.name.startswith(".") or p.name.startswith(".tmp-")) == ["run", "x.onnx"]


def test_export_writes_both_files_or_neither(cli, tmp_path: Path) -> None:
    out = tmp_path / "run"
    assert cli(*RUNS["td3"], "--out", out, "--no-progress", "--device", "cpu", "--set", "eval_episodes=1").code == 0
    (tmp_path / "old.pt").write_bytes(b"precious")
    for args, message in (
        (["--onnx", tmp_path / "p.onnx", "--torchscript", tmp_path / "old.pt"], "already exists"),  # the second is refused
        (["--onnx", tmp_path / "old.pt", "--torchscript", tmp_path / "p.pt"], "already exists"),  # the first is refused
        (["--onnx", tmp_path / "p.onnx", "--torchscript", tmp_path / "no-dir" / "p.pt"], "does not exist"),
        (["--onnx", tmp_path / "p.bin", "--torchscript", tmp_path / "p.bin"], "two outputs name"),
        (["--onnx", tmp_path, "--torchscript", tmp_path / "p.pt"], "directory"),
    ):
        result = cli("export", out, *args)
        assert result.code == 2 and message in result.err, result.err
        assert len(result.err.strip().splitlines()) == 1 and "Traceback" not in result.err
        written = sorted(p.name for p in tmp_path.iterdir() if p.name not in (".locks", ".rlpipe-root"))  # the run's publishing
        assert written == ["old.pt", "run"]  # neither file, no temporary file
    assert (tmp_path / "old.pt").read_bytes() == b"precious"
    both = cli("export", out, "--onnx", tmp_path / "p.onnx", "--torchscript", tmp_path / "old.pt", "--force")  # control
    assert both.code == 0, both.err
    assert (tmp_path / "p.onnx").stat().st_size > 0 and (tmp_path / "old.pt").read_bytes() != b"precious"
