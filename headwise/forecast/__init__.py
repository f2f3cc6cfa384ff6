"""Forecasts of each head's final role from a run's early checkpoints (docs/roles.md,
"Forecasting"); forecasts of contract clauses built on them are ``headwise.contract.forecast``."""

from headwise.forecast.roles import Forecaster, forecast_heads, linear_forecast, load_forecaster

__all__ = ["Forecaster", "forecast_heads", "linear_forecast", "load_forecaster"]
