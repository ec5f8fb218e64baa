"""bench/chain.py: a decode layer's chain with weights streamed after each wait or ahead of it."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from bench_scripts import load, run_main, stack_frames

from mk.backends.cuda import build

NVCC = build.nvcc()


def _same(row: str) -> str:
    """A table row's "same sums as direct" cell."""
    return row.split("|")[6].strip()


def test_the_program_runs_every_mode_once() -> None:
    bench = load("chain")
    src = bench.program_source([32, 0, 16], 2, [1, 4])
    assert src == bench.program_source([32, 0, 16], 2, [1, 4])  # deterministic
    runs = [line.strip() for line in src.splitlines() if line.strip().startswith('run("')]
    assert runs == [
        'run("chain", 0, 0, 0);',
        'run("direct", 1, 0, 0);',
        'run("chainr", 0, 0, 0);',
        'run("directr", 1, 0, 0);',
        'run("chainmk", 0, 0, 0);',
        'run("directmk", 1, 0, 0);',
        'run("chainll", 0, 0, 0);',
        'run("directll", 1, 0, 0);',
        'run("directlls", 1, 0, 0);',
        'run("directllsw", 1, 0, 0);',
        'run("directpfw", 1, 0, 0);',
        'run("directpfs", 1, 0, 0);',
        'run("directpfs2", 1, 0, 0);',
        'run("directpfp4", 1, 0, 0);',
        'run("directpfp8", 1, 0, 0);',
        'run("directpfp16", 1, 0, 0);',
        'run("directsp0", 1, 0, 0);',
        'run("directsp", 1, 0, 0);',
        'run("directsp2", 1, 0, 0);',
        'run("chainbg", 5, 1, 0);',
        'run("chainbg", 5, 4, 0);',
        'run("ring", 2, 1, 0);',
        'run("ring", 2, 4, 0);',
        f'run("stream", 3, {bench.SLOTS}, 0);',
        f'run("bare", 4, {bench.SLOTS}, 0);',
        'run("ringc", 2, 1, 1);',
        'run("ringc", 2, 4, 1);',
        f'run("streamc", 3, {bench.SLOTS}, 1);',
        f'run("barec", 4, {bench.SLOTS}, 1);',
        'run("bgll", 5, 1, 0);',
        'run("bgll", 5, 4, 0);',
        'run("ringll", 2, 1, 0);',
        'run("ringll", 2, 4, 0);',
        'run("ringcll", 2, 1, 1);',
        'run("ringcll", 2, 4, 1);',
        'run("ringdyn", 2, 1, 0);',
        'run("ringdyn", 2, 4, 0);',
    ]
    assert "__constant__ int c_rows[kPhases] = {32, 0, 16};" in src
    assert "__constant__ int c_prefix[kPhases] = {0, 32, 32};" in src
    assert "cp.async.bulk.prefetch.L2.global" in src  # the directpf modes' next slab
    assert f"constexpr int SPARE = {bench.SPARE};" in src  # the directsp modes' prefetching CTAs
    assert "atomicAdd(claim, 1u)" in src  # the dyn modes' loader claims its chunks
    assert "return (long long)r * ctas + cta;" in src  # every phase's rows interleaved


def test_clusters_add_the_cluster_local_modes() -> None:
    bench = load("chain")
    plain = bench.program_source([32, 0, 16], 2, [1], local=[False, True, False])
    assert "chaincl" not in plain and "cudaLaunchCooperativeKernel" in plain
    src = bench.program_source([32, 0, 16], 2, [1], local=[False, True, False], cluster=4)
    runs = [line.strip() for line in src.splitlines() if line.strip().startswith('run("')]
    assert runs[19:21] == ['run("chaincl", 0, 0, 0);', 'run("directcl", 1, 0, 0);']
    assert "__constant__ int c_local[kPhases] = {0, 1, 0};" in src
    assert "attrs[0].val.clusterDim.x = 4;" in src
    assert "mbarrier.arrive.release.cluster.shared::cluster.b64" in src


