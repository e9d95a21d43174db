"""The seeds and counts the commands take: every command accepts the same seed range
(rlpipe.limits), refuses an out-of-range seed, env count, budget or count with one line and
exit 2 before anything is allocated or written, and accepts the range's edges."""

from __future__ import annotations

import contextlib
import json
import os
from pathlib import Path

import pytest

from rlpipe.limits import (
    MAX_ARGUMENT_FILE_BYTES,
    MAX_BATCH_SIZE,
    MAX_BUFFER_SIZE,
    MAX_COPIES,
    MAX_ENV_STEPS,
    MAX_EPISODES,
    MAX_LAYERS,
    MAX_NUM_ENVS,
    MAX_SEED,
    MAX_UPDATES,
    max_torch_threads,
)
from tests.conftest import store_contents
from tests.test_collector import collect_dataset, train_tiny_ppo

BIG = str(2**70)  # overflowed torch.manual_seed in train; collect accepted it
SEED_RANGE = "less than or equal to 4294967295"  # typer's words for an option's range
CARTPOLE = ["--env", "CartPole-v1"]


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A store with a CartPole, a GoalWorld and a Pendulum dataset, and a trained PPO run beside it."""
    root = tmp_path_factory.mktemp("bounds")
    collect_dataset(root / "store", "CartPole-v1", "cartpole", fmt="arrow", episodes=4, num_envs=2)
    collect_dataset(root / "store", "GoalWorld-v0", "goals", fmt="arrow", episodes=4, num_envs=2)
    collect_dataset(root / "store", "Pendulum-v1", "pendulum", fmt="arrow", episodes=2, num_envs=1)
    train_tiny_ppo(root / "run")
    return root


def tree(path: Path) -> list[tuple[str, int]]:
    """Every file under ``path`` with its size, but the locks and the verification cache that
    reading a dataset keeps: what a refused command must leave as it was."""
    files = [p.relative_to(path) for p in path.rglob("*") if p.is_file()]
    return sorted((str(p), (path / p).stat().st_size) for p in files if not {".locks", ".verified"} & set(p.parts))


def command(args: list[str], world: Path, out: Path) -> list[str]:
    """``args`` with the paths each command needs: the world's store and run, a fresh output."""
    args = [str(world / "run") if a == "RUN" else a for a in args]
    where = {
        "collect": ["--store", out],
        "train": ["--store", world / "store", "--out", out, "--no-progress"],
        "relabel": ["--store", world / "store", "--name", "out"],
        "sweep": ["--root", out, "--name", "s"],
        "datasets": ["--store", world / "store", "--name", "out"],
        "ope": ["--store", world / "store", "--out", out / "fqe.json"],
        "export": [],
        "report": ["--out", out],
    }
    return [*args, *where.get(args[0], [])]


