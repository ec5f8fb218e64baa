// RUN: mk-opt %s --split-input-file -p 'nn-to-mugraph{attention-fold=0 cache-rows=1},mugraph-append-writes' | filecheck %s
// RUN: mk-opt %s --split-input-file -p 'nn-to-mugraph{attention-fold=0 cache-rows=1},mugraph-append-writes' | mk-opt --split-input-file | filecheck %s
// RUN: mk-opt %s --split-input-file -p 'nn-to-mugraph{attention-fold=0 cache-rows=1},mugraph-append-writes{append-writes=0}' | filecheck %s --check-prefix=OFF

// A decode step's K rows: their QK-norm + RoPE kernel (one block per KV head) writes them into
// the donated cache at %p itself; the cache_write kernel goes, and the attention reads the
// kernel's result, the written cache. V's write reads its one row through the reshape (no
// graph_def makes it; @v_rows has the rows of a batch): it keeps its kernel.
func.func @step(%q: tensor<1x64xbf16>, %k: tensor<1x32xbf16>, %v: tensor<1x32xbf16>, %qw: tensor<16xbf16>, %kw: tensor<16xbf16>, %cos: tensor<1x8xbf16>, %sin: tensor<1x8xbf16>, %pos: tensor<1xi32>, %k_cache: tensor<1x2x32x16xbf16> {nn.donated}, %v_cache: tensor<1x2x32x16xbf16> {nn.donated}) -> tensor<1x64xbf16> {
  %p = nn.step %pos {offset = 0 : i64} : (tensor<1xi32>) -> tensor<1xi32>
  %len = nn.step %pos {offset = 1 : i64} : (tensor<1xi32>) -> tensor<1xi32>
  %q4 = nn.reshape %q : (tensor<1x64xbf16>) -> tensor<1x4x1x16xbf16>
  %k4 = nn.reshape %k : (tensor<1x32xbf16>) -> tensor<1x2x1x16xbf16>
  %v4 = nn.reshape %v : (tensor<1x32xbf16>) -> tensor<1x2x1x16xbf16>
  %qn = nn.rms_norm %q4, %qw {epsilon = 1.0e-06 : f32} : (tensor<1x4x1x16xbf16>, tensor<16xbf16>) -> tensor<1x4x1x16xbf16>
  %qr = nn.rope %qn, %cos, %sin : (tensor<1x4x1x16xbf16>, tensor<1x8xbf16>, tensor<1x8xbf16>) -> tensor<1x4x1x16xbf16>
  %kn = nn.rms_norm %k4, %kw {epsilon = 1.0e-06 : f32} : (tensor<1x2x1x16xbf16>, tensor<16xbf16>) -> tensor<1x2x1x16xbf16>
  %kr = nn.rope %kn, %cos, %sin : (tensor<1x2x1x16xbf16>, tensor<1x8xbf16>, tensor<1x8xbf16>) -> tensor<1x2x1x16xbf16>
  %kc = nn.cache_write %k_cache, %kr, %p {dim = 2 : i64} : (tensor<1x2x32x16xbf16>, tensor<1x2x1x16xbf16>, tensor<1xi32>) -> tensor<1x2x32x16xbf16>
  %vc = nn.cache_write %v_cache, %v4, %p {dim = 2 : i64} : (tensor<1x2x32x16xbf16>, tensor<1x2x1x16xbf16>, tensor<1xi32>) -> tensor<1x2x32x16xbf16>
  %att = nn.attention %qr, %kc, %vc, %len {scale = 0.25 : f32, causal = false} : (tensor<1x4x1x16xbf16>, tensor<1x2x32x16xbf16>, tensor<1x2x32x16xbf16>, tensor<1xi32>) -> tensor<1x4x1x16xbf16>
  %o = nn.reshape %att : (tensor<1x4x1x16xbf16>) -> tensor<1x64xbf16>
  func.return %o : tensor<1x64xbf16>
}
// CHECK-LABEL: func.func @step
// CHECK:         %kc = mugraph.graph_def grid [2, 1, 1] threads 128 forloop 1 (%k, %kw, %cos, %sin, %k_cache, %p) attributes {mk.fused = "graph+cache_write"} : ({{.*}}) -> tensor<1x2x32x16xbf16> {
// CHECK-NEXT:    ^bb0(%k_a: tensor<1x32xbf16>, %kw_a: tensor<16xbf16>, %cos_a: tensor<1x8xbf16>, %sin_a: tensor<1x8xbf16>, %k_cache_a: tensor<1x2x32x16xbf16>, %p_a: tensor<1xi32>, %kr_r: tensor<1x2x32x16xbf16>):
// CHECK:           %kr_rot = mugraph.rope
// CHECK-NEXT:      %kc_at = mugraph.input %p_a imap [-1, -1, -1] fmap -1 : tensor<1xi32> -> tensor<1xi32>
// CHECK-NEXT:      mugraph.output %kr_rot to %kr_r omap [1, -1, -1] at %kc_at dim 2 over %k_cache_a : tensor<1x1x1x16xf32>, tensor<1xi32> -> tensor<1x2x32x16xbf16>
// CHECK:         %vc = mugraph.kernel "cache_write" (%v_cache, %v, %p)
// CHECK:         mugraph.graph_def grid [2, 1, 1] threads 128 forloop 1 (%qr, %kc, %vc, %len)
// CHECK-NOT:     "cache_write" (%k_cache
// OFF-LABEL: func.func @step
// OFF:         %kr = mugraph.graph_def grid [2, 1, 1]
// OFF:         %kc = mugraph.kernel "cache_write" (%k_cache, %kr, %p)
// OFF-NOT:     at %

