"""Tampered records read back as one line and exit 2, naming the file and the field, with
nothing written: dataset lineage and provenance, stored spaces, a run's metrics.json and
checkpoint.json for `rlpipe report`, env specs with keyword arguments their env does not
take, FQE on another env's dataset and the import of a truncated Minari file. Each has its
control: the untouched input works."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from tests.test_collector import collect_dataset
from tests.test_fuzz_inputs import files
from tests.test_report import fake_run
from tests.test_store_safety import one_line_exit_2

SHORT_BC = ("--updates", "2", "--device", "cpu", "--set", "eval_every=2", "--set", "eval_episodes=1")
SHORT_BC += ("--set", "heldout_eval_episodes=0", "--no-progress")


@pytest.fixture(scope="module")
def originals(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A store (`data`: CartPole, Arrow and HDF5; `pendulum`; `goals`: GoalWorld with info
    columns; `m`: a merge of a filter of `data` with `data`; `gh`: HER on `goals`; `ghs`: a
    sample of `gh`) and a short PPO run on CartPole."""
    from rlpipe.algos import get_algo
    from rlpipe.datasets.her import relabel_dataset
    from rlpipe.datasets.ops import filter_dataset, merge_datasets, sample_dataset
    from rlpipe.datasets.store import open_dataset

    root = tmp_path_factory.mktemp("tampered")
    store = root / "store"
    collect_dataset(store, "CartPole-v1", "data", fmt="both", episodes=3, num_envs=1)
    collect_dataset(store, "Pendulum-v1", "pendulum", fmt="arrow", episodes=1, num_envs=1)
    collect_dataset(store, "GoalWorld-v0", "goals", fmt="arrow", episodes=2, num_envs=1)
    filter_dataset("data", "f", min_return=-1e9, store=store)
    merge_datasets(["f", "data"], "m", store=store)
    relabel_dataset(open_dataset("goals", store), "gh", strategy="future", k=1, seed=0, store=store)
    sample_dataset("gh", "ghs", episodes=1, store=store)
    ppo = get_algo("ppo")
    config = ppo.make_config("CartPole-v1", env_steps=256, eval_every=256, eval_episodes=1, heldout_eval_episodes=0)
    ppo.train(config, root / "run", progress=False)
    return root


@pytest.fixture
def work(originals: Path, tmp_path: Path) -> Path:
    """A copy of the originals to tamper with."""
    shutil.copytree(originals, tmp_path / "work")
    return tmp_path / "work"


def edit(path: Path, change: Any) -> None:
    """Apply ``change`` (a function of the parsed document) to the JSON file at ``path``."""
    document = json.loads(path.read_text())
    change(document)
    path.write_text(json.dumps(document))


def setter(path: tuple[str | int, ...], value: Any) -> Any:
    def change(document: Any) -> None:
        for key in path[:-1]:
            document = document[key]
        document[path[-1]] = value

    return change


def refused(result, *words: str) -> None:
    """Exit 2, one line on stderr holding every word (the file, the field), no traceback."""
    assert "Traceback" not in result.err, result.err
    for word in words:
        one_line_exit_2(result, word)


# -- lineage and provenance --------------------------------------------------------------------

LINEAGE_CASES = [
    ("m", ("lineage", "parents"), {"name": "f"}, "'lineage.parents' is missing or not a list"),
    ("m", ("lineage", "parents", 0, "name"), 7, "'lineage.parents[0].name' is missing or not a string"),
    ("m", ("lineage", "parents", 1, "content_hash"), None, "'lineage.parents[1].content_hash' is missing or not a string"),
    ("m", ("lineage", "arguments"), ["f", "data"], "'lineage.arguments' is missing or not an object"),
    ("m", ("lineage", "parents", 0, "lineage", "operation"), 1.5, "'lineage.parents[0].lineage.operation' is missing or not a string"),
    ("m", ("lineage", "parents", 1, "producer"), "random", "'lineage.parents[1].producer' is not an object"),
    ("gh", ("provenance", "source_dataset"), ["goals"], "'provenance.source_dataset' is missing or not a string"),
    ("ghs", ("lineage", "parents", 0, "provenance"), True, "'lineage.parents[0].provenance' is not an object"),
]


