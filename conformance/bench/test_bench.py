"""The benchmarks: the roofline copy per device, then forward and forward + backward per case."""

from collections.abc import Callable


def test_copy_bandwidth(bench_device: str, bench_copy: Callable[[str], None]) -> None:
    bench_copy(bench_device)


def test_bench_forward(bench_target: object, bench_run: Callable[[str], None]) -> None:
    bench_run("forward")


def test_bench_backward(bench_target: object, bench_run: Callable[[str], None]) -> None:
    bench_run("backward")
