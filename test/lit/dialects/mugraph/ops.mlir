// RUN: MK_ROUNDTRIP
// RUN: MK_GENERIC_ROUNDTRIP
// RUN: mk-opt %s --split-input-file -o %t.first.mlir && mk-opt %t.first.mlir --split-input-file -o %t.second.mlir && diff %t.first.mlir %t.second.mlir

// Library kernels: a kind from a closed set, the nn op's attributes kept as free attributes.
func.func @library(%x: tensor<8x4096xbf16>, %g: tensor<4096xbf16>, %table: tensor<32000x4096xbf16>, %ids: tensor<8xi32>, %q: tensor<1x32x1x128xbf16>, %k: tensor<1x8x4096x128xbf16>, %v: tensor<1x8x4096x128xbf16>, %len: tensor<1xi32>) -> (tensor<8x4096xbf16>, tensor<4096x8xbf16>, tensor<1x32x1x128xbf16>) {
  %e = mugraph.kernel "embedding" (%table, %ids) : (tensor<32000x4096xbf16>, tensor<8xi32>) -> tensor<8x4096xbf16>
  %n = mugraph.kernel "rms_norm" (%e, %g) {epsilon = 1.000000e-06 : f32} : (tensor<8x4096xbf16>, tensor<4096xbf16>) -> tensor<8x4096xbf16>
  %s = mugraph.kernel "add" (%n, %x) : (tensor<8x4096xbf16>, tensor<8x4096xbf16>) -> tensor<8x4096xbf16>
  %t = mugraph.kernel "transpose" (%s) {perm = array<i64: 1, 0>} : (tensor<8x4096xbf16>) -> tensor<4096x8xbf16>
  %a = mugraph.kernel "attention" (%q, %k, %v, %len) {scale = 0.0883883461 : f32, causal = false} : (tensor<1x32x1x128xbf16>, tensor<1x8x4096x128xbf16>, tensor<1x8x4096x128xbf16>, tensor<1xi32>) -> tensor<1x32x1x128xbf16>
  func.return %s, %t, %a : tensor<8x4096xbf16>, tensor<4096x8xbf16>, tensor<1x32x1x128xbf16>
}
// CHECK-LABEL: func.func @library
// CHECK:      %e = mugraph.kernel "embedding" (%table, %ids) : (tensor<32000x4096xbf16>, tensor<8xi32>) -> tensor<8x4096xbf16>
// CHECK-NEXT: %n = mugraph.kernel "rms_norm" (%e, %g) {epsilon = 1.000000e-06 : f32} : (tensor<8x4096xbf16>, tensor<4096xbf16>) -> tensor<8x4096xbf16>
// CHECK-NEXT: %s = mugraph.kernel "add" (%n, %x) : (tensor<8x4096xbf16>, tensor<8x4096xbf16>) -> tensor<8x4096xbf16>
// CHECK-NEXT: %t = mugraph.kernel "transpose" (%s) {perm = array<i64: 1, 0>} : (tensor<8x4096xbf16>) -> tensor<4096x8xbf16>
// CHECK-NEXT: %a = mugraph.kernel "attention" (%q, %k, %v, %len) {scale = 0.0883883461 : f32, causal = false} : (tensor<1x32x1x128xbf16>, tensor<1x8x4096x128xbf16>, tensor<1x8x4096x128xbf16>, tensor<1xi32>) -> tensor<1x32x1x128xbf16>

// -----

