"""``ckptbench recommend``: settings from saved results (the reference runs in results/, read only) or a
fresh sweep, as TOML that parses and as arguments; bad files exit 2 with one line."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
FS = REPO / "results" / "bench-vm-20261126T042848.json"
CKPT = REPO / "results" / "bench-checkpoint-vm-20261126T055124.json"


def test_from_saved_results(cli):
    doc = cli.json("recommend", str(FS), str(CKPT), "--ckpt-size", "140GB", "--mtbf", "6h")
    fs = json.loads(FS.read_text())
    assert fs["results"][fs["best"]]["config"]["block_size"] != 4 * 2**20  # the sweep's best is another block
    settings = doc["settings"]
    ours = json.loads(CKPT.read_text())["results"][0]["details"]
    # The later file wins, and the writer's settings come as one configuration: threads and block size alike.
    for key, detail in (("threads", "threads"), ("block_size_bytes", "block_size_bytes"),
                        ("shard_size_bytes", "shard_size_bytes"), ("direct", "direct")):
        assert settings[key]["value"] == ours[detail] and str(CKPT) in settings[key]["reason"], key
    assert settings["async"]["value"] is True
    # the interval is computed in the mode recommended (async), inside the optimum's plateau
    assert settings["interval_s"]["value"] > 0 and "async" in settings["interval_s"]["reason"]
    assert "exact optimum" in settings["interval_s"]["reason"]
    toml = tomllib.loads(doc["toml"])
    assert toml["checkpoint"]["threads"] == settings["threads"]["value"]
    assert "interval" in toml["schedule"]
    call = next(line for line in doc["code"] if line.startswith("ckptbench.Checkpointer("))
    assert f"threads={ours['threads']}" in call and f"block_size={ours['block_size_bytes']}" in call
    assert call.endswith(".save(state_dict, path, async_=True)")
    assert any("FileSystemWriter(path, thread_count=" in line for line in doc["code"])


def test_tied_configurations_give_the_cheapest_one(cli, tmp_path: Path):
    fs = json.loads(FS.read_text())
    by_median = sorted(range(len(fs["results"])), key=lambda i: -fs["results"][i]["write"]["gbps"])
    fs["best"], fs["leaders"] = by_median[0], by_median[:3]
    path = tmp_path / "tied.json"
    path.write_text(json.dumps(fs))
    settings = cli.json("recommend", str(path))["settings"]
    cheapest = min((fs["results"][i]["config"] for i in by_median[:3]),
                   key=lambda c: (c["threads"], c["block_size"]))
    assert (settings["threads"]["value"], settings["block_size_bytes"]["value"]) == (
        cheapest["threads"], cheapest["block_size"])
    assert "3 of" in settings["threads"]["reason"] and "tie" in settings["threads"]["reason"]
    fs["leaders"] = [by_median[0]]  # a winner beyond the noise is taken as it is
    path.write_text(json.dumps(fs))
    settings = cli.json("recommend", str(path))["settings"]
    assert settings["threads"]["value"] == fs["results"][by_median[0]]["config"]["threads"]
    assert "beyond the noise" in settings["threads"]["reason"]


def test_fresh_sweep_when_no_files(cli, tmp_path: Path):
    result = cli("recommend", "--target", str(tmp_path), "--size", "8MiB")
    assert result.exit_code == 0, result.stderr
    assert "a fresh sweep of" in result.stdout and "[checkpoint]" in result.stdout
    assert list(tmp_path.iterdir()) == []


def test_the_fresh_sweep_measures_no_block_larger_than_its_files(cli, tmp_path: Path, monkeypatch):
    """As in ``bench``: 8 MiB over 4 files issues no I/O above 2 MiB, so the 4 and 16 MiB blocks of the sweep
    shrink to 2 MiB instead of being measured (and recommended) as sizes they are not."""
    from ckptbench.bench import fs

    swept = []

    def run_fs_bench(spec, storage, **kwargs):
        swept.append(spec.block_sizes)
        return real(spec, storage, **kwargs)

    real = fs.run_fs_bench
    monkeypatch.setattr(fs, "run_fs_bench", run_fs_bench)
    doc = cli.json("recommend", "--target", str(tmp_path), "--size", "8MiB")
    assert swept == [(2**20, 2 * 2**20)]
    assert doc["settings"]["block_size_bytes"]["value"] in (2**20, 2 * 2**20)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(("content", "needle"), [
    (None, "does not exist"),
    ("{nope", "not JSON"),
    ('{"a": 1}', "not a ckptbench result"),
    ('{"schema": "ckptbench.bench.fs/2"}', "version this ckptbench does not read"),
    ('{"schema": "someone.else/1"}', "unknown result schema"),
])
def test_bad_result_files(cli, tmp_path: Path, content, needle):
    path = tmp_path / "r.json"
    if content is not None:
        path.write_text(content)
    result = cli("recommend", str(FS), str(path))
    assert result.exit_code == 2
    assert len(result.stderr.strip().splitlines()) == 1 and needle in result.stderr


def test_interval_needs_size_and_rate(cli):
    result = cli("recommend", str(FS), "--ckpt-size", "10GB")
    assert result.exit_code == 2 and "go together" in result.stderr
    result = cli("recommend", str(FS), "--target", "/tmp")
    assert result.exit_code == 2 and "fresh sweep" in result.stderr


PREFLIGHT = REPO / "results" / "preflight-vm-20261126T071318.json"
DISTRIBUTED = REPO / "results" / "bench-distributed-vm-20261126T110824.json"


def _one_error_line(result, path: Path | None = None) -> str:
    assert result.exit_code == 2, (result.stdout, result.stderr)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("ckptbench: error: "), result.stderr
    assert path is None or path.name in lines[0], result.stderr
    return lines[0]


@pytest.mark.parametrize(("content", "needle"), [
    ('{"schema": "ckptbench.bench.fs/1"}', "not a well-formed ckptbench.bench.fs/1 document (no 'results')"),
    ('{"schema": "ckptbench.preflight/1", "x": Infinity}', "not JSON (Infinity is not a JSON number)"),
    ("[" * 100_000 + "]" * 100_000, "JSON nested too deeply to read"),
], ids=["no-results", "infinity", "deeply-nested"])
def test_malformed_results_are_one_line(cli, tmp_path: Path, content, needle):
    path = tmp_path / "r.json"
    path.write_text(content)
    assert needle in _one_error_line(cli("recommend", str(path)), path)


def _paths(value, prefix=()):
    """Every key/index path into a JSON value (the first two items of each list)."""
    if isinstance(value, dict):
        for key, item in value.items():
            yield (*prefix, key)
            yield from _paths(item, (*prefix, key))
    elif isinstance(value, list):
        for index, item in enumerate(value[:2]):
            yield (*prefix, index)
            yield from _paths(item, (*prefix, index))


MUTATIONS = {"delete": ..., "null": None, "text": "x", "negative": -1, "zero": 0, "huge": 10**400, "empty-list": []}


@pytest.mark.parametrize("source", [FS, CKPT, PREFLIGHT, DISTRIBUTED], ids=lambda p: p.name.split("-20")[0])
def test_single_field_mutations_never_give_a_traceback(cli, tmp_path: Path, source: Path):
    """Every field the advice reads, mutated one at a time: good advice (0) or one line naming the file (2)."""
    original = json.loads(source.read_text())
    paths = [p for p in _paths(original) if p[0] not in ("environment", "argv", "rounds", "schema")]
    path = tmp_path / "mutated.json"
    for where in paths[::max(1, len(paths) // 60)]:
        for name, value in MUTATIONS.items():
            document = json.loads(source.read_text())
            parent = document
            for key in where[:-1]:
                parent = parent[key]
            if value is ...:
                del parent[where[-1]]
            else:
                parent[where[-1]] = value
            path.write_text(json.dumps(document))
            result = cli("recommend", str(path), "--ckpt-size", "10GB", "--mtbf", "6h")
            assert result.exit_code in (0, 2) and "Traceback" not in result.stderr, (where, name, result.stderr)
            if result.exit_code == 2:
                _one_error_line(result)  # the file's name, or "no write rate in these results"


def test_distributed_results_give_async_and_interval(cli):
    doc = cli.json("recommend", str(DISTRIBUTED), "--ckpt-size", "10GB", "--mtbf", "6h")
    summary = json.loads(DISTRIBUTED.read_text())["summary"]
    assert doc["settings"]["async"]["value"] is True  # a 120 ms stall against a 666 ms sync save
    assert "2 ranks blocked" in doc["settings"]["async"]["reason"]
    assert f"{summary['save']['gbps']['median']:.2f} GB/s" in doc["settings"]["interval_s"]["reason"]


def test_help_examples_name_files_that_exist(cli):
    text = cli("recommend", "--help").stdout
    named = [word for word in text.split() if word.startswith("results/")]
    assert named and all((REPO / word).exists() for word in named)


def test_a_network_mount_result_gives_its_faster_durable_mode_and_why(cli, tmp_path: Path):
    fs = json.loads(FS.read_text())
    for row in fs["results"]:  # as bench writes it on a FUSE mount where buffered + fdatasync won
        row["config"].update(direct=False, direct_fallback_reason=None)
        row["durable_modes"] = {"write_direct": False, "write_reason": "buffered + fdatasync faster beyond the noise"}
    path = tmp_path / "cephfs.json"
    path.write_text(json.dumps(fs))
    direct = cli.json("recommend", str(path))["settings"]["direct"]
    assert direct["value"] is False
    assert direct["reason"].endswith("buffered + fdatasync faster beyond the noise") and "unavailable" not in direct["reason"]


def _fake_tool(directory: Path, name: str, output: str) -> None:
    script = directory / name
    script.write_text(f"#!/bin/sh\ncat <<'OUT'\n{output}\nOUT\n")
    script.chmod(0o755)


@pytest.mark.parametrize(("stripe_count", "needle"), [
    (1, "striped over 1 target, fewer than the {threads} writer streams"),
    (-1, "striped over every target, as many or more than the {threads} writer streams"),
    (None, "Lustre: lfs not found on PATH: the layout is unknown"),
])
def test_a_lustre_result_says_what_its_stripes_imply_for_the_threads_advised(cli, tmp_path: Path, monkeypatch,
                                                                            stripe_count, needle):
    """The layout bench read (fake ``lfs`` on PATH, as no Lustre is mounted here), judged against the
    threads recommend advises rather than the most bench ran."""
    from ckptbench.bench.layout import layout_notes

    tools = tmp_path / "bin"
    tools.mkdir()
    if stripe_count is not None:
        _fake_tool(tools, "lfs", f"stripe_count:  {stripe_count} stripe_size:   1048576")
    monkeypatch.setenv("PATH", f"{tools}:/usr/bin:/bin" if stripe_count is not None else str(tools))
    fs = json.loads(FS.read_text())
    fs["best"] = next(i for i, r in enumerate(fs["results"]) if r["config"]["threads"] == 4)
    fs["leaders"] = [fs["best"]]  # 4 threads advised: more than one stripe, fewer than the 16 streams bench ran
    fs["environment"]["layout"] = layout_notes(tmp_path, "lustre", "rw", streams=16)
    path = tmp_path / "lustre.json"
    path.write_text(json.dumps(fs))
    monkeypatch.undo()  # recommend runs no tool: it reads what bench wrote
    doc = cli.json("recommend", str(path))
    threads = doc["settings"]["threads"]["value"]
    assert threads == 4 and len(doc["notes"]) == 1
    assert doc["notes"][0].startswith(f"{path}: ") and needle.format(threads=threads) in doc["notes"][0]
    if stripe_count == 1:
        assert f"lfs setstripe -c {threads}" in doc["notes"][0]
    shown = cli("recommend", str(path)).output
    assert "# the filesystem's layout" in shown and needle.format(threads=threads)[:30] in shown


def test_no_layout_no_notes(cli):
    assert cli.json("recommend", str(FS))["notes"] == []


def test_a_checkpoint_result_on_object_storage_recommends_no_filesystem_settings(cli, tmp_path: Path):
    """O_DIRECT and the block size are a filesystem's: from a writer shoot-out on an object store (memory://
    here, as s3://) recommend names neither, and its snippet passes neither."""
    cli("bench", "memory://rec", "--workload", "checkpoint", "--size", "4MiB", "--repeat", "1", "--warmup", "0",
        "--output", str(tmp_path))
    [result] = tmp_path.glob("bench-checkpoint-*.json")
    doc = cli.json("recommend", str(result))
    assert "threads" in doc["settings"] and "shard_size_bytes" in doc["settings"]
    assert "direct" not in doc["settings"] and "block_size_bytes" not in doc["settings"]
    assert "direct" not in doc["code"] and "block_size" not in doc["code"]
