"""Env families are plug-ins: the generic layers name no env id and reach a family only
through its registration, so a family kept outside rlpipe (tests/fake_family.py) collects,
trains offline and evaluates through the same code as Combat and MPE."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

import rlpipe
from rlpipe.envs import multiagent
from rlpipe.envs.multiagent import FAMILIES, EnvFamily

PACKAGE = Path(rlpipe.__file__).parent
GENERIC = (
    "training/*.py",
    "training/multiagent/__init__.py",
    "training/multiagent/teams.py",
    "commands/*.py",
    "cli/*.py",
    "nets/*.py",
    "storage/*.py",
    "datasets/*.py",
)
COIN = EnvFamily(name="coin", envs={"Coin-v0": ("tests.fake_family", {})}, plugin="tests.fake_family")


def family_mentions(path: Path) -> list[str]:
    """The env ids of registered families and the families' own modules that ``path`` names."""
    text = path.read_text()
    ids = [env_id for family in FAMILIES for env_id in family.envs if env_id in text]
    modules = {module for family in FAMILIES for module, _ in family.envs.values()} | {family.plugin for family in FAMILIES}
    return ids + [module for module in modules if re.search(rf"\b{re.escape(module)}\b", text)]


def test_generic_modules_name_no_env_id_and_import_no_family_module() -> None:
    generic = sorted(path for pattern in GENERIC for path in PACKAGE.glob(pattern))
    assert len(generic) > 50
    found = {str(path.relative_to(PACKAGE)): names for path in generic if (names := family_mentions(path))}
    assert found == {}
    # control: the check sees a family's own module
    assert "Combat-v0" in family_mentions(PACKAGE / "training/multiagent/combat.py")


@pytest.fixture
def coin_family(monkeypatch: pytest.MonkeyPatch) -> None:
    """Register the test's family as one entry, as rlpipe/envs/multiagent.py registers its own."""
    monkeypatch.setattr(multiagent, "FAMILIES", (*FAMILIES, COIN))
    monkeypatch.setattr(multiagent, "MULTI_AGENT_ENVS", {**multiagent.MULTI_AGENT_ENVS, **COIN.envs})


def test_a_family_registered_outside_rlpipe_collects_trains_and_evaluates(cli, coin_family: None, tmp_path: Path) -> None:
    store = tmp_path / "store"
    collected = cli("collect", "--env", "Coin-v0", "--episodes", "40", "--store", store, "--quiet")
    assert collected.code == 0, collected.err
    meta = json.loads((store / "coin-random/metadata.json").read_text())
    assert meta["multi_agent"] and meta["total_steps"] == 80 and meta["producer"]["params"] == {"episodes": 40}

    trained = cli(
        "train", "bc", "--dataset", "coin-random", "--store", store, "--updates", "200",
        "--set", "eval_every=200", "--set", "eval_episodes=20", "--out", tmp_path / "bc", "--no-progress", "--device", "cpu",
    )  # fmt: skip
    assert trained.code == 0, trained.err
    metrics = json.loads((tmp_path / "bc/metrics.json").read_text())
    assert "eval_coin_hit_rate" in metrics  # the family's own keys, from its dataset evaluator
    checkpoint = json.loads((tmp_path / "bc/checkpoint.json").read_text())
    assert checkpoint["env_kwargs"] == {"agents": 2}

    evaluated = cli("eval", tmp_path / "bc", "--episodes", "20", "--json")
    assert evaluated.code == 0, evaluated.err
    report = json.loads(evaluated.out)
    assert report["algo"] == "bc" and report["env_id"] == "Coin-v0" and report["hit_rate"] == metrics["eval_coin_hit_rate"]
    line = cli("eval", tmp_path / "bc", "--episodes", "20").out
    assert line.startswith("bc Coin-v0: hit_rate ") and line.rstrip().endswith("over 20 episodes")


def test_an_unregistered_family_is_one_line(cli, tmp_path: Path) -> None:
    """The control: without its registration entry the same commands refuse the env."""
    result = cli("collect", "--env", "Coin-v0", "--episodes", "4", "--store", tmp_path / "store", "--quiet")
    assert result.code == 2 and "Coin-v0" in result.err and len(result.err.strip().splitlines()) == 1, result.err
    assert not (tmp_path / "store" / "coin-random").exists()