@pytest.mark.parametrize(
    "args, message",
    [
        # One seed range, 0 to 2**32 - 1, on every command that takes a seed.
        (["collect", *CARTPOLE, "--episodes", "2", "--seed", BIG], SEED_RANGE),
        (["collect", *CARTPOLE, "--episodes", "2", "--seed", "-1"], "greater than or equal to 0"),
        (["train", "ppo", *CARTPOLE, "--seed", BIG], SEED_RANGE),
        (["train", "ppo", *CARTPOLE, "--seed", "-1"], "greater than or equal to 0"),
        (["train", "ppo", *CARTPOLE, "--set", f"seed={2**32}"], "setting seed=4294967296: expected an integer from 0 to 4294967295"),
        (["train", "bc", "--dataset", "cartpole", "--seed", BIG], SEED_RANGE),
        (["eval", "RUN", "--seed", "-5"], "greater than or equal to 0"),
        (["eval", "RUN", "--seed", BIG], SEED_RANGE),
        (["relabel", "her", "--dataset", "goals", "--seed", BIG], SEED_RANGE),
        (["sweep", "ppo", *CARTPOLE, "--seeds", BIG], "--seeds=1180591620717411303424: expected an integer from 0 to 4294967295"),
        (["sweep", "ppo", *CARTPOLE, "--seeds", f"0,{2**32}"], "expected an integer from 0 to 4294967295"),
        (["sweep", "ppo", *CARTPOLE, "--seeds", "0-99999999999999"], "at most 1000 seeds per setting"),  # was a MemoryError
        (["sweep", "ppo", *CARTPOLE, "--seeds", f"0-{2**63}"], "at most 1000 seeds per setting"),  # was an OverflowError
        (["sweep", "ppo", *CARTPOLE, "--seeds", "3-1"], "expected distinct seeds"),
        # Env counts: at least 1, at most MAX_NUM_ENVS (10^11 asked for 373 GiB before the first step).
        (["collect", *CARTPOLE, "--episodes", "2", "--num-envs", "99999999999"], "--num-envs must be auto or an integer from 1 to 4096"),
        (["collect", *CARTPOLE, "--episodes", "2", "--num-envs", "4097"], "from 1 to 4096, got '4097'"),
        (["collect", *CARTPOLE, "--episodes", "2", "--num-envs", "0"], "from 1 to 4096, got '0'"),
        (["collect", *CARTPOLE, "--episodes", "2", "--num-envs", "-3"], "from 1 to 4096, got '-3'"),
        (["collect", *CARTPOLE, "--episodes", "2", "--num-envs", "²"], "from 1 to 4096, got '²'"),
        (["train", "ppo", *CARTPOLE, "--num-envs", "99999999999"], "setting num_envs=99999999999: expected an integer from 1 to 4096"),
        (["train", "ppo", *CARTPOLE, "--num-envs", "0"], "setting num_envs=0: expected a positive number"),
        (["sweep", "ppo", *CARTPOLE, "--seeds", "0", "--set", "num_envs=99999999999"], "setting num_envs=99999999999"),
        # Budgets and counts.
        (["collect", *CARTPOLE, "--episodes", "0"], "--episodes/--steps must be at least 1"),
        (["collect", *CARTPOLE, "--episodes", "-1"], "--episodes/--steps must be at least 1"),
        (["collect", *CARTPOLE, "--steps", "-5"], "--episodes/--steps must be at least 1"),
        (
            ["collect", *CARTPOLE, "--episodes", BIG, "--num-envs", "4"],
            f"--episodes/--steps must be at most {MAX_ENV_STEPS}",
        ),  # was an OverflowError
        (["collect", *CARTPOLE], "give exactly one of --episodes and --steps"),
        (["collect", *CARTPOLE, "--episodes", "2", "--workers", "0"], "Invalid value for '--workers'"),
        (["collect", *CARTPOLE, "--expert", "ppo", "--expert-steps", "-1", "--episodes", "2"], "--expert-steps must be at least 1, got -1"),
        (["collect", "--env", "Combat-v0", "--episodes", "0"], "--episodes/--steps must be at least 1"),
        (["train", "ppo", *CARTPOLE, "--env-steps", "-5"], "setting env_steps=-5: expected a positive number"),
        (["train", "ppo", *CARTPOLE, "--checkpoint-every", "0"], "setting checkpoint_every=0: expected a positive number"),
        (["train", "bc", "--dataset", "cartpole", "--updates", "-1"], "setting updates=-1: expected a positive number"),
        (
            ["train", "bc", "--dataset", "cartpole", "--updates", str(MAX_UPDATES + 1)],
            f"setting updates={MAX_UPDATES + 1}: expected at most",
        ),
        (["train", "bc", "--dataset", "cartpole", "--max-samples", "0"], "setting max_samples=0: expected a positive number"),
        (["train", "ppo", *CARTPOLE, "--set", "heldout_eval_episodes=-1"], "setting heldout_eval_episodes=-1: expected an integer >= 0"),
        (["eval", "RUN", "--episodes", "0"], "Invalid value for '--episodes'"),
        (["eval", "RUN", "--video-episodes", "-1"], "Invalid value for '--video-episodes'"),
        (["relabel", "her", "--dataset", "goals", "--k", "0"], "--k must be at least 1"),
        (["relabel", "her", "--dataset", "goals", "--k", BIG], "at most 4294967296 (2**32) are written, so k <= "),
        (["sweep", "ppo", *CARTPOLE, "--seeds", "0", "--retries", "-1"], "Invalid value for '--retries'"),
        (["sweep", "ppo", *CARTPOLE, "--seeds", "0", "--workers", "0"], "Invalid value for '--workers'"),
        # A misspelt device is refused before a sweep makes its root.
        (["sweep", "ppo", *CARTPOLE, "--seeds", "0", "--device", "mps"], "unknown device 'mps'; use auto, cpu or cuda"),
        (["train", "ppo", *CARTPOLE, "--device", "mps"], "unknown device 'mps'; use auto, cpu or cuda"),
        # Integers beyond int64 and budgets beyond any run (tracebacks, or runs that never ended).
        (["datasets", "filter", "cartpole", "--episodes", BIG], f"--episodes: episode id {BIG} is out of range"),
        (["datasets", "filter", "cartpole", "--episodes", f"1,{2**63}"], "out of range (ids are 64-bit integers, below 2**63)"),
        (["datasets", "filter", "cartpole", "--episodes", "9" * 200], "(200 digits) is out of range"),
        (
            ["datasets", "filter", "cartpole", "--episodes", "@/dev/zero"],
            "--episodes: cannot read episode ids from /dev/zero: not a regular file",
        ),
        (
            ["train", "iql", "--dataset", "pendulum", "--finetune-env-steps", BIG],
            f"setting finetune_env_steps={BIG}: expected at most {MAX_BUFFER_SIZE}",
        ),
        (["train", "iql", "--dataset", "pendulum", "--finetune-env-steps", str(MAX_BUFFER_SIZE + 1)], "expected at most"),
        (
            ["train", "iql", "--dataset", "pendulum", "--finetune-env-steps", "4", "--set", "finetune_mixing_ratio=1.5"],
            "setting finetune_mixing_ratio=1.5: expected a number in [0, 1]",
        ),
        # Counts that hung, exhausted the machine or ended in a torch C++ error.
        (["train", "ppo", *CARTPOLE, "--env-steps", str(2**63)], f"setting env_steps={2**63}: expected at most {MAX_ENV_STEPS}"),
        (
            ["train", "ppo", *CARTPOLE, "--set", f"torch_threads={10**5}"],
            f"setting torch_threads=100000: expected at most {max_torch_threads()}",
        ),
        (["train", "bc", "--dataset", "cartpole", "--set", f"batch_size={2**63}"], f"expected at most {MAX_BATCH_SIZE}"),
        (["train", "bc", "--dataset", "cartpole", "--set", f"eval_episodes={2**63}"], f"expected at most {MAX_EPISODES}"),
        (["eval", "RUN", "--episodes", str(2**63)], f"--episodes={2**63}: expected an integer from 1 to {MAX_EPISODES}"),
        # Counts that size an update's tensors or repeat its steps (2**63 - 1 overflowed torch's size
        # arithmetic in a traceback, 10**12 layers or epochs ran until killed), any other count, and negatives.
        (
            ["train", "ppo", *CARTPOLE, "--set", f"num_steps={2**63 - 1}"],
            f"setting num_steps={2**63 - 1}: expected at most {MAX_BUFFER_SIZE}",
        ),
        (["train", "ppo", *CARTPOLE, "--set", f"num_epochs={10**12}"], f"expected at most {MAX_UPDATES}"),
        (["train", "bc", "--dataset", "cartpole", "--set", f"recurrent_hidden={2**63 - 1}"], "expected at most 8192"),
        (["train", "cql", "--dataset", "pendulum", "--set", f"num_sampled_actions={2**63 - 1}"], f"expected at most {MAX_COPIES}"),
        (["train", "edac", "--dataset", "pendulum", "--set", f"n_critics={2**63 - 1}"], f"expected at most {MAX_COPIES}"),
        (["train", "dt", "--dataset", "pendulum", "--set", f"layers={10**12}"], f"expected at most {MAX_LAYERS}"),
        (["train", "dynamics", "--dataset", "pendulum", "--set", f"iterations={10**12}"], f"expected at most {MAX_UPDATES}"),
        (["train", "td3bc", "--dataset", "pendulum", "--set", f"policy_delay={10**12}"], f"expected at most {MAX_ENV_STEPS}"),
        (["train", "bcq", "--dataset", "pendulum", "--set", "act_candidates=-1"], "setting act_candidates=-1: expected a positive number"),
        (["train", "cql", "--dataset", "pendulum", "--set", "quantiles=-1"], "setting quantiles=-1: expected an integer >= 0"),
        (["train", "pets", "--env", "Pendulum-v1", "--set", "random_steps=0"], "setting random_steps=0: expected a positive number"),
        (["collect", *CARTPOLE, "--episodes", str(2**32)], f"--episodes/--steps must be at most {MAX_ENV_STEPS}"),  # ran until killed
        (["collect", *CARTPOLE, "--steps", str(10**12)], f"--episodes/--steps must be at most {MAX_ENV_STEPS}"),
        (["ope", "fqe", "RUN", "--dataset", "cartpole", "--updates", str(10**18)], "Invalid value for '--updates'"),
        (["ope", "fqe", "RUN", "--dataset", "cartpole", "--updates", str(MAX_UPDATES + 1)], f"less than or equal to {MAX_UPDATES}"),
        (["export", "RUN", "--torchscript", "OUT/policy"], "(--torchscript): TorchScript needs a file name with an extension"),
        (["report", "RUN", "--datasets", "OUT/no-store"], "--datasets OUT/no-store: no such dataset store"),
    ],
)
def test_out_of_range_is_one_line_exit_2_and_writes_nothing(cli, world: Path, tmp_path: Path, args: list[str], message: str) -> None:
    before = tree(world)
    out = tmp_path / "out"
    args, message = [a.replace("OUT", str(out)) for a in args], message.replace("OUT", str(out))
    result = cli(*command(args, world, out))
    assert result.code == 2, result.err
    assert result.err.startswith("error: ") and result.err.strip().count("\n") == 0 and message in result.err, result.err
    assert "Traceback" not in result.err
    assert tree(world) == before and not out.exists() and list(tmp_path.iterdir()) == []


