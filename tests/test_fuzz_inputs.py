"""Fuzzing through the CLI what others hand you: a dataset's metadata.json and a run's
checkpoint (checkpoint.json and the safetensors weights), truncated, bit-flipped or with a
JSON value replaced. `rlpipe datasets validate|inspect|list`, `rlpipe eval` and `rlpipe train bc` must
either work or refuse with one line on stderr and exit 2, writing nothing: never a
traceback. Derandomized, so failures reproduce; about 30 s."""

from __future__ import annotations

import hashlib
import json
import shutil
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.test_collector import collect_dataset
from tests.test_fuzz_readers import mutate

FUZZ = settings(
    max_examples=40,
    derandomize=True,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)


@pytest.fixture(scope="module")
def originals(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A store with a small CartPole dataset (Arrow and Minari HDF5) and a trained PPO run."""
    from rlpipe.algos import get_algo

    root = tmp_path_factory.mktemp("fuzz-inputs")
    collect_dataset(root / "store", "CartPole-v1", "data", fmt="both", episodes=4, num_envs=2)
    ppo = get_algo("ppo")
    ppo.train(
        ppo.make_config("CartPole-v1", env_steps=256, eval_every=256, eval_episodes=1, heldout_eval_episodes=0),
        root / "run",
        progress=False,
    )
    return root


def damage(data: st.DataObject, raw: bytes, is_json: bool) -> bytes:
    """``raw`` truncated, with 1-3 bytes flipped (often in the first 256: a JSON document's
    keys, a safetensors header) or, for JSON, with values replaced or dropped."""
    how = data.draw(st.sampled_from(["truncate", "flip", "json"] if is_json else ["truncate", "flip"]))
    if how == "truncate":
        return raw[: data.draw(st.integers(0, len(raw) - 1))]
    if how == "flip":
        damaged = bytearray(raw)
        end = data.draw(st.sampled_from([min(len(raw), 256), len(raw)]))
        for position, mask in data.draw(
            st.lists(st.tuples(st.integers(0, end - 1), st.integers(1, 255)), min_size=1, max_size=3, unique_by=lambda flip: flip[0])
        ):
            damaged[position] ^= mask
        return bytes(damaged)
    value = json.loads(raw)
    for _ in range(data.draw(st.integers(1, 3))):
        value = mutate(data, value)
    return json.dumps(value).encode()  # may hold NaN, as a buggy writer would


def files(root: Path) -> dict[str, bytes]:
    """Every file under ``root`` but locks and the verification cache: what must not change."""
    found = {str(p.relative_to(root)): p for p in root.rglob("*") if p.is_file()}
    return {name: path.read_bytes() for name, path in found.items() if ".locks" not in name and ".verified" not in name}


def assert_works_or_one_line(result, before: dict[str, bytes], after: dict[str, bytes]) -> None:
    assert result.code in (0, 2), result.err
    if result.code == 2:
        assert result.err.startswith("error: ") and result.err.count("\n") == 1, result.err
    assert after == before  # a refusal writes nothing, and reading writes nothing either


@FUZZ
@given(data=st.data())
def test_damaged_metadata_through_validate_and_train(cli, originals: Path, data: st.DataObject) -> None:
    train = data.draw(st.integers(0, 3)) == 0  # training costs ~0.5 s: a quarter of the examples
    with tempfile.TemporaryDirectory() as tmp:
        store = Path(tmp) / "store"
        shutil.copytree(originals / "store", store)
        meta = store / "data" / "metadata.json"
        meta.write_bytes(damage(data, meta.read_bytes(), is_json=True))
        before = files(Path(tmp))
        for command in ("validate", "inspect"):
            result = cli("datasets", command, "data", "--store", store)
            assert_works_or_one_line(result, before, files(Path(tmp)))
        listed = cli("datasets", "list", "--store", store)  # a broken dataset is listed as broken
        assert listed.code == 0 and ("data: broken: " in listed.out) == (result.code == 2), listed.out + listed.err
        if train:
            out = Path(tmp) / "bc"
            trained = cli(
                "train",
                "bc",
                "--dataset",
                "data",
                "--store",
                store,
                "--out",
                out,
                "--updates",
                "2",
                "--device",
                "cpu",
                "--set",
                "eval_every=2",
                "--set",
                "eval_episodes=1",
                "--set",
                "heldout_eval_episodes=0",
                "--no-progress",
            )
            assert trained.code in (0, 2) and (trained.code == 0 or trained.err.count("\n") == 1), trained.err
            assert out.exists() == (trained.code == 0)  # nothing half-written


@FUZZ
@given(data=st.data(), target=st.sampled_from(["checkpoint.json", "model.safetensors"]), rehash=st.booleans())
def test_damaged_checkpoint_through_eval(cli, originals: Path, data: st.DataObject, target: str, rehash: bool) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        run = Path(tmp) / "run"
        shutil.copytree(originals / "run", run)
        path = run / target
        path.write_bytes(damage(data, path.read_bytes(), is_json=target.endswith(".json")))
        if target == "model.safetensors" and rehash:  # a consistent record: only the safetensors reader's checks remain
            record = json.loads((run / "checkpoint.json").read_text())
            record["sha256"] = hashlib.sha256(path.read_bytes()).hexdigest()
            (run / "checkpoint.json").write_text(json.dumps(record))
        before = files(Path(tmp))
        result = cli("eval", run, "--episodes", "1", "--json")
        assert_works_or_one_line(result, before, files(Path(tmp)))
        if target == "model.safetensors" and not rehash:
            assert result.code == 2 and "do not match their recorded sha256" in result.err, result.err