// RMSNorm fused into the following linear (Mirage's RMSNorm+Linear): the loop walks K, a
// matmul accumulator and a mean-of-squares accumulator share it, the norm is applied after.
func.func @rms_norm_linear(%x: tensor<8x4096xbf16>, %g: tensor<4096xbf16>, %w: tensor<6144x4096xbf16>) -> tensor<8x6144xbf16> {
  %y = mugraph.graph_def grid [48, 1, 1] threads 128 forloop 64 (%x, %g, %w) : (tensor<8x4096xbf16>, tensor<4096xbf16>, tensor<6144x4096xbf16>) -> tensor<8x6144xbf16> {
  ^bb0(%xa: tensor<8x4096xbf16>, %ga: tensor<4096xbf16>, %wa: tensor<6144x4096xbf16>, %ya: tensor<8x6144xbf16>):
    %xt = mugraph.input %xa imap [-1, -1, -1] fmap 1 : tensor<8x4096xbf16> -> tensor<8x64xbf16>
    %gt = mugraph.input %ga imap [-1, -1, -1] fmap 0 : tensor<4096xbf16> -> tensor<64xbf16>
    %wt = mugraph.input %wa imap [0, -1, -1] fmap 1 : tensor<6144x4096xbf16> -> tensor<128x64xbf16>
    %xg = mugraph.binary "mul" %xt, %gt : (tensor<8x64xbf16>, tensor<64xbf16>) -> tensor<8x64xbf16>
    %p = mugraph.matmul %xg, %wt transpose_b : (tensor<8x64xbf16>, tensor<128x64xbf16>) -> tensor<8x128xf32>
    %acc = mugraph.accum "sum" %p : tensor<8x128xf32> -> tensor<8x128xf32>
    %ms = mugraph.accum "mean_sq_last" %xt : tensor<8x64xbf16> -> tensor<8x1xf32>
    %rs = mugraph.thread_map %ms : (tensor<8x1xf32>) -> tensor<8x1xf32> {
    ^bb0(%m: f32):
      %eps = arith.constant 1.000000e-06 : f32
      %sum = arith.addf %m, %eps : f32
      %r = math.rsqrt %sum : f32
      mugraph.yield %r : f32
    }
    %yt = mugraph.binary "mul" %acc, %rs : (tensor<8x128xf32>, tensor<8x1xf32>) -> tensor<8x128xbf16>
    mugraph.output %yt to %ya omap [1, -1, -1] : tensor<8x128xbf16> -> tensor<8x6144xbf16>
  }
  func.return %y : tensor<8x6144xbf16>
}
// CHECK-LABEL: func.func @rms_norm_linear
// CHECK:      %y = mugraph.graph_def grid [48, 1, 1] threads 128 forloop 64 (%x, %g, %w) : (tensor<8x4096xbf16>, tensor<4096xbf16>, tensor<6144x4096xbf16>) -> tensor<8x6144xbf16> {
// CHECK-NEXT: ^bb0(%xa: tensor<8x4096xbf16>, %ga: tensor<4096xbf16>, %wa: tensor<6144x4096xbf16>, %ya: tensor<8x6144xbf16>):
// CHECK-NEXT:   %xt = mugraph.input %xa imap [-1, -1, -1] fmap 1 : tensor<8x4096xbf16> -> tensor<8x64xbf16>
// CHECK-NEXT:   %gt = mugraph.input %ga imap [-1, -1, -1] fmap 0 : tensor<4096xbf16> -> tensor<64xbf16>
// CHECK-NEXT:   %wt = mugraph.input %wa imap [0, -1, -1] fmap 1 : tensor<6144x4096xbf16> -> tensor<128x64xbf16>
// CHECK-NEXT:   %xg = mugraph.binary "mul" %xt, %gt : (tensor<8x64xbf16>, tensor<64xbf16>) -> tensor<8x64xbf16>
// CHECK-NEXT:   %p = mugraph.matmul %xg, %wt transpose_b : (tensor<8x64xbf16>, tensor<128x64xbf16>) -> tensor<8x128xf32>
// CHECK-NEXT:   %acc = mugraph.accum "sum" %p : tensor<8x128xf32> -> tensor<8x128xf32>
// CHECK-NEXT:   %ms = mugraph.accum "mean_sq_last" %xt : tensor<8x64xbf16> -> tensor<8x1xf32>
// CHECK-NEXT:   %rs = mugraph.thread_map %ms : (tensor<8x1xf32>) -> tensor<8x1xf32> {
// CHECK-NEXT:   ^bb0(%m: f32):
// CHECK-NEXT:     %eps = arith.constant 1.000000e-06 : f32
// CHECK-NEXT:     %sum = arith.addf %m, %eps : f32
// CHECK-NEXT:     %r = math.rsqrt %sum : f32
// CHECK-NEXT:     mugraph.yield %r : f32
// CHECK-NEXT:   }
// CHECK-NEXT:   %yt = mugraph.binary "mul" %acc, %rs : (tensor<8x128xf32>, tensor<8x1xf32>) -> tensor<8x128xbf16>
// CHECK-NEXT:   mugraph.output %yt to %ya omap [1, -1, -1] : tensor<8x128xbf16> -> tensor<8x6144xbf16>
// CHECK-NEXT: }
// CHECK-NEXT: func.return %y : tensor<8x6144xbf16>

// -----

