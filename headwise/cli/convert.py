"""``headwise convert --hf DIR|ID --out DIR``: convert a local HF checkpoint to headwise."""

from __future__ import annotations

import argparse
from typing import Any

from headwise.cli.options import add_hf_arguments, add_subcommand


def register(subparsers: Any) -> None:
    """Add the ``convert`` subcommand to the top-level parser's subparsers."""
    parser = add_subcommand(
        subparsers, "convert", run,
        help="convert a local HuggingFace checkpoint directory (no network access)",
        description="Read config.json and model.safetensors (or pytorch_model.bin, loaded with "
                    "weights_only=True) from --hf and write headwise's config.json and "
                    "model.safetensors to --out. --hf is a directory or a model id (gpt2, "
                    "org/name) in the local HuggingFace cache (HF_HUB_CACHE, HF_HOME/hub or "
                    "~/.cache/huggingface/hub). Supported model_type values: bert, gpt2, "
                    "llama, mistral, qwen2.",
    )
    add_hf_arguments(parser, required=True)
    parser.add_argument("--out", required=True, metavar="DIR", help="output directory")
    parser.add_argument("--overwrite", action="store_true",
                        help="replace a model directory already in --out (its model and "
                             "tokenizer files are deleted first); never a run, a checkpoint "
                             "or --hf itself")
    parser.add_argument("--lenient", action="store_true",
                        help="ignore HF keys the converter does not use (e.g. task heads)")


def run(args: argparse.Namespace) -> int:
    """Convert and print a one-line summary; errors propagate as ``CheckpointError`` (exit 2)."""
    from pathlib import Path

    from headwise.atomic import MODEL, check_empty_dir, check_output_dir
    from headwise.interop import convert, load_converted
    from headwise.interop.hub_cache import resolve_model

    source = resolve_model(args.hf, args.revision, field="--hf")
    # checked first under the options' names (the library checks again, under its own)
    check_output_dir(args.out, "--out", overwrite=args.overwrite, replaces=(MODEL,),
                     sources=[Path(source)])
    check_empty_dir(Path(args.out), "--out", args.overwrite)
    out = convert(source, args.out, strict=not args.lenient, overwrite=args.overwrite)
    model = load_converted(out)
    c = model.config
    n_params = sum(p.numel() for p in model.parameters())
    print(f"converted {args.hf} -> {out}: {c.n_layers} layers x {c.n_heads} heads "
          f"(kv heads {c.n_kv_heads}), d_model {c.d_model}, {n_params:,} parameters")
    return 0
