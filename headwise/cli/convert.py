"""``headwise convert --hf DIR --out DIR``: convert a local HuggingFace checkpoint to headwise."""

from __future__ import annotations

import argparse
from typing import Any


def register(subparsers: Any) -> None:
    """Add the ``convert`` subcommand to the top-level parser's subparsers."""
    parser = subparsers.add_parser(
        "convert",
        help="convert a local HuggingFace checkpoint directory (no network access)",
        description="Read config.json and model.safetensors (or pytorch_model.bin, loaded with "
                    "weights_only=True) from --hf and write headwise's config.json and "
                    "model.safetensors to --out. Supported model_type values: bert, gpt2, "
                    "llama, mistral, qwen2.",
    )
    parser.add_argument("--hf", required=True, metavar="DIR", help="HuggingFace model directory")
    parser.add_argument("--out", required=True, metavar="DIR", help="output directory")
    parser.add_argument("--lenient", action="store_true",
                        help="ignore HF keys the converter does not use (e.g. task heads)")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Convert and print a one-line summary; errors propagate as ``CheckpointError`` (exit 2)."""
    from headwise.interop import convert, load_converted

    out = convert(args.hf, args.out, strict=not args.lenient)
    model = load_converted(out)
    c = model.config
    n_params = sum(p.numel() for p in model.parameters())
    print(f"converted {args.hf} -> {out}: {c.n_layers} layers x {c.n_heads} heads "
          f"(kv heads {c.n_kv_heads}), d_model {c.d_model}, {n_params:,} parameters")
    return 0
