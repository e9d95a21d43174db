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
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.test_collector import collect_dataset, train_tiny_ppo
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
    root = tmp_path_factory.mktemp("fuzz-inputs")
    collect_dataset(root / "store", "CartPole-v1", "data", fmt="both", episodes=4, num_envs=2)
    train_tiny_ppo(root / "run")
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


# Schema-driven: every JSON field a command reads from a dataset's metadata.json (lineage and
# provenance records included), a run's checkpoint.json or its metrics.json, set to each JSON
# type it does not have, through every command that reads it. Each command works, or refuses
# with one line (exit 2) and writes nothing; none changes what it reads. About a minute.

JSON_TYPES: dict[str, Any] = {"null": None, "bool": True, "int": 7, "float": 0.5, "string": "x", "list": [1], "object": {"k": 1}}


def json_type(value: Any) -> str:
    """The JSON type name of a parsed value (the keys of JSON_TYPES)."""
    kinds = {type(None): "null", bool: "bool", int: "int", float: "float", str: "string", list: "list", dict: "object"}
    return kinds[type(value)]


def other_types(value: Any) -> list[str]:
    """The JSON types a field holding ``value`` (absent: ``MISSING``) is mutated to."""
    return [name for name in JSON_TYPES if value is MISSING or name != json_type(value)]


MISSING = object()


def field_at(document: Any, path: tuple[str | int, ...]) -> Any:
    for key in path:
        if isinstance(document, dict) and key in document or isinstance(document, list) and isinstance(key, int):
            document = document[key]
        else:
            return MISSING
    return document


def set_field(document: Any, path: tuple[str | int, ...], value: Any) -> None:
    for key in path[:-1]:
        document = document[key]
    document[path[-1]] = value


CHEAP = ("show", "inspect", "validate", "lineage", "list")
ALL_DATA = (*CHEAP, "train", "filter", "export", "report", "ope")
# (dataset, field path in its metadata.json, the commands that read the field)
DATASET_FIELDS: list[tuple[str, tuple[str | int, ...], tuple[str, ...]]] = [
    *[
        ("data", (key,), ALL_DATA)
        for key in (
            "format",
            "format_version",
            "name",
            "multi_agent",
            "total_episodes",
            "total_steps",
            "formats",
            "files",
            "content_hash",
            "kind",
            "observation_space",
            "action_space",
            "env_id",
        )
    ],
    ("data", ("files", "steps/shard-00000.arrow"), CHEAP),
    ("data", ("files", "steps/shard-00000.arrow", "sha256"), CHEAP),
    ("data", ("files", "steps/shard-00000.arrow", "bytes"), CHEAP),
    ("data", ("env_spec",), (*CHEAP, "train", "filter", "export")),
    ("data", ("eval_env_spec",), (*CHEAP, "train")),
    ("data", ("producer",), (*CHEAP, "train", "filter", "export", "report")),
    ("data", ("producer", "algorithm"), (*CHEAP, "filter", "export", "report")),
    ("data", ("producer", "seed"), (*CHEAP, "filter", "report")),
    ("data", ("episode_return",), (*CHEAP, "filter")),
    ("data", ("episode_return", "mean"), (*CHEAP, "filter")),
    ("data", ("episode_length",), CHEAP),
    ("data", ("ref_min_score",), (*CHEAP, "train", "export")),
    ("data", ("num_episodes_average_score",), (*CHEAP, "export")),
    ("goals", ("info_space",), (*CHEAP, "train", "filter", "relabel", "report")),
    *[
        ("m", path, (*CHEAP, "filter", "report"))
        for path in (
            ("lineage",),
            ("lineage", "operation"),
            ("lineage", "arguments"),
            ("lineage", "parents"),
            ("lineage", "parents", 0),
            ("lineage", "parents", 0, "name"),
            ("lineage", "parents", 0, "content_hash"),
            ("lineage", "parents", 0, "lineage"),
            ("lineage", "parents", 0, "lineage", "parents"),
            ("lineage", "parents", 1, "producer"),
        )
    ],
    *[
        ("gh", path, (*CHEAP, "filter", "report"))
        for path in (("provenance",), ("provenance", "source_dataset"), ("provenance", "source_content_hash"), ("provenance", "k"))
    ],
]
# (field path in checkpoint.json, the commands that read it)
CHECKPOINT_FIELDS: list[tuple[tuple[str | int, ...], tuple[str, ...]]] = [
    *[
        ((key,), ("eval", "export-policy", "ope"))
        for key in ("format", "algo", "env_id", "env_spec", "weights_file", "sha256", "policy", "action_space", "torch_version")
    ],
    *[
        (path, ("eval", "export-policy", "ope"))
        for path in (
            ("policy", "kind"),
            ("policy", "spec"),
            ("policy", "spec", "obs_dim"),
            ("policy", "spec", "act_dim"),
            ("policy", "spec", "hidden"),
            ("policy", "spec", "discrete"),
            ("action_space", "type"),
            ("action_space", "n"),
            ("action_space", "start"),
        )
    ],
    (("config",), ("eval", "export-policy", "ope", "report")),
    (("config", "hidden"), ("report",)),
]
METRICS_FIELDS = [
    (key,)
    for key in (
        "algo",
        "env_id",
        "eval_return_mean",
        "eval_return_std",
        "env_steps",
        "gradient_updates",
        "seed",
        "dataset",
        "eval_episodes",
        "wall_seconds",
        "checkpoint_sha256",
        "eval_success_rate",
        "heldout_return_mean",
    )
]