// Gated MLP: silu(x·W1ᵀ)·(x·W3ᵀ) as one thread_map epilogue, then the down projection with
// the residual add fused into its epilogue (the residual has fmap -1: the same tile every
// iteration, so the epilogue may read it).
func.func @gated_mlp(%x: tensor<8x4096xbf16>, %w1: tensor<12288x4096xbf16>, %w3: tensor<12288x4096xbf16>, %w2: tensor<4096x12288xbf16>) -> tensor<8x4096xbf16> {
  %h = mugraph.graph_def grid [96, 1, 1] threads 256 forloop 64 (%x, %w1, %w3) attributes {mk.fused = "silu_mul"} : (tensor<8x4096xbf16>, tensor<12288x4096xbf16>, tensor<12288x4096xbf16>) -> tensor<8x12288xbf16> {
  ^bb0(%xa: tensor<8x4096xbf16>, %w1a: tensor<12288x4096xbf16>, %w3a: tensor<12288x4096xbf16>, %ha: tensor<8x12288xbf16>):
    %xt = mugraph.input %xa imap [-1, -1, -1] fmap 1 : tensor<8x4096xbf16> -> tensor<8x64xbf16>
    %w1t = mugraph.input %w1a imap [0, -1, -1] fmap 1 : tensor<12288x4096xbf16> -> tensor<128x64xbf16>
    %w3t = mugraph.input %w3a imap [0, -1, -1] fmap 1 : tensor<12288x4096xbf16> -> tensor<128x64xbf16>
    %p1 = mugraph.matmul %xt, %w1t transpose_b : (tensor<8x64xbf16>, tensor<128x64xbf16>) -> tensor<8x128xf32>
    %p3 = mugraph.matmul %xt, %w3t transpose_b : (tensor<8x64xbf16>, tensor<128x64xbf16>) -> tensor<8x128xf32>
    %a1 = mugraph.accum "sum" %p1 : tensor<8x128xf32> -> tensor<8x128xf32>
    %a3 = mugraph.accum "sum" %p3 : tensor<8x128xf32> -> tensor<8x128xf32>
    %ht = mugraph.thread_map %a1, %a3 : (tensor<8x128xf32>, tensor<8x128xf32>) -> tensor<8x128xbf16> {
    ^bb0(%gate: f32, %up: f32):
      %one = arith.constant 1.000000e+00 : f32
      %neg = arith.negf %gate : f32
      %e = math.exp %neg : f32
      %den = arith.addf %one, %e : f32
      %silu = arith.divf %gate, %den : f32
      %prod = arith.mulf %silu, %up : f32
      mugraph.yield %prod : f32
    }
    mugraph.output %ht to %ha omap [1, -1, -1] : tensor<8x128xbf16> -> tensor<8x12288xbf16>
  }
  %y = mugraph.graph_def grid [32, 1, 1] threads 128 forloop 192 (%h, %w2, %x) : (tensor<8x12288xbf16>, tensor<4096x12288xbf16>, tensor<8x4096xbf16>) -> tensor<8x4096xbf16> {
  ^bb0(%hb: tensor<8x12288xbf16>, %w2b: tensor<4096x12288xbf16>, %rb: tensor<8x4096xbf16>, %yb: tensor<8x4096xbf16>):
    %ht = mugraph.input %hb imap [-1, -1, -1] fmap 1 : tensor<8x12288xbf16> -> tensor<8x64xbf16>
    %w2t = mugraph.input %w2b imap [0, -1, -1] fmap 1 : tensor<4096x12288xbf16> -> tensor<128x64xbf16>
    %rt = mugraph.input %rb imap [1, -1, -1] fmap -1 : tensor<8x4096xbf16> -> tensor<8x128xbf16>
    %p = mugraph.matmul %ht, %w2t transpose_b : (tensor<8x64xbf16>, tensor<128x64xbf16>) -> tensor<8x128xf32>
    %acc = mugraph.accum "sum" %p : tensor<8x128xf32> -> tensor<8x128xf32>
    %yt = mugraph.binary "add" %acc, %rt : (tensor<8x128xf32>, tensor<8x128xbf16>) -> tensor<8x128xbf16>
    mugraph.output %yt to %yb omap [1, -1, -1] : tensor<8x128xbf16> -> tensor<8x4096xbf16>
  }
  func.return %y : tensor<8x4096xbf16>
}
// CHECK-LABEL: func.func @gated_mlp
// CHECK:      %h = mugraph.graph_def grid [96, 1, 1] threads 256 forloop 64 (%x, %w1, %w3) attributes {mk.fused = "silu_mul"} : (tensor<8x4096xbf16>, tensor<12288x4096xbf16>, tensor<12288x4096xbf16>) -> tensor<8x12288xbf16> {
// CHECK:        %ht = mugraph.thread_map %a1, %a3 : (tensor<8x128xf32>, tensor<8x128xf32>) -> tensor<8x128xbf16> {
// CHECK-NEXT:   ^bb0(%gate: f32, %up: f32):
// CHECK:          %silu = arith.divf %gate, %den : f32
// CHECK-NEXT:     %prod = arith.mulf %silu, %up : f32
// CHECK-NEXT:     mugraph.yield %prod : f32
// CHECK-NEXT:   }
// CHECK-NEXT:   mugraph.output %ht to %ha omap [1, -1, -1] : tensor<8x128xbf16> -> tensor<8x12288xbf16>
// CHECK:      %y = mugraph.graph_def grid [32, 1, 1] threads 128 forloop 192 (%h, %w2, %x) : (tensor<8x12288xbf16>, tensor<4096x12288xbf16>, tensor<8x4096xbf16>) -> tensor<8x4096xbf16> {
// CHECK:        %rt = mugraph.input %rb imap [1, -1, -1] fmap -1 : tensor<8x4096xbf16> -> tensor<8x128xbf16>
// CHECK:        %yt = mugraph.binary "add" %acc, %rt : (tensor<8x128xf32>, tensor<8x128xbf16>) -> tensor<8x128xbf16>

// -----

