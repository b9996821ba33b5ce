#!/usr/bin/env python3
"""Per-operation CPU of the frames beneath one root frame, from `perf script`.

Usage:
    perf script -i DATA --comm tokio-rt-worker -F ip,sym > stacks.txt
    python3 attribute.py stacks.txt ROOT OPS HZ [TOP]

ROOT is a substring of the frame to attribute beneath (for example
`redlock_loop::main::{{closure}}::{{closure}}`, the example's timed loop, or
`Forward<St,Si,Item>`, redis-rs's connection tasks). OPS is how many
operations the recording covered and HZ the sampling frequency given to
`perf record -F`. Prints the root's CPU per operation, then, per frame, the
CPU per operation of the samples that have it beneath the root (inclusive),
highest first. Frame pointers are needed for whole stacks
(`RUSTFLAGS="-C force-frame-pointers=yes"`); BENCHMARKS.md has the commands.
"""

import collections
import re
import sys


def stacks(path):
    """Each sample's frames, leaf first, offsets removed."""
    current = []
    with open(path) as lines:
        for line in lines:
            if not line.strip():
                if current:
                    yield current
                current = []
                continue
            parts = line.strip().split(None, 1)
            frame = parts[1] if len(parts) > 1 else "?"
            current.append(re.sub(r"\+0x[0-9a-f]+$", "", frame))
    if current:
        yield current


def main():
    path, root, ops, hz = sys.argv[1], sys.argv[2], int(sys.argv[3]), float(sys.argv[4])
    top = int(sys.argv[5]) if len(sys.argv) > 5 else 40
    per_sample_us = 1e6 / hz
    beneath = collections.Counter()
    samples = 0
    for frames in stacks(path):
        at_root = [i for i, frame in enumerate(frames) if root in frame]
        if not at_root:
            continue
        samples += 1
        # Frames under the outermost occurrence of the root, once each.
        for frame in set(frames[: max(at_root)]):
            beneath[frame] += 1
    print(f"{root}: {samples} samples, {samples / ops * per_sample_us:.1f} µs per operation")
    for frame, n in beneath.most_common(top):
        print(f"{n / ops * per_sample_us:7.1f}  {frame[:150]}")


if __name__ == "__main__":
    main()
