"""ROS 2 from Python on a GPU: frames of examples/python/ros2_pub.py (made on the GPU
with PyTorch, in another process) read in place by a PyTorch subscription, 1080p and 4K,
every byte checked on the GPU, and no device-to-host copy on the publisher's side.
Without a GPU it prints `SKIPPED <name>: <reason>` and returns."""

import json
import os
import random
import sys

import zenoh_cuda_shm as zcs
from zenoh_cuda_shm import ros2
from zcs_testing import IO_TIMEOUT, Peer, gpu_or_skip, zenoh_config

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
ROS2_PUB = os.path.join(ROOT, "examples", "python", "ros2_pub.py")
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