def test_the_edges_of_the_ranges_are_accepted(cli, world: Path, tmp_path: Path) -> None:
    """Control: the largest seed and env count work on the commands that refuse one more."""
    collected = cli(
        "collect", *CARTPOLE, "--episodes", "2", "--seed", MAX_SEED, "--num-envs", MAX_NUM_ENVS, "--store", tmp_path / "store", "--quiet"
    )
    assert collected.code == 0 and "2 episodes" in collected.out, collected.err
    evaluated = cli("eval", world / "run", "--episodes", "1", "--seed", MAX_SEED)
    assert evaluated.code == 0, evaluated.err
    trained = cli(
        "train",
        "ppo",
        *CARTPOLE,
        "--seed",
        MAX_SEED,
        "--env-steps",
        "64",
        "--set",
        "eval_every=64",
        "--set",
        "eval_episodes=1",
        "--set",
        "heldout_eval_episodes=1",
        "--out",
        tmp_path / "run",
        "--no-progress",
        "--device",
        "cpu",
    )
    assert trained.code == 0, trained.err
    relabelled = cli("relabel", "her", "--dataset", "goals", "--seed", MAX_SEED, "--k", "2", "--name", "edge", "--store", world / "store")
    assert relabelled.code == 0, relabelled.err
    assert store_contents(tmp_path / "store") == ["cartpole-random"]


