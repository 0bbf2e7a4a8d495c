"""Several writers at once on this host, as a node's ranks write: the distributed checkpoint benchmark run by
``ranks`` processes that this process starts itself (no launcher needed), each saving and cold-loading its
share of ``size_bytes`` at the same moment.

It is how ``preflight`` measures concurrency in one command: a node's ranks are processes, so their writes
contend the way one process's threads do not. The processes are ``python -m ckptbench bench TARGET
--workload checkpoint`` with the environment of a launch (``RANK``, ``WORLD_SIZE``, a free loopback port);
rank 0 prints the ``ckptbench.bench.distributed/1`` document. ``run_ranks_here`` starts any command that way
(``bench --mlperf``'s subset mode). Only the processes started here are stopped, by PID, when the run fails
or is interrupted.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from ckptbench.errors import StorageIOError

#: Variables of an enclosing launch that must not leak into the ranks started here.
_LAUNCH_VARIABLES = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
                     "GROUP_RANK", "ROLE_RANK", "TORCHELASTIC_RUN_ID", "SLURM_PROCID", "SLURM_STEP_NUM_TASKS",
                     "SLURM_NTASKS", "SLURM_LOCALID")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def run_local_ranks(target: str, *, ranks: int, size_bytes: int, model: str, repeat: int, warmup: int = 1,
                    timeout_s: float = 900.0, storage_options: dict[str, str] | None = None,
                    device: str = "cpu") -> dict[str, Any]:
    """Run the distributed checkpoint benchmark with ``ranks`` processes on this host; return rank 0's document.

    ``size_bytes`` is all ranks' shares together (fully sharded: each writes about ``size_bytes / ranks``).
    Raises StorageIOError with the first rank's one-line error when the run fails."""
    argv = ["bench", target, "--workload", "checkpoint", "--model", model, "--size", f"{size_bytes}B", "--repeat",
            str(repeat), "--warmup", str(warmup), "--device", device, "--json"]
    for key, value in (storage_options or {}).items():
        argv += ["--storage-option", f"{key}={value}"]
    return run_ranks_here(argv, target=target, ranks=ranks, timeout_s=timeout_s)


def run_ranks_here(args: list[str], *, target: str, ranks: int, timeout_s: float) -> dict[str, Any]:
    """``python -m ckptbench ARGS`` as ``ranks`` processes of one launch on this host; return the JSON document
    rank 0 prints. Raises StorageIOError with the first rank's one-line error when the run fails."""
    if ranks < 2:
        raise ValueError(f"ranks {ranks} must be at least 2")
    port = str(_free_port())
    env = {k: v for k, v in os.environ.items() if k not in _LAUNCH_VARIABLES}
    env.update(OMP_NUM_THREADS=env.get("OMP_NUM_THREADS", "1"), CKPTBENCH_LOG_PROGRESS="0",
               TORCH_CPP_LOG_LEVEL="FATAL", MASTER_ADDR="127.0.0.1", MASTER_PORT=port, WORLD_SIZE=str(ranks),
               LOCAL_WORLD_SIZE=str(ranks))
    argv = [sys.executable, "-m", "ckptbench", *args]
    with tempfile.TemporaryDirectory(prefix="ckptbench-ranks-") as scratch:
        procs: list[subprocess.Popen] = []
        outputs = [Path(scratch) / f"rank{r}.out" for r in range(ranks)]
        errors = [Path(scratch) / f"rank{r}.err" for r in range(ranks)]
        try:
            for r in range(ranks):
                with outputs[r].open("w") as out, errors[r].open("w") as err:
                    procs.append(subprocess.Popen(argv, stdout=out, stderr=err, stdin=subprocess.DEVNULL,
                                                  env={**env, "RANK": str(r), "LOCAL_RANK": str(r)}))
            deadline = time.monotonic() + timeout_s
            for p in procs:
                p.wait(timeout=max(1.0, deadline - time.monotonic()))
        except BaseException:
            _stop(procs)
            raise
        codes = [p.returncode for p in procs]
        if any(codes):
            raise StorageIOError(f"{ranks} writers at once on {target} failed: {_first_error(errors, codes)}")
        try:
            return json.loads(outputs[0].read_text())
        except ValueError:
            raise StorageIOError(f"{ranks} writers at once on {target}: rank 0 printed no result") from None


def run_sample_fresh(spec: Any, target: str, *, settings: dict[str, str], timeout_s: float = 900.0) -> dict[str, Any]:
    """The single-process checkpoint benchmark ``spec`` (a ``shootout.CheckpointBenchSpec``) on the local
    directory ``target``, in a process of its own, with the writer ``settings`` (``CKPTBENCH_SAVE_*``) in its
    environment; its ``ckptbench.bench.checkpoint/1`` document. A job's rank starts fresh: the same runs in a
    process that already measured other sizes stalled its async saves about half again as long here
    (memory that earlier state_dicts and arenas left behind). StorageIOError with the child's error line."""
    import dataclasses

    env = {k: v for k, v in os.environ.items() if k not in _LAUNCH_VARIABLES}
    env.update(OMP_NUM_THREADS=env.get("OMP_NUM_THREADS", "1"), CKPTBENCH_LOG_PROGRESS="0", **settings)
    argv = [sys.executable, "-c", "from ckptbench.bench.local_ranks import sample_main; sample_main()", target,
            json.dumps(dataclasses.asdict(spec))]
    with tempfile.TemporaryDirectory(prefix="ckptbench-sample-") as scratch:
        out, err = Path(scratch) / "out", Path(scratch) / "err"
        with out.open("w") as stdout, err.open("w") as stderr:
            proc = subprocess.Popen(argv, stdout=stdout, stderr=stderr, stdin=subprocess.DEVNULL, env=env)
            try:
                proc.wait(timeout=timeout_s)
            except BaseException:
                _stop([proc])
                raise
        if proc.returncode:
            raise StorageIOError(f"the sample of {spec.size_bytes} bytes on {target} failed: "
                                 f"{_first_error([err], [proc.returncode])}")
        try:
            return json.loads(out.read_text())
        except ValueError:
            raise StorageIOError(f"the sample on {target} printed no result") from None


def sample_main() -> None:
    """The child of :func:`run_sample_fresh`: argv = TARGET SPEC_JSON; prints the document."""
    from ckptbench.bench.shootout import CheckpointBenchSpec, run_checkpoint_bench
    from ckptbench.errors import CkptbenchError
    from ckptbench.storage import resolve_target

    target, raw = sys.argv[1], json.loads(sys.argv[2])
    try:
        spec = CheckpointBenchSpec(**{**raw, "writers": tuple(raw["writers"])})
        report = run_checkpoint_bench(spec, resolve_target(target, {}))
    except CkptbenchError as exc:
        print(f"ckptbench: error: {exc}", file=sys.stderr)
        raise SystemExit(2) from None
    print(json.dumps(report.to_dict()))


def _stop(procs: list[subprocess.Popen]) -> None:
    """SIGTERM then SIGKILL the processes started here (each cleans its scratch on SIGTERM)."""
    for p in procs:
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + 10.0
    for p in procs:
        try:
            p.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


def _first_error(errors: list[Path], codes: list[int]) -> str:
    for path, code in zip(errors, codes, strict=True):
        lines = [line for line in path.read_text(errors="replace").splitlines() if line.startswith("ckptbench: error:")]
        if code and lines:
            return lines[0].removeprefix("ckptbench: error:").strip()
    return f"exit status {next(c for c in codes if c)}"
