"""Pre-flight verdicts from measurements (pure): each check flips where its threshold says."""

from __future__ import annotations

import dataclasses

import pytest

from ckptbench.decide.verdict import BORDERLINE, FAIL, PASS, WARN, Job, Measurements, evaluate, interference_fraction
from ckptbench.errors import UsageError
from ckptbench.model.failures import FailureModel
from ckptbench.model.interference import ASSUMED
from ckptbench.model.sizing import Parallelism, TrainingRecipe, checkpoint_size

GB = 1e9


def job(**kw) -> Job:
    base = dict(size=checkpoint_size(1e9, TrainingRecipe(), Parallelism(dp=8)), model_name="1B", ranks=8,
                ranks_per_node=8, failures=FailureModel(24 * 3600.0, source="test"))
    return Job(**{**base, **kw})


def measured(**kw) -> Measurements:
    base = dict(measured_bytes=2**30, write_bps=2 * GB, read_bps=3 * GB, stall_s=0.1, persist_s=0.6,
                interference=0.0, memcpy_bps=10 * GB, shared_storage=False, free_bytes=10**12,
                host_memory_bytes=512 * 2**30, threads=4, direct=True, shape="job")
    return Measurements(**{**base, **kw})


def status(verdict, name: str) -> str:
    return next(c.status for c in verdict.checks if c.name == name)


def test_a_healthy_job_passes():
    v = evaluate(job(), measured())
    assert v.verdict == PASS and v.exit_code == 0
    p = v.predictions
    assert p["checkpoint_per_node_bytes"] == 14 * 10**9  # dp rank 0 writes everything without sharding
    assert p["sync_checkpoint_s"] == pytest.approx(7.0)
    assert p["restore_s"] == pytest.approx(14e9 / 3e9)
    assert 0 < p["waste_fraction"] < 0.05 and p["goodput"] == pytest.approx(1 - p["waste_fraction"])


def test_node_bytes_follow_sharding():
    sharded = job(size=checkpoint_size(1e9, TrainingRecipe(), Parallelism(dp=16, sharding="zero3")), ranks=16)
    # zero3 splits everything over 16 ranks; a node holds 8 of them: half the checkpoint.
    assert sharded.node_bytes == pytest.approx(7e9, rel=1e-6)


def test_slow_storage_fails_checkpoint_time_and_async_can_rescue_it():
    slow = measured(write_bps=0.5 * GB)  # 28 s sync
    v = evaluate(job(), slow)
    assert v.predictions["mode"] == "async"  # a 1.4 s stall beats a 28 s block
    assert status(v, "checkpoint-time") == PASS
    v = evaluate(job(max_ckpt_time_s=1.0), slow)
    assert status(v, "checkpoint-time") == FAIL and v.exit_code == 1


def test_interference_can_make_sync_the_better_choice():
    v = evaluate(job(interference=0.99), measured())
    assert v.predictions["mode"] == "sync"
    assert next(a for a in v.recommendation if a.setting == "async").value is False


def test_a_given_interval_is_checked_against_max_overhead():
    v = evaluate(job(interval_s=60.0), measured())  # 7 s (or the stall) every minute
    assert v.predictions["interval_s"] == 60.0 and not v.predictions["interval_is_optimal"]
    assert v.predictions["overhead_fraction"] == pytest.approx(v.predictions["blocking_s"] / 60)
    assert status(v, "overhead") == (FAIL if v.predictions["overhead_fraction"] > 0.02 else PASS)
    assert status(evaluate(job(interval_s=60.0, max_overhead=0.5), measured()), "overhead") == PASS


def test_free_space_memory_and_cache_checks():
    assert status(evaluate(job(), measured(free_bytes=10**9)), "free-space") == FAIL
    object_store = evaluate(job(), measured(free_bytes=None, shared_storage=True))
    assert status(object_store, "free-space") == PASS
    assert status(evaluate(job(), measured(host_memory_bytes=20 * 10**9)), "host-memory") == WARN
    assert status(evaluate(job(), measured(host_memory_bytes=10 * 10**9)), "host-memory") == FAIL
    cached = evaluate(job(), measured(read_bps=9.5 * GB))
    assert status(cached, "read-bandwidth-sanity") == WARN and cached.verdict == WARN and cached.exit_code == 0