// Decode attention split over the KV length (flash-decoding). Grid x: the 8 KV heads (each
// with its 4 query heads, GQA), grid y: 4 splits of the 4096 keys; the loop walks 64 keys at a
// time with an online-softmax accumulator. Partial results get a leading dim indexed by y.
// The merge kernel rescales the 4 partials by e^(m_i - max m) and normalises.
func.func @decode_attention(%q: tensor<1x32x1x128xbf16>, %k: tensor<1x8x4096x128xbf16>, %v: tensor<1x8x4096x128xbf16>) -> tensor<1x32x1x128xbf16> {
  %o, %m, %l = mugraph.graph_def grid [8, 4, 1] threads 128 forloop 16 (%q, %k, %v) : (tensor<1x32x1x128xbf16>, tensor<1x8x4096x128xbf16>, tensor<1x8x4096x128xbf16>) -> (tensor<4x1x32x1x128xf32>, tensor<4x1x32x1x1xf32>, tensor<4x1x32x1x1xf32>) {
  ^bb0(%qa: tensor<1x32x1x128xbf16>, %ka: tensor<1x8x4096x128xbf16>, %va: tensor<1x8x4096x128xbf16>, %oa: tensor<4x1x32x1x128xf32>, %ma: tensor<4x1x32x1x1xf32>, %la: tensor<4x1x32x1x1xf32>):
    %qt = mugraph.input %qa imap [1, -1, -1] fmap -1 : tensor<1x32x1x128xbf16> -> tensor<1x4x1x128xbf16>
    %kt = mugraph.input %ka imap [1, 2, -1] fmap 2 : tensor<1x8x4096x128xbf16> -> tensor<1x1x64x128xbf16>
    %vt = mugraph.input %va imap [1, 2, -1] fmap 2 : tensor<1x8x4096x128xbf16> -> tensor<1x1x64x128xbf16>
    %q2 = mugraph.reshape %qt : tensor<1x4x1x128xbf16> -> tensor<4x128xbf16>
    %k2 = mugraph.reshape %kt : tensor<1x1x64x128xbf16> -> tensor<64x128xbf16>
    %v2 = mugraph.reshape %vt : tensor<1x1x64x128xbf16> -> tensor<64x128xbf16>
    %s = mugraph.matmul %q2, %k2 transpose_b : (tensor<4x128xbf16>, tensor<64x128xbf16>) -> tensor<4x64xf32>
    %ss = mugraph.unary "scale" %s {factor = 0.0883883461 : f32} : tensor<4x64xf32> -> tensor<4x64xf32>
    %ot, %mt, %lt = mugraph.accum_softmax %ss, %v2 : (tensor<4x64xf32>, tensor<64x128xbf16>) -> (tensor<4x128xf32>, tensor<4x1xf32>, tensor<4x1xf32>)
    %o5 = mugraph.reshape %ot : tensor<4x128xf32> -> tensor<1x1x4x1x128xf32>
    %m5 = mugraph.reshape %mt : tensor<4x1xf32> -> tensor<1x1x4x1x1xf32>
    %l5 = mugraph.reshape %lt : tensor<4x1xf32> -> tensor<1x1x4x1x1xf32>
    mugraph.output %o5 to %oa omap [2, 0, -1] : tensor<1x1x4x1x128xf32> -> tensor<4x1x32x1x128xf32>
    mugraph.output %m5 to %ma omap [2, 0, -1] : tensor<1x1x4x1x1xf32> -> tensor<4x1x32x1x1xf32>
    mugraph.output %l5 to %la omap [2, 0, -1] : tensor<1x1x4x1x1xf32> -> tensor<4x1x32x1x1xf32>
  }
  %out = mugraph.graph_def grid [8, 1, 1] threads 128 forloop 1 (%o, %m, %l) : (tensor<4x1x32x1x128xf32>, tensor<4x1x32x1x1xf32>, tensor<4x1x32x1x1xf32>) -> tensor<1x32x1x128xbf16> {
  ^bb0(%ob: tensor<4x1x32x1x128xf32>, %mb: tensor<4x1x32x1x1xf32>, %lb: tensor<4x1x32x1x1xf32>, %res: tensor<1x32x1x128xbf16>):
    %op = mugraph.input %ob imap [2, -1, -1] fmap -1 : tensor<4x1x32x1x128xf32> -> tensor<4x1x4x1x128xf32>
    %mp = mugraph.input %mb imap [2, -1, -1] fmap -1 : tensor<4x1x32x1x1xf32> -> tensor<4x1x4x1x1xf32>
    %lp = mugraph.input %lb imap [2, -1, -1] fmap -1 : tensor<4x1x32x1x1xf32> -> tensor<4x1x4x1x1xf32>
    %mx = mugraph.reduce "max" %mp dim 0 keepdim : tensor<4x1x4x1x1xf32> -> tensor<1x1x4x1x1xf32>
    %w = mugraph.thread_map %mp, %mx : (tensor<4x1x4x1x1xf32>, tensor<1x1x4x1x1xf32>) -> tensor<4x1x4x1x1xf32> {
    ^bb0(%mi: f32, %mmax: f32):
      %d = arith.subf %mi, %mmax : f32
      %e = math.exp %d : f32
      mugraph.yield %e : f32
    }
    %lw = mugraph.binary "mul" %lp, %w : (tensor<4x1x4x1x1xf32>, tensor<4x1x4x1x1xf32>) -> tensor<4x1x4x1x1xf32>
    %lsum = mugraph.reduce "sum" %lw dim 0 : tensor<4x1x4x1x1xf32> -> tensor<1x4x1x1xf32>
    %ow = mugraph.binary "mul" %op, %w : (tensor<4x1x4x1x128xf32>, tensor<4x1x4x1x1xf32>) -> tensor<4x1x4x1x128xf32>
    %osum = mugraph.reduce "sum" %ow dim 0 : tensor<4x1x4x1x128xf32> -> tensor<1x4x1x128xf32>
    %fin = mugraph.binary "div" %osum, %lsum : (tensor<1x4x1x128xf32>, tensor<1x4x1x1xf32>) -> tensor<1x4x1x128xbf16>
    mugraph.output %fin to %res omap [1, -1, -1] : tensor<1x4x1x128xbf16> -> tensor<1x32x1x128xbf16>
  }
  func.return %out : tensor<1x32x1x128xbf16>
}
// CHECK-LABEL: func.func @decode_attention
// CHECK:      %o, %m, %l = mugraph.graph_def grid [8, 4, 1] threads 128 forloop 16 (%q, %k, %v) : (tensor<1x32x1x128xbf16>, tensor<1x8x4096x128xbf16>, tensor<1x8x4096x128xbf16>) -> (tensor<4x1x32x1x128xf32>, tensor<4x1x32x1x1xf32>, tensor<4x1x32x1x1xf32>) {
// CHECK:        %kt = mugraph.input %ka imap [1, 2, -1] fmap 2 : tensor<1x8x4096x128xbf16> -> tensor<1x1x64x128xbf16>
// CHECK:        %ss = mugraph.unary "scale" %s {factor = 0.0883883461 : f32} : tensor<4x64xf32> -> tensor<4x64xf32>
// CHECK-NEXT:   %ot, %mt, %lt = mugraph.accum_softmax %ss, %v2 : (tensor<4x64xf32>, tensor<64x128xbf16>) -> (tensor<4x128xf32>, tensor<4x1xf32>, tensor<4x1xf32>)
// CHECK:        mugraph.output %o5 to %oa omap [2, 0, -1] : tensor<1x1x4x1x128xf32> -> tensor<4x1x32x1x128xf32>
// CHECK:      %out = mugraph.graph_def grid [8, 1, 1] threads 128 forloop 1 (%o, %m, %l)
// CHECK:        %mx = mugraph.reduce "max" %mp dim 0 keepdim : tensor<4x1x4x1x1xf32> -> tensor<1x1x4x1x1xf32>
// CHECK:        %lsum = mugraph.reduce "sum" %lw dim 0 : tensor<4x1x4x1x1xf32> -> tensor<1x4x1x1xf32>
// CHECK:        %fin = mugraph.binary "div" %osum, %lsum : (tensor<1x4x1x128xf32>, tensor<1x4x1x1xf32>) -> tensor<1x4x1x128xbf16>

