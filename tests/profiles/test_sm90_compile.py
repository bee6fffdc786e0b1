"""The learner step's kernels compiled for Hopper, at the seed-scale step's own launches, on any machine
(hotloop.profiles.sm90_compile: launches captured on the CPU interpreter, compiled for sm_90 with the Triton wheel's
ptxas). Issue 38: "check that each GEMM kernel compiled to warpgroup MMA (HGMMA in cuobjdump -sass) and not to the
older HMMA path", and lever 1, programmatic dependent launch: every kernel launched with it waits for its
predecessor before touching memory. The faults: ci/mutants' `fwd_gemm_two_warps` patch applied to kernels/linear.py's
source (its forward launches at 2 warps, which a warpgroup MMA cannot use) turns those kernels to HMMA; a load
hoisted above the wait in a copy of kernels/tf32_split.py makes that kernel unsafe.
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import os
import shutil
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from hotloop.guards.mutate import apply_patch
from hotloop.kernels._common import interpreting
from hotloop.kernels.dependent_launch import dependent_launch
from hotloop.kernels.tf32_split import tf32_round_copy
from hotloop.profiles.kernel_evidence import STEP_GEMM_KERNELS
from hotloop.profiles.sm90_compile import (
    MMA_PATH_COLUMNS,
    PDL_ORDER_COLUMNS,
    Launch,
    capture_launches,
    compile_launches,
    dependent_launch_order,
    launch_spec,
    mma_paths,
)
from hotloop.trainer.config import preset
from hotloop.trainer.replay import PrioritizedReplay
from hotloop.trainer.step import HotLearner

REPO = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.skipif(
    not interpreting(),
    reason="captures launches on the CPU interpreter (TRITON_INTERPRET=1, which tests/conftest.py sets where there is no GPU)",
)

GEMMS = {name for names in STEP_GEMM_KERNELS.values() for name in names}
TF32_GEMMS = GEMMS - {"_heads_bwd_fp32_kernel"}
"""The step's GEMMs with TF32 dots (forward TF32, backward 3xTF32); the heads' backward is FP32 FMAs by design."""
GROUPED = {"_fwd_grouped_tf32_gemm_kernel", "_heads_grouped_tf32_kernel"}
TWO_STREAM = {
    "_fwd_online_tf32_gemm_kernel",
    "_fwd_ddqn_tf32_gemm_kernel",
    "_heads_online_tf32_kernel",
    "_heads_ddqn_tf32_kernel",
}
"""The forward kernels of a step with Config.grouped_forward on (GROUPED), and of the default step (TWO_STREAM)."""


@pytest.fixture(scope="module")
def seed_step():
    """(learner, the launches of one seed-scale learner step, their compiled kernels): the seed-scale net and batch
    (8192 rows, trunk 512-256, heads 80, 4x4x4 actions) over a replay of 8192 random transitions, with
    programmatic dependent launch on (Config.dependent_launch: the prologue it adds changes no kernel's MMA path)."""
    cfg = preset("seed-scale", replay_capacity=8192, learner="hotloop", dependent_launch=True)
    rp = PrioritizedReplay(
        cfg.replay_capacity, cfg.obs_dim, 3, alpha=cfg.per_alpha, eps=cfg.per_eps, device="cpu", use_kernels=True
    )
    g = torch.Generator().manual_seed(0)
    n = cfg.replay_capacity
    rp.add(
        torch.randn(n, cfg.obs_dim, generator=g),
        torch.randint(0, 4, (n, 3), generator=g),
        torch.randn(n, generator=g),
        torch.randn(n, cfg.obs_dim, generator=g),
        torch.rand(n, generator=g) < 0.1,
    )
    learner = HotLearner(cfg, cfg.obs_dim, (4, 4, 4), torch.device("cpu"), rp)
    with capture_launches() as launches:
        learner.step()
    return learner, launches, compile_launches(launches)


def test_every_tf32_gemm_of_the_seed_scale_step_compiles_to_warpgroup_mma_only(seed_step):
    _, launches, compiled = seed_step
    gemms = [i for i, launch in enumerate(launches) if launch.name in GEMMS]
    # every GEMM kernel of the (default) step was launched and is judged; the grouped forward's: the test below
    assert {launches[i].name for i in gemms} == GEMMS - GROUPED
    table = mma_paths([launches[i] for i in gemms], [compiled[i] for i in gemms])
    assert list(table.columns) == MMA_PATH_COLUMNS
    tf32 = table[table["kernel"].isin(TF32_GEMMS)]
    assert len(tf32) >= 10 and tf32["path"].eq("warpgroup").all(), tf32.to_string()
    assert (tf32["warpgroup_mma"] > 0).all() and tf32["warp_mma"].eq(0).all()
    heads_bwd = table[table["kernel"].eq("_heads_bwd_fp32_kernel")]
    assert heads_bwd["path"].eq("none").all() and (heads_bwd["fma_f32"] > 0).all(), heads_bwd.to_string()


def test_the_grouped_forward_of_the_seed_scale_step_compiles_to_warpgroup_mma_only(seed_step, monkeypatch):
    """Config.grouped_forward: the three forwards in one launch per layer (grid z = 3), at the seed-scale step's
    tiles; its forward GEMMs replace the default step's four forward kernels and compile to HGMMA only."""
    learner, _, _ = seed_step
    monkeypatch.setattr(learner, "cfg", replace(learner.cfg, grouped_forward=True))
    with capture_launches() as launches:
        learner.step()
    gemms = [launch for launch in launches if launch.name in GEMMS]
    assert {launch.name for launch in gemms} == GEMMS - TWO_STREAM
    forward = [launch for launch in gemms if launch.name in GROUPED]
    assert len(forward) == len(learner.layout.layers) + 1, [launch.name for launch in forward]
    compiled = compile_launches(forward)
    table = mma_paths(forward, compiled)
    assert table["path"].eq("warpgroup").all() and (table["warpgroup_mma"] > 0).all(), table.to_string()
    assert table["warp_mma"].eq(0).all()
    order = dependent_launch_order(forward, compiled)  # launched with PDL (the fixture's config): wait first
    assert order["launch_pdl"].all() and order["safe"].all(), order.to_string()


def _patched_linear(tmp_path: Path, patch: str):
    """kernels/linear.py with ci/mutants/<patch> applied (guards.mutate.apply_patch on a copy), loaded as a module
    under the original's name (so that the compile child finds its kernels where they live: the patch changes the
    launch, not the kernel bodies)."""
    import hotloop.kernels.linear as original

    tree = tmp_path / "tree"
    (tree / "kernels").mkdir(parents=True)
    shutil.copy(inspect.getsourcefile(original), tree / "kernels" / "linear.py")
    err = apply_patch(REPO / "ci" / "mutants" / patch, tree)
    assert err is None, err
    spec = importlib.util.spec_from_file_location(original.__name__, tree / "kernels" / "linear.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_two_warp_forward_mutant_falls_back_to_warp_mma(seed_step, tmp_path, monkeypatch):
    learner, _, _ = seed_step
    patched = _patched_linear(tmp_path, "fwd_gemm_two_warps.patch")
    monkeypatch.setattr(learner, "linear_forward", patched.linear_forward)  # the step's launch point (trainer/step.py)
    with capture_launches() as launches:
        learner.step()
    two_warps = [launch for launch in launches if launch.name in GEMMS and launch.options.get("num_warps") == 2]
    # the patch leaves the 8-warp launches (those storing y^T) alone: the Double-DQN ones and the online output layer
    assert {launch.name for launch in two_warps} == {"_fwd_ddqn_tf32_gemm_kernel", "_fwd_online_tf32_gemm_kernel"}, [
        (launch.name, launch.options) for launch in launches
    ]
    table = mma_paths(two_warps, compile_launches(two_warps))
    assert table["path"].eq("warp").all() and (table["warp_mma"] > 0).all(), table.to_string()


def test_every_launch_of_the_step_waits_for_its_predecessor_before_touching_memory(seed_step):
    _, launches, compiled = seed_step
    table = dependent_launch_order(launches, compiled)
    assert list(table.columns) == PDL_ORDER_COLUMNS and len(table) == len(launches) >= 20
    # every launch of the step uses PDL (none left out by its launcher), and each waits before its first access
    assert table["launch_pdl"].all() and table["safe"].all(), table.to_string()
    assert table["waits"].eq(1).all() and table["triggers"].eq(1).all() and (table["first_memory_line"] > 0).all()


def test_a_load_hoisted_above_the_wait_is_unsafe(tmp_path, monkeypatch):
    """The fault, in the source: a copy of kernels/tf32_split.py (as module `pdl_mutant_tf32_split`, which the
    compile child imports from tmp_path) whose weight-rounding kernel loads its input before gdc_prologue."""
    import hotloop.kernels.tf32_split as original

    text = Path(inspect.getsourcefile(original)).read_text()
    prologue = "    gdc_prologue(GDC)\n"
    load = "    x = tl.load(src_ptr + offs, mask=mask)\n"
    start = text.index("def _fwd_weights_rna_kernel(")
    body = text[start:]
    assert body.count(prologue) >= 1 and load in body, "the kernel's source changed: update the fault"
    mutant_body = body.replace(prologue, "", 1).replace(load, load + prologue, 1)
    (tmp_path / "pdl_mutant_tf32_split.py").write_text(text[:start] + mutant_body)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("PYTHONPATH", f"{tmp_path}:{os.environ.get('PYTHONPATH', '')}")
    mutant = importlib.import_module("pdl_mutant_tf32_split")
    src = torch.randn(2, 5000)
    with dependent_launch(True), capture_launches() as launches:
        original.tf32_round_copy(src, torch.empty_like(src))
        mutant.tf32_round_copy(src, torch.empty_like(src))
    assert [launch.fn.__module__ for launch in launches] == [original.__name__, "pdl_mutant_tf32_split"]
    table = dependent_launch_order(launches, compile_launches(launches))
    assert table["launch_pdl"].all() and table["safe"].tolist() == [True, False], table.to_string()
    assert table.loc[1, "first_memory_line"] < table.loc[1, "wait_line"]


@pytest.mark.parametrize(
    "line,access",
    [
        ("\tld.global.b32 %r1, [%rd1];", True),
        ("@%p1 ld.global.v4.b32 {%r1, %r2, %r3, %r4}, [%rd2];", True),
        ("\tldu.global.f32 %f1, [%rd1];", True),
        ("\tld.f32 %f1, [%rd1];", True),  # a generic address may be global
        (
            "\tcp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%r1], [%rd1, {%r2}], [%r4];",
            True,
        ),
        ("\tcp.async.cg.shared.global [%r1], [%rd1], 16;", True),
        ("\tatom.global.gpu.acq_rel.add.f32 %f1, [%rd1], %f2;", True),
        ("\tred.global.add.f32 [%rd1], %f1;", True),
        ("\tst.global.b32 [%rd1], %r1;", True),
        ("\tld.param.u64 %rd1, [k_param_0];", False),
        ("\tld.shared.b32 %r1, [%r2];", False),
        ("\tst.shared.b32 [%r1], %r2;", False),
        ("\tcvta.to.global.u64 %rd2, %rd1;", False),
        ("\tgriddepcontrol.wait;", False),
    ],
)
def test_the_order_check_sees_every_kind_of_global_access(line, access):
    """A PDL launch whose PTX has `line` before its wait is unsafe exactly when `line` may touch global memory."""
    launch = Launch(lambda: None, "k", {}, (), {"launch_pdl": True})
    table = dependent_launch_order([launch], [{"name": "k", "ptx": f"{line}\n\tgriddepcontrol.wait;\n", "sass": ""}])
    assert table["safe"].tolist() == [not access]


def test_launches_without_dependent_launch_pass_neither_flag():
    src = torch.randn(3000)
    with capture_launches() as launches:
        tf32_round_copy(src, torch.empty_like(src))
    assert launches[0].options.get("launch_pdl") is False and launches[0].args["GDC"] is False
    table = dependent_launch_order(launches, [{"name": "k", "ptx": "ld.global.b32 %r1, [%rd1];", "sass": ""}])
    assert table["safe"].tolist() == [True] and table["waits"].tolist() == [0]
    with pytest.raises(ValueError, match="1 launches but 0 compiled"):
        dependent_launch_order(launches, [])


def test_a_launch_argument_without_a_signature_type_is_named():
    def kernel(x_ptr, n):
        pass

    launch = Launch(kernel, "kernel", {"x_ptr": torch.zeros(2), "n": object()}, (), {})
    with pytest.raises(ValueError, match="argument n: object has no Triton signature type"):
        launch_spec(launch)
    launch.args["n"] = torch.zeros(2, dtype=torch.complex64)
    with pytest.raises(ValueError, match="argument n: a tensor of dtype torch.complex64"):
        launch_spec(launch)


def test_capture_needs_the_interpreter(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    with pytest.raises(RuntimeError, match="TRITON_INTERPRET=1"):
        with capture_launches():
            pass


def test_a_kernel_whose_run_is_set_on_itself_is_refused_not_run():
    """The fault CI met (tests/kernels/test_segment_tree.py once patched `run` with monkeypatch.setattr, whose undo
    leaves the bound method on the kernel): inside the capture that kernel would run for real, on the interpreter
    with the GPU's constexprs; it is refused with the cause instead."""
    from hotloop.kernels import tf32_split
    from hotloop.kernels.tf32_split import tf32_round_copy

    src = torch.randn(300)
    kernel = tf32_split._fwd_weights_rna_kernel
    kernel.run = kernel.run  # what monkeypatch's undo leaves behind
    try:
        with pytest.raises(RuntimeError, match="_fwd_weights_rna_kernel ran instead of being recorded"):
            with capture_launches():
                tf32_round_copy(src, torch.empty_like(src))
    finally:
        del kernel.run
    with capture_launches() as launches:
        tf32_round_copy(src, torch.empty_like(src))
    assert [launch.name for launch in launches] == ["_fwd_weights_rna_kernel"]


def test_mma_paths_reads_each_launchs_sass():
    def kernel(x_ptr, BLOCK_M):
        pass

    launch = Launch(kernel, "kernel", {"x_ptr": torch.zeros(1), "BLOCK_M": 64}, ("BLOCK_M",), {"num_warps": 8})
    sass = {
        "warpgroup": "HGMMA.64x64x8.F32.TF32 R0, gdesc[UR4], RZ ;",
        "warp": "HMMA.1688.F32.TF32 R0, R4, R8, R0 ;",
        "mixed": "HGMMA.64x64x8.F32.TF32 R0 ;\nHMMA.1688.F32.TF32 R0 ;",
        "none": "FFMA R0, R1, R2, R0 ;\nEXIT ;",
    }
    table = mma_paths([launch] * 4, [{"name": "kernel", "ptx": "", "sass": text} for text in sass.values()])
    assert table["path"].tolist() == list(sass)
    assert table["tiles"].tolist() == ["BLOCK_M=64"] * 4 and table["num_warps"].tolist() == [8] * 4
    assert table["fma_f32"].tolist() == [0, 0, 0, 1]
    with pytest.raises(ValueError, match="1 launches but 0 compiled"):
        mma_paths([launch], [])
