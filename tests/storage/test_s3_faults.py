"""Object-store faults against the real server (Ceph RGW) through a fault-injecting proxy
(tests/servers/faultproxy.py): 503 SlowDown / 500, connection resets mid-part, stalls, and the server
stopped mid-upload and restarted. Each save either succeeds (and loads bit-exact) or fails cleanly:
one-line ckptbench error, no manifest, no multipart upload left, no shard object left, the previous
checkpoint intact. What is left on the server is always checked with a direct client, not through
the proxy."""

from __future__ import annotations

import random
import time
from collections import Counter
from dataclasses import dataclass
from typing import Any

import faultproxy  # tests/servers, put on the path by conftest.py
import numpy as np
import pytest
import torch

import ckptbench
from ckptbench.checkpoint.manifest import MANIFEST_NAME
from ckptbench.errors import CkptbenchError

pytestmark = pytest.mark.s3

SHARD_BYTES = 12 * 2**20  # the state below: 2 shards, 12 MiB (3 parts) and 8 MiB (2 parts)
PARTS = 5


@pytest.fixture
def proxy(fault_proxy) -> Any:
    return fault_proxy


def state(seed: int) -> dict[str, torch.Tensor]:
    """~20 MiB of random bytes in two big tensors (multipart uploads) and a small one."""
    rng = np.random.default_rng(seed)
    return {"a": torch.from_numpy(rng.integers(0, 2**31, size=3 * 2**20, dtype=np.int32)),
            "b": torch.from_numpy(rng.standard_normal(2**20)),  # float64, 8 MiB
            "step": torch.tensor(seed)}


def assert_bit_exact(loaded: dict, expected: dict) -> None:
    assert sorted(loaded) == sorted(expected)
    for key, tensor in expected.items():
        assert loaded[key].dtype == tensor.dtype and loaded[key].shape == tensor.shape, key
        assert torch.equal(loaded[key].reshape(-1).view(torch.uint8), tensor.reshape(-1).view(torch.uint8)), key


def save(state_dict: dict, url: str, options: dict, **kwargs: Any) -> Any:
    return ckptbench.save(state_dict, url, shard_size=SHARD_BYTES, storage_options=options, **kwargs)


def through(proxy: Any, s3_server: Any, **extra: Any) -> dict[str, Any]:
    """storage_options that reach the server through the proxy: 5 MiB parts, 2 in flight by default."""
    return s3_server.options(**{"endpoint_url": proxy.endpoint, "part_size": "5MiB", "max_concurrency": 2, **extra})


def leftovers(s3_server: Any, bucket: str, prefix: str = "ckpt/") -> tuple[list, list[str]]:
    """(multipart uploads in progress, object keys under ``prefix``), asked directly of the server."""
    client = s3_server.client()
    uploads = client.list_multipart_uploads(Bucket=bucket).get("Uploads", [])
    keys = [item["Key"] for item in client.list_objects_v2(Bucket=bucket, Prefix=prefix).get("Contents", [])]
    return uploads, sorted(keys)


def manifest_bytes(s3_server: Any, bucket: str) -> bytes | None:
    client = s3_server.client()
    try:
        return client.get_object(Bucket=bucket, Key=f"ckpt/{MANIFEST_NAME}")["Body"].read()
    except client.exceptions.NoSuchKey:
        return None


def one_line(exc: BaseException) -> str:
    assert isinstance(exc, CkptbenchError), repr(exc)
    text = str(exc)
    assert "\n" not in text, text
    return text


def attempts_per_part(proxy: Any) -> Counter[tuple[str, int]]:
    return Counter((r.path, r.part_number) for r in proxy.requests if r.kind == "UploadPart")


# -- faults that retries absorb -------------------------------------------------------------------


def _client(client: str) -> str:
    if client == "crt":
        pytest.importorskip("awscrt")
    return client