@pytest.mark.parametrize(
    ("name", "path", "value", "message"), LINEAGE_CASES, ids=lambda v: ".".join(map(str, v)) if isinstance(v, tuple) else None
)
def test_tampered_lineage_is_one_line(work: Path, cli, name: str, path: tuple, value: Any, message: str) -> None:
    store = work / "store"
    meta = store / name / "metadata.json"
    edit(meta, setter(path, value))
    refused(cli("datasets", "lineage", name, "--store", store), str(meta), message)
    before = files(work)
    refused(cli("report", work / "run", "--out", work / "report", "--datasets", store), str(meta), message)
    assert not (work / "report").exists() and files(work) == before


def test_lineage_and_report_of_intact_records(work: Path, cli) -> None:
    """The control: the same records untouched are printed and reported."""
    store = work / "store"
    result = cli("datasets", "lineage", "m", "--store", store)
    assert result.code == 0 and "merge()" in result.out and "filter(min_return=-1000000000.0)" in result.out, result.err
    result = cli("datasets", "lineage", "ghs", "--store", store)
    assert result.code == 0 and "her relabelling (strategy=future, k=1)" in result.out and "goals [" in result.out, result.err
    result = cli("report", work / "run", "--out", work / "report", "--datasets", store)
    assert result.code == 0, result.err
    assert "merge()" in (work / "report" / "index.html").read_text()


# Sub-fields the record checks passed over (issue 63, group 8): a parent's row count and
# producer fields, and the settings a HER relabelling records beside its source.
RECORD_FIELD_CASES = [
    ("m", ("lineage", "parents", 0, "total_steps"), "12", "'lineage.parents[0].total_steps' is not a non-negative integer"),
    ("m", ("lineage", "parents", 1, "total_steps"), -1, "'lineage.parents[1].total_steps' is not a non-negative integer"),
    ("m", ("lineage", "parents", 1, "producer", "algorithm"), 3, "'lineage.parents[1].producer.algorithm' is not str"),
    ("m", ("lineage", "parents", 1, "producer", "seed"), "0", "'lineage.parents[1].producer.seed' is not int or null"),
    ("gh", ("provenance", "transform"), 3, "'provenance.transform' is not str"),
    ("gh", ("provenance", "strategy"), {}, "'provenance.strategy' is not str"),
    ("gh", ("provenance", "k"), "1", "'provenance.k' is not int"),
    ("gh", ("provenance", "seed"), [0], "'provenance.seed' is not int or null"),
    ("gh", ("provenance", "original_episodes"), None, "'provenance.original_episodes' is not int"),
    ("ghs", ("lineage", "parents", 0, "provenance", "k"), 1.5, "'lineage.parents[0].provenance.k' is not int"),
]


@pytest.mark.parametrize(
    ("name", "path", "value", "message"), RECORD_FIELD_CASES, ids=lambda v: ".".join(map(str, v)) if isinstance(v, tuple) else None
)
def test_record_sub_field_of_a_wrong_type_is_refused_by_every_reader(
    work: Path, cli, name: str, path: tuple, value: Any, message: str
) -> None:
    """`datasets validate`, `datasets inspect` and training refuse it in one line (they accepted it)."""
    store = work / "store"
    meta = store / name / "metadata.json"
    edit(meta, setter(path, value))
    refused(cli("datasets", "validate", name, "--store", store), str(meta), message)
    refused(cli("datasets", "inspect", name, "--store", store), str(meta), message)
    refused(cli("train", "bc", "--dataset", name, "--store", store, "--out", work / "r", *SHORT_BC), str(meta), message)
    assert not (work / "r").exists()


