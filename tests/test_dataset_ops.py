"""merge, filter, split and sample: the chosen episodes, byte for byte, their lineage, and refusals."""

from __future__ import annotations

import json
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest

from rlpipe.datasets.loader import load_dataset
from rlpipe.datasets.ops import episode_index, merge_datasets
from rlpipe.datasets.store import open_dataset
from rlpipe.datasets.writer import write_rows
from tests.conftest import store_contents

OBS = gym.spaces.Box(-10.0, 10.0, (2,), np.float32)
ACT = gym.spaces.Box(-1.0, 1.0, (1,), np.float32)


def _episode_rows(episode: int, length: int, reward: float) -> dict[str, np.ndarray]:
    """A trajectory whose observations encode (episode, step), so selected rows can be traced."""
    positions = np.stack([np.full(length + 1, episode), np.arange(length + 1)], axis=1).astype(np.float32) / 100
    return {
        "episode_id": np.full(length, episode, np.int64),
        "step": np.arange(length, dtype=np.int64),
        "obs": positions[:-1],
        "action": np.zeros((length, 1), np.float32),
        "reward": np.full(length, reward, np.float32),
        "next_obs": positions[1:],
        "terminated": np.r_[np.zeros(length - 1, bool), True],
        "truncated": np.zeros(length, bool),
    }


def _make(
    store: Path, name: str, lengths: list[int], rewards: list[float], env_id: str = "Pendulum-v1", obs_space: gym.Space = OBS
) -> Path:
    batches = [_episode_rows(i, n, r) for i, (n, r) in enumerate(zip(lengths, rewards))]
    return write_rows(
        name,
        iter(batches),
        obs_space,
        ACT,
        env_id=env_id,
        producer={"algorithm": "test", "seed": 0},
        store=store,
        fmt="arrow",
        shard_bytes=300,
    )  # a few episodes a shard


def _traced_episodes(store: Path, name: str) -> list[int]:
    """The source episode of each result episode, read from its observations."""
    data = load_dataset(name, store)
    return [int(round(data.obs[start, 0] * 100)) for start in data.episode_starts()]


@pytest.fixture
def source(store: Path) -> Path:
    rewards = [float(r) for r in np.random.default_rng(3).normal(0, 1, 20)]
    _make(store, "src", [3 + i % 5 for i in range(20)], rewards)
    return store


def test_filter_top_return_keeps_the_best_episodes_whole_and_records_lineage(source: Path, cli) -> None:
    store = source
    result = cli("datasets", "filter", "src", "--top-return", "10%", "--name", "best", "--store", store)
    assert result.code == 0, result.err
    index = episode_index(open_dataset("src", store))
    best = sorted(np.argsort(-index.episode_return)[:2].tolist())
    assert _traced_episodes(store, "best") == best
    data, src = load_dataset("best", store), load_dataset("src", store)
    rows = np.isin(src.episode_id, best)
    np.testing.assert_array_equal(data.obs, src.obs[rows])
    np.testing.assert_array_equal(data.reward, src.reward[rows])
    np.testing.assert_array_equal(np.unique(data.episode_id), [0, 1])
    meta = open_dataset("best", store).metadata
    assert meta["lineage"]["operation"] == "filter" and meta["lineage"]["arguments"]["top_return"] == "10%"
    assert meta["lineage"]["parents"][0]["content_hash"] == open_dataset("src", store).metadata["content_hash"]
    assert cli("datasets", "validate", "best", "--store", store).code == 0


def test_filter_criteria_combine(source: Path) -> None:
    from rlpipe.datasets.ops import filter_dataset

    index = episode_index(open_dataset("src", source))
    filter_dataset("src", "short-good", min_return=0.0, max_length=5, store=source)
    expected = [i for i in range(20) if index.episode_return[i] >= 0 and index.length[i] <= 5]
    assert _traced_episodes(source, "short-good") == expected
    filter_dataset("src", "picked", episode_ids=[7, 2, 7], store=source)
    assert _traced_episodes(source, "picked") == [2, 7]


