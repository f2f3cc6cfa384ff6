"""``headwise generate RUN --prompt TEXT``: continue a prompt with a run's model."""

from __future__ import annotations

import argparse
from typing import Any

import torch

import headwise.validate as check
from headwise.cli.options import add_device_argument, add_run_argument, add_subcommand
from headwise.errors import SpecError


def register(subparsers: Any) -> None:
    """Add the ``generate`` subcommand."""
    p = add_subcommand(
        subparsers, "generate", run, help="continue a prompt with a run's model",
        description="Print the prompt and its continuation, one token at a time: the most "
                    "likely token (default) or sampled (--sample). Text is encoded by the run's "
                    "tokenizer, or as bytes for byte-level text tasks.")
    add_run_argument(p)
    p.add_argument("--prompt", required=True, help="the text to continue")
    p.add_argument("--max-new-tokens", type=int, default=20, metavar="N",
                   help="tokens to add at most (default 20)")
    p.add_argument("--stop", action="append", default=[], metavar="TEXT",
                   help="stop at this token (one token's text, e.g. a newline for bytes; "
                        "repeatable; default: the tokenizer's end-of-sequence token)")
    p.add_argument("--sample", action="store_true",
                   help="sample each token instead of taking the most likely one")
    p.add_argument("--temperature", type=float, default=1.0,
                   help="with --sample (default 1): 0 (greedy) or a finite number >= 1e-4 "
                        "that leaves the logits divided by it finite")
    p.add_argument("--top-k", type=int, metavar="K",
                   help="with --sample: the K likeliest only (K at most the vocabulary)")
    p.add_argument("--top-p", type=float, metavar="P",
                   help="with --sample: the likeliest tokens up to probability P")
    p.add_argument("--seed", type=int, default=0,
                   help="with --sample: an integer in [0, 2^63) (default 0)")
    add_device_argument(p, "cpu", "cpu")


def run(args: argparse.Namespace) -> int:
    """Load the run, give it a tokenizer, print the prompt and its continuation."""
    from headwise import load_run
    from headwise.model.generate import generate

    seed = check.seed(args.seed, "--seed")
    for option, texts in (("--prompt", [args.prompt]), ("--stop", args.stop)):
        for text in texts:
            _check_utf8(text, option)
    loaded = load_run(args.run, device=args.device)  # byte-level runs get a ByteTokenizer
    model = loaded.model
    if model.tokenizer is None:
        raise SpecError("--prompt: the run's model reads the tokens of synthetic tasks, not "
                        "text; expected a run with a tokenizer or a byte-level text task")
    if not args.sample and (args.top_k is not None or args.top_p is not None):
        raise SpecError("--top-k/--top-p: expected them with --sample")
    stops = [_stop_id(model, text) for text in args.stop] or None
    generator = torch.Generator(device=model.embed.weight.device).manual_seed(seed)
    try:
        text = generate(model, args.prompt, args.max_new_tokens, eos_token_id=stops,
                        do_sample=args.sample, top_k=args.top_k, top_p=args.top_p,
                        temperature=args.temperature, return_type="str", generator=generator)
    except ValueError as e:  # "field: what was expected", said with the option's name
        field, _, rest = str(e).partition(": ")
        if not (rest and field.isidentifier()):  # not a field's message: as it is
            raise SpecError(str(e)) from None
        raise SpecError(f"{_OPTIONS.get(field, '--' + field.replace('_', '-'))}: {rest}"
                        ) from None
    print(text)
    return 0


_OPTIONS = {"input": "--prompt", "model": "RUN", "eos_token_id": "--stop"}


def _stop_id(model: Any, text: str) -> int:
    try:
        return int(model.to_single_token(text))
    except Exception as e:  # ConfigError naming the string: say it for --stop
        raise SpecError(f"--stop: {e}") from None


def _check_utf8(text: str, option: str) -> None:
    """Refuse text that is not UTF-8: argv's bytes that are not UTF-8 arrive as surrogate
    escapes (U+DC80..U+DCFF for the bytes 0x80..0xFF), which no tokenizer encodes.

    Raises:
        SpecError: naming ``option``, the character and its byte.
    """
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        code = ord(text[e.start])
        what = f"byte 0x{code - 0xDC00:02x}" if 0xDC80 <= code <= 0xDCFF else f"U+{code:04X}"
        raise SpecError(f"{option}: character {e.start + 1} is not UTF-8 ({what}); expected "
                        "UTF-8 text") from None
