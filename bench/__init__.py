"""Benchmarks that print JSON and compare against a reference measured in the same run."""