@pytest.mark.parametrize("client", ["boto3", "crt"])
@pytest.mark.parametrize("status", [503, 500])
def test_transient_errors_on_part_uploads_are_retried(s3_server, s3_bucket, proxy, status, client):
    url, expected = f"s3://{s3_bucket}/ckpt", state(1)
    proxy.fail(3, status=status, kind="UploadPart")
    save(expected, url, through(proxy, s3_server, max_attempts=5, client=_client(client)))
    assert proxy.injected("status", "UploadPart") == 3
    assert proxy.count("UploadPart", "passed") == PARTS
    assert max(attempts_per_part(proxy).values()) >= 2  # a part was retried, not re-planned
    assert_bit_exact(ckptbench.load(url, storage_options=s3_server.options()), expected)
    uploads, keys = leftovers(s3_server, s3_bucket)
    assert uploads == [] and f"ckpt/{MANIFEST_NAME}" in keys and len(keys) == 3


@pytest.mark.parametrize("client", ["boto3", "crt"])
def test_connection_resets_mid_part_are_retried(s3_server, s3_bucket, proxy, client):
    url, expected = f"s3://{s3_bucket}/ckpt", state(2)
    proxy.reset(2, after_bytes=2 * 2**20, kind="UploadPart")  # RST 2 MiB into a 5 MiB part, twice
    save(expected, url, through(proxy, s3_server, max_attempts=5, client=_client(client)))
    assert proxy.injected("reset", "UploadPart") == 2
    assert proxy.count("UploadPart", "passed") == PARTS
    assert_bit_exact(ckptbench.load(url, storage_options=s3_server.options()), expected)
    assert leftovers(s3_server, s3_bucket)[0] == []


def test_stalled_part_hits_the_read_timeout_and_is_retried(s3_server, s3_bucket, proxy):
    url, expected = f"s3://{s3_bucket}/ckpt", state(3)
    proxy.stall(1, kind="UploadPart")
    started = time.monotonic()
    save(expected, url, through(proxy, s3_server, max_attempts=5, read_timeout_s=2))
    assert time.monotonic() - started < 15
    assert proxy.injected("stall", "UploadPart") == 1
    assert proxy.count("UploadPart", "passed") == PARTS
    assert_bit_exact(ckptbench.load(url, storage_options=s3_server.options()), expected)
    assert leftovers(s3_server, s3_bucket)[0] == []


def test_a_completion_awaiting_its_answer_holds_no_part_upload_back(s3_server, s3_bucket, proxy):
    """One upload in flight: while the first object's CompleteMultipartUpload goes unanswered (until the
    read timeout, then it is retried), the second object's parts are uploaded, not after it."""
    url, expected = f"s3://{s3_bucket}/ckpt", state(5)
    proxy.stall(1, kind="CompleteMultipartUpload")
    save(expected, url, through(proxy, s3_server, max_concurrency=1, read_timeout_s=2))
    seen = [(r.kind, r.path, r.outcome) for r in proxy.requests
            if r.kind in ("UploadPart", "CompleteMultipartUpload")]
    stalled = next(i for i, (_, _, outcome) in enumerate(seen) if outcome == "stall")
    retried = next(i for i, (kind, path, _) in enumerate(seen)
                   if i > stalled and kind == "CompleteMultipartUpload" and path == seen[stalled][1])
    other = [path for kind, path, _ in seen[:retried] if kind == "UploadPart" and path != seen[stalled][1]]
    assert len(other) == 2, seen  # the other object's parts, all before the retried completion
    assert_bit_exact(ckptbench.load(url, storage_options=s3_server.options()), expected)
    assert leftovers(s3_server, s3_bucket)[0] == []


def test_slowdown_on_manifest_and_completion_is_retried(s3_server, s3_bucket, proxy):
    url, expected = f"s3://{s3_bucket}/ckpt", state(4)
    proxy.fail(1, status=503, kind="CompleteMultipartUpload")
    proxy.fail(2, status=503, kind="PutObject", path=MANIFEST_NAME)
    save(expected, url, through(proxy, s3_server, max_attempts=5))
    assert proxy.injected("status") == 3
    assert_bit_exact(ckptbench.load(url, storage_options=s3_server.options()), expected)
    assert leftovers(s3_server, s3_bucket)[0] == []


