"""lab: probes, benches and experiment kernels run from a checkout, not shipped in the wheel (pyproject.toml lists
the hotloop packages only). Run them from the repository root (`PYTHONPATH=results python -m lab.kernel_bench`); the test suite
imports them through pytest's `pythonpath = ["."]`. They import `hotloop` as any user script does; no module of
hotloop imports them (tests/test_layout.py).

kernel_bench (each Triton kernel vs its plain-torch reference, CUDA events; kernel_bench_inputs: the seed-scale
inputs and (kernel, reference) pairs it times), split_gemm_probe (the backward GEMMs by precision, split placement
and layout), precision_variants (the step's GEMMs in a chosen `tl.dot` precision: the mutants the precision probe
must catch) and precision_bounds (the probe's errors for the step and those variants: where its bounds come from),
trace_synth (synthetic Kineto traces of N events) and trace_read_bench (the trace readers' time and memory on
them), learner_compare (the two learners side by side on the same batches)."""
