"""How every Python subscriber example waits: a receive that gives up after an idle
timeout and says once, in the Rust examples' words, that it is waiting for a publisher."""

import time


def receive(recv, n, idle_timeout, waiting_line, hint):
    """The next message from `recv(timeout=…)`, or None after `idle_timeout` s without
    one (0: wait for ever). Says once that it waits (`waiting_line`): after 2 s before a
    first message (`n == 0`), after 5 s between messages. Before a first message,
    `hint()` then runs about once a second, to name what the graph shows; its time
    counts toward the idle timeout."""
    notice = 2.0 if n == 0 else 5.0
    start = time.monotonic()
    said = False
    while True:
        waited = time.monotonic() - start
        if not said and waited >= notice:
            said = True
            print(waiting_line, flush=True)
        if said and n == 0:
            hint()
            waited = time.monotonic() - start
        step = 1.0 if said else notice - waited
        if idle_timeout:
            step = min(step, idle_timeout - waited)
            if step <= 0:
                return None
        try:
            return recv(timeout=step)
        except TimeoutError:
            pass