def test_server_restarted_within_the_retry_budget(s3_server, s3_bucket, proxy):
    """The server stops while parts are in flight and is back 1.5 s later: retries carry the save."""
    url, expected = f"s3://{s3_bucket}/ckpt", state(5)
    proxy.down_on(kind="UploadPart", skip=2, for_s=1.5)
    save(expected, url, through(proxy, s3_server, max_attempts=8))
    assert proxy.downs == 1 and not proxy.is_down
    # A part in flight when the server went away may have reached it with its answer lost: sent again.
    assert proxy.count("UploadPart", "passed") >= PARTS
    assert_bit_exact(ckptbench.load(url, storage_options=s3_server.options()), expected)
    uploads, keys = leftovers(s3_server, s3_bucket)
    assert uploads == [] and len(keys) == 3


# -- faults that outlast the retries: a clean failure -----------------------------------------------


@pytest.mark.parametrize("fault", ["slowdown", "reset"])
def test_persistent_fault_fails_cleanly(s3_server, s3_bucket, proxy, fault):
    url = f"s3://{s3_bucket}/ckpt"
    if fault == "slowdown":
        proxy.fail(None, status=503, kind="UploadPart")
    else:
        proxy.reset(None, after_bytes=2**20, kind="UploadPart")
    started = time.monotonic()
    with pytest.raises(CkptbenchError) as info:
        save(state(6), url, through(proxy, s3_server, max_attempts=2))
    assert time.monotonic() - started < 20
    text = one_line(info.value)
    assert url in text
    if fault == "slowdown":
        assert "SlowDown" in text
    assert max(attempts_per_part(proxy).values()) >= 2  # retried up to max_attempts, then gave up
    assert proxy.count("UploadPart", "passed") == 0
    assert proxy.count("AbortMultipartUpload", "passed") >= 1
    assert leftovers(s3_server, s3_bucket) == ([], [])


def test_max_attempts_counts_the_first_try(s3_server, s3_bucket, proxy):
    proxy.fail(None, status=503, kind="PutObject")
    with pytest.raises(CkptbenchError):
        ckptbench.save({"x": torch.ones(16)}, f"s3://{s3_bucket}/ckpt",
                       storage_options=through(proxy, s3_server, max_attempts=2))
    shards = Counter(r.path for r in proxy.requests if r.kind == "PutObject")
    assert list(shards.values()) == [2]


def test_failed_overwrite_keeps_the_previous_checkpoint(s3_server, s3_bucket, proxy):
    url, previous = f"s3://{s3_bucket}/ckpt", state(7)
    save(previous, url, through(proxy, s3_server))
    committed, (_, committed_keys) = manifest_bytes(s3_server, s3_bucket), leftovers(s3_server, s3_bucket)
    # one part at a time: the first shard's 3 parts land and its object is completed, then every
    # part upload of the second shard gets 503 (so the failed save must delete a completed object)
    proxy.fail(None, status=503, kind="UploadPart", skip=3)
    with pytest.raises(CkptbenchError) as info:
        save(state(8), url, through(proxy, s3_server, max_attempts=2, max_concurrency=1), overwrite=True)
    assert url in one_line(info.value)
    assert proxy.count("UploadPart", "passed") == PARTS + 3
    assert proxy.count("CompleteMultipartUpload", "passed") == 2 + 1
    assert manifest_bytes(s3_server, s3_bucket) == committed
    assert leftovers(s3_server, s3_bucket) == ([], committed_keys)
    assert_bit_exact(ckptbench.load(url, storage_options=s3_server.options()), previous)


# -- the commit (manifest PUT) fails --------------------------------------------------------------