def one_line_exit_2(result, message: str) -> None:
    assert result.code == 2, result.err
    assert result.err.startswith("error: ") and result.err.count("\n") == 1 and message in result.err, result.err
    assert "Traceback" not in result.err


def test_the_bounded_flags_take_valid_values(cli, world: Path, tmp_path: Path) -> None:
    """Control for the bounds above: in-range ids (inline and from a file), FQE updates, a
    fine-tuning budget, a TorchScript file name and a dataset store all work."""
    store = ["--store", world / "store"]
    (tmp_path / "ids.txt").write_text("0\n1\n")
    for ids, name in (("0,1", "first-two"), (f"@{tmp_path / 'ids.txt'}", "from-file")):
        filtered = cli("datasets", "filter", "cartpole", "--name", name, "--episodes", ids, *store)
        assert filtered.code == 0 and "(2 episodes" in filtered.out, filtered.err
    fqe = cli("ope", "fqe", world / "run", "--dataset", "cartpole", "--updates", "2", "--out", tmp_path / "fqe.json", *store)
    assert fqe.code == 0 and (tmp_path / "fqe.json").is_file(), fqe.err
    settings = ["--set", "eval_every=2", "--set", "eval_episodes=1", "--set", "heldout_eval_episodes=0", "--set", "finetune_eval_every=4"]
    settings += ["--set", "finetune_mixing_ratio=0.5"]
    finetuned = cli(
        "train", "iql", "--dataset", "pendulum", "--updates", "2", "--finetune-env-steps", "4", *settings,
        "--out", tmp_path / "iql", "--no-progress", "--device", "cpu", *store,
    )  # fmt: skip
    assert finetuned.code == 0, finetuned.err
    exported = cli("export", world / "run", "--torchscript", tmp_path / "policy.pt")
    assert exported.code == 0 and (tmp_path / "policy.pt").stat().st_size > 0, exported.err
    reported = cli("report", world / "run", "--out", tmp_path / "report", "--datasets", world / "store", "--ope", tmp_path / "fqe.json")
    assert reported.code == 0 and (tmp_path / "report" / "index.html").is_file(), reported.err


