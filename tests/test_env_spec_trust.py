"""Env specs read from datasets and runs build only registered envs: a spec or id that names
other code is refused with one line before anything is imported or called, unless the user
trusts it (--trust-env-spec or RLPIPE_TRUST_ENV_SPEC=1)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import pytest

import rlpipe.envs
from rlpipe.datasets.writer import write_rows
from rlpipe.envs import TRUST_ENV_SPEC_VAR
from rlpipe.training.offline import dataset_env_id
from tests.test_dataset_store import synthetic_rows
from tests.test_fuzz_readers import trained_run  # noqa: F401  (a fixture: a short PPO run on CartPole-v1)
from tests.test_store_safety import RLPIPE, one_line_exit_2

OBS, ACT = gym.spaces.Box(-1.0, 1.0, (4,), np.float32), gym.spaces.Discrete(2)  # CartPole's layout
CARTPOLE = json.loads(gym.spec("CartPole-v1").to_json())
REFUSED = "untrusted env spec"
LOCAL_MODULE = "rlpipe_test_local_env"
SHORT_BC = ("--updates", "2", "--set", "eval_every=2", "--set", "eval_episodes=1", "--set", "heldout_eval_episodes=0", "--no-progress")


@pytest.fixture(autouse=True)
def untrusted(monkeypatch: pytest.MonkeyPatch):
    """Specs untrusted (the default); the registry and modules restored, whatever a test trusts,
    registers or imports."""
    monkeypatch.setenv(TRUST_ENV_SPEC_VAR, "0")
    before = set(gym.registry)
    yield
    for env_id in set(gym.registry) - before:
        del gym.registry[env_id]
    sys.modules.pop(LOCAL_MODULE, None)


def planted_spec(kind: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[dict[str, Any], Path]:
    """CartPole's spec with code of the planter's choice, and the file that code would create:
    `subprocess.getoutput(cmd)` called as the env, or a module whose import creates it."""
    marker = tmp_path / "marker"
    touch = {"cmd": f"touch {marker}"}
    if kind == "entry point":
        return {**CARTPOLE, "entry_point": "subprocess:getoutput", "kwargs": touch}, marker
    if kind == "unregistered id":
        return {**CARTPOLE, "id": "Planted-v0", "entry_point": "subprocess:getoutput", "kwargs": touch, "vector_entry_point": None}, marker
    code = f"{local_env_module(tmp_path, monkeypatch)}:LocalCartPole"
    if kind == "vector entry point":
        return {**CARTPOLE, "vector_entry_point": code}, tmp_path / "imported"
    return {**CARTPOLE, "additional_wrappers": [{"name": "Planted", "entry_point": code, "kwargs": {}}]}, tmp_path / "imported"


KINDS = ["entry point", "unregistered id", "vector entry point", "wrapper"]


def edit(path: Path, **fields: Any) -> None:
    """Set fields of a dataset's metadata.json or a run's checkpoint.json (neither is covered
    by the data's hashes, so the dataset or run stays otherwise valid)."""
    file = path / "metadata.json" if (path / "metadata.json").is_file() else path / "checkpoint.json"
    meta = json.loads(file.read_text())
    meta.update(fields)
    file.write_text(json.dumps(meta))


def cartpole_dataset(store: Path) -> Path:
    return write_rows(
        "data",
        [synthetic_rows([20] * 5, OBS, ACT)],
        OBS,
        ACT,
        env_id="CartPole-v1",
        producer={"algorithm": "test"},
        store=store,
        fmt="arrow",
    )


def local_env_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """An importable module, not registered with gymnasium, whose import creates
    `tmp_path/imported` and which defines a CartPole env."""
    (tmp_path / f"{LOCAL_MODULE}.py").write_text(
        "from pathlib import Path\n"
        "from gymnasium.envs.classic_control.cartpole import CartPoleEnv\n"
        "Path(__file__).with_name('imported').touch()\n"
        "class LocalCartPole(CartPoleEnv):\n"
        "    pass\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    return LOCAL_MODULE


@pytest.mark.parametrize("key", ["env_spec", "eval_env_spec"])
@pytest.mark.parametrize("kind", KINDS)
def test_planted_dataset_spec_is_refused_before_it_runs(
    store: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, cli, kind: str, key: str
) -> None:
    spec, marker = planted_spec(kind, tmp_path, monkeypatch)
    edit(cartpole_dataset(store), **{key: json.dumps(spec)})
    sweep = ["sweep", "bc", "--dataset", "data", "--seeds", "0", "--set", "updates=2", "--root", tmp_path / "sweeps"]
    for command in (["train", "bc", "--dataset", "data", *SHORT_BC], ["datasets", "validate", "data"], sweep):
        result = cli(*command, "--store", store)
        one_line_exit_2(result, REFUSED)
        assert "--trust-env-spec" in result.err and "RLPIPE_TRUST_ENV_SPEC=1" in result.err
    assert not marker.exists() and not (tmp_path / "sweeps").exists()
    assert not any(env_id.startswith("dataset-") or env_id == "Planted-v0" for env_id in gym.registry)


def test_planted_spec_does_run_once_trusted(store: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The control: the same planted spec, trusted, runs its code (so the marker would show it)."""
    spec, marker = planted_spec("entry point", tmp_path, monkeypatch)
    edit(cartpole_dataset(store), env_spec=json.dumps(spec))
    monkeypatch.setenv(TRUST_ENV_SPEC_VAR, "1")
    with pytest.raises(TypeError, match="must inherit from the gymnasium.Env class"):  # getoutput ran, returned a str
        gym.make(dataset_env_id("data", store))
    assert marker.exists()


def test_planted_env_id_would_import_a_module_and_is_refused(store: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, cli) -> None:
    """gymnasium imports the module of an id `module:Env-v0`: refused when a dataset records one."""
    module = local_env_module(tmp_path, monkeypatch)
    edit(cartpole_dataset(store), env_id=f"{module}:CartPole-v1", env_spec=None)
    for command in (["train", "bc", "--dataset", "data", *SHORT_BC], ["datasets", "validate", "data"]):
        one_line_exit_2(cli(*command, "--store", store), f"names env '{module}:CartPole-v1', which would import module '{module}'")
    assert not (tmp_path / "imported").exists() and module not in sys.modules


@pytest.mark.parametrize("kind", KINDS)
def test_planted_run_spec_is_refused_before_it_runs(
    trained_run: Path, store: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, cli, kind: str
) -> None:
    spec, marker = planted_spec(kind, tmp_path, monkeypatch)
    run = tmp_path / "run"
    shutil.copytree(trained_run, run)
    edit(run, env_spec=json.dumps(spec))
    one_line_exit_2(cli("eval", run, "--episodes", "1"), REFUSED)
    collect = ["collect", "--env", "CartPole-v1", "--expert", "ppo", "--expert-run", run, "--episodes", "1", "--store", store]
    one_line_exit_2(cli(*collect), REFUSED)
    assert not marker.exists() and not (store / "cartpole-expert").exists()


def test_planted_spec_is_refused_by_relabel(store: Path, tmp_path: Path, cli) -> None:
    obs_space, act_space = rlpipe.envs.env_spaces("GoalWorld-v0")
    write_rows(
        "goals",
        [synthetic_rows([10] * 3, obs_space, act_space)],
        obs_space,
        act_space,
        env_id="GoalWorld-v0",
        producer={"algorithm": "test"},
        store=store,
        fmt="arrow",
    )
    marker = tmp_path / "marker"
    goalworld = json.loads(gym.spec("GoalWorld-v0").to_json())
    edit(store / "goals", env_spec=json.dumps({**goalworld, "entry_point": "subprocess:getoutput", "kwargs": {"cmd": f"touch {marker}"}}))
    one_line_exit_2(cli("relabel", "her", "--dataset", "goals", "--store", store), REFUSED)
    assert not marker.exists() and not (store / "goals-her-future").exists()


def test_unregistered_entry_point_is_built_only_when_trusted(store: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, cli) -> None:
    """A test-local env module under CartPole-v1's id: refused (not even imported) without
    trust; with --trust-env-spec it is imported and trained in, and the run records that spec,
    so evaluating the run needs trust again (here RLPIPE_TRUST_ENV_SPEC=1)."""
    module = local_env_module(tmp_path, monkeypatch)
    local = {**CARTPOLE, "entry_point": f"{module}:LocalCartPole", "vector_entry_point": None, "max_episode_steps": 30}
    edit(cartpole_dataset(store), env_spec=json.dumps(local))
    run = tmp_path / "run"
    train = ["train", "bc", "--dataset", "data", "--store", store, "--out", run, *SHORT_BC]
    one_line_exit_2(cli(*train), f"entry point '{module}:LocalCartPole' for 'CartPole-v1' is not the registered")
    one_line_exit_2(cli("datasets", "validate", "data", "--store", store), REFUSED)
    assert not (tmp_path / "imported").exists() and module not in sys.modules and not run.exists()

    assert cli("datasets", "validate", "data", "--store", store, "--trust-env-spec").code == 0
    trained = cli(*train, "--trust-env-spec")
    assert trained.code == 0, trained.err
    assert (tmp_path / "imported").exists() and module in sys.modules
    recorded = json.loads(json.loads((run / "checkpoint.json").read_text())["env_spec"])
    assert (recorded["entry_point"], recorded["max_episode_steps"]) == (f"{module}:LocalCartPole", 30)

    monkeypatch.setenv(TRUST_ENV_SPEC_VAR, "0")
    one_line_exit_2(cli("eval", run, "--episodes", "1"), REFUSED)
    monkeypatch.setenv(TRUST_ENV_SPEC_VAR, "1")
    evaluated = cli("eval", run, "--episodes", "2", "--json")
    assert evaluated.code == 0, evaluated.err
    assert json.loads(evaluated.out)["env_id"].endswith("/CartPole-v1")


def test_registered_spec_with_other_settings_needs_no_trust(store: Path, tmp_path: Path, cli) -> None:
    """kwargs and a time limit (plain JSON) are applied to the registered entry point untrusted;
    a run trained there evaluates in a fresh process (whose registry lacks the dataset's id)."""
    pendulum = json.loads(gym.spec("Pendulum-v1").to_json())
    box, act = gym.spaces.Box(-1.0, 1.0, (3,), np.float32), gym.spaces.Box(-2.0, 2.0, (1,), np.float32)
    write_rows(
        "pendulum",
        [synthetic_rows([20] * 3, box, act)],
        box,
        act,
        env_id="Pendulum-v1",
        producer={"algorithm": "test"},
        store=store,
        fmt="arrow",
    )
    edit(store / "pendulum", env_spec=json.dumps({**pendulum, "max_episode_steps": 17, "kwargs": {"g": 5.0}}))
    assert cli("datasets", "validate", "pendulum", "--store", store).code == 0
    env = gym.make(dataset_env_id("pendulum", store))
    assert env.spec.max_episode_steps == 17 and env.unwrapped.g == 5.0
    run = tmp_path / "run"
    assert cli("train", "bc", "--dataset", "pendulum", "--store", store, "--out", run, *SHORT_BC).code == 0
    evaluated = subprocess.run(
        [RLPIPE, "eval", str(run), "--episodes", "1", "--json"], capture_output=True, text=True, env={**os.environ, TRUST_ENV_SPEC_VAR: "0"}
    )
    assert evaluated.returncode == 0, evaluated.stderr
    assert json.loads(evaluated.stdout)["return_mean"] > -17 * 16.3  # 17-step episodes (at least -16.3 a step)


@pytest.mark.parametrize("change", [{"kwargs": [1]}, {"max_episode_steps": "long"}, {"max_episode_steps": 0}, {"id": "../x"}])
def test_malformed_spec_is_one_line(store: Path, cli, change: dict[str, Any]) -> None:
    edit(cartpole_dataset(store), env_spec=json.dumps({**CARTPOLE, **change}))
    one_line_exit_2(cli("train", "bc", "--dataset", "data", "--store", store, *SHORT_BC), "unreadable environment spec")


@pytest.fixture(scope="module")
def robotics_registered() -> None:
    """FetchReach-v4 registered before `untrusted` notes the registry (module scope first), so
    that fixture leaves the robotics ids in place for the tests after these."""
    pytest.importorskip("gymnasium_robotics", reason="the robotics extra (gymnasium-robotics) is not installed")
    pytest.importorskip("mujoco", reason="the robotics envs need mujoco")
    from rlpipe.envs.extras import register_optional

    register_optional("FetchReach-v4")


def test_env_ids_that_register_on_first_use_are_trusted(robotics_registered: None, tmp_path: Path, cli) -> None:
    """A run in FetchReach-v4 (an id gymnasium-robotics registers when rlpipe first needs it)
    evaluates in a fresh process, where the id is not registered until then: its spec is the
    registered one, so no trust is needed; and the robotics import's Adroit notices are not shown."""
    run = tmp_path / "run"
    short = ("--set", "eval_every=100", "--set", "eval_episodes=1", "--set", "heldout_eval_episodes=0", "--no-progress")
    trained = cli("train", "ddpg-her", "--env", "FetchReach-v4", "--env-steps", "100", "--out", run, "--device", "cpu", *short)
    assert trained.code == 0, trained.err
    evaluated = subprocess.run(
        [RLPIPE, "eval", str(run), "--episodes", "1", "--json"], capture_output=True, text=True, env={**os.environ, TRUST_ENV_SPEC_VAR: "0"}
    )
    assert evaluated.returncode == 0, evaluated.stderr
    assert json.loads(evaluated.stdout)["env_id"] == "FetchReach-v4"
    assert "Adroit" not in evaluated.stderr and "Traceback" not in evaluated.stderr, evaluated.stderr


@pytest.mark.parametrize("env_id", ["FetchNowhere-v4", "Nowhere-v0"])
def test_unknown_ids_are_still_refused(robotics_registered: None, trained_run: Path, tmp_path: Path, cli, env_id: str) -> None:
    """The control: an id that neither the registry nor an optional family knows stays untrusted."""
    run = tmp_path / "run"
    shutil.copytree(trained_run, run)
    edit(run, env_id=env_id, env_spec=json.dumps({**CARTPOLE, "id": env_id}))
    one_line_exit_2(cli("eval", run, "--episodes", "1"), f"{env_id!r} is not registered here")


def test_the_robotics_import_shows_what_is_not_about_adroit(capsys: pytest.CaptureFixture[str]) -> None:
    """The Adroit notice is held back narrowly: other output of the import is passed on, and
    users of Adroit ids see it all."""
    import sys

    from rlpipe.envs.extras import _quiet_adroit_notices

    for env_id, shown in (("FetchReach-v4", "other\n"), ("AdroitHandDoor-v1", "AdroitHandDoor-v1 changed\nother\n")):
        with _quiet_adroit_notices(env_id):
            print("AdroitHandDoor-v1 changed", file=sys.stderr)
            print("other", file=sys.stderr)
        assert capsys.readouterr().err == shown
