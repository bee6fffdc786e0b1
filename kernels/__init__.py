"""hotloop.kernels: the Triton kernels of the hot path, each module holding `_name_kernel`(s), the launcher that
checks its inputs, and the plain-torch reference it is tested against (float64 on fresh random input) — the
references of the loss terms (losses.py) and of the sum tree (sum_tree.py) live here too.

Layer: the bottom one. It imports nothing of hotloop.trainer, hotloop.profiles or hotloop.guards
(tests/test_layout.py checks the import graph)."""