def failed_commit(s3_server: Any, bucket: str, proxy: Any) -> tuple[dict, list[str]]:
    """Save one checkpoint, then overwrite it while every manifest PUT gets 503 (never stored).
    Returns (previous state, keys of the previous checkpoint)."""
    url, previous = f"s3://{bucket}/ckpt", state(12)
    save(previous, url, through(proxy, s3_server))
    _, committed_keys = leftovers(s3_server, bucket)
    proxy.fail(None, status=503, kind="PutObject", path=MANIFEST_NAME)
    with pytest.raises(CkptbenchError) as info:
        save(state(13), url, through(proxy, s3_server, max_attempts=2), overwrite=True)
    assert url in one_line(info.value) and "SlowDown" in str(info.value)
    return previous, committed_keys


def test_failed_commit_keeps_the_previous_checkpoint(s3_server, s3_bucket, proxy):
    previous, _ = failed_commit(s3_server, s3_bucket, proxy)
    assert manifest_bytes(s3_server, s3_bucket) is not None
    assert_bit_exact(ckptbench.load(f"s3://{s3_bucket}/ckpt", storage_options=s3_server.options()), previous)
    assert leftovers(s3_server, s3_bucket)[0] == []


def test_failed_commit_removes_the_new_shards(s3_server, s3_bucket, proxy):
    _, committed_keys = failed_commit(s3_server, s3_bucket, proxy)
    assert leftovers(s3_server, s3_bucket) == ([], committed_keys)


def test_ambiguous_commit_never_leaves_a_broken_checkpoint(s3_server, s3_bucket, proxy):
    """The manifest PUT reaches the server but its answer never comes back (reset after the whole
    body): the outcome is unknown to the client. Whether the save reports success or a one-line
    failure, the location then holds a complete checkpoint, the previous or the new one, never a
    manifest without its shards (a fix for the test above must not delete shards in this case)."""
    url, previous, new = f"s3://{s3_bucket}/ckpt", state(14), state(15)
    save(previous, url, through(proxy, s3_server))
    proxy.reset(None, after_bytes=2**30, kind="PutObject", path=MANIFEST_NAME)
    try:
        save(new, url, through(proxy, s3_server, max_attempts=2), overwrite=True)
        failed = False
    except CkptbenchError as exc:
        assert url in one_line(exc)
        failed = True
    assert proxy.injected("reset", "PutObject") >= 1
    loaded = ckptbench.load(url, storage_options=s3_server.options())
    assert int(loaded["step"]) == 15 or failed  # a reported success means the new one is committed
    assert_bit_exact(loaded, new if int(loaded["step"]) == 15 else previous)
    assert leftovers(s3_server, s3_bucket)[0] == []


# -- the server stops mid-upload and stays down past the retries -------------------------------------


def fail_by_outage(s3_server: Any, bucket: str, proxy: Any) -> tuple[dict, dict, bytes, str]:
    """Save a checkpoint, then overwrite it while the server stops after 2 parts went through.
    Returns (previous state, options, committed manifest, the one-line error), the proxy still down."""
    url, previous = f"s3://{bucket}/ckpt", state(9)
    options = through(proxy, s3_server, max_attempts=2, connect_timeout_s=1)
    save(previous, url, options)
    committed = manifest_bytes(s3_server, bucket)
    proxy.down_on(kind="UploadPart", skip=2)
    started = time.monotonic()
    with pytest.raises(CkptbenchError) as info:
        save(state(10), url, options, overwrite=True)
    assert time.monotonic() - started < 15  # retries with backoff, then give up: no hang
    assert proxy.is_down and proxy.downs == 1
    return previous, options, committed, one_line(info.value)


def test_server_down_mid_upload_fails_in_bounded_time_then_recovers(s3_server, s3_bucket, proxy):
    """The save fails in bounded time with one line; meanwhile the committed checkpoint is untouched
    (read directly, not through the proxy); once the server is back, the next save succeeds."""
    url, latest = f"s3://{s3_bucket}/ckpt", state(11)
    previous, options, committed, text = fail_by_outage(s3_server, s3_bucket, proxy)
    assert proxy.endpoint in text
    assert manifest_bytes(s3_server, s3_bucket) == committed
    assert_bit_exact(ckptbench.load(url, storage_options=s3_server.options()), previous)
    proxy.up()
    save(latest, url, options, overwrite=True)
    assert_bit_exact(ckptbench.load(url, storage_options=options), latest)
    assert_bit_exact(ckptbench.load(url, storage_options=s3_server.options()), latest)
    assert len(leftovers(s3_server, s3_bucket)[1]) == 3  # the new shards and manifest: stale ones swept


