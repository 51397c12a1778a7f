"""privzo bench pad-to: both paddings run the config's real stepper and report their shapes."""

from __future__ import annotations

import pytest

from privzo.bench.pad_to import pad_to_benchmark


def test_both_paddings_are_measured_with_their_shapes(tiny_run_config, cache_dir):
    # the tiny run's batch size: both calibrations are the ones other tests of the tiny run make
    config = tiny_run_config("optimizer.physical_batch_size=2")
    result = pad_to_benchmark(config, cache_dir, steps=2)
    padded, batch = result.cases
    assert (padded.pad_to, batch.pad_to) == ("max_length", "batch")
    assert padded.rows is not None and padded.rows % 2 == 0 and padded.rows > 8
    assert padded.length == config.task.max_length == 16  # TINY_RUN's bound
    assert batch.rows is None and batch.length is None
    for case in result.cases:
        assert case.steps == 2 and 0 < case.min_cpu_s <= case.median_cpu_s <= case.max_cpu_s
    assert result.ratio == padded.median_cpu_s / batch.median_cpu_s
    assert "max_length / batch (medians)" in result.table()
    assert result.to_json()["max_length_over_batch"] == result.ratio


def test_an_algorithm_without_the_public_shape_is_refused(tiny_run_config, cache_dir):
    with pytest.raises(ValueError, match="cannot pad to max_length"):
        pad_to_benchmark(tiny_run_config("optimizer.algorithm=dpsgd"), cache_dir, steps=1)
