#!/usr/bin/env python3
"""Independent reference for `onecopy analyze --chunker fixed:SIZE`.

Usage: analyze-reference.py SIZE PATH...

Walks PATHs the way `onecopy analyze` documents (directories recursively in any order, symbolic
links inside directories not followed, a PATH given explicitly followed; regular files and block
devices read, other special files skipped), cuts every file into SIZE-byte blocks from its first
byte (the last block shorter), and prints one JSON object with total_bytes, zero_bytes,
unique_bytes, chunks and unique_chunks. An all-zero block counts in total, zero and chunks but
not in unique_*. Distinct contents are told apart by SHA-256 (hashlib), not BLAKE3, so that the
check shares no code with onecopy.
"""
import hashlib
import json
import os
import stat
import sys


def sources(path, explicit):
    info = os.stat(path) if explicit else os.lstat(path)
    if stat.S_ISDIR(info.st_mode):
        for entry in os.scandir(path):
            yield from sources(entry.path, False)
    elif stat.S_ISREG(info.st_mode) or stat.S_ISBLK(info.st_mode):
        yield path


def main():
    size = int(sys.argv[1])
    zero_block = bytes(size)
    seen = set()
    counts = dict(total_bytes=0, zero_bytes=0, unique_bytes=0, chunks=0, unique_chunks=0)
    for top in sys.argv[2:]:
        for path in sources(top, True):
            with open(path, "rb", buffering=0) as file:
                while True:
                    block = file.read(size)
                    # Unbuffered reads of regular files return short only at the end; keep
                    # reading to be sure for devices and pipes.
                    while 0 < len(block) < size:
                        more = file.read(size - len(block))
                        if not more:
                            break
                        block += more
                    if not block:
                        break
                    counts["total_bytes"] += len(block)
                    counts["chunks"] += 1
                    if block == zero_block[: len(block)]:
                        counts["zero_bytes"] += len(block)
                        continue
                    digest = hashlib.sha256(block).digest()
                    if digest not in seen:
                        seen.add(digest)
                        counts["unique_bytes"] += len(block)
                        counts["unique_chunks"] += 1
    print(json.dumps(counts))


if __name__ == "__main__":
    main()
