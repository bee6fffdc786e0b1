"""Compile the TF32 forward GEMM kernel (kernels/linear.py `_fwd_online_tf32_gemm_kernel`) for sm90 on a machine
without a GPU (Triton's bundled ptxas) and print its resources, to see what rounding its operands to TF32 costs in
the code: shared memory, wgmma and cp.async counts, the integer ops, registers and stack (cuobjdump -res-usage).
Usage: python forward_rounding.py [N K WARPS [ROUNDS]] (default 512 64 4 X: seed scale's first layer, as the step
launches it: 128 x 128 x BLOCK_K tiles, 3 stages, a gathered input; ROUNDS: which of the kernel's rounding switches
are on, letters of X (the x tile in the loop), W (the weight tile in the loop), Y (the stored output), or "-" for
none), with hotloop importable."""
import os
import re
import subprocess
import sys
import tempfile

import triton
import triton.backends.nvidia as nv
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from hotloop.kernels import linear

n, k, warps = (int(a) for a in sys.argv[1:4]) if len(sys.argv) > 3 else (512, 64, 4)
fn = linear._fwd_online_tf32_gemm_kernel
sig = {"x_ptr": "*fp32", "idx_ptr": "*i64", "w_ptr": "*fp32", "b_ptr": "*fp32", "g_ptr": "*fp32", "y_ptr": "*fp32",
       "yt_ptr": "*fp32", "M": "i32", "N": "i32", "K": "i32", "stride_xm": "i32", "x_zstride": "i32",
       "p_zstride": "i32", "y_zstride": "i32", "gain_group": "i32"}
consts = dict(GATHER=True, RELU=True, STORE_T=False, BLOCK_M=128, BLOCK_N=min(128, n), BLOCK_K=min(32, k))
rounds = sys.argv[4] if len(sys.argv) > 4 else "X"
consts.update({f"ROUND_{c}": c in rounds for c in "XWY"})
sig.update({c: "constexpr" for c in consts})
src = ASTSource(fn=fn, signature=sig, constexprs={(fn.arg_names.index(c),): v for c, v in consts.items()})
kern = triton.compile(src, target=GPUTarget("cuda", 90, 32), options=dict(num_warps=warps, num_stages=3))
ptx = kern.asm["ptx"]
with tempfile.NamedTemporaryFile(suffix=".cubin", delete=False) as f:
    f.write(kern.asm["cubin"])
cuobjdump = os.path.join(os.path.dirname(nv.__file__), "bin", "cuobjdump")
usage = subprocess.run([cuobjdump, "-res-usage", f.name], capture_output=True, text=True).stdout
cp_async = len(re.findall(r"cp\.async\.(?:ca|cg)", ptx))
print(f"rounds {rounds} N {n} K {k} warps {warps} shared {kern.metadata.shared} B, wgmma {ptx.count('wgmma.mma_async')}, "
      f"cp.async {cp_async}, ld.shared {ptx.count('ld.shared')}, "
      f"st.shared {ptx.count('st.shared')}, and.b32 {ptx.count('and.b32')}, "
      f"spill ld/st {ptx.count('ld.local') + ptx.count('st.local')}")
print(" ".join(l.strip() for l in usage.splitlines() if "REG" in l))