def test_merge_concatenates_and_weights_by_steps(store: Path, cli) -> None:
    _make(store, "a", [10] * 10, [1.0] * 10)
    _make(store, "b", [5] * 30, [-1.0] * 30)
    assert cli("datasets", "merge", "a", "b", "--name", "ab", "--store", store).code == 0
    merged = open_dataset("ab", store).metadata
    assert merged["total_steps"] == 250 and merged["total_episodes"] == 40
    assert [p["name"] for p in merged["lineage"]["parents"]] == ["a", "b"]

    result = cli("datasets", "merge", "a", "b", "--weights", "0.2,0.8", "--seed", "1", "--name", "ab28", "--store", store)
    assert result.code == 0, result.err
    data = load_dataset("ab28", store)
    from_a = int((data.reward > 0).sum())
    # b has 150 steps, so 0.8 of the result is 150 steps and a gives 37.5: four of its 10-step episodes
    assert len(data) - from_a == 150 and from_a == 40
    again = merge_datasets(["a", "b"], "ab28-again", weights=[0.2, 0.8], seed=1, store=store)
    assert json.loads((again / "metadata.json").read_text())["content_hash"] == open_dataset("ab28", store).metadata["content_hash"]


def test_split_is_by_episode_seeded_and_disjoint(source: Path, cli) -> None:
    assert cli("datasets", "split", "src", "--val", "0.25", "--seed", "4", "--store", source).code == 0
    train, val = _traced_episodes(source, "src-train"), _traced_episodes(source, "src-val")
    assert len(val) == 5 and sorted(train + val) == list(range(20)) and not set(train) & set(val)
    assert open_dataset("src-val", source).metadata["lineage"]["arguments"]["side"] == "val"
    assert (
        cli("datasets", "split", "src", "--val", "0.25", "--seed", "5", "--train-name", "t5", "--val-name", "v5", "--store", source).code
        == 0
    )
    assert _traced_episodes(source, "v5") != val


def test_sample_by_episodes_and_by_steps(source: Path) -> None:
    from rlpipe.datasets.ops import sample_dataset

    sample_dataset("src", "five", episodes=5, seed=2, store=source)
    assert len(_traced_episodes(source, "five")) == 5
    sample_dataset("src", "forty", steps=40, seed=2, store=source)
    steps = open_dataset("forty", source).metadata["total_steps"]
    assert 40 <= steps < 40 + 7  # whole episodes: at most one episode (<= 7 steps) over


def test_lineage_prints_the_tree_back_to_the_collection(source: Path, cli) -> None:
    store = source
    assert cli("datasets", "sample", "src", "--episodes", "10", "--name", "half", "--store", store).code == 0
    assert cli("datasets", "filter", "half", "--top-return", "3", "--name", "top3", "--store", store).code == 0
    result = cli("datasets", "lineage", "top3", "--store", store)
    assert result.code == 0, result.err
    lines = result.out.splitlines()
    assert lines[0].startswith("top3 [") and "filter(top_return=3)" in lines[0]
    assert "half [" in lines[1] and "sample(" in lines[1] and "(in the store)" in lines[1]
    assert "src [" in lines[2] and "collected by algorithm=test" in lines[2]
    assert cli("datasets", "rm", "half", "--store", store).code == 0
    assert "(not in the store)" in cli("datasets", "lineage", "top3", "--store", store).out.splitlines()[1]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["merge", "src", "--name", "x"], "at least two"),
        (["merge", "src", "other-env", "--name", "x"], "differ in env id"),
        (["merge", "src", "other-space", "--name", "x"], "differ in observation space"),
        (["merge", "src", "src", "--weights", "0.7,0.7", "--name", "x"], "sum to 1"),
        (["merge", "src", "src", "--weights", "a,b", "--name", "x"], "comma-separated numbers"),
        (["filter", "src", "--name", "x"], "needs a criterion"),
        (["filter", "src", "--min-return", "1e9", "--name", "x"], "empty"),
        (["filter", "src", "--top-return", "150%", "--name", "x"], "percentage"),
        (["filter", "src", "--episodes", "99", "--name", "x"], "no episode 99"),
        (["filter", "src", "--top-return", "10%", "--name", "src"], "already exists"),
        (["split", "src", "--val", "0.99"], "training side empty"),
        (["split", "src", "--val", "1.5"], "fraction in (0, 1)"),
        (["split", "src", "--val", "0.5", "--train-name", "y", "--val-name", "y"], "must differ"),
        (["sample", "src", "--episodes", "21", "--name", "x"], "1..20"),
        (["sample", "src", "--name", "x"], "exactly one"),
        (["sample", "missing", "--episodes", "1", "--name", "x"], "not found"),
    ],
)
def test_refusals_are_one_line_exit_2_and_write_nothing(source: Path, cli, args: list[str], message: str) -> None:
    _make(source, "other-env", [3], [0.0], env_id="MountainCarContinuous-v0")
    _make(source, "other-space", [3], [0.0], obs_space=gym.spaces.Box(-20.0, 20.0, (2,), np.float32))
    before = store_contents(source)
    result = cli("datasets", *args, "--store", source)
    assert result.code == 2 and message in result.err and len(result.err.strip().splitlines()) == 1, result.err
    assert store_contents(source) == before


