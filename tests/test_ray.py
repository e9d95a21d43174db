"""The Ray backends: collection equal to the local backend's bytes (also when a task's worker
dies and Ray retries it) and no dataset from a killed driver, a small Tune sweep, a Tune trial that fails once and resumes from
its saved state, and collection on a real `ray start --head` cluster joined through RAY_ADDRESS.

All Ray tests share one xdist group: they start Ray processes and use a module-wide session.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

ray = pytest.importorskip("ray", reason="the Ray tests need the rlpipe[ray] extra: pip install -e '.[ray]'")

from rlpipe.commands.collect import collect_dataset  # noqa: E402
from rlpipe.commands.sweep import SweepSpec, Trial, run_sweep, run_trial  # noqa: E402
from tests.test_sweep_tasks import kill_driver_after_its_first_task  # noqa: E402

pytestmark = [pytest.mark.ray, pytest.mark.xdist_group("ray")]
RAY_BIN = Path(sys.executable).parent / "ray"
FAULTS_ENV = "RLPIPE_TEST_FAULTS"


def _inject_faults() -> None:
    """Ray worker setup hook: one-shot faults, each armed by a marker file in $RLPIPE_TEST_FAULTS
    and claimed (deleted) by the first worker that reaches it.

    ``kill-task``: a collection task's worker dies after collecting, before its shards are
    committed. ``fail-trial``: a training run raises right after its first saved state. Every
    restored state is recorded in ``restored-N.json``.
    """
    import os
    from pathlib import Path

    from rlpipe.commands import tasks
    from rlpipe.training import resume

    faults = Path(os.environ[FAULTS_ENV])

    def claim(name: str) -> bool:
        try:
            (faults / name).unlink()
            return True
        except FileNotFoundError:
            return False

    collect, save, restore = tasks.collect, resume.Checkpointer.maybe_save, resume.Checkpointer.restore

    def dying_collect(*args, **kwargs):
        collect(*args, **kwargs)
        if claim("kill-task"):
            os._exit(1)

    def failing_save(self, done, loop):
        save(self, done, loop)
        if self.dir is not None and (self.dir / resume.STATE_FILE).exists() and claim("fail-trial"):
            raise RuntimeError("injected trial failure")

    def recording_restore(self):
        loop = restore(self)
        if loop is not None:
            (faults / f"restored-{len(list(faults.glob('restored-*')))}.json").write_text(json.dumps(loop))
        return loop

    tasks.collect, resume.Checkpointer.maybe_save, resume.Checkpointer.restore = dying_collect, failing_save, recording_restore


def _dataset_files(path: Path) -> dict[str, bytes]:
    return {str(p.relative_to(path)): p.read_bytes() for p in sorted(path.rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def faults(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Where tests arm the one-shot faults of :func:`_inject_faults`."""
    return tmp_path_factory.mktemp("faults")


@pytest.fixture(scope="module")
def local_ray(faults: Path):
    """One local Ray (2 CPUs) for the module: starting one takes ~8 s. Its workers run
    :func:`_inject_faults` (inert until a test arms a fault)."""
    os.environ["RAY_USAGE_STATS_ENABLED"] = "0"
    os.environ.pop("RAY_ADDRESS", None)
    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])  # workers cannot import this test module
    ray.init(
        num_cpus=2,
        include_dashboard=False,
        object_store_memory=512 * 2**20,
        log_to_driver=False,
        runtime_env={"worker_process_setup_hook": _inject_faults, "env_vars": {FAULTS_ENV: str(faults)}},
    )
    yield ray
    ray.shutdown()


def test_ray_collection_is_byte_identical_to_local_workers(local_ray, tmp_path: Path) -> None:
    budget = dict(episodes=60, num_envs=2, seed=3, name="cartpole", fmt="both", progress=False)
    on_ray = collect_dataset("CartPole-v1", store=tmp_path / "ray", backend="ray", workers=2, **budget)
    local = collect_dataset("CartPole-v1", store=tmp_path / "local", backend="local", workers=1, **budget)
    assert on_ray.metadata["producer"]["params"]["tasks"] == 2  # 60 episodes: two tasks of TASK_EPISODES
    assert _dataset_files(on_ray.path) == _dataset_files(local.path)
    control = collect_dataset("CartPole-v1", store=tmp_path / "control", backend="ray", workers=2, **{**budget, "seed": 4})
    assert _dataset_files(control.path) != _dataset_files(on_ray.path)  # the comparison can fail


def test_a_task_whose_worker_died_is_retried_to_the_same_bytes(local_ray, faults: Path, tmp_path: Path) -> None:
    budget = dict(episodes=60, num_envs=2, seed=3, name="cartpole", fmt="arrow", progress=False)
    (faults / "kill-task").touch()
    on_ray = collect_dataset("CartPole-v1", store=tmp_path / "ray", backend="ray", workers=2, **budget)
    assert not (faults / "kill-task").exists(), "no worker died"
    local = collect_dataset("CartPole-v1", store=tmp_path / "local", backend="local", workers=1, **budget)
    assert _dataset_files(on_ray.path) == _dataset_files(local.path)


