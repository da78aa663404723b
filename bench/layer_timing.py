"""Timing one layer's call for the layer benches (bench/gated_delta_net.py, bench/mamba2_layer.py):
each round timed alone after a warm-up, reported as min, median and mean."""
import statistics
import time


def timed(fn, rounds: int) -> list[float]:
    fn()  # warm-up
    times = []
    for _ in range(rounds):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return times


def report(label: str, times: list[float]) -> None:
    print(f"  {label:<46} min {min(times) * 1e3:8.2f}  median {statistics.median(times) * 1e3:8.2f}"
          f"  mean {statistics.mean(times) * 1e3:8.2f} ms  ({len(times)} runs)")