// -----

// Argmax over a 32768-entry vocabulary as partial + reduce: each of 16 blocks finds the max of
// its 2048-wide chunk and its global position; the partials (an extra trailing dim indexed by
// grid axis x) are reduced by a second kernel.
func.func @argmax(%logits: tensor<8x32768xbf16>) -> tensor<8xi32> {
  %pv, %pi = mugraph.graph_def grid [16, 1, 1] threads 256 forloop 1 (%logits) : (tensor<8x32768xbf16>) -> (tensor<8x16xf32>, tensor<8x16xi32>) {
  ^bb0(%la: tensor<8x32768xbf16>, %pva: tensor<8x16xf32>, %pia: tensor<8x16xi32>):
    %lt = mugraph.input %la imap [1, -1, -1] fmap -1 : tensor<8x32768xbf16> -> tensor<8x2048xbf16>
    %pos = mugraph.position %lt dim 1 : tensor<8x2048xbf16> -> tensor<8x2048xi32>
    %mv, %mi = mugraph.argmax %lt, %pos dim 1 : (tensor<8x2048xbf16>, tensor<8x2048xi32>) -> (tensor<8x1xf32>, tensor<8x1xi32>)
    mugraph.output %mv to %pva omap [1, -1, -1] : tensor<8x1xf32> -> tensor<8x16xf32>
    mugraph.output %mi to %pia omap [1, -1, -1] : tensor<8x1xi32> -> tensor<8x16xi32>
  }
  %ids = mugraph.graph_def grid [8, 1, 1] threads 32 forloop 1 (%pv, %pi) : (tensor<8x16xf32>, tensor<8x16xi32>) -> tensor<8xi32> {
  ^bb0(%pvb: tensor<8x16xf32>, %pib: tensor<8x16xi32>, %idb: tensor<8xi32>):
    %vt = mugraph.input %pvb imap [0, -1, -1] fmap -1 : tensor<8x16xf32> -> tensor<1x16xf32>
    %it = mugraph.input %pib imap [0, -1, -1] fmap -1 : tensor<8x16xi32> -> tensor<1x16xi32>
    %bv, %bi = mugraph.argmax %vt, %it dim 1 : (tensor<1x16xf32>, tensor<1x16xi32>) -> (tensor<1x1xf32>, tensor<1x1xi32>)
    %id = mugraph.reshape %bi : tensor<1x1xi32> -> tensor<1xi32>
    mugraph.output %id to %idb omap [0, -1, -1] : tensor<1xi32> -> tensor<8xi32>
  }
  func.return %ids : tensor<8xi32>
}
// CHECK-LABEL: func.func @argmax
// CHECK:        %pos = mugraph.position %lt dim 1 : tensor<8x2048xbf16> -> tensor<8x2048xi32>
// CHECK-NEXT:   %mv, %mi = mugraph.argmax %lt, %pos dim 1 : (tensor<8x2048xbf16>, tensor<8x2048xi32>) -> (tensor<8x1xf32>, tensor<8x1xi32>)
// CHECK-NEXT:   mugraph.output %mv to %pva omap [1, -1, -1] : tensor<8x1xf32> -> tensor<8x16xf32>
// CHECK:      %ids = mugraph.graph_def grid [8, 1, 1] threads 32 forloop 1 (%pv, %pi)
// CHECK:        %id = mugraph.reshape %bi : tensor<1x1xi32> -> tensor<1xi32>
// CHECK-NEXT:   mugraph.output %id to %idb omap [0, -1, -1] : tensor<1xi32> -> tensor<8xi32>

