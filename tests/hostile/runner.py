"""Run hostile CLI cases in one process under an address-space limit; one JSON line per case.

Usage: python runner.py CASES.json RESULTS.jsonl LIMIT_BYTES

Each case runs ``headwise.cli.main(argv)`` in a fresh temporary directory after its set-up
operations (see ``cases.py``). The result line holds the exit code, stderr, and seconds taken;
an exception escaping ``main`` is recorded as exit code -1 with its last traceback line.
"""

from __future__ import annotations

import base64
import contextlib
import io
import json
import os
import resource
import shutil
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any

HELD: list[int] = []  # lock files a case holds open until it ends
SAVED_ENV: dict[str, str | None] = {}  # variables a case set, restored when it ends


def _setup(op: list[Any], subs: dict[str, str]) -> None:
    kind, *args = op
    args = [subs.get(a, a) if isinstance(a, str) else a for a in args]
    if kind == "write":
        Path(args[0]).parent.mkdir(parents=True, exist_ok=True)
        Path(args[0]).write_text(args[1], encoding="utf-8")
    elif kind == "bytes":
        Path(args[0]).parent.mkdir(parents=True, exist_ok=True)
        Path(args[0]).write_bytes(base64.b64decode(args[1]))
    elif kind == "sparse":  # a huge file that takes no disk space
        Path(args[0]).parent.mkdir(parents=True, exist_ok=True)
        with open(args[0], "wb") as f:
            f.truncate(args[1])
    elif kind == "mkdir":
        Path(args[0]).mkdir(parents=True, exist_ok=True)
    elif kind == "copytree":
        shutil.copytree(args[0], args[1])
    elif kind == "flip":
        data = bytearray(Path(args[0]).read_bytes())
        data[-3] ^= 0x01
        Path(args[0]).write_bytes(bytes(data))
    elif kind == "truncate":
        data = Path(args[0]).read_bytes()
        Path(args[0]).write_bytes(data[: len(data) // 2])
    elif kind == "delete":
        p = Path(args[0])
        shutil.rmtree(p) if p.is_dir() else p.unlink()
    elif kind == "json":  # set a key of a JSON file (dotted path)
        data = json.loads(Path(args[0]).read_text())
        node = data
        *parents, last = args[1].split(".")
        for key in parents:
            node = node[key]
        node[last] = args[2]
        Path(args[0]).write_text(json.dumps(data))
    elif kind == "tensors":  # safetensors from {name: [shape, dtype(, value)]} and metadata
        import torch
        from safetensors.torch import save_file

        tensors = {k: torch.full(v[0], v[2] if len(v) > 2 else 0.01 if v[1].startswith(
                       "float") else 1, dtype=getattr(torch, v[1])) for k, v in args[1].items()}
        Path(args[0]).parent.mkdir(parents=True, exist_ok=True)
        save_file(tensors, args[0], metadata=args[2] if len(args) > 2 else None)
    elif kind == "empty_tensors":  # a safetensors file of N empty tensors (header only)
        header = json.dumps({f"t{i}": {"dtype": "F32", "shape": [0], "data_offsets": [0, 0]}
                             for i in range(args[1])}).encode()
        Path(args[0]).write_bytes(len(header).to_bytes(8, "little") + header)
    elif kind == "added_tokens":  # a tokenizer.json with N added tokens
        vocab = {"[UNK]": 0, "a": 1}
        added = [{"id": 2 + i, "content": f"t{i}", "single_word": False, "lstrip": False,
                  "rstrip": False, "normalized": True, "special": False}
                 for i in range(args[1])]
        Path(args[0]).write_text(json.dumps({
            "version": "1.0", "truncation": None, "padding": None, "added_tokens": added,
            "normalizer": None, "pre_tokenizer": {"type": "Whitespace"},
            "post_processor": None, "decoder": None,
            "model": {"type": "WordLevel", "vocab": vocab, "unk_token": "[UNK]"}}))
    elif kind == "symlink":  # args[0] -> args[1] (the target need not exist)
        Path(args[0]).parent.mkdir(parents=True, exist_ok=True)
        os.symlink(args[1], args[0])
    elif kind == "copy":  # a file copied to another name (a forged addition)
        shutil.copyfile(args[0], args[1])
    elif kind == "env":  # an environment variable for this case only (a path made absolute)
        SAVED_ENV.setdefault(args[0], os.environ.get(args[0]))
        os.environ[args[0]] = str(Path(args[1]).absolute())
    elif kind == "huge_tensor":  # a safetensors file of one float32 tensor, its data sparse
        count = 1
        for n in args[2]:
            count *= n
        header = json.dumps({args[1]: {"dtype": "F32", "shape": args[2],
                                       "data_offsets": [0, 4 * count]}}).encode()
        Path(args[0]).parent.mkdir(parents=True, exist_ok=True)
        with open(args[0], "wb") as f:
            f.write(len(header).to_bytes(8, "little") + header)
            f.truncate(8 + len(header) + 4 * count)
    elif kind == "fifo":
        os.mkfifo(args[0])
    elif kind == "lock":  # hold the run's writer lock (another open file: flock conflicts)
        import fcntl

        fd = os.open(args[0], os.O_RDWR | os.O_CREAT)
        fcntl.flock(fd, fcntl.LOCK_EX)
        os.ftruncate(fd, 0)
        os.pwrite(fd, b"1\n", 0)  # pid 1: a process that is running
        HELD.append(fd)
    else:
        raise ValueError(f"unknown set-up operation {kind!r}")


def main() -> None:
    cases = json.loads(Path(sys.argv[1]).read_text())
    results = Path(sys.argv[2])
    limit = int(sys.argv[3])
    import torch

    from headwise.cli import main as cli

    torch.set_num_threads(1)
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    subs = {k: v for k, v in os.environ.items() if k.startswith("HOSTILE_")}
    home = os.getcwd()
    with open(results, "a") as out:
        for case in cases:
            tmp = tempfile.mkdtemp(prefix="hostile-")
            os.chdir(tmp)
            err, sink = io.StringIO(), io.StringIO()
            t0 = time.perf_counter()
            try:
                for op in case.get("setup", []):
                    _setup(op, {f"${k}": v for k, v in subs.items()})
                argv = [subs.get(a[1:], a) if a.startswith("$") else a for a in case["argv"]]
                t0 = time.perf_counter()
                with contextlib.redirect_stderr(err), contextlib.redirect_stdout(sink):
                    code = cli(argv)
            except BaseException as e:  # noqa: BLE001 - recorded as a failure of the case
                code = -1
                err.write(f"{type(e).__name__}: {e}\n"
                          + "".join(traceback.format_exception(e)[-3:]))
            seconds = time.perf_counter() - t0
            while HELD:
                os.close(HELD.pop())
            for name, old in SAVED_ENV.items():
                os.environ.pop(name, None) if old is None else os.environ.__setitem__(name, old)
            SAVED_ENV.clear()
            os.chdir(home)
            shutil.rmtree(tmp, ignore_errors=True)
            out.write(json.dumps({"id": case["id"], "code": code, "stderr": err.getvalue(),
                                  "seconds": seconds}) + "\n")
            out.flush()


if __name__ == "__main__":
    main()