def test_uploads_orphaned_by_an_outage_are_aborted_by_the_next_save(s3_server, s3_bucket, proxy):
    _, options, _, _ = fail_by_outage(s3_server, s3_bucket, proxy)
    proxy.up()
    save(state(11), f"s3://{s3_bucket}/ckpt", options, overwrite=True)
    assert leftovers(s3_server, s3_bucket)[0] == []


def test_outage_error_names_the_checkpoint(s3_server, s3_bucket, proxy):
    _, _, _, text = fail_by_outage(s3_server, s3_bucket, proxy)
    assert f"s3://{s3_bucket}/ckpt" in text


def test_a_put_whose_answer_is_lost_is_an_unknown_outcome_and_a_refused_one_is_not(s3_server, s3_bucket, proxy):
    """The store tells the two apart, attempt by attempt: the commit may only remove a save's shards
    after a write the server refused (or never received)."""
    from ckptbench.errors import OutcomeUnknownError, StorageIOError
    from ckptbench.storage.store import open_store

    store = open_store(f"s3://{s3_bucket}/probe", through(proxy, s3_server, max_attempts=2))
    proxy.reset(None, after_bytes=2**30, kind="PutObject", path="lost.json")
    with pytest.raises(OutcomeUnknownError, match="may have been stored"):
        store.put_atomic("lost.json", b"{}")
    proxy.fail(None, status=503, kind="PutObject", path="refused.json")
    with pytest.raises(StorageIOError) as info:
        store.put_atomic("refused.json", b"{}")
    assert not isinstance(info.value, OutcomeUnknownError) and "SlowDown" in str(info.value)
    proxy.reset(1, after_bytes=2**30, kind="PutObject", path="retried.json")  # lost once, then refused
    proxy.fail(None, status=503, kind="PutObject", path="retried.json")
    with pytest.raises(OutcomeUnknownError):
        store.put_atomic("retried.json", b"{}")
    store.put_atomic("fine.json", b"{}")  # and the next write starts afresh


# -- throttling ------------------------------------------------------------------------------------


@dataclass
class Sometimes(faultproxy.Rule):
    """A rule hitting a seeded random ``fraction`` of the requests it matches (for as long as it stays)."""

    fraction: float = 0.2
    seed: int = 0

    def __post_init__(self) -> None:
        super().__post_init__()
        self._random = random.Random(self.seed)

    def matches(self, request: Any) -> bool:
        return super().matches(request) and self._random.random() < self.fraction


@pytest.mark.parametrize("client", ["boto3", "s3fs", "crt"])
def test_a_save_under_20_percent_slowdown_completes_bit_exact_and_leaves_no_uploads(s3_server, s3_bucket, proxy,
                                                                                  client):
    """503 SlowDown on a fifth of the data path's requests (part uploads, their start and completion):
    retried with backoff, the save completes, loads bit-exact, and no multipart upload stays open."""
    if client != "boto3":
        pytest.importorskip({"s3fs": "s3fs", "crt": "awscrt"}[client])
    url, expected = f"s3://{s3_bucket}/ckpt", state(7)
    for kind in ("UploadPart", "CreateMultipartUpload", "CompleteMultipartUpload"):
        proxy.add(Sometimes("status", None, kind=kind, status=503, fraction=0.2, seed=len(kind)))
    save(expected, url, through(proxy, s3_server, client=client, max_concurrency=4))
    assert proxy.injected("status") >= 1  # throttled requests there were, and they were retried
    assert_bit_exact(ckptbench.load(url, storage_options=s3_server.options()), expected)
    uploads, keys = leftovers(s3_server, s3_bucket)
    assert uploads == [] and f"ckpt/{MANIFEST_NAME}" in keys


