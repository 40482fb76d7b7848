"""``report --follow``'s stop request with real signals: the first SIGINT or SIGTERM asks for
a graceful stop, the second stops at once; the handlers before are put back."""

from __future__ import annotations

import signal

import pytest

from endpoint_runtime.analytics.progress import Progress
from endpoint_runtime.analytics.stopping import StopRequest


@pytest.mark.parametrize("number", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_the_first_signal_asks_for_a_stop_and_the_second_stops_at_once(
    number: signal.Signals, capsys: pytest.CaptureFixture[str],
) -> None:
    before = signal.getsignal(number)
    with StopRequest(Progress(total=1)) as stop:
        assert stop.requested is None
        signal.raise_signal(number)
        assert stop.requested == number.name
        with pytest.raises(KeyboardInterrupt):
            signal.raise_signal(number)
    assert signal.getsignal(number) is before
    assert f"live: {number.name}: stopping after the round in progress" in capsys.readouterr().err