// -----

// The partial argmax as the epilogue of the kernel that computes the logits: the positions of a
// tile the graph writes are where its plain output puts them.
func.func @argmax_of_written(%x: tensor<8x64xf32>, %w: tensor<32768x64xbf16>) -> (tensor<8x32768xbf16>, tensor<8x16xf32>, tensor<8x16xi32>) {
  %l, %pv, %pi = mugraph.graph_def grid [16, 1, 1] threads 256 forloop 1 (%x, %w) : (tensor<8x64xf32>, tensor<32768x64xbf16>) -> (tensor<8x32768xbf16>, tensor<8x16xf32>, tensor<8x16xi32>) {
  ^bb0(%xa: tensor<8x64xf32>, %wa: tensor<32768x64xbf16>, %la: tensor<8x32768xbf16>, %pva: tensor<8x16xf32>, %pia: tensor<8x16xi32>):
    %xt = mugraph.input %xa imap [-1, -1, -1] fmap -1 : tensor<8x64xf32> -> tensor<8x64xf32>
    %wt = mugraph.input %wa imap [0, -1, -1] fmap -1 : tensor<32768x64xbf16> -> tensor<2048x64xbf16>
    %p = mugraph.matmul %xt, %wt transpose_b : (tensor<8x64xf32>, tensor<2048x64xbf16>) -> tensor<8x2048xf32>
    %lt = mugraph.unary "exp" %p : tensor<8x2048xf32> -> tensor<8x2048xbf16>
    mugraph.output %lt to %la omap [1, -1, -1] : tensor<8x2048xbf16> -> tensor<8x32768xbf16>
    %pos = mugraph.position %lt dim 1 : tensor<8x2048xbf16> -> tensor<8x2048xi32>
    %mv, %mi = mugraph.argmax %lt, %pos dim 1 : (tensor<8x2048xbf16>, tensor<8x2048xi32>) -> (tensor<8x1xf32>, tensor<8x1xi32>)
    mugraph.output %mv to %pva omap [1, -1, -1] : tensor<8x1xf32> -> tensor<8x16xf32>
    mugraph.output %mi to %pia omap [1, -1, -1] : tensor<8x1xi32> -> tensor<8x16xi32>
  }
  func.return %l, %pv, %pi : tensor<8x32768xbf16>, tensor<8x16xf32>, tensor<8x16xi32>
}
// CHECK-LABEL: func.func @argmax_of_written
// CHECK:        mugraph.output %lt to %la omap [1, -1, -1]
// CHECK-NEXT:   %pos = mugraph.position %lt dim 1 : tensor<8x2048xbf16> -> tensor<8x2048xi32>

// -----

