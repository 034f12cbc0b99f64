"""How every Python subscriber example waits: a receive that gives up after an idle
timeout and says once, in the Rust examples' words, that it is waiting for a publisher."""


def receive(recv, n, idle_timeout, waiting_line, hint):
    """The next message from `recv(timeout=…)`, or None after `idle_timeout` s without
    one (0: wait for ever). Says once that it waits (`waiting_line`): after 2 s before a
    first message (`n == 0`), after 5 s between messages. Before a first message,
    `hint()` then runs about once a second, to name what the graph shows."""
    notice = 2.0 if n == 0 else 5.0
    waited = 0.0
    while True:
        step = notice if waited < notice else 1.0
        if idle_timeout:
            step = min(step, idle_timeout - waited)
            if step <= 0:
                return None
        try:
            return recv(timeout=step)
        except TimeoutError:
            waited += step
        if waited == notice:
            print(waiting_line, flush=True)
        if waited >= notice and n == 0:
            hint()