def test_provenance_that_loops_back_is_one_line(work: Path, cli) -> None:
    """A relabelling whose provenance names itself (or a dataset made from it) would print its
    own tree again and again: refused, naming the file and the field."""
    store = work / "store"
    gh = json.loads((store / "gh" / "metadata.json").read_text())
    edit(
        store / "gh" / "metadata.json", lambda meta: meta["provenance"].update(source_dataset="gh", source_content_hash=gh["content_hash"])
    )
    refused(cli("datasets", "lineage", "gh", "--store", store), f"{store / 'gh' / 'metadata.json'} 'provenance'", "loops back")
    refused(cli("report", work / "run", "--out", work / "report", "--datasets", store), "loops back")
    assert not (work / "report").exists()
    printed = cli("datasets", "lineage", "ghs", "--store", store)  # the control: its copy of gh's record is intact
    assert printed.code == 0 and len(printed.out.splitlines()) == 3, printed.out + printed.err


# -- stored spaces ------------------------------------------------------------------------------

BAD_SPACES = {
    "a number": 5,
    "a list": [1],
    "garbage": "garbage",
    "an empty Box": '{"type": "Box"}',
    "a Dict of a number": '{"type": "Dict", "subspaces": 5}',
    "a Box of 10**12 values": '{"type": "Box", "dtype": "float32", "shape": [1000000, 1000000], "low": 0, "high": 1}',
}


@pytest.mark.parametrize("bad", list(BAD_SPACES))
def test_malformed_info_space_is_one_line_everywhere(work: Path, cli, monkeypatch: pytest.MonkeyPatch, bad: str) -> None:
    store = work / "store"
    meta = store / "goals" / "metadata.json"
    edit(meta, setter(("info_space",), BAD_SPACES[bad]))
    monkeypatch.setenv("MINARI_DATASETS_PATH", str(work / "minari"))
    before = files(work)
    commands = [
        ("datasets", "inspect", "goals"),
        ("datasets", "validate", "goals"),
        ("train", "bc", "--dataset", "goals", "--out", work / "bc", *SHORT_BC),
        ("datasets", "filter", "goals", "--name", "out", "--min-return", "-1e9"),
        ("datasets", "split", "goals", "--val", "0.5", "--train-name", "out", "--val-name", "out2"),
        ("datasets", "sample", "goals", "--name", "out", "--episodes", "1"),
        ("datasets", "export", "goals"),
        ("relabel", "her", "--dataset", "goals", "--name", "out"),
    ]
    for command in commands:
        refused(cli(*command, "--store", store), str(meta), "'info_space'")
    refused(cli("report", work / "run", "--out", work / "report", "--datasets", store), str(meta), "'info_space'")
    assert files(work) == before and not (work / "report").exists() and not (work / "minari").exists()


@pytest.mark.parametrize("key", ["observation_space", "action_space"])
def test_malformed_dataset_spaces_are_one_line(work: Path, cli, key: str) -> None:
    store = work / "store"
    meta = store / "data" / "metadata.json"
    for bad in ("garbage", '{"type": "Box"}', BAD_SPACES["a Box of 10**12 values"]):
        edit(meta, setter((key,), bad))
        for command in (("datasets", "inspect", "data"), ("ope", "fqe", work / "run", "--dataset", "data", "--updates", "2")):
            refused(cli(*command, "--store", store), str(meta), repr(key), "unreadable space")


@pytest.mark.parametrize(
    "bad", [5, "garbage", {"type": "Box"}, {"type": "Discrete", "n": "two"}, {"type": "Box", "shape": [10**9], "low": 0, "high": 1}]
)
def test_malformed_checkpoint_space_is_one_line(work: Path, cli, bad: Any) -> None:
    run = work / "run"
    edit(run / "checkpoint.json", setter(("action_space",), bad))
    for command in (("eval", run, "--episodes", "1"), ("export", run, "--torchscript", work / "policy.pt")):
        refused(cli(*command), "checkpoint", "action_space")
    assert not (work / "policy.pt").exists()


def test_intact_spaces_work(work: Path, cli) -> None:
    """The control: the untouched dataset and run."""
    store = work / "store"
    assert cli("datasets", "inspect", "goals", "--store", store).code == 0
    assert cli("datasets", "filter", "goals", "--name", "out", "--min-return", "-1e9", "--store", store).code == 0
    assert cli("eval", work / "run", "--episodes", "1").code == 0


# -- the run files `rlpipe report` reads -------------------------------------------------------


