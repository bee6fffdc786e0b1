"""hotloop.profiles: measurement. Trace reading (Kineto JSON: kineto_reader; Nsight Systems SQLite: nsight_reader)
into one event schema (trace_schema), the counts over it (trace_counts; trace_stream for a trace read as a
stream of frames, in bounded memory; trace_anomalies) and `hotloop inspect` (inspect_cmd; rank_traces: the
traces of a data-parallel run's ranks and their cross-rank spread),
`hotloop nsys` (nsys_cmd), NVTX ranges (ranges), per-epoch tables and timers (epoch_table, epoch_timer), NVML
telemetry, plots, durable_files (fsync of a run folder after an atomic replace), run_lock (one writer per run
folder), input_files (every input file read: regular files only, whole reads capped), kernel_evidence (MMA
instruction counts of compiled Triton kernels; sm90_compile: the launches of a piece of work compiled for Hopper
on any machine, and each one's MMA path from its SASS), `hotloop report`, provenance (commit and GPU of a result). The
synthetic traces, the trace readers' benchmark, the kernel bench and the split-GEMM probe are lab code, in the
checkout's results/lab/ (not shipped).

Layer: above hotloop.kernels (kernel_evidence and sm90_compile may import it); never
imports hotloop.trainer or hotloop.guards (tests/test_layout.py). The committed results are in the checkout's
results/, outside the package."""