def test_restore_against_the_failure_rate():
    assert status(evaluate(job(failures=FailureModel(600.0)), measured(read_bps=0.1 * GB)), "restore") == FAIL


def test_aggregate_bandwidth_caps_shared_storage():
    big = job(ranks=64, size=checkpoint_size(1e9, TrainingRecipe(), Parallelism(dp=64, sharding="zero3")),
              aggregate_bps=1 * GB)
    v = evaluate(big, measured(shared_storage=True))
    assert v.predictions["sync_checkpoint_s"] == pytest.approx(14.0)  # 14 GB total at 1 GB/s
    assert all("--aggregate-bandwidth" not in a for a in v.assumptions)
    uncapped = evaluate(dataclasses.replace(big, aggregate_bps=None), measured(shared_storage=True))
    assert any("--aggregate-bandwidth" in a for a in uncapped.assumptions)


def test_interference_fraction():
    assert interference_fraction(None) is None
    assert interference_fraction(-0.1) == 0.0
    assert interference_fraction(1.0) == pytest.approx(0.5)  # twice as slow: half the throughput lost
    assert interference_fraction(1e6) == 0.99


@pytest.mark.parametrize(("kw", "needle"), [
    ({"ranks": 12}, "not a multiple"), ({"max_overhead": 0.0}, "between 0 and 100"), ({"retain": 0}, "at least 1"),
])
def test_bad_jobs(kw, needle):
    with pytest.raises(UsageError, match=needle):
        job(**kw)


def remedy(verdict, name: str) -> str:
    return next(c.remedy for c in verdict.checks if c.name == name)


def sharded_job(sharding: str, **kw) -> Job:
    """64 ranks on 8 nodes: sharding changes what the busiest node writes."""
    return job(size=checkpoint_size(1e9, TrainingRecipe(), Parallelism(dp=64, sharding=sharding)), ranks=64, **kw)


@pytest.mark.parametrize(("sharding", "suggested"), [
    ("none", "--sharding zero1/zero3"), ("zero1", "--sharding zero3"), ("zero2", "--sharding zero3"),
    ("zero3", None), ("fsdp", None),
])
def test_remedies_suggest_only_a_sharding_that_shards_more(sharding: str, suggested: str | None):
    v = evaluate(sharded_job(sharding, max_ckpt_time_s=0.01), measured(host_memory_bytes=2 * 10**9))
    assert status(v, "checkpoint-time") == FAIL and status(v, "host-memory") in (WARN, FAIL)
    for name in ("checkpoint-time", "host-memory"):
        text = remedy(v, name)
        if suggested is None:
            assert "--sharding" not in text, text
        else:
            assert suggested in text and f"--sharding {sharding}" not in text, text


def test_checkpoint_time_remedy_suggests_async_only_to_a_sync_job():
    v = evaluate(sharded_job("fsdp", max_ckpt_time_s=0.01), measured())
    assert v.predictions["mode"] == "async"
    assert remedy(v, "checkpoint-time") == ("faster storage, or more nodes (data-parallel ranks), each rank writing "
                                            "a smaller share")
    v = evaluate(job(max_ckpt_time_s=0.01, interference=0.99), measured())  # one node: sharding cannot help
    assert v.predictions["mode"] == "sync"
    assert remedy(v, "checkpoint-time") == "faster storage, or async saves"
    one_rank = job(size=checkpoint_size(1e9), ranks=1, ranks_per_node=1, max_ckpt_time_s=0.01)
    assert remedy(evaluate(one_rank, measured()), "checkpoint-time") == ("faster storage, or a smaller checkpoint "
                                                                         "(fewer bytes per rank)")


# -- ranges, BORDERLINE, the interference assumption, the plateau ------------------------------------


def test_every_prediction_has_a_range_around_its_point():
    v = evaluate(job(), measured(write_bps_range=(1.5 * GB, 2.5 * GB), read_bps_range=(2 * GB, 4 * GB),
                                 stall_s_range=(0.08, 0.15), persist_s_range=(0.5, 0.9)))
    p = v.predictions
    for key in ("sync_checkpoint_s", "async_stall_s", "async_persist_s", "restore_s", "overhead_fraction",
                "waste_fraction", "goodput", "optimal_interval_s"):
        low, high = p[f"{key}_range"]
        assert low <= p[key] <= high and low < high, key
    assert p["sync_checkpoint_s_range"] == pytest.approx([14e9 / 2.5e9, 14e9 / 1.5e9])
    assert p["restore_s_range"] == pytest.approx([14e9 / 4e9, 14e9 / 2e9])


