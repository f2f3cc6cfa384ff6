"""Pipeline: a spec compiled into model, levers, data and contract; train, verify and report."""

from headwise.pipeline.compile import MASK_BUILDERS, Compiled, compile_spec, held_out_mixture
from headwise.pipeline.options import RunOptions
from headwise.pipeline.run import RunOutcome, train_run

__all__ = ["MASK_BUILDERS", "Compiled", "RunOptions", "RunOutcome", "compile_spec",
           "held_out_mixture", "train_run"]
