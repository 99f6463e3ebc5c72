"""Which malloc settings fix glibc's thresholds, and the values a worker restores."""

from __future__ import annotations

from dask_ddp.predict.heap import Thresholds, fixed_thresholds


def test_dynamic_thresholds_are_left_alone() -> None:
    assert fixed_thresholds({}) is None
    assert fixed_thresholds({"GLIBC_TUNABLES": "glibc.malloc.tcache_count=0"}) is None


def test_a_set_threshold_fixes_both_with_glibcs_defaults_for_the_other() -> None:
    # Dask's nanny: MALLOC_TRIM_THRESHOLD_=65536; the mmap threshold stays at 128 KiB.
    assert fixed_thresholds({"MALLOC_TRIM_THRESHOLD_": "65536"}) == Thresholds(128 << 10, 65536)
    assert fixed_thresholds({"MALLOC_TOP_PAD_": "0"}) == Thresholds(128 << 10, 128 << 10)
    assert fixed_thresholds({"MALLOC_MMAP_THRESHOLD_": "0x100000"}) == Thresholds(1 << 20,
                                                                                 128 << 10)


def test_a_tunable_wins_over_its_variable() -> None:
    env = {"MALLOC_TRIM_THRESHOLD_": "65536",
           "GLIBC_TUNABLES": "glibc.malloc.tcache_count=0:glibc.malloc.trim_threshold=1024"}
    assert fixed_thresholds(env) == Thresholds(128 << 10, 1024)
    assert fixed_thresholds({"GLIBC_TUNABLES": "glibc.malloc.mmap_threshold=4096"}) == (
        Thresholds(4096, 128 << 10))
