"""hotloop.profiles: measurement. Trace reading (Kineto JSON: kineto_reader; Nsight Systems SQLite: nsight_reader)
into one event schema (trace_schema), the counts over it (trace_counts) and `hotloop inspect` (inspect_cmd),
`hotloop nsys` (nsys_cmd), NVTX ranges (ranges), per-epoch tables and timers (epoch_table, epoch_timer), NVML
telemetry, plots, `hotloop report`, provenance (commit and GPU of a result), and the kernel bench and split-GEMM
probe (kernel_bench, split_gemm_probe). baselines/ is package data: the per-GPU baselines of `hotloop gate`.

Layer: above hotloop.kernels (only the kernel bench and the probe import it); never imports hotloop.trainer or
hotloop.guards (tests/test_layout.py). profiles/h200/ and profiles/cpu/ in a checkout are committed results: data,
not code, never shipped or imported."""
