"""bench.hotpath_bench.top_frames on raw py-spy --native lines: a thread waiting (a
pool worker parked on its queue or a lock, the event loop in epoll or select) is left
out; a pool worker running a job (an fsync) counts, though _worker is up its stack."""
from __future__ import annotations

from bench.hotpath_bench import top_frames, waiting

THREAD = "_bootstrap (threading.py:1002);_bootstrap_inner (threading.py:1045);run (threading.py:982)"
WORKER = THREAD + ";_worker (concurrent/futures/thread.py:{line})"
LOOP = ("<module> (semel/__main__.py:5);run (asyncio/runners.py:118);run_until_complete (asyncio/base_events.py:640);"
        "run_forever (asyncio/base_events.py:607);_run_once (asyncio/base_events.py:1884)")

FSYNC = (WORKER.format(line=58) + ";run (concurrent/futures/thread.py:58);_flush (semel/storage/flusher.py:120);"
         "os_fsync (posixmodule.c:3720);fsync (libc.so.6)")
QUEUE_GET = (WORKER.format(line=81) + ";_queue_SimpleQueue_get_impl (_queuemodule.c:217);"
             "PyThread_acquire_lock_timed (thread_pthread.h:479);sem_clockwait (libc.so.6);"
             "__futex_abstimed_wait_common (libc.so.6)")
LOCK = (THREAD + ";_loop (semel/broker/watchdog.py:40);wait (threading.py:331);"
        "lock_PyThread_acquire_lock (_threadmodule.c:155);acquire_timed (_threadmodule.c:98);"
        "PyThread_acquire_lock_timed (thread_pthread.h:479);sem_clockwait (libc.so.6)")
EPOLL = LOOP + ";select (selectors.py:469);select_epoll_poll_impl (selectmodule.c:1590);epoll_wait (libc.so.6)"
SELECT = LOOP + ";select (selectors.py:323);select_select_impl (selectmodule.c:330);__select (libc.so.6)"
CRC = LOOP + ";_run (asyncio/events.py:80);append (semel/storage/log.py:300);crc32c (crc32c.c:90)"


def test_waits_are_idle_and_work_in_worker_threads_is_busy(tmp_path):
    assert waiting(QUEUE_GET.split(";")) and waiting(LOCK.split(";"))
    assert waiting(EPOLL.split(";")) and waiting(SELECT.split(";"))
    assert not waiting(FSYNC.split(";")) and not waiting(CRC.split(";"))
    raw = tmp_path / "stacks.txt"
    raw.write_text("\n".join(f"{stack} {n}" for stack, n in (
        (FSYNC, 30), (CRC, 10), (QUEUE_GET, 500), (LOCK, 200), (EPOLL, 400), (SELECT, 5))) + "\n")
    top = top_frames(raw)
    assert (top["busy_samples"], top["idle_samples_left_out"]) == (40, 1105)
    assert top["native_self"] == [{"function": "fsync (libc.so.6)", "self_pct": 75.0},
                                  {"function": "crc32c (crc32c.c)", "self_pct": 25.0}]
    assert top["python_innermost"][0] == {"function": "_flush (flusher.py)", "self_pct": 75.0,
                                          "inclusive_pct": 75.0}