# --- parents are verified as loading verifies them -------------------------------------------


def _rewrite_last_shard(path: Path, edit) -> None:
    """Rewrite the last shard with `edit(table)` and re-record its size and sha256, as a
    consistent-looking but wrong dataset would (metadata's counts are left as they were)."""
    import pyarrow as pa

    from rlpipe.storage.files import sha256_file

    shard = sorted((path / "steps").iterdir())[-1]
    table = edit(pa.ipc.open_file(str(shard)).read_all())
    with pa.OSFile(str(shard), "wb") as sink, pa.ipc.new_file(sink, table.schema) as ipc:
        ipc.write_table(table)
    meta = json.loads((path / "metadata.json").read_text())
    meta["files"][f"steps/{shard.name}"] = {"sha256": sha256_file(shard), "bytes": shard.stat().st_size}
    (path / "metadata.json").write_text(json.dumps(meta))


def _drop_last_episode(table):
    ids = table.column("episode_id").to_numpy()
    return table.slice(0, int((ids != ids[-1]).sum()))


def _duplicate_last_episode(table):
    import pyarrow as pa

    ids = table.column("episode_id").to_numpy()
    copy = table.filter(pa.array(ids == ids[-1]))
    field = table.schema.field("episode_id")
    copy = copy.set_column(table.schema.get_field_index("episode_id"), field, pa.array(np.full(len(copy), ids[-1] + 1), field.type))
    return pa.concat_tables([table, copy])


def _edit_metadata(path: Path, key: str, delta: int) -> None:
    meta = json.loads((path / "metadata.json").read_text())
    meta[key] += delta
    (path / "metadata.json").write_text(json.dumps(meta))