@pytest.fixture(scope="module")
def schema_originals(originals: Path) -> Path:
    """`originals`' run and a small store: `data` (CartPole, Arrow and HDF5), `goals`
    (GoalWorld, with info columns), `m` (a merge of a filter of `data` with `data`: nested
    lineage) and `gh` (a HER relabelling of `goals`: provenance)."""
    from rlpipe.datasets.her import relabel_dataset
    from rlpipe.datasets.ops import filter_dataset, merge_datasets
    from rlpipe.datasets.store import open_dataset

    root = originals.parent / "schema"
    store = root / "store"
    collect_dataset(store, "CartPole-v1", "data", fmt="both", episodes=3, num_envs=1)
    collect_dataset(store, "GoalWorld-v0", "goals", fmt="arrow", episodes=2, num_envs=1)
    filter_dataset("data", "f", min_return=-1e9, store=store)
    merge_datasets(["f", "data"], "m", store=store)
    relabel_dataset(open_dataset("goals", store), "gh", strategy="future", k=1, seed=0, store=store)
    shutil.copytree(originals / "run", root / "run")
    return root


def inputs(tmp: Path) -> dict[str, bytes]:
    """What a command may read under ``tmp`` (all but the outputs, `out/` and `store/derived/`)."""
    return {key: value for key, value in files(tmp).items() if not key.startswith(("out/", "store/derived/"))}


def run_commands(cli, tmp: Path, names: tuple[str, ...], dataset: str | None = "data") -> None:
    """Run each named command on the store and run under ``tmp`` (``dataset``: the mutated
    one, None for a mutated run): it works or refuses in one line, without a traceback; a
    refusal leaves no output; nothing it reads changes."""
    store, run, out = tmp / "store", tmp / "run", tmp / "out"
    name = dataset or "data"
    short = ("--device", "cpu", "--set", "eval_every=2", "--set", "eval_episodes=1", "--set", "heldout_eval_episodes=0", "--no-progress")
    cards = ("--datasets", tmp / "alone") if dataset else ()  # the report's store: the mutated dataset alone
    commands = {
        "show": (["datasets", "show", name, "--store", store], None),
        "inspect": (["datasets", "inspect", name, "--store", store], None),
        "validate": (["datasets", "validate", name, "--store", store], None),
        "lineage": (["datasets", "lineage", name, "--store", store], None),
        "list": (["datasets", "list", "--store", store], None),
        "train": (["train", "bc", "--dataset", name, "--store", store, "--out", out / "bc", "--updates", "2", *short], out / "bc"),
        "filter": (["datasets", "filter", name, "--name", "derived", "--min-return", "-1e9", "--store", store], store / "derived"),
        "export": (["datasets", "export", name, "--id", "fuzz/copy-v0", "--store", store], out / "minari" / "fuzz"),
        "relabel": (["relabel", "her", "--dataset", name, "--k", "1", "--name", "derived", "--store", store], store / "derived"),
        "report": (["report", run, "--out", out / "report", *cards], out / "report"),
        "ope": (["ope", "fqe", run, "--dataset", "data", "--store", store, "--updates", "2"], None),
        "eval": (["eval", run, "--episodes", "1"], None),
        "export-policy": (["export", run, "--torchscript", out / "policy.pt"], out / "policy.pt"),
        "scoreboard": (["scoreboard", run, "--datasets", store, "--out", out / "scores"], out / "scores"),
    }
    if dataset and "report" in names:
        shutil.copytree(store / dataset, tmp / "alone" / dataset)
    out.mkdir(exist_ok=True)
    for command in names:
        args, output = commands[command]
        before = inputs(tmp)
        result = cli(*args)
        assert "Traceback" not in result.err, (command, result.err)
        assert result.code in (0, 2), (command, result.code, result.err)
        if result.code == 2:
            assert result.err.startswith("error: ") and result.err.count("\n") == 1, (command, result.err)
            assert output is None or not output.exists(), (command, "wrote its output on a refusal")
        assert inputs(tmp) == before, (command, "changed what it reads, or left something behind")
        for written in (out, store / "derived"):  # the next command starts from the same inputs
            shutil.rmtree(written, ignore_errors=True)
        out.mkdir()


