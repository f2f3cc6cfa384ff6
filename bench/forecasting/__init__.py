"""The benchmarks that fit and score headwise's packaged forecasters (see README.md here)."""