def test_episode_ids_from_a_fifo_or_a_huge_file_are_refused_unread(cli, world: Path, tmp_path: Path) -> None:
    """`--episodes @FILE` reads a regular file of bounded size only: a FIFO used to hang (a
    watchdog writer would unblock a reader that waits, failing the message check) and
    /dev/zero (above) to exhaust memory."""
    import threading

    fifo, huge = tmp_path / "ids.fifo", tmp_path / "ids.txt"
    os.mkfifo(fifo)
    with open(huge, "wb") as handle:
        handle.truncate(MAX_ARGUMENT_FILE_BYTES + 1)

    def unblock() -> None:
        with contextlib.suppress(OSError):  # no reader waits: nothing to unblock
            os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))

    watchdog = threading.Timer(10, unblock)
    watchdog.start()
    try:
        before = tree(world)
        for path, message in ((fifo, "not a regular file"), (huge, f"larger than {MAX_ARGUMENT_FILE_BYTES} bytes")):
            result = cli("datasets", "filter", "cartpole", "--name", "out", "--episodes", f"@{path}", "--store", world / "store")
            one_line_exit_2(result, f"--episodes: cannot read episode ids from {path}: {message}")
        assert tree(world) == before
    finally:
        watchdog.cancel()


GOOD_ESTIMATE = {
    "run": "r",
    "dataset": "d",
    "checkpoint_sha256": "0" * 64,
    "estimate": 1.5,
    "standard_error": None,
    "config": {"gamma": 0.99},
}


@pytest.mark.parametrize(
    "text, message",
    [
        ("{}", "expected a JSON list of estimates, got an object"),  # was read as no estimates at all
        (json.dumps({"estimates": [GOOD_ESTIMATE]}), "expected a JSON list of estimates, got an object"),
        ("[]", "it holds no estimate"),
        (json.dumps([{**GOOD_ESTIMATE, "estimate": "nan"}]), "estimate 0: 'estimate' is not a finite number"),  # was shown as NaN
        (json.dumps([{**GOOD_ESTIMATE, "estimate": "inf"}]), "'estimate' is not a finite number"),
        (json.dumps([{**GOOD_ESTIMATE, "standard_error": "-inf"}]), "'standard_error' is not a finite number or null"),
        (json.dumps([GOOD_ESTIMATE, {**GOOD_ESTIMATE, "config": {"gamma": True}}]), "estimate 1: 'config.gamma' is not a finite number"),
        (json.dumps([{**GOOD_ESTIMATE, "estimate": 10**400}]), "'estimate' is not a finite number"),  # float() overflowed
        ("[" + "9" * 5000 + "]", "not JSON (Exceeds the limit"),  # an integer too long to parse
        ("[" * 100_000 + "]" * 100_000, "not JSON (maximum recursion depth"),  # a RecursionError
        ("[NaN]", "not JSON (NaN is not standard JSON)"),
    ],
)
def test_report_refuses_an_ope_file_that_is_not_fqe_estimates(cli, world: Path, tmp_path: Path, text: str, message: str) -> None:
    (tmp_path / "fqe.json").write_text(text)
    result = cli("report", world / "run", "--out", tmp_path / "report", "--ope", tmp_path / "fqe.json")
    one_line_exit_2(result, f"--ope {tmp_path / 'fqe.json'}")
    assert message in result.err, result.err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["fqe.json"]