def test_fresh_memory_slower_than_the_reads_reaches_the_restore_range_and_says_so():
    reads = dict(read_bps_range=(2 * GB, 4 * GB))
    slow = evaluate(job(), measured(fresh_memory_bps=0.5 * GB, hypervisor_reclaims=True, **reads))
    assert slow.predictions["restore_s_range"] == pytest.approx([14e9 / 4e9, 14e9 / 0.5e9])
    assert slow.predictions["restore_s"] == pytest.approx(14e9 / 3e9)  # the point stays the measured reads'
    said = " ".join(slow.assumptions)
    assert "fresh memory" in said and "28s" in said.replace(" ", "") and "hypervisor" in said
    assert slow.predictions["restore_memory_bound"] is True
    # faster than the slowest reads (if slower than their point): the range and the assumptions stay as
    # without it, and the restore is not called memory-bound
    fast = evaluate(job(), measured(fresh_memory_bps=2.5 * GB, **reads))
    plain = evaluate(job(), measured(**reads))
    assert fast.predictions["restore_s_range"] == pytest.approx(plain.predictions["restore_s_range"])
    assert fast.assumptions == plain.assumptions
    assert fast.predictions["restore_memory_bound"] is False and plain.predictions["restore_memory_bound"] is False


def test_a_kernel_paging_out_idle_memory_is_said_and_changes_no_number():
    reclaiming = evaluate(job(), measured(proactive_reclaim_s=60.0))
    plain = evaluate(job(), measured())
    said = [a for a in reclaiming.assumptions if a not in plain.assumptions]
    assert len(said) == 1 and "pages out memory left unaccessed for 1m" in said[0] and "DAMON" in said[0]
    assert reclaiming.predictions == plain.predictions and reclaiming.verdict == plain.verdict


def test_a_range_across_a_threshold_is_borderline_with_exit_3():
    # 14 GB per node at 2 GB/s (1.5-2.5 GB/s over the runs): a sync save of 7 s (5.6-9.3 s) against 8 s
    m = measured(write_bps_range=(1.5 * GB, 2.5 * GB))
    v = evaluate(job(max_ckpt_time_s=8.0, interference=0.99), m)  # sync: async costs more here
    assert v.predictions["mode"] == "sync"
    check = next(c for c in v.checks if c.name == "checkpoint-time")
    assert check.status == BORDERLINE and check.value_range == pytest.approx((5.6, 14e9 / 1.5e9))
    assert "spans FAIL and PASS" in check.message and check.remedy.startswith("settle it:")
    assert v.verdict == BORDERLINE and v.exit_code == 3
    # the same threshold outside the range decides: PASS at 10 s, FAIL at 5 s
    assert status(evaluate(job(max_ckpt_time_s=10.0, interference=0.99), m), "checkpoint-time") == PASS
    failed = evaluate(job(max_ckpt_time_s=5.0, interference=0.99), m)
    assert status(failed, "checkpoint-time") == FAIL and failed.exit_code == 1


def test_a_definite_failure_outranks_borderline():
    m = measured(write_bps_range=(1.5 * GB, 2.5 * GB), free_bytes=10**9)
    v = evaluate(job(max_ckpt_time_s=8.0, interference=0.99), m)
    assert {c.status for c in v.checks} >= {BORDERLINE, FAIL} and v.verdict == FAIL and v.exit_code == 1


