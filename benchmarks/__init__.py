"""The measurements, recorders and reproducers beside the package: run each from the repository root as
`python -m benchmarks.NAME` (README.md in this folder lists them all)."""
