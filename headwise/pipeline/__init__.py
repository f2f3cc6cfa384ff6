"""Pipeline: a spec compiled into model, levers, data and contract; train, verify and report."""

from headwise.pipeline.compile import MASK_BUILDERS, Compiled, compile_spec

__all__ = ["MASK_BUILDERS", "Compiled", "compile_spec"]
