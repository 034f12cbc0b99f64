"""ROS 2 from Python on a GPU, 1080p and 4K, every byte checked on the GPU:
- frames of examples/python/ros2_pub.py (made on the GPU with PyTorch, in another
  process) read in place by a PyTorch subscription, no device-to-host copy on the
  publisher's side;
- a Python node and the Rust examples (ros2_image_pub, ros2_image_sub), both ways,
  zero-copy both ways;
- a consumer read ordered after a slow publisher kernel, with a negative control;
- a publisher of ROS 2's CUDA buffer backend (written from its sources) to a Python
  subscription, in place.
Without a GPU each prints `SKIPPED <name>: <reason>` and returns."""

import json
import os
import random
import subprocess
import sys
import time

import zenoh_cuda_shm as zcs
from zenoh_cuda_shm import ros2
from zcs_testing import IO_TIMEOUT, SKIPPED_LINES, Peer, gpu_or_skip, gpu_required, zenoh_config

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
ROS2_PUB = os.path.join(ROOT, "examples", "python", "ros2_pub.py")
GPU_PEER = os.path.join("gpu", "gpu_peer.py")
sys.path.insert(0, os.path.join(ROOT, "examples", "python"))


def test_ros2_frames_from_python_read_in_place_on_the_gpu(port, key):
    torch = gpu_or_skip("test_ros2_frames_from_python_read_in_place_on_the_gpu")
    if torch is None:
        return
    from ros2_pub import pattern

    for width, height, n in [(1920, 1080, 10), (3840, 2160, 6)]:
        domain, topic = random.randrange(1, 200), f"/camera/image_{width}"
        with zcs.open({"device": "cuda"}, zenoh=zenoh_config(listen=port)) as s:
            assert s.backend == "cuda-vmm", s.host_reason
            node = ros2.Node(s, "py_gpu_sub", domain=domain)
            sub = node.create_subscription(ros2.Image, topic, qos_profile=ros2.QoSProfile(
                depth=10, history=ros2.HistoryPolicy.KEEP_ALL))
            # The example, not a helper of the tests: its first argument is a flag.
            p = Peer("--device", "cuda", "--no-multicast-scouting", "-e", f"tcp/127.0.0.1:{port}", "--domain", domain,
                     "--topic", topic, "--width", width, "--height", height, "-n", n, "-r", 0,
                     "--wait-zero-copy", 1, script=ROS2_PUB)
            try:
                stream = torch.cuda.Stream()  # a consumer stream of its own
                with torch.cuda.stream(stream):
                    for _ in range(n):
                        msg = sub.recv(timeout=IO_TIMEOUT)
                        assert (msg.path, msg.encoding, msg.height, msg.width) == ("zero-copy", "rgba8", height, width)
                        assert msg.__dlpack_device__() == (2, torch.cuda.current_device())
                        frame = torch.from_dlpack(msg)  # ordered after the publisher's writes on `stream`
                        assert frame.is_cuda and tuple(frame.shape) == (height, width, 4)
                        want = pattern(frame.numel(), msg.seq, torch, frame.device).to(torch.uint8)
                        assert torch.equal(frame.reshape(-1), want), f"frame {msg.seq} of {width}x{height}"
                        del frame, msg
                out = p.finish(timeout=120)
            except BaseException:
                p.kill()
                raise
            summary = json.loads(next(line for line in out.splitlines() if line.startswith('{"role":"ros2_pub"')))
            assert summary["frames"] == n and summary["device_to_host"] == 0, summary
            stats = sub.stats()
            assert stats["channel"] == n and stats["base"] == 0, stats


def examples_or_skip(name):
    """The folder with the Rust ROS 2 examples (`ZCS_EXAMPLES_DIR`, else `.gpu-bin` where
    scripts/gpu-build.sh puts them), or `None` after recording SKIPPED; with
    ZCS_REQUIRE_GPU=1 their absence fails the test."""
    d = os.environ.get("ZCS_EXAMPLES_DIR") or os.path.join(ROOT, ".gpu-bin")
    if all(os.access(os.path.join(d, p), os.X_OK) for p in ("ros2_image_pub", "ros2_image_sub")):
        return d
    reason = f"no ros2_image_pub / ros2_image_sub in {d} (ZCS_EXAMPLES_DIR)"
    assert not gpu_required(), f"{name}: {reason}"
    SKIPPED_LINES.append(f"SKIPPED {name}: {reason}")
    return None


