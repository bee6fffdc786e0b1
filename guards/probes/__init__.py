"""hotloop.guards.probes: the measurements the harness runs on the trainer, kept out of the trainer, the kernels and the
harness library. precision_probe (the learner's GEMMs measured against float64: the gate's "TF32 forward only"
verdict), bench_variants (the learner-step and loop-iteration variants `hotloop bench` times side by side, and the
random replay fill they share with the probe), bench (`hotloop bench`'s library: timing, roofline floor, table).

Layer: above hotloop.trainer and the harness library of hotloop.guards (it may import hotloop.kernels,
hotloop.profiles, hotloop.trainer and guards' library modules); below guards' composition modules (gate, faults)
and the `hotloop` command, which import it. Nothing of the learner step imports it (tests/test_layout.py). The lab
code that is not shipped (kernel and split-GEMM benches, precision variants, trace synthesis) is in the checkout's
results/lab/, outside every package."""
