"""``benchmark/kernels/ncu_source.py``: Nsight Compute's SASS source page summed by instruction
and opcode (the GPU stage ``moe-ncu-gluon`` with ``SOURCE=1`` writes the page)."""

import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..",
                                "benchmark", "kernels"))
import ncu_source  # noqa: E402

PAGE = '''"Kernel Name","moe_gemm_mx_frag_gluon_kernel"
"# Address","Source","Warp Stall Sampling (All Samples)","Warp Stall Sampling (Not-issued Samples)"
"0x100","BAR.SYNC.DEFER_BLOCKING 0x0 ;","1,200","1,150"
"0x110","@!P0 LDGSTS.E.BYPASS.128 [R0], desc[UR48][R2.64] ;","30","10"
"0x120","DEPBAR.LE SB0, 0x3 ;","2,500","2,480"
"0x130","HMUL2.BF16_V2 R52, R52, R15 ;","270","40"
"0x140","BAR.SYNC.DEFER_BLOCKING 0x0 ;","1,000","990"
'''


def test_ranks_instructions_and_sums_opcodes(tmp_path):
    path = tmp_path / "source.csv"
    path.write_text(PAGE)
    (rows,) = ncu_source.tables(str(path))
    assert len(rows) == 5
    assert ncu_source.opcode(rows[1]["Source"]) == "LDGSTS"
    text = ncu_source.report(rows, top=2)
    ranked = [line for line in text.splitlines() if line.startswith("| 0x")]
    assert [line.split(" | ")[0] for line in ranked] == ["| 0x120", "| 0x100"]
    assert "5,000 stall samples" in text
    assert "| BAR | 2,200 | 44.0% |" in text and "| DEPBAR | 2,500 | 50.0% |" in text
