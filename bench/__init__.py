"""Benchmarks. Each module has `run(out_dir: Path, quick: bool) -> dict` and writes JSON
(and plots where useful) into out_dir; `semel bench` runs them all."""
