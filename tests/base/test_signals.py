import os
import signal
import threading

import pytest

from preflight.base.errors import Interrupted
from preflight.base.signals import STOPPING, interrupting


@pytest.mark.parametrize("signum", STOPPING)
def test_a_stopping_signal_raises_interrupted_and_the_handlers_before_come_back(signum):
    before = {s: signal.getsignal(s) for s in STOPPING}
    with pytest.raises(Interrupted) as caught, interrupting():
        os.kill(os.getpid(), signum)
    assert caught.value.signum == signum
    assert {s: signal.getsignal(s) for s in STOPPING} == before


def test_given_on_signal_it_is_called_instead_and_the_block_goes_on():
    calls = []
    with interrupting(on_signal=lambda: calls.append("stop")):
        os.kill(os.getpid(), signal.SIGTERM)
        calls.append("after")
    assert calls == ["stop", "after"]


def test_off_the_main_thread_the_process_handlers_stay():
    before = signal.getsignal(signal.SIGTERM)
    seen = []

    def body() -> None:
        with interrupting():
            seen.append(signal.getsignal(signal.SIGTERM))

    t = threading.Thread(target=body)
    t.start()
    t.join(10)
    assert seen == [before]
