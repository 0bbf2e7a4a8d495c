"""``ckptbench compare`` over the three tiers CI has: a local directory, CephFS (ceph-fuse) and Ceph RGW
(s3://), in one run: every tier measured and verified, the model and the S3 tier's bill, nothing left
behind on any tier, no credential in any output; and a bad last target failing before the first is
measured. Small I/O, never asserts timings."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest


def _credentials(server) -> list[str]:
    return ["--storage-option", f"key={server.key}", "--storage-option", f"secret={server.secret}"]


def _leftovers(client, bucket: str) -> tuple[list[str], list[str]]:
    keys = [o["Key"] for o in client.list_objects_v2(Bucket=bucket).get("Contents", [])]
    uploads = [u["Key"] for u in client.list_multipart_uploads(Bucket=bucket).get("Uploads", [])]
    return keys, uploads


@pytest.mark.s3
@pytest.mark.netfs
def test_local_cephfs_and_rgw_side_by_side(cli, s3_server, s3_bucket, cephfs_dir: Path, tmp_path: Path):
    local = tmp_path / "local"
    local.mkdir()
    tier = tmp_path / "rgw.toml"
    tier.write_text(
        f'url = "s3://{s3_bucket}/compare"\n'
        'notes = "Ceph RGW of the test fixture, priced like S3 Standard"\n'
        "cost_per_gib_month_usd = 0.023\ncost_per_1000_put_usd = 0.005\ncost_per_1000_get_usd = 0.0004\n"
        f'[storage_options]\nendpoint_url = "{s3_server.endpoint}"\npart_size = "5MiB"\n')
    out, png = tmp_path / "results", tmp_path / "tiers.png"
    result = cli("compare", str(local), str(cephfs_dir), str(tier), *_credentials(s3_server), "--size", "16MiB",
                 "--repeat", "1", "--warmup", "0", "--failures", "llama3", "--gpus", "1024", "--restart", "10m",
                 "--ranks", "128", "--json", "--output", str(out), "--plot", str(png))
    assert result.exit_code == 0, result.stderr
    doc = json.loads(result.stdout)
    assert [t["label"] for t in doc["tiers"]] == [str(local), str(cephfs_dir), "rgw"]
    assert [t["kind"] for t in doc["tiers"]] == ["directory", "directory", "object"]
    filesystems = [t["filesystem"] for t in doc["tiers"]]
    assert "ceph" in filesystems[1] and "ceph" not in filesystems[0] and filesystems[2] == "s3"
    for t in doc["tiers"]:
        assert t["bench"]["data_verified"] is True
        assert t["measured"]["save_gbps"] > 0 and t["measured"]["load_gbps"] > 0
        model = t["model"]
        assert model["error"] is None and model["optimal_interval_s"] > 0
        assert 0 < model["overhead_fraction"] < model["waste_fraction"] < 1
    assert doc["job"]["mtbf_s"] == pytest.approx(54 * 86400 / 419 * 16384 / 1024)
    s3 = doc["tiers"][2]
    assert s3["bench"]["environment"]["target"]["endpoint"] == s3_server.endpoint
    bill = s3["model"]["bill"]
    assert bill["complete"] is True and bill["storage_usd"] > 0 and bill["put_usd"] > 0 and bill["get_usd"] > 0
    assert bill["total_usd"] == pytest.approx(bill["storage_usd"] + bill["put_usd"] + bill["get_usd"])
    assert bill["put_requests_per_checkpoint"] > bill["objects_per_checkpoint"]  # 5 MiB parts: multipart uploads
    assert doc["tiers"][0]["model"]["bill"] is None and doc["tiers"][1]["model"]["bill"] is None
    assert set(doc["best"]) | set(doc["tied"]) >= {"save_gbps", "load_gbps", "waste_fraction"}
    assert all(w["remedy"] for w in doc["warnings"])

    assert list(local.iterdir()) == [] and list(cephfs_dir.iterdir()) == []
    assert _leftovers(s3_server.client(), s3_bucket) == ([], [])
    (saved,) = out.glob("compare-*.json")
    for text in (result.stdout, result.stderr, saved.read_text()):
        assert s3_server.secret not in text
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.s3
@pytest.mark.parametrize(("url", "endpoint", "needle"), [
    ("s3://no-such-bucket-ckptbench/x", None, "'no-such-bucket-ckptbench' does not exist"),
    ("s3://bucket/x", "http://127.0.0.1:9", "cannot reach the S3 endpoint http://127.0.0.1:9"),
])
def test_a_bad_last_target_fails_before_the_first_is_measured(cli, s3_server, tmp_path: Path, url, endpoint, needle):
    first, second = tmp_path / "a", tmp_path / "b"
    first.mkdir()
    second.mkdir()
    start = time.monotonic()
    result = cli("compare", str(first), str(second), url, "--endpoint-url", endpoint or s3_server.endpoint,
                 *_credentials(s3_server), "--size", "8MiB")
    assert result.exit_code == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and needle in lines[0] and url.split("/")[2] in lines[0]
    assert s3_server.secret not in result.stderr
    assert list(first.iterdir()) == [] and list(second.iterdir()) == []
    assert time.monotonic() - start < 30