// The remaining tile ops: rms_norm on a whole row, concat, reduce "mean", the *_last
// accumulator kinds, a thread_map with two results, and a discardable attribute on an input.
func.func @tile_ops(%x: tensor<8x4096xbf16>, %g: tensor<4096xbf16>) -> (tensor<8x4096xbf16>, tensor<8x6xf32>) {
  %n, %stats = mugraph.graph_def grid [8, 1, 1] threads 1024 forloop 1 (%x, %g) : (tensor<8x4096xbf16>, tensor<4096xbf16>) -> (tensor<8x4096xbf16>, tensor<8x6xf32>) {
  ^bb0(%xa: tensor<8x4096xbf16>, %ga: tensor<4096xbf16>, %na: tensor<8x4096xbf16>, %sa: tensor<8x6xf32>):
    %xt = mugraph.input %xa imap [0, -1, -1] fmap -1 {mk.note = "one row per block"} : tensor<8x4096xbf16> -> tensor<1x4096xbf16>
    %gt = mugraph.input %ga imap [-1, -1, -1] fmap -1 : tensor<4096xbf16> -> tensor<4096xbf16>
    %nt = mugraph.rms_norm %xt, %gt {epsilon = 1.000000e-05 : f32} : (tensor<1x4096xbf16>, tensor<4096xbf16>) -> tensor<1x4096xbf16>
    %mean = mugraph.reduce "mean" %xt dim 1 keepdim : tensor<1x4096xbf16> -> tensor<1x1xf32>
    %lo, %hi = mugraph.thread_map %mean : (tensor<1x1xf32>) -> (tensor<1x1xf32>, tensor<1x1xf32>) {
    ^bb0(%a: f32):
      %c = arith.constant 1.000000e+00 : f32
      %l = arith.subf %a, %c : f32
      %h = arith.addf %a, %c : f32
      mugraph.yield %l, %h : f32, f32
    }
    %s1 = mugraph.accum "sum_last" %xt : tensor<1x4096xbf16> -> tensor<1x1xf32>
    %s2 = mugraph.accum "max_last" %xt : tensor<1x4096xbf16> -> tensor<1x1xf32>
    %s3 = mugraph.accum "mean_last" %xt : tensor<1x4096xbf16> -> tensor<1x1xf32>
    %s4 = mugraph.accum "sum_sq_last" %xt : tensor<1x4096xbf16> -> tensor<1x1xf32>
    %st = mugraph.concat %lo, %hi, %s1, %s2, %s3, %s4 dim 1 : (tensor<1x1xf32>, tensor<1x1xf32>, tensor<1x1xf32>, tensor<1x1xf32>, tensor<1x1xf32>, tensor<1x1xf32>) -> tensor<1x6xf32>
    mugraph.output %nt to %na omap [0, -1, -1] : tensor<1x4096xbf16> -> tensor<8x4096xbf16>
    mugraph.output %st to %sa omap [0, -1, -1] : tensor<1x6xf32> -> tensor<8x6xf32>
  }
  func.return %n, %stats : tensor<8x4096xbf16>, tensor<8x6xf32>
}
// CHECK-LABEL: func.func @tile_ops
// CHECK:        %xt = mugraph.input %xa imap [0, -1, -1] fmap -1 {mk.note = "one row per block"} : tensor<8x4096xbf16> -> tensor<1x4096xbf16>
// CHECK:        %nt = mugraph.rms_norm %xt, %gt {epsilon = 1.000000e-05 : f32} : (tensor<1x4096xbf16>, tensor<4096xbf16>) -> tensor<1x4096xbf16>
// CHECK-NEXT:   %mean = mugraph.reduce "mean" %xt dim 1 keepdim : tensor<1x4096xbf16> -> tensor<1x1xf32>
// CHECK-NEXT:   %lo, %hi = mugraph.thread_map %mean : (tensor<1x1xf32>) -> (tensor<1x1xf32>, tensor<1x1xf32>) {
// CHECK:          mugraph.yield %l, %h : f32, f32
// CHECK:        %s2 = mugraph.accum "max_last" %xt : tensor<1x4096xbf16> -> tensor<1x1xf32>
// CHECK:        %st = mugraph.concat %lo, %hi, %s1, %s2, %s3, %s4 dim 1 : (tensor<1x1xf32>, tensor<1x1xf32>, tensor<1x1xf32>, tensor<1x1xf32>, tensor<1x1xf32>, tensor<1x1xf32>) -> tensor<1x6xf32>

// -----

// RoPE on a tile: one head per block, the position's cos/sin broadcast to it.
func.func @rope_tile(%q: tensor<1x4x1x64xbf16>, %c: tensor<1x32xf32>, %s: tensor<1x32xf32>) -> tensor<1x4x1x64xbf16> {
  %r = mugraph.graph_def grid [4, 1, 1] threads 128 forloop 1 (%q, %c, %s) : (tensor<1x4x1x64xbf16>, tensor<1x32xf32>, tensor<1x32xf32>) -> tensor<1x4x1x64xbf16> {
  ^bb0(%qa: tensor<1x4x1x64xbf16>, %ca: tensor<1x32xf32>, %sa: tensor<1x32xf32>, %ra: tensor<1x4x1x64xbf16>):
    %qt = mugraph.input %qa imap [1, -1, -1] fmap -1 : tensor<1x4x1x64xbf16> -> tensor<1x1x1x64xbf16>
    %ct = mugraph.input %ca imap [-1, -1, -1] fmap -1 : tensor<1x32xf32> -> tensor<1x32xf32>
    %st = mugraph.input %sa imap [-1, -1, -1] fmap -1 : tensor<1x32xf32> -> tensor<1x32xf32>
    %rt = mugraph.rope %qt, %ct, %st : (tensor<1x1x1x64xbf16>, tensor<1x32xf32>, tensor<1x32xf32>) -> tensor<1x1x1x64xf32>
    mugraph.output %rt to %ra omap [1, -1, -1] : tensor<1x1x1x64xf32> -> tensor<1x4x1x64xbf16>
  }
  func.return %r : tensor<1x4x1x64xbf16>
}
// CHECK-LABEL: func.func @rope_tile
// CHECK:        %rt = mugraph.rope %qt, %ct, %st : (tensor<1x1x1x64xbf16>, tensor<1x32xf32>, tensor<1x32xf32>) -> tensor<1x1x1x64xf32>

// -----

