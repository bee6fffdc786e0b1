"""graph vs eager vs eager2 divergence trajectory (run from a tree dir, PYTHONPATH=tree)."""
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