@pytest.mark.parametrize(
    ("file", "content", "words"),
    [
        ("metrics.json", "not json", ["metrics.json", "not JSON"]),
        ("metrics.json", "[1, 2]", ["metrics.json", "is not a JSON object"]),
        ("metrics.json", "[" * 100_000, ["metrics.json", "not JSON"]),
        ("metrics.json", {"eval_return_mean": "high"}, ["metrics.json", "'eval_return_mean' is not a number"]),
        ("metrics.json", {"env_id": ["Pendulum-v1"]}, ["metrics.json", "'env_id' is not a string"]),
        ("metrics.json", {"seed": "zero"}, ["metrics.json", "'seed' is not an integer or null"]),
        ("metrics.json", {"heldout_return_mean": -1.0}, ["metrics.json", "'heldout_return_std'"]),
        ("metrics.json", {"env_steps": 10**400}, ["metrics.json", "'env_steps' is not a non-negative integer"]),
        ("checkpoint.json", "{", ["checkpoint.json", "not JSON"]),
        ("checkpoint.json", {"config": [1]}, ["checkpoint.json", "'config' is not an object"]),
    ],
)
def test_report_refuses_a_bad_run_file_in_one_line(tmp_path: Path, cli, file: str, content: Any, words: list[str]) -> None:
    run = fake_run(tmp_path / "runs", "sac", 0, [(1000, -900.0), (2000, -300.0)])
    if isinstance(content, dict):
        edit(run / file, lambda document: document.update(content))
    else:
        (run / file).write_text(content)
    refused(cli("report", run, "--out", tmp_path / "report", "--markdown", tmp_path / "results.md"), str(run / file), *words)
    assert not (tmp_path / "report").exists() and not (tmp_path / "results.md").exists()


@pytest.mark.parametrize("file", ["metrics.json", "checkpoint.json"])
def test_report_does_not_read_a_huge_run_file(tmp_path: Path, cli, file: str) -> None:
    """A 1 GiB file (sparse: it costs no disk) is refused by its size, not read whole."""
    run = fake_run(tmp_path / "runs", "sac", 0, [(1000, -900.0)])
    with open(run / file, "r+b") as handle:
        handle.truncate(1 << 30)
    refused(cli("report", run, "--out", tmp_path / "report"), str(run / file), "larger than")
    assert not (tmp_path / "report").exists()


def test_report_escapes_run_folder_names(tmp_path: Path, cli) -> None:
    """Run folders named like markup are text in the HTML page and the Markdown table; the
    control: each is one row of the table, with the table's columns."""
    runs = tmp_path / "runs"
    names = ["<script>alert(1)<", "a|b", "c`d`e", "$\\frac{$", "_x_", "link"]
    for i, name in enumerate(names):  # another learning rate each: one group each
        algo = "[l](y)*z*" if name == "link" else "sac"  # a value of metrics.json is escaped too
        fake_run(runs, name, 0, [(1000, -900.0 + i), (2000, -300.0 + i)], lr=10.0**-i, algo=algo)
    result = cli("report", *[runs / name for name in names], "--out", tmp_path / "report", "--markdown", tmp_path / "results.md")
    assert result.code == 0, result.err
    page = (tmp_path / "report" / "index.html").read_text()
    assert "<script>alert" not in page and "&lt;script&gt;alert(1)&lt;" in page
    table = [line for line in (tmp_path / "results.md").read_text().splitlines() if line.startswith("| ") and not line.startswith("| ---")]
    columns = table[0].count(" | ")
    assert len(table) == 1 + len(names)
    for line in table[1:]:  # no cell split by a `|` of a name
        assert line.replace("\\|", "").count(" | ") == columns, line
    text = "\n".join(table)
    assert "<script>" not in text and "&lt;script&gt;alert(1)&lt;" in text
    for escaped in ("a\\|b", "c\\`d\\`e", "\\_x\\_", "\\[l\\](y)\\*z\\*"):
        assert escaped in text, text


# -- env specs with keyword arguments the env does not take ------------------------------------


def bogus_kwargs(spec_json: str) -> str:
    spec = json.loads(spec_json)
    spec["kwargs"] = {**spec["kwargs"], "bogus": 1}
    return json.dumps(spec)