def rust_example(examples, name, *args):
    return subprocess.Popen([os.path.join(examples, name), "--no-multicast-scouting", *map(str, args)],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def example_summary(proc, role, timeout=120):
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, _ = proc.communicate()
        raise AssertionError(f"{role} did not end:\n{out[-3000:]}")
    lines = [line for line in out.splitlines() if line.startswith('{"role":"%s"' % role)]
    assert lines and proc.returncode == 0, out[-3000:]
    return json.loads(lines[-1])


def test_ros2_rust_and_python_nodes_zero_copy_on_the_gpu(port, key):
    name = "test_ros2_rust_and_python_nodes_zero_copy_on_the_gpu"
    torch = gpu_or_skip(name)
    if torch is None:
        return
    examples = examples_or_skip(name)
    if examples is None:
        return
    from ros2_pub import pattern

    for width, height, n in [(1920, 1080, 10), (3840, 2160, 6)]:
        domain = random.randrange(1, 200)
        with zcs.open({"device": "cuda"}, zenoh=zenoh_config(listen=port)) as s:
            assert s.backend == "cuda-vmm", s.host_reason
            node = ros2.Node(s, "py_gpu_node", domain=domain)
            keep_all = ros2.QoSProfile(depth=10, history=ros2.HistoryPolicy.KEEP_ALL)
            # Rust → Python: frames filled on the GPU by ros2_image_pub, read in place here.
            sub = node.create_subscription(ros2.Image, "/from_rust", qos_profile=keep_all)
            rust_pub = rust_example(examples, "ros2_image_pub", "-e", f"tcp/127.0.0.1:{port}", "--domain", domain,
                                    "-t", "/from_rust", "--width", width, "--height", height, "-n", n, "-r", 0,
                                    "--wait-zero-copy", 1, "--linger", 1)
            try:
                stream = torch.cuda.Stream()
                with torch.cuda.stream(stream):
                    for seq in range(1, n + 1):
                        msg = sub.recv(timeout=IO_TIMEOUT)
                        assert (msg.seq, msg.path, msg.height, msg.width) == (seq, "zero-copy", height, width)
                        assert msg.__dlpack_device__() == (2, torch.cuda.current_device())
                        frame = torch.from_dlpack(msg)
                        want = pattern(frame.numel(), seq, torch, frame.device).to(torch.uint8)
                        assert torch.equal(frame.reshape(-1), want), f"frame {seq} of {width}x{height} from Rust"
                        del frame, msg
                res = example_summary(rust_pub, "ros2_pub")
            finally:
                if rust_pub.poll() is None:
                    rust_pub.kill()
            assert res["frames"] == n and res["device_to_host"] == 0, res

            # Python → Rust: frames made on the GPU here; ros2_image_sub checks every byte on
            # the GPU and reports the path of each.
            pub = node.create_publisher(ros2.Image, "/to_rust", keep_all)
            rust_sub = rust_example(examples, "ros2_image_sub", "-e", f"tcp/127.0.0.1:{port}", "--domain", domain,
                                    "-t", "/to_rust", "-n", n, "--idle-timeout", 30)
            try:
                end = time.monotonic() + IO_TIMEOUT
                while pub.zero_copy_subscribers < 1:
                    assert time.monotonic() < end, "the Rust subscription never reached the zero-copy path"
                    time.sleep(0.01)
                for _ in range(n):
                    seq = pub.next_seq
                    pub.publish(pattern(width * height * 4, seq, torch, "cuda").to(torch.uint8).reshape(height, width, 4),
                                encoding="rgba8", frame_id="camera")
                res = example_summary(rust_sub, "ros2_sub")
            finally:
                if rust_sub.poll() is None:
                    rust_sub.kill()
            assert (res["frames"], res["bad"], res["gaps"], res["disorder"]) == (n, 0, 0, 0), res
            assert res["paths"] == {"zero-copy": n}, res
            assert pub.stats()["device_to_host"] == 0, pub.stats()


def test_ros2_consumer_kernel_waits_for_a_slow_publisher_kernel(port, key):
    """The publisher (another process) writes its loan after a 400 ms kernel and
    publishes at once. Our read on a stream given to `from_dlpack` sees the finished
    frame, without a host wait; the same memory read on a stream that was not given to
    it sees the frame unwritten (the negative control: the order is what makes the
    first read right)."""
    name = "test_ros2_consumer_kernel_waits_for_a_slow_publisher_kernel"
    torch = gpu_or_skip(name)
    if torch is None:
        return
    from ros2_pub import pattern

    sleep_ms, width, height, domain = 400, 1920, 1080, random.randrange(1, 200)
    ordered, unordered = torch.cuda.Stream(), torch.cuda.Stream()
    for st in (ordered, unordered):  # kernels loaded and streams set up before the timed part
        with torch.cuda.stream(st):
            (torch.arange(16, device="cuda", dtype=torch.uint8) * 2).sum().item()
    with zcs.open({"device": "cuda"}, zenoh=zenoh_config(listen=port, block_prefix=key.split("/")[0])) as s:
        node = ros2.Node(s, "py_gpu_sub", domain=domain)
        sub = node.create_subscription(ros2.Image, "/" + key.split("/")[0], qos_profile=ros2.QoSProfile(
            depth=10, history=ros2.HistoryPolicy.KEEP_ALL))
        p = Peer("ros2-slow-pub", port, key, sleep_ms, domain, width, height, script=GPU_PEER)
        try:
            msg = sub.recv(timeout=IO_TIMEOUT)
            t_recv = time.perf_counter()
            assert msg.path == "zero-copy", msg.path_reason
            with torch.cuda.stream(ordered):
                frame = torch.from_dlpack(msg)  # `ordered` waits for the publisher's writes
                good = frame.clone()
                host_ms = (time.perf_counter() - t_recv) * 1e3
                waiting = not ordered.query()
            with torch.cuda.stream(unordered):
                early = frame.clone()  # the same block, read with no order after the writes
            unordered.synchronize()
            ordered.synchronize()
            waited_ms = (time.perf_counter() - t_recv) * 1e3
            line = p.expect("published")
            want = pattern(frame.numel(), msg.seq, torch, frame.device).to(torch.uint8).reshape(frame.shape)
            assert torch.equal(good, want), "the ordered read saw the frame before it was written"
            wrong = int((early != want).sum())
            assert wrong > want.numel() // 2, f"negative control: the unordered read saw only {wrong} wrong bytes"
            assert host_ms < sleep_ms / 4, (host_ms, line)
            assert waiting, "the consumer stream was idle: the publisher's kernel had already finished"
            assert waited_ms > sleep_ms / 4, (waited_ms, line)
            assert "busy_after_put=True" in line and "device_to_host=0" in line, line
            put_ms = float(line.split("put_ms=")[1].split()[0])
            assert put_ms < sleep_ms / 4, line
            print(f"ROS 2 slow publisher: publish {put_ms:.2f} ms, export {host_ms:.2f} ms, ordered read done after "
                  f"{waited_ms:.1f} ms, unordered read {wrong}/{want.numel()} bytes unwritten")
            del frame, msg
        finally:
            p.finish()


def test_ros2_cuda_buffer_publisher_to_a_python_subscription(port, key):
    """A publisher of ROS 2's CUDA buffer backend (rmw_zenoh 0.12.0 with
    cuda_buffer_backend 0.1.2, written from their sources: the child role of
    tests/tests/gpu_rosidl_cuda.rs) sends 1080p and 4K descriptors to a Python
    subscription, which reads both frames in place on the GPU after the publisher's
    event; a descriptor of a reused block is refused and counted; the publisher checks
    that its pool is whole again once our messages are gone."""
    name = "test_ros2_cuda_buffer_publisher_to_a_python_subscription"
    torch = gpu_or_skip(name)
    if torch is None:
        return
    binary = os.environ.get("ZCS_ROSIDL_CUDA_TEST") or os.path.join(ROOT, ".gpu-bin", "test-tests-gpu_rosidl_cuda")
    if not os.access(binary, os.X_OK):
        reason = f"no {binary} (ZCS_ROSIDL_CUDA_TEST; scripts/gpu-build.sh puts it in .gpu-bin)"
        assert not gpu_required(), f"{name}: {reason}"
        SKIPPED_LINES.append(f"SKIPPED {name}: {reason}")
        return
    from ros2_pub import pattern
    import tempfile

    domain = 60 + random.randrange(100)
    with tempfile.TemporaryDirectory(prefix="zcs-py-rosidl-") as d, \
            zcs.open({"device": "cuda"}, zenoh=zenoh_config(listen=port)) as s:
        node = ros2.Node(s, "py_cuda_sub", domain=domain, distro="rolling")
        sub = node.create_subscription(ros2.Image, "/camera/image", qos_profile=10)
        env = dict(os.environ, ZCS_CHILD_ROLE="rosidl-cuda-publisher", ZCS_ROSIDL_CUDA_DIR=d,
                   ZCS_ROSIDL_CUDA_PORT=str(port), ZCS_ROSIDL_CUDA_DOMAIN=str(domain))
        child = subprocess.Popen([binary, "--exact", "cuda_publisher_entry", "--include-ignored", "--nocapture",
                                  "--test-threads=1"], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                 text=True)
        try:
            stream = torch.cuda.Stream()
            with torch.cuda.stream(stream):
                for i, (width, height) in enumerate([(1920, 1080), (3840, 2160)]):
                    msg = sub.recv(timeout=IO_TIMEOUT)
                    assert (msg.width, msg.height, msg.path) == (width, height, "zero-copy"), msg.path_reason
                    assert msg.__dlpack_device__() == (2, torch.cuda.current_device())
                    frame = torch.from_dlpack(msg)  # ordered after the publisher's event
                    want = pattern(frame.numel(), 1000 + i, torch, frame.device).to(torch.uint8)
                    assert torch.equal(frame.reshape(-1), want), f"frame {i} ({width}x{height})"
                    del frame, msg
            stream.synchronize()
            end = time.monotonic() + IO_TIMEOUT
            while sub.stats()["backend_refused"] < 1:
                assert time.monotonic() < end, f"the stale descriptor was not refused: {sub.stats()}"
                time.sleep(0.01)
            stats = sub.stats()
            assert (stats["cuda_buffers"], stats["backend_refused"], stats["base"]) == (2, 1, 0), stats
            # Our messages are gone: the publisher now waits for its counts to be back at 0.
            open(os.path.join(d, "released"), "w").close()
            out, _ = child.communicate(timeout=90)
            assert child.returncode == 0, out[-3000:]
        finally:
            if child.poll() is None:
                child.kill()
                child.communicate()