def test_a_killed_ray_driver_leaves_no_dataset(local_ray, tmp_path: Path) -> None:
    env = {**os.environ, "RAY_ADDRESS": ray.get_runtime_context().gcs_address}  # joins this module's Ray
    kill_driver_after_its_first_task(tmp_path / "store", "backend='ray', workers=2", env)


def test_a_failed_tune_trial_resumes_from_its_saved_state(local_ray, faults: Path, tmp_path: Path) -> None:
    fixed = {"env_steps": 1024, "num_steps": 64, "num_envs": 2, "eval_every": 512, "eval_episodes": 2, "checkpoint_every": 256}
    spec = SweepSpec("ppo", env_id="CartPole-v1", fixed=fixed)
    (faults / "fail-trial").touch()
    run_sweep(spec, {}, [0], tmp_path / "sweep", backend="ray", workers=1, retries=1)
    assert not (faults / "fail-trial").exists(), "the trial did not fail"
    whole = run_trial(spec, Trial("default", {}, 0, tmp_path / "whole"))
    restored = [json.loads(path.read_text()) for path in faults.glob("restored-*.json")]
    assert len(restored) == 1 and 0 < restored[0]["updates"] < whole["gradient_updates"], "the restart began from scratch"
    resumed = json.loads((tmp_path / "sweep" / "runs" / "default" / "seed-0" / "metrics.json").read_text())
    assert {**resumed, "wall_seconds": 0} == {**whole, "wall_seconds": 0}
    assert (tmp_path / "sweep/runs/default/seed-0/model.safetensors").read_bytes() == (tmp_path / "whole/model.safetensors").read_bytes()


def test_ray_sweep_reports_every_seed(local_ray, tmp_path: Path) -> None:
    spec = SweepSpec(
        "ppo", env_id="CartPole-v1", fixed={"env_steps": 256, "num_steps": 64, "num_envs": 2, "eval_every": 256, "eval_episodes": 2}
    )
    summary = run_sweep(spec, {"learning_rate": [1e-3, 3e-4]}, [0, 1], tmp_path / "sweep", backend="ray", workers=2)
    settings = summary["settings"]
    assert set(settings) == {"learning_rate=0.001", "learning_rate=0.0003"}
    for stats in settings.values():
        assert set(stats["returns"]) == {"seed-0", "seed-1"}
        assert stats["return_ci95_low"] <= stats["return_mean"] <= stats["return_ci95_high"]
    for run in (tmp_path / "sweep" / "runs").glob("*/seed-*"):
        assert (run / "metrics.json").is_file()


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.mark.heavy  # starts a Ray cluster of its own (a CPU-minute)
def test_collection_on_a_started_cluster(tmp_path: Path) -> None:
    if ray.is_initialized():
        ray.shutdown()
    port = _free_port()
    temp_dir = tempfile.mkdtemp(prefix="rlpipe-ray-", dir="/tmp")  # Ray's socket paths must stay short
    # A HOME of its own: a ~/.ray/auth_token left by an earlier local Ray makes the head demand a token
    # and no RAY_* variables: the module's ray.init leaves RAY_AUTH_MODE=token in os.environ
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("RAY_")}, "RAY_USAGE_STATS_ENABLED": "0", "HOME": temp_dir}
    # --block keeps the head's processes under this one process group, so the test ends exactly
    # those (not every Ray process of the user, as `ray stop` would)
    log = Path(temp_dir) / "head.log"
    with log.open("w") as out:
        head = subprocess.Popen(
            [
                str(RAY_BIN),
                "start",
                "--head",
                "--block",
                "--num-cpus",
                "2",
                "--port",
                str(port),
                "--include-dashboard=false",
                "--node-ip-address",
                "127.0.0.1",
                f"--temp-dir={temp_dir}",
            ],
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        deadline = time.monotonic() + 120
        while "Ray runtime started" not in log.read_text() and head.poll() is None and time.monotonic() < deadline:
            time.sleep(0.2)
        assert "Ray runtime started" in log.read_text(), log.read_text()[-3000:]
        script = (
            "from rlpipe.commands.collect import collect_dataset; import sys; "
            "r = collect_dataset('CartPole-v1', episodes=60, num_envs=2, seed=3, name='cartpole', store=sys.argv[1], "
            "backend='ray', workers=2, progress=False); print(r.metadata['content_hash'])"
        )
        run = subprocess.run(
            [sys.executable, "-c", script, str(tmp_path / "cluster")],
            capture_output=True,
            text=True,
            env={**env, "RAY_ADDRESS": f"127.0.0.1:{port}"},
            timeout=240,
        )
        assert run.returncode == 0, run.stderr[-3000:]
    finally:
        os.killpg(head.pid, signal.SIGTERM)
        try:
            head.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(head.pid, signal.SIGKILL)
            head.wait()
        shutil.rmtree(temp_dir, ignore_errors=True)
    local = collect_dataset(
        "CartPole-v1",
        episodes=60,
        num_envs=2,
        seed=3,
        name="cartpole",
        store=tmp_path / "local",
        backend="local",
        workers=2,
        progress=False,
    )
    assert run.stdout.split()[-1] == local.metadata["content_hash"]
