"""Last run on the trees of 65a7a86..8a10f9a (branch wip/dw1-in-dx2, 2026-11-30); it reaches into private helpers
of that time's tests/unit/test_hot_learner.py (copied into each tree as hl_test.py: _setup, _rel): a record tied to
those commits, not kept working against later code (output: ab/dw1_in_dx2/replay_divergence.txt; the device run:
../device/replay_divergence.sh, as replaycheck.py).

graph vs eager vs eager2 divergence trajectory (run from a tree dir, PYTHONPATH=tree)."""
import importlib.util, sys, torch
spec = importlib.util.spec_from_file_location("hl_test", "hl_test.py"); m = importlib.util.module_from_spec(spec)
spec.loader.exec_module(m)
rel = m._rel
for trial in range(int(sys.argv[1]) if len(sys.argv) > 1 else 2):
    sizes = dict(batch_size=1024, replay_capacity=4096, trunk_hidden=(128, 64), head_hidden=32)
    runs = [m._setup(**sizes)[2] for _ in range(3)]
    graph, eager, eager2 = runs
    graph.capture()
    for l in (eager, eager2):
        for _ in range(2):
            l.step()
    torch.cuda.synchronize()
    out = [f"s0 d={rel(graph.nets, eager.nets):.1e} f={rel(eager2.nets, eager.nets):.1e}"]
    for k in range(1, 51):
        for l in runs:
            l.step()
        if k in (1, 2, 3, 5, 10, 20, 35, 50):
            torch.cuda.synchronize()
            out.append(f"s{k} d={rel(graph.nets, eager.nets):.1e} f={rel(eager2.nets, eager.nets):.1e} g={rel(graph.grads, eager.grads):.1e} gf={rel(eager2.grads, eager.grads):.1e}")
    print(f"trial {trial}:", " | ".join(out))