def test_clusters_add_the_shared_memory_modes() -> None:
    """Where every local phase follows one with rows that fit a receive buffer, the dsm modes
    take those values through the peers' shared memory."""
    bench = load("chain")
    src = bench.program_source([32, 16, 48], 2, [1, 4], local=[True, True, False], cluster=4)
    runs = [line.strip() for line in src.splitlines() if line.strip().startswith('run("')]
    assert runs[19:27] == [
        'run("chaincl", 0, 0, 0);', 'run("directcl", 1, 0, 0);',
        'run("chaindsm", 0, 0, 0);', 'run("directdsm", 1, 0, 0);',
        'run("bgdsm", 5, 1, 0);', 'run("bgdsm", 5, 4, 0);',
        'run("ringdsm", 2, 1, 0);', 'run("ringdsm", 2, 4, 0);',
    ]  # fmt: skip
    # phase 2's rows feed phase 0 (local) of the next layer, phase 0's feed phase 1
    assert "__constant__ int c_push[kPhases] = {1, 0, 1};" in src
    assert "st.shared::cluster.f32" in src
    after_empty = bench.program_source([32, 0, 16], 2, [1], local=[False, True, True], cluster=4)
    assert "chaincl" in after_empty and "chaindsm" not in after_empty
    assert bench.dsm_problem([32, 0, 16], [False, True, True], 4) == (
        "local phase 2 follows a phase without rows"
    )
    assert bench.dsm_problem([72, 48], [False, True], 16) == (
        "a cluster of 16 CTAs has more than 1024 values of phase 0"
    )
    assert bench.dsm_problem([32, 48], [False, True], 16) is None


def test_flagged_phases_add_the_mix_modes() -> None:
    """Phases marked `l` hand their values on with flags in chainmix / directmix, the rest wait
    on counters; a counter wait must not read the plain values of a flagged phase."""
    bench = load("chain")
    assert "directmix" not in bench.program_source([32, 0, 16], 2, [1])
    flagged = [True, True, False, False]
    src = bench.program_source([32, 0, 16, 72], 2, [1], flagged=flagged)
    runs = [line.strip() for line in src.splitlines() if line.strip().startswith('run("')]
    assert runs[19:21] == ['run("chainmix", 0, 0, 0);', 'run("directmix", 1, 0, 0);']
    assert "__constant__ int c_flagged[kPhases] = {1, 1, 0, 0};" in src
    assert "constexpr bool kLastFlagged = false;" in src
    assert bench.flag_problem([32, 0, 16, 72], flagged) is None
    assert bench.flag_problem([32, 0, 16, 72], [True, False, False, False]) == (
        "phase 2 waits on a counter but the values it reads (phase 0's) are flagged: "
        "flag the phases in between too"
    )


def test_accumulated_phases_run_the_counted_modes() -> None:
    """Phases marked `a` add their rows into every output: mk's f32 reductions and counter
    against counted words (a sum and its terms' count in one 8-byte word)."""
    bench = load("chain")
    src = bench.program_source([32, 0, 16, 72], 2, [1], acc=[False, False, True, True])
    runs = [line.strip() for line in src.splitlines() if line.strip().startswith('run("')]
    assert [r.split('"')[1] for r in runs] == [
        "chainmk", "directmk", "chainll", "directll", "directlls", "bare", "bgll", "ringll",
    ]  # fmt: skip
    assert "__constant__ int c_acc[kPhases] = {0, 0, 1, 1};" in src
    assert "red.relaxed.gpu.global.add.u64" in src  # the counted words' terms
    # mk's red.add.v4.f32, into the CTA's copy of the outputs (one copy by default)
    assert "atomicAdd(reinterpret_cast<float4*>(plain + (blockIdx.x % kAccCopies) * K + e)" in src
    assert "constexpr int kAccCopies = 1;" in src
    # the accumulated phases' outputs start at zero, the third and fourth of each layer's
    assert "prm.act_stride * (1 + (long long)l * 4 + 2), 0, 1 * K * sizeof(float)" in src
    assert "prm.act_stride * (1 + (long long)l * 4 + 3), 0, 1 * K * sizeof(float)" in src
    assert "constexpr unsigned kAccNap = 0;" in src and "kAccSpread = false;" in src
    tuned = bench.program_source(
        [32, 16], 2, [1], acc=[False, True], acc_nap=64, acc_spread=True, acc_copies=4
    )
    assert "constexpr unsigned kAccNap = 64;" in tuned and "kAccSpread = true;" in tuned
    assert "constexpr int kAccCopies = 4;" in tuned
    # four copies zeroed, and the stride holds them
    assert "0, 4 * K * sizeof(float)" in tuned and "(long long)4 * K)" in tuned


