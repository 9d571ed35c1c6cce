"""The code reward manager's threads: closed, or dropped with a batch in flight, it leaves none
running (and its cache file removed). Problems and helpers are test_code.py's."""

import os

import pytest
from test_code import ADD, INC, add_prog, item, make


def test_submit_then_close_leaves_no_running_thread():
    import threading

    before = set(threading.enumerate())  # thread objects: idents are reused once a thread ends
    r = make()
    r([item(add_prog(100), ADD)])
    r.close()
    r.close()  # twice is fine
    assert {t for t in threading.enumerate() if t.name == "fastcrit-code-reward"} - before == set()
    with pytest.raises(RuntimeError, match="closed"):
        r([item(add_prog(100), ADD)])


def test_a_dropped_manager_finishes_its_batch_and_cleans_up():
    import threading

    before = set(threading.enumerate())  # thread objects: idents are reused once a thread ends
    r = make()
    fut = r.submit([item("import time\ndef inc(x):\n    time.sleep(0.3)\n    return x + 1\n", INC)])
    cache_file = r.cache_file
    [thread] = [t for t in threading.enumerate() if t.name == "fastcrit-code-reward" and t not in before]
    del r  # the batch's coroutine holds the last reference: it closes the manager from the loop thread
    assert fut.result(timeout=60)[0].score == 1.0
    thread.join(30)
    assert not thread.is_alive() and not os.path.exists(cache_file)
