"""hotloop.trainer: the GPU-resident DQN trainer. config (presets), envs (GPU-vectorized CartPole and synthetic
envs, a Gymnasium adapter), replay (proportional PER on a sum tree), network / flat_net (weights as views of one
flat buffer), learner (the plain-torch reference learner), step (HotLearner: the captured learner step of fused
kernels), actor (the env step as a CUDA graph), readback (pinned double buffer), device_choice (the device and the
learner a config runs with), loop (epochs), checkpoint and resume, distributed (one all-reduce of the flat
gradient: data-parallel learners over torch.distributed). The probes and benches that measure it are in
hotloop.guards.probes and the checkout's results/lab/.

Layer: imports hotloop.kernels and hotloop.profiles, never hotloop.guards (tests/test_layout.py)."""