def test_a_sample_widens_the_range_and_says_how_to_settle_it():
    exact = evaluate(job(), measured(shape="job"))
    sampled = evaluate(job(), measured(shape="sample"))
    assert exact.predictions["sync_checkpoint_s_range"] == pytest.approx([7.0, 7.0])
    k = sampled.predictions["extrapolation_factor"]
    assert k > 1 and sampled.predictions["sync_checkpoint_s_range"] == pytest.approx([7.0 / k, 7.0 * k])
    assert any(a.startswith("sample: one process saved") for a in sampled.assumptions)
    edge = evaluate(job(max_ckpt_time_s=8.0, interference=0.99), measured(shape="sample"))
    text = next(c.remedy for c in edge.checks if c.name == "checkpoint-time")
    assert "torchrun/srun" in text
    # a one-rank node measured at its own size in one process is still a sample, not the job's rank: a job's
    # process under its launcher, minutes later, runs slower or faster than the runs in one process spread
    one = job(size=checkpoint_size(1e8), ranks=1, ranks_per_node=1)
    own = evaluate(one, measured(shape="sample", measured_bytes=one.node_bytes, sampled_bytes=one.node_bytes))
    assert own.predictions["extrapolation_factor"] == k
    assert any("without the job's launcher" in a for a in own.assumptions)
    assert evaluate(one, measured(shape="nodes")).predictions["extrapolation_factor"] == 1.0
    # runs that already spread the range: the allowance adds in quadrature (log scale), not on top of it
    spread = evaluate(job(), measured(shape="sample", write_bps_range=(1.25 * GB, 2.5 * GB)))
    low, high = spread.predictions["sync_checkpoint_s_range"]
    runs_low, runs_high = 14e9 / 2.5e9, 14e9 / 1.25e9  # the node's 14 GB at the runs' fastest and slowest
    assert runs_high < high < runs_high * k and runs_low / k < low < runs_low


def test_interference_is_assumed_not_probed_unless_given_or_measured_on_the_device():
    v = evaluate(job(), measured(interference=None, probe_interference=0.82))
    p = v.predictions
    assert p["interference"] == ASSUMED.point and p["interference_range"] == [ASSUMED.low, ASSUMED.high]
    assert p["interference_source"] == ASSUMED.source and "FastPersist" in ASSUMED.source
    assert any("CPU probe" in a and "information only" in a for a in v.assumptions)
    given = evaluate(job(interference=0.3), measured(interference=None, probe_interference=0.82))
    assert given.predictions["interference"] == 0.3 and given.predictions["interference_range"] == [0.3, 0.3]
    device = evaluate(job(), measured(interference=0.1))
    assert device.predictions["interference"] == 0.1 and "training device" in device.predictions["interference_source"]
    # measured on a GPU over several runs: the runs' extremes are the range, the device is named
    gpu = evaluate(job(), measured(interference=0.1, interference_range=(0.04, 0.3), device="cuda:0"))
    assert gpu.predictions["interference_range"] == [0.04, 0.3] and "(cuda:0)" in gpu.predictions["interference_source"]
    # the interference's range widens the waste's (the async mode's cost grows with it)
    assert gpu.predictions["mode"] == device.predictions["mode"] == "async"
    assert gpu.predictions["waste_fraction_range"][1] > device.predictions["waste_fraction_range"][1]
    assert gpu.predictions["waste_fraction_range"][0] < device.predictions["waste_fraction_range"][0]


def test_the_interval_is_a_round_value_inside_the_plateau():
    v = evaluate(job(), measured())
    p = v.predictions
    low, high = p["optimal_interval_plateau_s"]
    assert low < p["optimal_interval_s"] < high
    chosen = next(a.value for a in v.recommendation if a.setting == "interval_s")
    assert low <= chosen <= high and chosen == p["recommended_interval_s"]
    assert chosen % 60 == 0  # whole minutes at least, for an interval of hours


def test_node_memory_describes_the_training_node():
    here = evaluate(job(), measured(host_memory_bytes=20 * 10**9))
    assert status(here, "host-memory") == WARN
    assert any("--node-memory" in a for a in here.assumptions)
    node = evaluate(job(node_memory_bytes=2 * 10**12), measured(host_memory_bytes=20 * 10**9))
    assert status(node, "host-memory") == PASS
    assert "training node's (--node-memory)" in next(c.message for c in node.checks if c.name == "host-memory")
    assert not any("--node-memory" in a for a in node.assumptions)


def test_node_network_caps_shared_storage_only():
    capped = job(node_network_bps=1 * GB)
    assert evaluate(capped, measured(shared_storage=True)).predictions["sync_checkpoint_s"] == pytest.approx(14.0)
    assert evaluate(capped, measured(shared_storage=False)).predictions["sync_checkpoint_s"] == pytest.approx(7.0)
    with pytest.raises(UsageError, match="--node-memory"):
        job(node_memory_bytes=0)