@pytest.mark.parametrize("client", ["boto3", "s3fs", "crt"])
def test_throttling_brings_the_requests_in_flight_down_and_is_counted(s3_server, s3_bucket, proxy, client):
    """SlowDown answers reach the store's AIMD controller (its limit comes down from the configured
    concurrency) and its counts: each throttled answer, each retry, and (boto3 and the CRT, whose
    requests are followed one by one) the seconds they cost."""
    if client != "boto3":
        pytest.importorskip({"s3fs": "s3fs", "crt": "awscrt"}[client])
    from ckptbench.storage.s3_pacing import totals
    from ckptbench.storage.store import open_store

    url, expected = f"s3://{s3_bucket}/ckpt", state(8)
    options = through(proxy, s3_server, max_concurrency=4, client=client)
    pacing = open_store(url, options).pacing
    before, decreases = totals(), pacing.decreases
    proxy.fail(3, status=503, kind="UploadPart")
    save(expected, url, options)
    counted = totals().minus(before)
    assert proxy.injected("status", "UploadPart") == 3
    assert counted.throttled == 3 and counted.retries >= 3
    assert counted.retry_s > 0 or client == "s3fs"
    assert counted.requests >= (2 if client == "s3fs" else PARTS)  # s3fs: an object per request it is given
    assert pacing.decreases > decreases and pacing.lowest < 4
    assert_bit_exact(ckptbench.load(url, storage_options=s3_server.options()), expected)


def test_the_crt_reaches_each_endpoint_it_is_given(s3_server, s3_bucket, proxy):
    """Two endpoints on one host (the server, the proxy in front of it), the same settings otherwise:
    each save reaches the endpoint its options name (a CRT client pools connections per host name,
    port left out, so each endpoint needs its own)."""
    url, expected = f"s3://{s3_bucket}/ckpt", state(11)
    save(expected, url, s3_server.options(part_size="5MiB", max_concurrency=2, client=_client("crt")))
    assert proxy.count("UploadPart", "passed") == 0
    save(expected, url, through(proxy, s3_server, client="crt"), overwrite=True)
    assert proxy.count("UploadPart", "passed") == PARTS


def test_throttled_ranged_reads_through_the_crt_are_paced_retried_and_counted(s3_server, s3_bucket, proxy):
    """The CRT's ranged GETs: a SlowDown brings the controller down and is retried by ckptbench (the CRT
    client has no retries of its own), and the load is bit-exact."""
    from ckptbench.storage.s3_pacing import totals
    from ckptbench.storage.store import open_store

    url, expected = f"s3://{s3_bucket}/ckpt", state(10)
    options = through(proxy, s3_server, max_concurrency=4, client=_client("crt"))
    save(expected, url, options)
    pacing = open_store(url, options).pacing
    before, decreases = totals(), pacing.decreases
    shard = next(key for key in leftovers(s3_server, s3_bucket)[1] if not key.endswith(MANIFEST_NAME))
    proxy.fail(2, status=503, kind="GetObject", path=shard)  # ranged GETs of a shard, not the manifest's GET
    loaded = ckptbench.load(url, storage_options=options)
    counted = totals().minus(before)
    assert proxy.injected("status", "GetObject") == 2
    assert counted.throttled == 2 and counted.retries >= 2 and counted.retry_s > 0
    assert pacing.decreases > decreases
    assert_bit_exact(loaded, expected)


def test_without_adaptive_concurrency_throttling_is_still_retried_and_counted(s3_server, s3_bucket, proxy):
    from ckptbench.storage.s3_pacing import totals
    from ckptbench.storage.store import open_store

    url = f"s3://{s3_bucket}/ckpt"
    options = through(proxy, s3_server, adaptive_concurrency=False)
    assert open_store(url, options).pacing is None
    before = totals()
    proxy.fail(2, status=503, kind="UploadPart")
    save(state(9), url, options)
    assert totals().minus(before).throttled == 2