// -----

// A batch's V rows: nn-to-mugraph copies them in blocks, one per KV head (cache-rows=1, given
// in the RUN lines), and those blocks write them into the cache in place.
func.func @v_rows(%v: tensor<2x32xbf16>, %pos: tensor<1xi32>, %v_cache: tensor<2x2x8x16xbf16> {nn.donated}) -> tensor<2x2x8x16xbf16> {
  %v4 = nn.reshape %v : (tensor<2x32xbf16>) -> tensor<2x2x1x16xbf16>
  %vc = nn.cache_write %v_cache, %v4, %pos {dim = 2 : i64} : (tensor<2x2x8x16xbf16>, tensor<2x2x1x16xbf16>, tensor<1xi32>) -> tensor<2x2x8x16xbf16>
  func.return %vc : tensor<2x2x8x16xbf16>
}
// CHECK-LABEL: func.func @v_rows
// CHECK-NEXT:    %vc = mugraph.graph_def grid [2, 1, 1] threads 128 forloop 1 (%v, %v_cache, %pos) attributes {mk.fused = "graph+cache_write"} : (tensor<2x32xbf16>, tensor<2x2x8x16xbf16>, tensor<1xi32>) -> tensor<2x2x8x16xbf16> {
// CHECK:           %v4_x = mugraph.input %v_a imap [1, -1, -1] fmap -1 : tensor<2x32xbf16> -> tensor<2x16xbf16>
// CHECK-NEXT:      %v4_xv = mugraph.reshape %v4_x : tensor<2x16xbf16> -> tensor<2x1x1x16xbf16>
// CHECK-NEXT:      %vc_at = mugraph.input %pos_a imap [-1, -1, -1] fmap -1 : tensor<1xi32> -> tensor<1xi32>
// CHECK-NEXT:      mugraph.output %v4_xv to %v4_r omap [1, -1, -1] at %vc_at dim 2 over %v_cache_a : tensor<2x1x1x16xbf16>, tensor<1xi32> -> tensor<2x2x8x16xbf16>
// CHECK-NOT:     "cache_write"
// OFF-LABEL: func.func @v_rows
// OFF:         %v4 = mugraph.graph_def grid [2, 1, 1]
// OFF:         %vc = mugraph.kernel "cache_write" (%v_cache, %v4, %pos)

// -----

// Each condition that keeps the write a kernel of its own: a cache that is not donated (the
// result is a copy, not the argument's buffer), rows something else reads too, and a read of
// the cache between the rows' kernel and the write (it must see the cache before the write).
func.func @kept(%k: tensor<1x32xbf16>, %cos: tensor<1x8xbf16>, %sin: tensor<1x8xbf16>, %p: tensor<1xi32>, %a: tensor<1x2x4x16xbf16>, %b: tensor<1x2x4x16xbf16> {nn.donated}, %c: tensor<1x2x4x16xbf16> {nn.donated}) -> (tensor<1x2x4x16xbf16>, tensor<1x2x1x16xbf16>, tensor<1x2x4x16xbf16>, tensor<1x2x4x16xbf16>, tensor<1x2x4x16xbf16>) {
  %k4 = nn.reshape %k : (tensor<1x32xbf16>) -> tensor<1x2x1x16xbf16>
  %r1 = nn.rope %k4, %cos, %sin : (tensor<1x2x1x16xbf16>, tensor<1x8xbf16>, tensor<1x8xbf16>) -> tensor<1x2x1x16xbf16>
  %w1 = nn.cache_write %a, %r1, %p {dim = 2 : i64} : (tensor<1x2x4x16xbf16>, tensor<1x2x1x16xbf16>, tensor<1xi32>) -> tensor<1x2x4x16xbf16>
  %r2 = nn.rope %k4, %sin, %cos : (tensor<1x2x1x16xbf16>, tensor<1x8xbf16>, tensor<1x8xbf16>) -> tensor<1x2x1x16xbf16>
  %w2 = nn.cache_write %b, %r2, %p {dim = 2 : i64} : (tensor<1x2x4x16xbf16>, tensor<1x2x1x16xbf16>, tensor<1xi32>) -> tensor<1x2x4x16xbf16>
  %r3 = nn.rope %k4, %cos, %cos : (tensor<1x2x1x16xbf16>, tensor<1x8xbf16>, tensor<1x8xbf16>) -> tensor<1x2x1x16xbf16>
  %old = nn.mul %c, %c : (tensor<1x2x4x16xbf16>, tensor<1x2x4x16xbf16>) -> tensor<1x2x4x16xbf16>
  %w3 = nn.cache_write %c, %r3, %p {dim = 2 : i64} : (tensor<1x2x4x16xbf16>, tensor<1x2x1x16xbf16>, tensor<1xi32>) -> tensor<1x2x4x16xbf16>
  func.return %w1, %r2, %w2, %w3, %old : tensor<1x2x4x16xbf16>, tensor<1x2x1x16xbf16>, tensor<1x2x4x16xbf16>, tensor<1x2x4x16xbf16>, tensor<1x2x4x16xbf16>
}
// CHECK-LABEL: func.func @kept
// CHECK-NOT:     at %
// CHECK:         %w1 = mugraph.kernel "cache_write" (%a, %r1, %p)
// CHECK:         %w2 = mugraph.kernel "cache_write" (%b, %r2, %p)
// CHECK:         %old = mugraph.kernel "mul" (%c, %c)
// CHECK:         %w3 = mugraph.kernel "cache_write" (%c, %r3, %p)