@pytest.mark.skipif(NVCC is None, reason="needs nvcc")
def test_counted_words_sum_in_any_order(tmp_path: Path) -> None:
    """The counted word's decoding on the host: terms of both signs, added as 64-bit integers in
    two orders, give the same word, their count and their sum to the fixed point's step."""
    ll = load("chain_ll")
    main = (
        r"""
#include <cmath>
#include <cstdint>
#include <cstdio>
constexpr int K = 1024;
constexpr unsigned kAccNap = 0;
constexpr bool kAccSpread = false;
constexpr int kAccCopies = 1;
__device__ long long row_at(int cta, int r, int ctas) { return (long long)r * ctas + cta; }
"""
        + ll.LL_SOURCE
        + r"""
unsigned long long term(float v) {
  return (1ull << kCountShift) + static_cast<unsigned long long>(llrint(static_cast<double>(v) * kFixed));
}
int main() {
  unsigned long long up = 0, down = 0;
  double exact = 0;
  for (int t = 0; t < 200; ++t) {
    const float v = ((t * 7919) % 2001 - 1000) * 0.0137f;  // -13.7 .. 13.7
    up += term(v);
    down += term(((199 - t) * 7919 % 2001 - 1000) * 0.0137f);
    exact += v;
  }
  printf("%d %u %.9g %.9g\n", up == down, acc_count(up), acc_value(up), exact);
  return 0;
}
"""
    )
    cu, exe = tmp_path / "words.cu", tmp_path / "words"
    cu.write_text(main)
    subprocess.run(
        [str(NVCC), "-std=c++17", "-gencode=arch=compute_90a,code=sm_90a", "-o", str(exe), str(cu)],
        check=True,
    )  # fmt: skip
    same, count, value, exact = subprocess.run(
        [str(exe)], check=True, capture_output=True, text=True
    ).stdout.split()
    assert same == "1" and count == "200"
    assert abs(float(value) - float(exact)) < 200 * 2.0**-30 + 1e-6 * abs(float(exact))


def test_the_table_is_per_layer_against_the_floor() -> None:
    bench = load("chain")
    out = "chain 0 100.00 -1 0\ndirect 0 400.00 -1 0\nring 2 200.00 1 0\nring 4 210.00 0 0\n"
    out += "chainbg 1 150.00 -1 2750 0.91 1.07\nringdyn 1 120.00 1 0 0.80 1.25\n"
    out += "copy 4000.0\nbytes 400000000\nctas 132\n"
    text = bench.table(out, 4)
    assert "floor 100.0 µs (25.00 µs a layer), 132 CTAs" in text
    assert "| direct |  | 400.0 | 100.00 | 4.00 |  |  |  |" in text
    assert "| ring | 2 | 200.0 | 50.00 | 2.00 | yes |  |  |" in text
    assert "| ring | 4 | 210.0 | 52.50 | 2.10 | **no** |  |  |" in text
    # the unread stream's rate, and how evenly the CTAs moved chunks
    assert "| chainbg | 1 | 150.0 | 37.50 | 1.50 |  | 2750 | 0.91–1.07 |" in text
    assert "| ringdyn | 1 | 120.0 | 30.00 | 1.20 | yes |  | 0.80–1.25 |" in text