def test_report_refuses_bad_output_and_store_options(cli, world: Path, tmp_path: Path) -> None:
    (tmp_path / "file").write_text("kept")
    for args, message in (
        (["--out", tmp_path / "file"], f"--out {tmp_path / 'file'} is not a directory"),
        (["--out", tmp_path / "report", "--datasets", tmp_path / "missing"], f"--datasets {tmp_path / 'missing'}: no such dataset store"),
        (["--out", tmp_path / "report", "--datasets", tmp_path / "file"], "is not a directory"),
        (["--out", tmp_path / "report", "--markdown", tmp_path], f"cannot write {tmp_path} (--markdown): it is a directory"),
        (["--out", tmp_path / "report", "--markdown", tmp_path / "no-dir" / "r.md"], "(--markdown): directory"),
    ):
        one_line_exit_2(cli("report", world / "run", *args), message)
        assert sorted(p.name for p in tmp_path.iterdir()) == ["file"] and (tmp_path / "file").read_text() == "kept"
    control = cli("report", world / "run", "--out", tmp_path / "report", "--markdown", tmp_path / "results.md")
    assert control.code == 0 and (tmp_path / "results.md").is_file(), control.err


@pytest.mark.parametrize(
    "failure",
    [
        MemoryError("Unable to allocate 373. GiB for an array with shape (99999999999,) and data type int32"),  # numpy
        RuntimeError(
            "[enforce fail at alloc_cpu.cpp:127] err == 0. DefaultCPUAllocator: can't allocate memory: "
            "you tried to allocate 3200000000000 bytes. Error code 12 (Cannot allocate memory)"
        ),  # torch, --set hidden=[10**11]
    ],
)
def test_an_allocation_beyond_the_machine_is_one_line(cli, monkeypatch: pytest.MonkeyPatch, tmp_path: Path, failure: Exception) -> None:
    """The sizes users give most are bounded up front; any other allocation that fails (a
    size setting beyond this machine) still ends in one line and exit 2, not a traceback."""
    import rlpipe.commands.collect

    def collect_dataset(*args, **kwargs):
        raise failure

    monkeypatch.setattr(rlpipe.commands.collect, "collect_dataset", collect_dataset)
    result = cli("collect", *CARTPOLE, "--episodes", "2", "--store", tmp_path / "store")
    assert result.code == 2 and result.err.count("\n") == 1, result.err
    assert result.err == f"error: out of memory: {failure}; lower the sizes given\n"


def test_an_allocation_failure_with_cpp_frames_is_still_one_line(cli, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """torch's allocator error carries its C++ frames on further lines (--set rollout_batch=10**12
    printed them all): only its first line is the message."""
    import rlpipe.commands.collect

    first = "DefaultCPUAllocator: can't allocate memory: you tried to allocate 300000000000000 bytes."

    def collect_dataset(*args, **kwargs):
        raise RuntimeError(f"{first}\nException raised from allocate_cpu at alloc_cpu.cpp:117\nframe #0: <unknown function>")

    monkeypatch.setattr(rlpipe.commands.collect, "collect_dataset", collect_dataset)
    result = cli("collect", *CARTPOLE, "--episodes", "2", "--store", tmp_path / "store")
    assert result.code == 2 and result.err == f"error: out of memory: {first}; lower the sizes given\n", result.err


def test_another_runtime_error_is_not_called_out_of_memory(cli, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Control: a bug stays a traceback (the one-line form is for allocation failures only)."""
    import rlpipe.commands.collect

    def collect_dataset(*args, **kwargs):
        raise RuntimeError("shape mismatch")

    monkeypatch.setattr(rlpipe.commands.collect, "collect_dataset", collect_dataset)
    with pytest.raises(RuntimeError, match="shape mismatch"):
        cli("collect", *CARTPOLE, "--episodes", "2", "--store", tmp_path / "store")


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["collect", "--policy", "random", "--env", "CartPole-v1", "--episodes", "1", "--store", ""], "--store is given an empty value"),
        (["report", "runs", "--out="], "--out is given an empty value"),
        (["report", ""], "the argument after 'report' is empty"),
    ],
)
def test_an_empty_argument_is_refused_not_read_as_the_current_directory(cli, tmp_path: Path, monkeypatch, args, message) -> None:
    monkeypatch.chdir(tmp_path)
    result = cli(*args)
    assert result.code == 2 and result.err.startswith(f"error: {message}") and len(result.err.splitlines()) == 1, result.err
    assert list(tmp_path.iterdir()) == []  # nothing written in the current directory


def test_an_empty_store_or_report_directory_is_refused_from_python(tmp_path: Path) -> None:
    from rlpipe.commands.report import output_directory
    from rlpipe.datasets.store import store_root
    from rlpipe.errors import RlpipeError

    for call in (lambda: store_root(""), lambda: output_directory("")):
        with pytest.raises(RlpipeError, match="empty path"):
            call()