// -----

// A prefill's K rows: the RoPE's blocks of 48 rows split the cache's dim, each block writing
// its rows at %p plus its offset (omap [1, 2, -1] with the position).
func.func @prefill_rows(%k: tensor<1x2x96x16xbf16>, %cos: tensor<96x8xbf16>, %sin: tensor<96x8xbf16>, %p: tensor<1xi32>, %k_cache: tensor<1x2x128x16xbf16> {nn.donated}) -> tensor<1x2x128x16xbf16> {
  %kr = nn.rope %k, %cos, %sin : (tensor<1x2x96x16xbf16>, tensor<96x8xbf16>, tensor<96x8xbf16>) -> tensor<1x2x96x16xbf16>
  %kc = nn.cache_write %k_cache, %kr, %p {dim = 2 : i64} : (tensor<1x2x128x16xbf16>, tensor<1x2x96x16xbf16>, tensor<1xi32>) -> tensor<1x2x128x16xbf16>
  func.return %kc : tensor<1x2x128x16xbf16>
}
// CHECK-LABEL: func.func @prefill_rows
// CHECK:         %kc = mugraph.graph_def grid [2, 2, 1] threads 128 forloop 1 (%k, %cos, %sin, %k_cache, %p) attributes {mk.fused = "graph+cache_write"}
// CHECK:           mugraph.output %kr_rot to %kr_r omap [1, 2, -1] at %kc_at dim 2 over %k_cache_a : tensor<1x1x48x16xf32>, tensor<1xi32> -> tensor<1x2x128x16xbf16>
// CHECK-NOT:     "cache_write"
// OFF-LABEL: func.func @prefill_rows
// OFF:         %kc = mugraph.kernel "cache_write" (%k_cache, %kr, %p)

// -----

// A decode step's next token goes into the donated history by the argmax's reduce itself: each
// row's index at its column, at the step's position.
func.func @sample(%logits: tensor<3x512xbf16>, %tokens: tensor<16x3xi32> {nn.donated}, %p1: tensor<1xi32>) -> tensor<16x3xi32> {
  %next = nn.argmax %logits {dim = -1 : i64} : (tensor<3x512xbf16>) -> tensor<3xi32>
  %next2 = nn.reshape %next : (tensor<3xi32>) -> tensor<1x3xi32>
  %tokens2 = nn.cache_write %tokens, %next2, %p1 {dim = 0 : i64} : (tensor<16x3xi32>, tensor<1x3xi32>, tensor<1xi32>) -> tensor<16x3xi32>
  func.return %tokens2 : tensor<16x3xi32>
}
// CHECK-LABEL: func.func @sample
// CHECK:         %tokens2 = mugraph.graph_def grid [3, 1, 1] threads 32 forloop 1 (%next_pv, %next_pi, %tokens, %p1) attributes {mk.fused = "graph+cache_write"}
// CHECK:           %tokens2_at = mugraph.input %p1_a imap [-1, -1, -1] fmap -1 : tensor<1xi32> -> tensor<1xi32>
// CHECK-NEXT:      mugraph.output %bi to %next_r omap [1, -1, -1] at %tokens2_at dim 0 over %tokens_a : tensor<1x1xi32>, tensor<1xi32> -> tensor<16x3xi32>
// CHECK-NEXT:    }
// CHECK-NEXT:    func.return %tokens2
// CHECK-NOT:     "cache_write"

// OFF-LABEL: func.func @sample
// OFF:         %tokens2 = mugraph.kernel "cache_write" (%tokens, %next2, %p1)