DAMAGE = {  # what was done to the parent -> what the refusal says
    "dropped-episode": (lambda path: _rewrite_last_shard(path, _drop_last_episode), "metadata says 100"),
    "duplicated-episode": (lambda path: _rewrite_last_shard(path, _duplicate_last_episode), "metadata says 100"),
    "total-steps": (lambda path: _edit_metadata(path, "total_steps", 1), "shards hold 100 rows, metadata says 101"),
    "total-episodes": (lambda path: _edit_metadata(path, "total_episodes", -1), "shards hold 20 episodes, metadata says 19"),
    "bit-flip": (
        lambda path: (path / "steps" / "shard-00000.arrow").write_bytes(
            (lambda raw: raw[: len(raw) // 2] + bytes([raw[len(raw) // 2] ^ 1]) + raw[len(raw) // 2 + 1 :])(
                (path / "steps" / "shard-00000.arrow").read_bytes()
            )
        ),
        "sha256 differs",
    ),
}
VERBS = {
    "merge": ["merge", "good", "{parent}", "--name", "out"],
    "filter": ["filter", "{parent}", "--top-return", "3", "--name", "out"],
    "split": ["split", "{parent}", "--val", "0.25"],
    "sample": ["sample", "{parent}", "--episodes", "3", "--name", "out"],
}


@pytest.mark.parametrize("damage", sorted(DAMAGE))
@pytest.mark.parametrize("verb", sorted(VERBS))
def test_data_verbs_refuse_a_parent_that_loading_refuses(store: Path, cli, verb: str, damage: str) -> None:
    from rlpipe.errors import RlpipeError

    lengths, rewards = [3 + i % 5 for i in range(20)], [float(i % 7) for i in range(20)]
    for name in ("good", "src"):
        _make(store, name, lengths, rewards)
    load_dataset("src", store)  # remembered as verified: the verbs must not trust that once it changed
    control = cli("datasets", *[arg.format(parent="good") for arg in VERBS[verb]], "--store", store)
    assert control.code == 0, control.err  # an intact parent: written
    for written in ("out", "good-train", "good-val"):
        if (store / written).exists():
            assert cli("datasets", "rm", written, "--store", store).code == 0
    edit, message = DAMAGE[damage]
    edit(store / "src")
    with pytest.raises(RlpipeError, match=message):  # loading refuses it ...
        load_dataset("src", store)
    assert cli("datasets", "validate", "src", "--store", store).code == 2
    before = store_contents(store)
    result = cli("datasets", *[arg.format(parent="src") for arg in VERBS[verb]], "--store", store)  # ... and so does the verb
    assert result.code == 2, (result.out, result.err)
    assert ("dataset 'src'" in result.err or f"{store / 'src'}/" in result.err) and message in result.err, result.err  # names the parent
    assert len(result.err.strip().splitlines()) == 1 and "Traceback" not in result.err
    assert store_contents(store) == before  # no output, no temporary directory


# --- split: both sides or neither ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("names", "message"),
    [
        (["--train-name", "Side", "--val-name", "side"], "differ only in case"),
        (["--train-name", "t", "--val-name", "v\n"], "invalid dataset name 'v\\n'"),
        (["--train-name", "t", "--val-name", ""], "--val-name is given an empty value"),
        (["--train-name", "", "--val-name", "v"], "--train-name is given an empty value"),
        (["--train-name", "t", "--val-name", "V-old"], "differs only in case from the existing 'v-OLD'"),  # found under the lock
        (["--train-name", "t", "--val-name", "src"], "already exists"),
    ],
)
def test_split_checks_both_names_before_writing_either(source: Path, cli, names: list[str], message: str) -> None:
    _make(source, "v-OLD", [3], [0.0])
    before = store_contents(source)
    result = cli("datasets", "split", "src", "--val", "0.25", *names, "--store", source)
    assert result.code == 2 and message in result.err, result.err
    assert len(result.err.strip().splitlines()) == 1 and "Traceback" not in result.err
    assert store_contents(source) == before  # not the training side either
    control = cli("datasets", "split", "src", "--val", "0.25", "--train-name", "Side", "--val-name", "v", "--store", source)
    assert control.code == 0, control.err
    assert store_contents(source) == sorted([*before, "Side", "v"])


def test_split_val_name_held_by_another_writer_leaves_no_training_side(source: Path, cli) -> None:
    from rlpipe.datasets.writer import DatasetWriter

    before = store_contents(source)
    with DatasetWriter("src-val", OBS, ACT, env_id=None, store=source):  # a live writer of the validation side's name
        result = cli("datasets", "split", "src", "--val", "0.25", "--store", source)
        assert result.code == 2 and "being written by another process" in result.err, result.err
        assert not (source / "src-train").exists() and not any(p.endswith("-src-train") for p in store_contents(source))
    assert store_contents(source) == before


@pytest.mark.parametrize(("step", "published"), [("group-synced", False), ("group-first-moved", True)])
def test_split_failing_between_the_sides_publishes_both_or_neither(
    source: Path, monkeypatch: pytest.MonkeyPatch, step: str, published: bool
) -> None:
    """An exception injected before the commit leaves neither side (and no work files); one
    between the two sides' renames is after the commit: both are published."""
    from rlpipe.datasets.ops import split_dataset
    from rlpipe.storage import atomic

    real = atomic.fault_point

    def fail(at: str) -> None:
        if at == step:
            raise RuntimeError(f"injected at {at}")
        real(at)

    monkeypatch.setattr(atomic, "fault_point", fail)
    with pytest.raises(RuntimeError, match="injected"):
        split_dataset("src", 0.25, train_name="t", val_name="v", store=source)
    monkeypatch.setattr(atomic, "fault_point", real)
    assert store_contents(source) == (["src", "t", "v"] if published else ["src"])
    if published:
        assert sorted(_traced_episodes(source, "t") + _traced_episodes(source, "v")) == list(range(20))