def field_id(path: tuple[str | int, ...]) -> str:
    return ".".join(map(str, path))


@pytest.mark.parametrize(("dataset", "path", "names"), DATASET_FIELDS, ids=[f"{d}:{field_id(p)}" for d, p, _ in DATASET_FIELDS])
def test_every_metadata_field_of_every_type(
    cli, schema_originals: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, dataset, path, names
) -> None:
    monkeypatch.setenv("MINARI_DATASETS_PATH", str(tmp_path / "out" / "minari"))
    original = json.loads((schema_originals / "store" / dataset / "metadata.json").read_text())
    for kind in other_types(field_at(original, path)):
        tmp = tmp_path / kind
        shutil.copytree(schema_originals, tmp)
        meta = json.loads(json.dumps(original))
        set_field(meta, path, JSON_TYPES[kind])
        (tmp / "store" / dataset / "metadata.json").write_text(json.dumps(meta))
        run_commands(cli, tmp, names, dataset)
        shutil.rmtree(tmp)


def mutate_run_file(cli, originals: Path, tmp_path: Path, file: str, path, names) -> None:
    """Set the field at ``path`` of the run's ``file`` to every other JSON type, each in a
    fresh copy of ``originals``, and run the commands ``names`` on it."""
    original = json.loads((originals / "run" / file).read_text())
    for kind in other_types(field_at(original, path)):
        tmp = tmp_path / kind
        shutil.copytree(originals, tmp)
        mutated = json.loads(json.dumps(original))
        set_field(mutated, path, JSON_TYPES[kind])
        (tmp / "run" / file).write_text(json.dumps(mutated))
        run_commands(cli, tmp, names, None)
        shutil.rmtree(tmp)


@pytest.mark.parametrize(("path", "names"), CHECKPOINT_FIELDS, ids=[field_id(p) for p, _ in CHECKPOINT_FIELDS])
def test_every_checkpoint_field_of_every_type(cli, schema_originals: Path, tmp_path: Path, path, names) -> None:
    mutate_run_file(cli, schema_originals, tmp_path, "checkpoint.json", path, names)


@pytest.mark.parametrize("path", METRICS_FIELDS, ids=field_id)
def test_every_metrics_field_of_every_type(cli, schema_originals: Path, tmp_path: Path, path) -> None:
    mutate_run_file(cli, schema_originals, tmp_path, "metrics.json", path, ("report", "scoreboard"))


@pytest.fixture(scope="module")
def spec_runs(schema_originals: Path) -> dict[str, Path]:
    """`schema_originals`' PPO run (an actor-critic, an online config) and a discrete BCQ run
    trained for 2 updates on its `data` (a threshold in its spec, `dataset` and `store` in its config)."""
    from rlpipe.algos import get_algo

    bcq = get_algo("bcq")
    config = bcq.make_config(
        "CartPole-v1",
        dataset="data",
        store=str(schema_originals / "store"),
        updates=2,
        eval_every=2,
        eval_episodes=1,
        heldout_eval_episodes=0,
        device="cpu",
    )
    bcq.train(config, schema_originals / "bcq-run", progress=False)
    return {"ppo": schema_originals / "run", "bcq": schema_originals / "bcq-run"}


@pytest.mark.parametrize("section", [("policy", "spec"), ("config",)], ids=field_id)
@pytest.mark.parametrize("run", ["ppo", "bcq"])
def test_every_policy_spec_and_config_field_of_every_type(cli, spec_runs: dict[str, Path], tmp_path: Path, run: str, section) -> None:
    """Each field of the run's own policy spec and config, set to every other JSON type,
    through `rlpipe eval` and `rlpipe export`: it works or is one line (an activation of the
    wrong type was a KeyError, BCQ's threshold of null a TypeError, a store of 7 a TypeError)."""
    shutil.copytree(spec_runs[run], tmp_path / "run")
    original = json.loads((tmp_path / "run" / "checkpoint.json").read_text())
    fields = field_at(original, section)
    assert fields, "the run records no such fields"
    for key, value in fields.items():
        for kind in other_types(value):
            mutated = json.loads(json.dumps(original))
            set_field(mutated, (*section, key), JSON_TYPES[kind])
            (tmp_path / "run" / "checkpoint.json").write_text(json.dumps(mutated))
            run_commands(cli, tmp_path, ("eval", "export-policy"), None)