def test_bad_phases_are_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    bench = load("chain")
    monkeypatch.setattr("sys.argv", ["chain.py", "--phases", "12,8"])
    with pytest.raises(SystemExit, match="multiples of 8"):
        bench.main()
    monkeypatch.setattr("sys.argv", ["chain.py", "--inflight", "0"])
    with pytest.raises(SystemExit, match="in flight must be"):
        bench.main()
    monkeypatch.setattr("sys.argv", ["chain.py", "--phases", "l32,0,16"])
    with pytest.raises(SystemExit, match="phase 2 waits on a counter"):
        bench.main()
    monkeypatch.setattr("sys.argv", ["chain.py", "--phases", "32,a0,16"])
    with pytest.raises(SystemExit, match="accumulated phase needs rows"):
        bench.main()
    monkeypatch.setattr("sys.argv", ["chain.py", "--phases", "l32,0,a16"])
    with pytest.raises(SystemExit, match="neither c nor l"):
        bench.main()
    monkeypatch.setattr("sys.argv", ["chain.py", "--cluster", "17"])
    with pytest.raises(SystemExit, match="1 to 16 CTAs"):
        bench.main()


@pytest.mark.skipif(NVCC is None, reason="needs nvcc")
def test_the_program_builds_without_local_memory(tmp_path: Path) -> None:
    bench = load("chain")
    src = bench.program_source(
        [32, 0, 16, 48], 2, [2], local=[False, True, False, False], cluster=4
    )
    frames = stack_frames(str(NVCC), src, tmp_path)
    assert frames and all(f == "0" for f in frames), frames


@pytest.mark.gpu
def test_the_ring_sums_what_the_direct_stream_sums(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    args = ["--phases", "l32,l0,16,48", "--layers", "4", "--inflight", "1,12"]
    out = run_main("chain", args, monkeypatch, capsys)
    checked = ("| ring", "| directr", "| directmk", "| directll", "| directpf", "| directsp |")
    rows = [r for r in out if r.startswith((*checked, "| directsp2 |", "| directmix"))]
    assert len(rows) == 24 and all(_same(r) == "yes" for r in rows), rows
    # every chunk claimed once: the shares of a CTA's mean around 1
    shares = [r.split("|")[8].strip() for r in rows if r.startswith("| ringdyn")]
    assert len(shares) == 2 and all(
        0 < float(s.split("–")[0]) <= 1 <= float(s.split("–")[1]) for s in shares
    ), shares


@pytest.mark.gpu
def test_cluster_local_phases_run(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    args = ["--phases", "32,c0,16,48", "--layers", "4", "--inflight", "2", "--cluster", "4"]
    out = run_main("chain", args, monkeypatch, capsys)
    assert [r.split("|")[1].strip() for r in out if r.startswith("| ")][1:] == [
        "chain", "direct", "chainr", "directr", "chainmk", "directmk", "chainll", "directll",
        "directlls", "directllsw",
        "directpfw", "directpfs", "directpfs2", "directpfp4", "directpfp8", "directpfp16",
        "directsp0", "directsp", "directsp2",
        "chaincl", "directcl", "chaindsm", "directdsm", "bgdsm", "ringdsm", "chainbg",
        "ring", "stream", "bare", "ringc", "streamc", "barec", "bgll", "ringll", "ringcll",
        "ringdyn",
    ]  # fmt: skip
    checked = ("| ring", "| directr", "| directmk", "| directll")
    assert all(_same(r) == "yes" for r in out if r.startswith(checked))
    # the values through the peers' shared memory: directcl's sums
    dsm = [r for r in out if r.startswith(("| directdsm", "| ringdsm"))]
    assert len(dsm) == 2 and all(_same(r) == "yes" for r in dsm), dsm


@pytest.mark.gpu
def test_counted_words_sum_what_the_counters_sum(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    args = ["--phases", "32,0,a16,a72", "--layers", "4", "--inflight", "1"]
    out = run_main("chain", args, monkeypatch, capsys)
    rows = [r for r in out if r.startswith(("| directll", "| directlls", "| ringll"))]
    assert len(rows) == 3 and all(_same(r) == "within 1e-3" for r in rows), rows