// An in-place output: each block writes its head's row at run-time position %pt along dim 2;
// every other element of the result is the cache's (a KV-cache append).
func.func @append_rows(%k: tensor<1x2x1x16xbf16>, %cache: tensor<1x2x8x16xbf16>, %p: tensor<1xi32>) -> tensor<1x2x8x16xbf16> {
  %c = mugraph.graph_def grid [2, 1, 1] threads 128 forloop 1 (%k, %cache, %p) : (tensor<1x2x1x16xbf16>, tensor<1x2x8x16xbf16>, tensor<1xi32>) -> tensor<1x2x8x16xbf16> {
  ^bb0(%ka: tensor<1x2x1x16xbf16>, %cachea: tensor<1x2x8x16xbf16>, %pa: tensor<1xi32>, %ca: tensor<1x2x8x16xbf16>):
    %kt = mugraph.input %ka imap [1, -1, -1] fmap -1 : tensor<1x2x1x16xbf16> -> tensor<1x1x1x16xbf16>
    %pt = mugraph.input %pa imap [-1, -1, -1] fmap -1 : tensor<1xi32> -> tensor<1xi32>
    mugraph.output %kt to %ca omap [1, -1, -1] at %pt dim 2 over %cachea : tensor<1x1x1x16xbf16>, tensor<1xi32> -> tensor<1x2x8x16xbf16>
  }
  func.return %c : tensor<1x2x8x16xbf16>
}
// CHECK-LABEL: func.func @append_rows
// CHECK:        mugraph.output %kt to %ca omap [1, -1, -1] at %pt dim 2 over %cachea : tensor<1x1x1x16xbf16>, tensor<1xi32> -> tensor<1x2x8x16xbf16>

// -----

// An in-place output whose grid splits its dim (a prefill's rows): block (x, y) writes its two
// rows at %pt + 2y, the blocks' tiles side by side from %pt.
func.func @append_split_rows(%k: tensor<1x2x6x16xbf16>, %cache: tensor<1x2x8x16xbf16>, %p: tensor<1xi32>) -> tensor<1x2x8x16xbf16> {
  %c = mugraph.graph_def grid [2, 3, 1] threads 128 forloop 1 (%k, %cache, %p) : (tensor<1x2x6x16xbf16>, tensor<1x2x8x16xbf16>, tensor<1xi32>) -> tensor<1x2x8x16xbf16> {
  ^bb0(%ka: tensor<1x2x6x16xbf16>, %cachea: tensor<1x2x8x16xbf16>, %pa: tensor<1xi32>, %ca: tensor<1x2x8x16xbf16>):
    %kt = mugraph.input %ka imap [1, 2, -1] fmap -1 : tensor<1x2x6x16xbf16> -> tensor<1x1x2x16xbf16>
    %pt = mugraph.input %pa imap [-1, -1, -1] fmap -1 : tensor<1xi32> -> tensor<1xi32>
    mugraph.output %kt to %ca omap [1, 2, -1] at %pt dim 2 over %cachea : tensor<1x1x2x16xbf16>, tensor<1xi32> -> tensor<1x2x8x16xbf16>
  }
  func.return %c : tensor<1x2x8x16xbf16>
}
// CHECK-LABEL: func.func @append_split_rows
// CHECK:        mugraph.output %kt to %ca omap [1, 2, -1] at %pt dim 2 over %cachea : tensor<1x1x2x16xbf16>, tensor<1xi32> -> tensor<1x2x8x16xbf16>

// -----

// Split-K without a partial buffer: each of 8 blocks multiplies its 8 columns of x with the
// matching columns of w and adds the product into the result, which starts as %acc.
func.func @accumulate(%x: tensor<4x64xbf16>, %w: tensor<32x64xbf16>, %acc: tensor<4x32xf32>) -> tensor<4x32xf32> {
  %y = mugraph.graph_def grid [8, 1, 1] threads 128 forloop 1 (%x, %w, %acc) : (tensor<4x64xbf16>, tensor<32x64xbf16>, tensor<4x32xf32>) -> tensor<4x32xf32> {
  ^bb0(%xa: tensor<4x64xbf16>, %wa: tensor<32x64xbf16>, %acca: tensor<4x32xf32>, %ya: tensor<4x32xf32>):
    %xt = mugraph.input %xa imap [1, -1, -1] fmap -1 : tensor<4x64xbf16> -> tensor<4x8xbf16>
    %wt = mugraph.input %wa imap [1, -1, -1] fmap -1 : tensor<32x64xbf16> -> tensor<32x8xbf16>
    %p = mugraph.matmul %xt, %wt transpose_b : (tensor<4x8xbf16>, tensor<32x8xbf16>) -> tensor<4x32xf32>
    mugraph.output %p to %ya omap [-1, -1, -1] accumulate over %acca : tensor<4x32xf32> -> tensor<4x32xf32>
  }
  func.return %y : tensor<4x32xf32>
}
// CHECK-LABEL: func.func @accumulate
// CHECK:        %p = mugraph.matmul %xt, %wt transpose_b : (tensor<4x8xbf16>, tensor<32x8xbf16>) -> tensor<4x32xf32>
// CHECK-NEXT:   mugraph.output %p to %ya omap [-1, -1, -1] accumulate over %acca : tensor<4x32xf32> -> tensor<4x32xf32>
