"""``headwise export RUN --hf OUT``: write a trained run as a HuggingFace model directory."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from headwise.cli.options import add_run_argument, add_subcommand


def register(subparsers: Any) -> None:
    """Add the ``export`` subcommand to the top-level parser's subparsers."""
    parser = add_subcommand(
        subparsers, "export", run,
        help="export a run as a HuggingFace model directory (transformers loads it offline)",
        description="Write RUN's model to --hf OUT as config.json + model.safetensors (and the "
                    "tokenizer files when the run has them) for transformers' "
                    "AutoModelForCausalLM (GPT-2 family, Llama family incl. GQA) or AutoModel "
                    "(BERT-shaped encoders). LoRA adapters are merged into the weights "
                    "(or, with --peft DIR, written there as a PEFT adapter). A "
                    "config field, mask or task gate with no HuggingFace equivalent is refused, "
                    "naming it.",
    )
    add_run_argument(parser)
    parser.add_argument("--hf", required=True, metavar="OUT", help="output directory")
    parser.add_argument("--tokenizer", metavar="PATH",
                        help="tokenizer directory (or tokenizer.json) to copy; default: the "
                             "run's pretrained checkpoint's or text task's tokenizer")
    parser.add_argument("--peft", metavar="DIR",
                        help="write the LoRA adapters to DIR as a PEFT adapter and the base "
                             "weights (unmerged) to OUT, instead of merging them")
    parser.add_argument("--overwrite", action="store_true",
                        help="replace the HuggingFace files of a non-empty OUT (and an adapter "
                             "in --peft DIR); never a run or a checkpoint")


def run(args: argparse.Namespace) -> int:
    """Export and print a one-line summary; errors propagate as ``HeadwiseError`` (exit 2)."""
    from headwise.interop.load import TOKENIZER_FILES
    from headwise.pipeline.run_export import export_run

    out = export_run(args.run, args.hf, tokenizer=args.tokenizer, overwrite=args.overwrite,
                     peft=args.peft, names=("--hf", "--peft", "--tokenizer"))
    config = json.loads((out / "config.json").read_text(encoding="utf-8"))
    auto = "AutoModel" if config["model_type"] == "bert" else "AutoModelForCausalLM"
    tokenizer = [n for n in TOKENIZER_FILES if (Path(out) / n).is_file()]
    print(f"exported {args.run} -> {out}: {config['architectures'][0]} "
          f"(model_type {config['model_type']}), tokenizer files: "
          f"{', '.join(tokenizer) if tokenizer else 'none'}; load with "
          f"transformers.{auto}.from_pretrained({str(out)!r})"
          + (f", then peft.PeftModel.from_pretrained(model, {args.peft!r})" if args.peft else ""))
    return 0