def test_dataset_env_spec_with_an_unknown_kwarg_is_one_line(work: Path, cli) -> None:
    store = work / "store"
    meta = store / "data" / "metadata.json"
    edit(meta, lambda document: document.update(env_spec=bogus_kwargs(document["env_spec"])))
    refused(cli("train", "bc", "--dataset", "data", "--store", store, "--out", work / "bc", *SHORT_BC), f"{meta} 'env_spec'", "bogus")
    assert not (work / "bc").exists()


def test_run_env_spec_with_an_unknown_kwarg_is_one_line(work: Path, cli) -> None:
    run = work / "run"
    edit(run / "checkpoint.json", lambda document: document.update(env_spec=bogus_kwargs(document["env_spec"])))
    for command in (("eval", run, "--episodes", "1"), ("export", run, "--torchscript", work / "policy.pt")):
        refused(cli(*command), f"the run in {run}", "env_spec", "bogus")
    assert not (work / "policy.pt").exists()


def test_env_spec_with_known_kwargs_works(work: Path, cli) -> None:
    """The control: a keyword argument CartPole takes, in a dataset's and in a run's spec."""
    store, run = work / "store", work / "run"

    def known(document: dict[str, Any]) -> None:
        spec = json.loads(document["env_spec"])
        document["env_spec"] = json.dumps({**spec, "kwargs": {"sutton_barto_reward": True}})

    edit(store / "data" / "metadata.json", known)
    edit(run / "checkpoint.json", known)
    trained = cli("train", "bc", "--dataset", "data", "--store", store, "--out", work / "bc", *SHORT_BC)
    assert trained.code == 0, trained.err
    assert cli("eval", run, "--episodes", "1").code == 0


# -- FQE of a policy on another env's dataset --------------------------------------------------


def test_fqe_on_a_dataset_of_other_shapes_is_one_line(work: Path, cli) -> None:
    """A Pendulum dataset relabelled as CartPole's (its env id edited): the shapes differ."""
    store = work / "store"
    meta = store / "pendulum" / "metadata.json"
    edit(meta, lambda document: document.update(env_id="CartPole-v1", env_spec=None))
    out = work / "fqe.json"
    result = cli("ope", "fqe", work / "run", "--dataset", "pendulum", "--store", store, "--updates", "2", "--out", out)
    refused(result, f"{meta} 'observation_space'", "(3,)", "takes 4 observation values")
    assert not out.exists()
    edit(meta, lambda document: document.update(env_id="Pendulum-v1"))
    refused(cli("ope", "fqe", work / "run", "--dataset", "pendulum", "--store", store, "--updates", "2"), "comes from Pendulum-v1")


def test_fqe_on_the_policys_env_works(work: Path, cli) -> None:
    """The control."""
    result = cli("ope", "fqe", work / "run", "--dataset", "data", "--store", work / "store", "--updates", "2", "--json")
    assert result.code == 0, result.err
    assert json.loads(result.out)[0]["dataset"] == "data"


# -- importing a truncated Minari dataset ------------------------------------------------------


def test_import_of_a_truncated_minari_file_is_one_line(work: Path, cli, monkeypatch: pytest.MonkeyPatch) -> None:
    store = work / "store"
    monkeypatch.setenv("MINARI_DATASETS_PATH", str(work / "minari"))
    assert cli("datasets", "export", "data", "--id", "test/data-v0", "--store", store).code == 0
    hdf5 = work / "minari" / "test" / "data-v0" / "data" / "main_data.hdf5"
    raw = hdf5.read_bytes()
    for cut in (0, 100, len(raw) // 2, len(raw) - 1):
        hdf5.write_bytes(raw[:cut])
        refused(cli("datasets", "import", "test/data-v0", "--name", "imported", "--store", store), str(hdf5), "truncated")
        assert not (store / "imported").exists() and not any(
            path.name.startswith(".") and "imported" in path.name for path in store.iterdir()
        )
    hdf5.write_bytes(raw)  # the control: the whole file imports
    assert cli("datasets", "import", "test/data-v0", "--name", "imported", "--store", store).code == 0
    assert cli("datasets", "validate", "imported", "--store", store).code == 0
