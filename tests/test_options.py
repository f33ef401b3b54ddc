"""options.py: the typed options of decoding and serving, their merging and their checks."""

from __future__ import annotations

import inspect

import pytest

from translate.errors import UserError
from translate.options import SearchOptions, ServingLimits


def test_given_values_replace_only_what_is_given():
    base = SearchOptions(beam_size=4, length_penalty=1.0, max_len_a=0.5, max_len_b=7)
    assert base.given(beam_size=None, length_penalty=None) == base
    assert base.given(beam_size=6, nbest=2) == SearchOptions(6, 1.0, 0.5, 7, nbest=2)
    with pytest.raises(UserError, match="--nbest must be between 1 and the beam size"):
        base.given({"nbest": "--nbest"}, nbest=5)
    with pytest.raises(UserError, match="beam_size must be at least 1"):
        base.given(beam_size=0)


@pytest.mark.parametrize(
    "limits, message",
    [
        (ServingLimits(batch_window_ms=-1), "--batch-window-ms must be at least 0"),
        (ServingLimits(batch_window_ms=float("nan")), "--batch-window-ms must be a finite number, got nan"),
        (ServingLimits(body_timeout_s=float("inf")), "--body-timeout-s must be a finite number, got inf"),
        (ServingLimits(body_timeout_s=0), "--body-timeout-s must be at least 0.001, got 0"),
        (ServingLimits(max_batch=0), "--max-batch must be at least 1"),
        (ServingLimits(max_queue=0), "--max-queue must be at least 1"),
        (ServingLimits(max_request_bytes=0), "--max-request-bytes must be at least 1"),
        (ServingLimits(max_texts=20, max_queue=10), r"--max-texts \(20\) must not exceed --max-queue \(10\)"),
    ],
)
def test_serving_limits_name_the_option_out_of_range(limits, message):
    with pytest.raises(UserError, match=message):
        limits.check()


def test_the_command_lines_serving_defaults_are_the_limits_defaults():
    from translate.cli import serve

    defaults = {name: p.default for name, p in inspect.signature(serve).parameters.items()}
    limits = ServingLimits()
    for name in ("batch_window_ms", "max_batch", "max_queue", "max_request_bytes", "body_timeout_s"):
        assert defaults[name] == getattr(limits, name), name
    assert defaults["max_texts"] is None  # ServingLimits.max_texts, or --max-queue where less
    assert limits.check() is limits and limits.window == 0.005
