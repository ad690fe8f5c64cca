"""A compile worker process: ``python -m pycutlass.compiler.worker`` reads a job from stdin, writes a cubin.

Every translation unit compiles in its own process (its own session and process group), for two reasons: NVRTC
serializes compiles across the threads of one process, and an interrupted compile must stop at once. The parent
kills the whole process group (the worker and any nvcc, cicc or ptxas under it) when the user interrupts.

Protocol: stdin is one JSON line (backend, extra flags, arch, unit name) followed by the source; on success the
cubin bytes go to stdout and the exit code is 0; on a compile error the exit code is 3 and stderr holds a JSON
object with the message and the compiler log.
"""
from __future__ import annotations

import json
import sys


def main() -> int:
    from .backends import backend_by_name
    from ..errors import CompilationError

    header = json.loads(sys.stdin.buffer.readline())
    source = sys.stdin.buffer.read().decode()
    backend = backend_by_name(header["backend"], tuple(header["extra_flags"]))
    try:
        binary = backend.compile(source, header["arch"], header["unit_name"])
    except CompilationError as error:
        message = str(error).split("\n--- compiler log ---")[0]
        sys.stderr.write(json.dumps({"message": message, "log": error.log}))
        return 3
    sys.stdout.buffer.write(binary)
    return 0


if __name__ == "__main__":
    sys.exit(main())
