// RUN: mk-opt %s --split-input-file -p 'nn-to-mugraph{k-splits=1}' | filecheck %s
// RUN: mk-opt %s --split-input-file -p 'nn-to-mugraph{num-sms=8 tile-k=32 k-splits=1}' | filecheck %s --check-prefix=OPT
// RUN: mk-opt %s --split-input-file -p 'nn-to-mugraph{kv-splits=2 kv-chunk=16 k-splits=1}' | filecheck %s --check-prefix=SPLIT
// RUN: mk-opt %s --split-input-file -p 'nn-to-mugraph{k-splits=1}' | mk-opt --split-input-file | filecheck %s --check-prefix=ROUND
// RUN: mk-opt %s --split-input-file -p 'nn-to-mugraph{k-splits=1}' --print-op-generic | mk-opt --split-input-file -p 'nn-to-mugraph{k-splits=1}' | filecheck %s --check-prefix=ROUND
// RUN: mk-opt %s --split-input-file -p 'nn-to-mugraph{k-splits=0}' | filecheck %s --check-prefix=SPLITK
// RUN: mk-opt %s --split-input-file -p 'nn-to-mugraph{attention-fold=1 kv-splits=2}' | filecheck %s --check-prefix=FOLD
// RUN: mk-opt %s --split-input-file -p 'nn-to-mugraph{k-splits=1 norm-rows=4}' | filecheck %s --check-prefix=NORM
// RUN: mk-opt %s --split-input-file -p 'nn-to-mugraph{kv-splits=2 kv-chunk=16 k-splits=1 merge-rows=2}' | filecheck %s --check-prefix=ROWS
// RUN: mk-opt %s --split-input-file -p 'nn-to-mugraph{k-splits=1 gather-pairs=0}' | filecheck %s --check-prefix=PAIRS0
// RUN: mk-opt %s --split-input-file -p 'nn-to-mugraph{k-splits=1 cache-rows=0}' | filecheck %s --check-prefix=CROWS0

// RMSNorm + Linear: one graph_def. Grid x over the 1024 output columns (64 per block), the
// for-loop over K = 512 in chunks of tile-k; x·g feeds the matmul while Σx² accumulates in the
// same loop, and the epilogue's one thread_map scales each element by rsqrt(Σx²/512 + eps).
func.func @rmsnorm_linear(%x: tensor<8x512xbf16>, %g: tensor<512xbf16>, %w: tensor<1024x512xbf16>) -> tensor<8x1024xbf16> {
  %h = nn.rms_norm %x, %g {epsilon = 1.0e-06 : f32} : (tensor<8x512xbf16>, tensor<512xbf16>) -> tensor<8x512xbf16>
  %y = nn.linear %h, %w : (tensor<8x512xbf16>, tensor<1024x512xbf16>) -> tensor<8x1024xbf16>
  func.return %y : tensor<8x1024xbf16>
}
// With more rows than norm-rows the norm is a kernel of its own (a block per row) and the
// linear reads its output.
// CHECK-LABEL: func.func @rmsnorm_linear
// NORM-LABEL:  func.func @rmsnorm_linear
// NORM-NEXT:     %h = mugraph.graph_def grid [8, 1, 1] threads 128 forloop 1 (%x, %g)
// NORM:            mugraph.rms_norm %h_x, %h_w
// NORM:          %y = mugraph.graph_def grid [16, 1, 1] threads 128 forloop 8 (%h, %w) :
// CHECK-NEXT:    %y = mugraph.graph_def grid [16, 1, 1] threads 128 forloop 8 (%x, %g, %w) attributes {mk.fused = "rms_norm+linear"} : (tensor<8x512xbf16>, tensor<512xbf16>, tensor<1024x512xbf16>) -> tensor<8x1024xbf16> {
// CHECK-NEXT:    ^bb0(%x_a: tensor<8x512xbf16>, %g_a: tensor<512xbf16>, %w_a: tensor<1024x512xbf16>, %y_r: tensor<8x1024xbf16>):
// CHECK-NEXT:      %xt = mugraph.input %x_a imap [-1, -1, -1] fmap 1 : tensor<8x512xbf16> -> tensor<8x64xbf16>
// CHECK-NEXT:      %gt = mugraph.input %g_a imap [-1, -1, -1] fmap 0 : tensor<512xbf16> -> tensor<64xbf16>
// CHECK-NEXT:      %xg = mugraph.binary "mul" %xt, %gt : (tensor<8x64xbf16>, tensor<64xbf16>) -> tensor<8x64xf32>
// CHECK-NEXT:      %wt = mugraph.input %w_a imap [0, -1, -1] fmap 1 : tensor<1024x512xbf16> -> tensor<64x64xbf16>
// CHECK-NEXT:      %wp = mugraph.matmul %xg, %wt transpose_b : (tensor<8x64xf32>, tensor<64x64xbf16>) -> tensor<8x64xf32>
// CHECK-NEXT:      %wacc = mugraph.accum "sum" %wp : tensor<8x64xf32> -> tensor<8x64xf32>
// CHECK-NEXT:      %ss = mugraph.accum "sum_sq_last" %xt : tensor<8x64xbf16> -> tensor<8x1xf32>
// CHECK-NEXT:      %yt = mugraph.thread_map %wacc, %ss : (tensor<8x64xf32>, tensor<8x1xf32>) -> tensor<8x64xbf16> {
// CHECK-NEXT:      ^bb0(%[[ACC:.*]]: f32, %[[SS:.*]]: f32):
// CHECK-NEXT:        %[[K:.*]] = arith.constant 5.120000e+02 : f32
// CHECK-NEXT:        %[[MEAN:.*]] = arith.divf %[[SS]], %[[K]] : f32
// CHECK-NEXT:        %[[EPS:.*]] = arith.constant 1.000000e-06 : f32
// CHECK-NEXT:        %[[ME:.*]] = arith.addf %[[MEAN]], %[[EPS]] : f32
// CHECK-NEXT:        %[[RS:.*]] = math.rsqrt %[[ME]] : f32
// CHECK-NEXT:        %[[Y:.*]] = arith.mulf %[[ACC]], %[[RS]] : f32
// CHECK-NEXT:        mugraph.yield %[[Y]] : f32
// CHECK-NEXT:      }
// CHECK-NEXT:      mugraph.output %yt to %y_r omap [1, -1, -1] : tensor<8x64xbf16> -> tensor<8x1024xbf16>
// CHECK-NEXT:    }
// CHECK-NEXT:    func.return %y : tensor<8x1024xbf16>
// CHECK-NOT:     mugraph.

// The options change the tiling: tile-k=32 doubles the iterations.
// OPT-LABEL: func.func @rmsnorm_linear
// OPT-NEXT:    %y = mugraph.graph_def grid [16, 1, 1] threads 128 forloop 16 (%x, %g, %w)
// OPT:           %xt = mugraph.input %x_a imap [-1, -1, -1] fmap 1 : tensor<8x512xbf16> -> tensor<8x32xbf16>

// ROUND-LABEL: func.func @rmsnorm_linear
// ROUND-NEXT:    %y = mugraph.graph_def grid [16, 1, 1] threads 128 forloop 8 (%x, %g, %w) attributes {mk.fused = "rms_norm+linear"}

// Split-K (k-splits=0, auto): 16 column blocks leave most of 132 SMs idle, so grid z
// splits K = 8 iterations into 4 of 2; each block writes its f32 partial to the leading split
// dim of a [4, 8, 1024] workspace (omap z -> 0). The reduce kernel sums the partials over that
// dim and recomputes Σx² from x (one block's split sees only part of the row).
// SPLITK-LABEL: func.func @rmsnorm_linear
// SPLITK-NEXT:    %y_p = mugraph.graph_def grid [16, 1, 4] threads 128 forloop 2 (%x, %g, %w) attributes {mk.split_k = 4 : i64, mk.fused = "rms_norm+linear"} : (tensor<8x512xbf16>, tensor<512xbf16>, tensor<1024x512xbf16>) -> tensor<4x8x1024xf32> {
// SPLITK:           %xt = mugraph.input %x_a imap [-1, -1, 1] fmap 1 : tensor<8x512xbf16> -> tensor<8x64xbf16>
// SPLITK-NEXT:      %gt = mugraph.input %g_a imap [-1, -1, 0] fmap 0 : tensor<512xbf16> -> tensor<64xbf16>
// SPLITK:           %wt = mugraph.input %w_a imap [0, -1, 1] fmap 1 : tensor<1024x512xbf16> -> tensor<64x64xbf16>
// SPLITK:           %wacc = mugraph.accum "sum" %wp : tensor<8x64xf32> -> tensor<8x64xf32>
// SPLITK-NOT:       sum_sq_last
// SPLITK:           %y_pv = mugraph.reshape %wacc : tensor<8x64xf32> -> tensor<1x8x64xf32>
// SPLITK-NEXT:      mugraph.output %y_pv to %y_p_r omap [2, -1, 0] : tensor<1x8x64xf32> -> tensor<4x8x1024xf32>
// SPLITK-NEXT:    }
// SPLITK-NEXT:    %y = mugraph.graph_def grid [16, 1, 1] threads 128 forloop 8 (%y_p, %x) attributes {mk.split_k_reduce = 4 : i64} : (tensor<4x8x1024xf32>, tensor<8x512xbf16>) -> tensor<8x1024xbf16> {
// SPLITK:           %y_pt = mugraph.input %y_p_a imap [2, -1, -1] fmap -1 : tensor<4x8x1024xf32> -> tensor<4x8x64xf32>
// SPLITK-NEXT:      %y_s = mugraph.reduce "sum" %y_pt dim 0 : tensor<4x8x64xf32> -> tensor<8x64xf32>
// SPLITK-NEXT:      %xt = mugraph.input %x_a imap [-1, -1, -1] fmap 1 : tensor<8x512xbf16> -> tensor<8x64xbf16>
// SPLITK-NEXT:      %ss = mugraph.accum "sum_sq_last" %xt : tensor<8x64xbf16> -> tensor<8x1xf32>
// SPLITK-NEXT:      %yt = mugraph.thread_map %y_s, %ss : (tensor<8x64xf32>, tensor<8x1xf32>) -> tensor<8x64xbf16> {
// SPLITK:             arith.divf
// SPLITK:             math.rsqrt
// SPLITK:           }
// SPLITK-NEXT:      mugraph.output %yt to %y_r omap [1, -1, -1] : tensor<8x64xbf16> -> tensor<8x1024xbf16>
// SPLITK-NEXT:    }
// SPLITK-NEXT:    func.return %y : tensor<8x1024xbf16>

// -----

// Gated MLP: gate and up share x, so they are one graph_def with two accumulators and a
// silu(gate)·up thread_map epilogue; the down projection needs the whole intermediate, so it is
// a second kernel, with the residual add fused into its epilogue (the residual is read with
// fmap -1: the same tile in every iteration).
func.func @gated_mlp(%x: tensor<4x256xbf16>, %w_gate: tensor<512x256xbf16>, %w_up: tensor<512x256xbf16>, %w_down: tensor<256x512xbf16>) -> tensor<4x256xbf16> {
  %g = nn.linear %x, %w_gate : (tensor<4x256xbf16>, tensor<512x256xbf16>) -> tensor<4x512xbf16>
  %u = nn.linear %x, %w_up : (tensor<4x256xbf16>, tensor<512x256xbf16>) -> tensor<4x512xbf16>
  %s = nn.silu %g : (tensor<4x512xbf16>) -> tensor<4x512xbf16>
  %m = nn.mul %s, %u : (tensor<4x512xbf16>, tensor<4x512xbf16>) -> tensor<4x512xbf16>
  %d = nn.linear %m, %w_down : (tensor<4x512xbf16>, tensor<256x512xbf16>) -> tensor<4x256xbf16>
  %y = nn.add %d, %x : (tensor<4x256xbf16>, tensor<4x256xbf16>) -> tensor<4x256xbf16>
  func.return %y : tensor<4x256xbf16>
}
// CHECK-LABEL: func.func @gated_mlp
// CHECK-NEXT:    %m = mugraph.graph_def grid [8, 1, 1] threads 128 forloop 4 (%x, %w_gate, %w_up) attributes {mk.fused = "linear+linear+silu+mul"} : (tensor<4x256xbf16>, tensor<512x256xbf16>, tensor<512x256xbf16>) -> tensor<4x512xbf16> {
// CHECK:           %w_gateacc = mugraph.accum "sum" %w_gatep : tensor<4x64xf32> -> tensor<4x64xf32>
// CHECK:           %w_upacc = mugraph.accum "sum" %w_upp : tensor<4x64xf32> -> tensor<4x64xf32>
// CHECK-NEXT:      %mt = mugraph.thread_map %w_gateacc, %w_upacc : (tensor<4x64xf32>, tensor<4x64xf32>) -> tensor<4x64xbf16> {
// CHECK:             math.exp
// CHECK:             mugraph.yield
// CHECK-NEXT:      }
// CHECK-NEXT:      mugraph.output %mt to %m_r omap [1, -1, -1] : tensor<4x64xbf16> -> tensor<4x512xbf16>
// CHECK-NEXT:    }
// CHECK-NEXT:    %y = mugraph.graph_def grid [4, 1, 1] threads 128 forloop 8 (%m, %w_down, %x) attributes {mk.fused = "linear+add"}
// CHECK:           %x_t = mugraph.input %x_a imap [1, -1, -1] fmap -1 : tensor<4x256xbf16> -> tensor<4x64xbf16>
// CHECK-NEXT:      %yt = mugraph.thread_map %w_downacc, %x_t : (tensor<4x64xf32>, tensor<4x64xbf16>) -> tensor<4x64xbf16> {
// CHECK:             arith.addf
// CHECK:           mugraph.output %yt to %y_r omap [1, -1, -1] : tensor<4x64xbf16> -> tensor<4x256xbf16>
// CHECK:         func.return %y : tensor<4x256xbf16>

// -----

// Decode attention, grouped-query (4 query heads per KV head), keys past kv_len masked: grid
// x = KV heads, y = splits of the 256 keys, z = batch; the loop walks kv-chunk keys with an
// online-softmax accumulator; partials carry a leading split dim; a merge kernel combines them.
func.func @attention_decode(%q: tensor<2x8x1x64xbf16>, %k: tensor<2x2x256x64xbf16>, %v: tensor<2x2x256x64xbf16>, %kv_len: tensor<2xi32>) -> tensor<2x8x1x64xbf16> {
  %o = nn.attention %q, %k, %v, %kv_len {scale = 0.125 : f32, causal = false} : (tensor<2x8x1x64xbf16>, tensor<2x2x256x64xbf16>, tensor<2x2x256x64xbf16>, tensor<2xi32>) -> tensor<2x8x1x64xbf16>
  func.return %o : tensor<2x8x1x64xbf16>
}
// CHECK-LABEL: func.func @attention_decode
// CHECK-NEXT:    %o_o, %o_m, %o_l = mugraph.graph_def grid [2, 4, 2] threads 128 forloop 1 (%q, %k, %v, %kv_len) : (tensor<2x8x1x64xbf16>, tensor<2x2x256x64xbf16>, tensor<2x2x256x64xbf16>, tensor<2xi32>) -> (tensor<4x2x8x1x64xf32>, tensor<4x2x8x1x1xf32>, tensor<4x2x8x1x1xf32>) {
// CHECK:           %qt = mugraph.input %q_a imap [1, -1, 0] fmap -1 : tensor<2x8x1x64xbf16> -> tensor<1x4x1x64xbf16>
// CHECK:           %kt = mugraph.input %k_a imap [1, 2, 0] fmap 2 : tensor<2x2x256x64xbf16> -> tensor<1x1x64x64xbf16>
// CHECK:           %s = mugraph.matmul %q2, %k2 transpose_b : (tensor<4x64xbf16>, tensor<64x64xbf16>) -> tensor<4x64xf32>
// CHECK:           %kpi = mugraph.position %kt dim 2
// CHECK:           %lent = mugraph.input %kv_len_a imap [-1, -1, 0] fmap -1 : tensor<2xi32> -> tensor<1xi32>
// CHECK-NEXT:      %ss = mugraph.thread_map %s, %kp, %lent : (tensor<4x64xf32>, tensor<1x64xf32>, tensor<1xi32>) -> tensor<4x64xf32> {
// CHECK:             arith.cmpf olt
// CHECK:             arith.select
// CHECK:           %ot, %mt, %lt = mugraph.accum_softmax %ss, %v2 : (tensor<4x64xf32>, tensor<64x64xbf16>) -> (tensor<4x64xf32>, tensor<4x1xf32>, tensor<4x1xf32>)
// CHECK:           mugraph.output %o5 to %o_r omap [2, 0, 1] : tensor<1x1x4x1x64xf32> -> tensor<4x2x8x1x64xf32>
// CHECK:         %o = mugraph.graph_def grid [2, 1, 2] threads 128 forloop 1 (%o_o, %o_m, %o_l)
// CHECK:           %mx = mugraph.reduce "max" %mp dim 0 keepdim : tensor<4x1x4x1x1xf32> -> tensor<1x1x4x1x1xf32>
// CHECK:           %osum = mugraph.reduce "sum" %ow dim 0 : tensor<4x1x4x1x64xf32> -> tensor<1x4x1x64xf32>
// CHECK:           mugraph.output %fin to %o_r omap [1, -1, 0] : tensor<1x4x1x64xbf16> -> tensor<2x8x1x64xbf16>
// CHECK:         func.return %o : tensor<2x8x1x64xbf16>

// With num-sms=8 there are 2 splits of 128 keys, walked in 2 chunks of 64.
// OPT-LABEL: func.func @attention_decode
// OPT-NEXT:    %o_o, %o_m, %o_l = mugraph.graph_def grid [2, 2, 2] threads 128 forloop 2 (%q, %k, %v, %kv_len)

// -----

// Prefill attention (300 queries, causal over a cache of 320 keys with kv_len): grid x = KV
// heads, y = blocks of 60 queries, z = batch; the loop walks all the keys in kv-chunk steps, so
// there is no split and no merge; q and the result follow the query blocks.
func.func @attention_prefill(%q: tensor<1x4x300x64xbf16>, %k: tensor<1x2x320x64xbf16>, %v: tensor<1x2x320x64xbf16>, %kv_len: tensor<1xi32>) -> tensor<1x4x300x64xbf16> {
  %o = nn.attention %q, %k, %v, %kv_len {scale = 0.125 : f32, causal = true} : (tensor<1x4x300x64xbf16>, tensor<1x2x320x64xbf16>, tensor<1x2x320x64xbf16>, tensor<1xi32>) -> tensor<1x4x300x64xbf16>
  func.return %o : tensor<1x4x300x64xbf16>
}
// CHECK-LABEL: func.func @attention_prefill
// CHECK-NEXT:    %o = mugraph.graph_def grid [2, 5, 1] threads 128 forloop 5 (%q, %k, %v, %kv_len)
// CHECK:           %qt = mugraph.input %q_a imap [1, 2, 0] fmap -1 : tensor<1x4x300x64xbf16> -> tensor<1x2x60x64xbf16>
// CHECK:           %kt = mugraph.input %k_a imap [1, -1, 0] fmap 2 : tensor<1x2x320x64xbf16> -> tensor<1x1x64x64xbf16>
// CHECK:           %qpi = mugraph.position %qt dim 2
// CHECK:           mugraph.output %fin4 to %o_r omap [1, 2, 0] : tensor<1x2x60x64xbf16> -> tensor<1x4x300x64xbf16>
// CHECK-NOT:     mugraph.graph_def
// CHECK:         func.return %o : tensor<1x4x300x64xbf16>

// -----

// Argmax over the vocabulary as partial + reduce; the embedding is a library gather kernel.
func.func @lm_head_argmax(%ids: tensor<4xi32>, %embed: tensor<1000x128xbf16>, %logits: tensor<4x32768xbf16>) -> (tensor<4x128xbf16>, tensor<4xi32>) {
  %h = nn.embedding %embed, %ids : (tensor<1000x128xbf16>, tensor<4xi32>) -> tensor<4x128xbf16>
  %next = nn.argmax %logits {dim = -1 : i64} : (tensor<4x32768xbf16>) -> tensor<4xi32>
  func.return %h, %next : tensor<4x128xbf16>, tensor<4xi32>
}
// CHECK-LABEL: func.func @lm_head_argmax
// CHECK-NEXT:    %h = mugraph.kernel "embedding" (%embed, %ids) : (tensor<1000x128xbf16>, tensor<4xi32>) -> tensor<4x128xbf16>
// CHECK-NEXT:    %next_pv, %next_pi = mugraph.graph_def grid [128, 1, 1] threads 128 forloop 1 (%logits) : (tensor<4x32768xbf16>) -> (tensor<4x128xf32>, tensor<4x128xi32>) {
// CHECK:           %xt = mugraph.input %logits_a imap [1, -1, -1] fmap -1 : tensor<4x32768xbf16> -> tensor<4x256xbf16>
// CHECK-NEXT:      %pos = mugraph.position %xt dim 1 : tensor<4x256xbf16> -> tensor<4x256xi32>
// CHECK-NEXT:      %mv, %mi = mugraph.argmax %xt, %pos dim 1 : (tensor<4x256xbf16>, tensor<4x256xi32>) -> (tensor<4x1xf32>, tensor<4x1xi32>)
// CHECK-NEXT:      mugraph.output %mv to %pv_r omap [1, -1, -1] : tensor<4x1xf32> -> tensor<4x128xf32>
// CHECK-NEXT:      mugraph.output %mi to %pi_r omap [1, -1, -1] : tensor<4x1xi32> -> tensor<4x128xi32>
// CHECK-NEXT:    }
// CHECK-NEXT:    %next = mugraph.graph_def grid [4, 1, 1] threads 32 forloop 1 (%next_pv, %next_pi)
// CHECK:           %bv, %bi = mugraph.argmax %vt, %it dim 1 : (tensor<1x128xf32>, tensor<1x128xi32>) -> (tensor<1x1xf32>, tensor<1x1xi32>)
// CHECK-NEXT:      %id = mugraph.reshape %bi : tensor<1x1xi32> -> tensor<1xi32>
// CHECK-NEXT:      mugraph.output %id to %next_r omap [0, -1, -1] : tensor<1xi32> -> tensor<4xi32>
// CHECK:         func.return %h, %next : tensor<4x128xbf16>, tensor<4xi32>

// -----

// A chain of elementwise ops not fed by a linear is one graph_def with one thread_map; the
// row-broadcast operand is read with the grid's column split only.
func.func @elementwise_chain(%a: tensor<4x128xf32>, %b: tensor<4x128xf32>, %c: tensor<128xf32>) -> tensor<4x128xf32> {
  %s = nn.silu %a : (tensor<4x128xf32>) -> tensor<4x128xf32>
  %m = nn.mul %s, %b : (tensor<4x128xf32>, tensor<4x128xf32>) -> tensor<4x128xf32>
  %r = nn.add %m, %c : (tensor<4x128xf32>, tensor<128xf32>) -> tensor<4x128xf32>
  func.return %r : tensor<4x128xf32>
}
// CHECK-LABEL: func.func @elementwise_chain
// CHECK-NEXT:    %r = mugraph.graph_def grid [2, 1, 1] threads 128 forloop 1 (%a, %b, %c) attributes {mk.fused = "silu+mul+add"} : (tensor<4x128xf32>, tensor<4x128xf32>, tensor<128xf32>) -> tensor<4x128xf32> {
// CHECK-NEXT:    ^bb0(%a_a: tensor<4x128xf32>, %b_a: tensor<4x128xf32>, %c_a: tensor<128xf32>, %r_r: tensor<4x128xf32>):
// CHECK-NEXT:      %a_t = mugraph.input %a_a imap [1, -1, -1] fmap -1 : tensor<4x128xf32> -> tensor<4x64xf32>
// CHECK-NEXT:      %b_t = mugraph.input %b_a imap [1, -1, -1] fmap -1 : tensor<4x128xf32> -> tensor<4x64xf32>
// CHECK-NEXT:      %c_t = mugraph.input %c_a imap [0, -1, -1] fmap -1 : tensor<128xf32> -> tensor<64xf32>
// CHECK-NEXT:      %rt = mugraph.thread_map %a_t, %b_t, %c_t : (tensor<4x64xf32>, tensor<4x64xf32>, tensor<64xf32>) -> tensor<4x64xf32> {
// CHECK:             math.exp
// CHECK:             mugraph.yield
// CHECK-NEXT:      }
// CHECK-NEXT:      mugraph.output %rt to %r_r omap [1, -1, -1] : tensor<4x64xf32> -> tensor<4x128xf32>

// -----

// Everything else is a library kernel carrying the nn op's attributes (defaults filled in).
func.func @library(%x: tensor<4x6xf32>, %c: tensor<4x3xf32>, %s: tensor<4x3xf32>) -> (tensor<6x4xf32>, tensor<4xf32>, tensor<4x6xf32>) {
  %t = nn.transpose %x {perm = array<i64: 1, 0>} : (tensor<4x6xf32>) -> tensor<6x4xf32>
  %r = nn.reduce_sum %x {dim = 1 : i64} : (tensor<4x6xf32>) -> tensor<4xf32>
  %e = nn.rope %x, %c, %s : (tensor<4x6xf32>, tensor<4x3xf32>, tensor<4x3xf32>) -> tensor<4x6xf32>
  %m = nn.softmax %e : (tensor<4x6xf32>) -> tensor<4x6xf32>
  func.return %t, %r, %m : tensor<6x4xf32>, tensor<4xf32>, tensor<4x6xf32>
}
// CHECK-LABEL: func.func @library
// CHECK-NEXT:    %t = mugraph.kernel "transpose" (%x) {perm = array<i64: 1, 0>} : (tensor<4x6xf32>) -> tensor<6x4xf32>
// CHECK-NEXT:    %r = mugraph.kernel "reduce_sum" (%x) {dim = 1 : i64, keepdim = false} : (tensor<4x6xf32>) -> tensor<4xf32>
// A RoPE with rows to spread is the exception: one block per row (cos and sin tiled alike).
// CHECK-NEXT:    %e = mugraph.graph_def grid [4, 1, 1] threads 128 forloop 1 (%x, %c, %s)
// CHECK:           %e_c = mugraph.input %c_a imap [0, -1, -1] fmap -1 : tensor<4x3xf32> -> tensor<1x3xf32>
// CHECK:           mugraph.rope %e_x, %e_c, %e_s : (tensor<1x6xf32>, tensor<1x3xf32>, tensor<1x3xf32>) -> tensor<1x6xf32>
// CHECK:         %m = mugraph.kernel "softmax" (%e) {dim = -1 : i64} : (tensor<4x6xf32>) -> tensor<4x6xf32>
// CHECK-NEXT:    func.return %t, %r, %m : tensor<6x4xf32>, tensor<4xf32>, tensor<4x6xf32>

// -----

// A norm feeding several linears fuses with all of them (one read of x). A split-heads reshape
// of an output folds into the output map when a block's columns are whole heads (q: 64 columns
// = one head); k's 32-column tiles are half a head, so its reshape stays a copy kernel.
func.func @qkv(%x: tensor<1x256xbf16>, %g: tensor<256xbf16>, %wq: tensor<256x256xbf16>, %wk: tensor<128x256xbf16>) -> (tensor<1x4x1x64xbf16>, tensor<1x2x1x64xbf16>) {
  %h = nn.rms_norm %x, %g {epsilon = 1.0e-05 : f32} : (tensor<1x256xbf16>, tensor<256xbf16>) -> tensor<1x256xbf16>
  %q = nn.linear %h, %wq : (tensor<1x256xbf16>, tensor<256x256xbf16>) -> tensor<1x256xbf16>
  %k = nn.linear %h, %wk : (tensor<1x256xbf16>, tensor<128x256xbf16>) -> tensor<1x128xbf16>
  %q4 = nn.reshape %q : (tensor<1x256xbf16>) -> tensor<1x4x1x64xbf16>
  %k4 = nn.reshape %k : (tensor<1x128xbf16>) -> tensor<1x2x1x64xbf16>
  func.return %q4, %k4 : tensor<1x4x1x64xbf16>, tensor<1x2x1x64xbf16>
}
// CHECK-LABEL: func.func @qkv
// CHECK-NEXT:    %q4, %k = mugraph.graph_def grid [4, 1, 1] threads 128 forloop 4 (%x, %g, %wq, %wk) attributes {mk.fused = "rms_norm+linear+linear+reshape"} : (tensor<1x256xbf16>, tensor<256xbf16>, tensor<256x256xbf16>, tensor<128x256xbf16>) -> (tensor<1x4x1x64xbf16>, tensor<1x128xbf16>) {
// CHECK:           %wkt = mugraph.input %wk_a imap [0, -1, -1] fmap 1 : tensor<128x256xbf16> -> tensor<32x64xbf16>
// CHECK:           %ss = mugraph.accum "sum_sq_last" %xt : tensor<1x64xbf16> -> tensor<1x1xf32>
// CHECK-NEXT:      %qt = mugraph.thread_map %wqacc, %ss : (tensor<1x64xf32>, tensor<1x1xf32>) -> tensor<1x64xbf16> {
// CHECK:             arith.constant 2.560000e+02 : f32
// CHECK:           }
// CHECK-NEXT:      %q4v = mugraph.reshape %qt : tensor<1x64xbf16> -> tensor<1x1x1x64xbf16>
// CHECK-NEXT:      mugraph.output %q4v to %q4_r omap [1, -1, -1] : tensor<1x1x1x64xbf16> -> tensor<1x4x1x64xbf16>
// CHECK-NEXT:      %kt = mugraph.thread_map %wkacc, %ss : (tensor<1x32xf32>, tensor<1x1xf32>) -> tensor<1x32xbf16> {
// CHECK:           }
// CHECK-NEXT:      mugraph.output %kt to %k_r omap [1, -1, -1] : tensor<1x32xbf16> -> tensor<1x128xbf16>
// CHECK-NEXT:    }
// CHECK-NEXT:    %k4 = mugraph.kernel "reshape" (%k) : (tensor<1x128xbf16>) -> tensor<1x2x1x64xbf16>

// -----

// Attention with one KV split (no merge kernel: the epilogue normalises), causal with kv_len:
// the mask compares key positions with kv_len and with the query's position kv_len - Sq + i.
// The reshapes around it fold into its maps: q is read from the [1, 256] tensor and the result
// is written as [1, 256].
func.func @attention_views(%qf: tensor<1x256xf32>, %k: tensor<1x2x64x64xf32>, %v: tensor<1x2x64x64xf32>, %kv_len: tensor<1xi32>) -> tensor<1x256xf32> {
  %q = nn.reshape %qf : (tensor<1x256xf32>) -> tensor<1x4x1x64xf32>
  %o = nn.attention %q, %k, %v, %kv_len {scale = 0.125 : f32, causal = true} : (tensor<1x4x1x64xf32>, tensor<1x2x64x64xf32>, tensor<1x2x64x64xf32>, tensor<1xi32>) -> tensor<1x4x1x64xf32>
  %o2 = nn.reshape %o : (tensor<1x4x1x64xf32>) -> tensor<1x256xf32>
  func.return %o2 : tensor<1x256xf32>
}
// CHECK-LABEL: func.func @attention_views
// CHECK-NEXT:    %o2 = mugraph.graph_def grid [2, 1, 1] threads 128 forloop 1 (%qf, %k, %v, %kv_len) : (tensor<1x256xf32>, tensor<1x2x64x64xf32>, tensor<1x2x64x64xf32>, tensor<1xi32>) -> tensor<1x256xf32> {
// CHECK:           %qt = mugraph.input %qf_a imap [1, -1, 0] fmap -1 : tensor<1x256xf32> -> tensor<1x128xf32>
// CHECK-NEXT:      %q2 = mugraph.reshape %qt : tensor<1x128xf32> -> tensor<2x64xf32>
// CHECK:           %ss = mugraph.thread_map %s, %kp, %lent
// CHECK:             arith.cmpf olt
// CHECK:             arith.cmpf ole
// CHECK:             arith.andi
// CHECK:           %ot, %mt, %lt = mugraph.accum_softmax %ss, %v2
// CHECK-NEXT:      %fin = mugraph.thread_map %ot, %lt, %mt
// CHECK:           %fin2 = mugraph.reshape %fin : tensor<2x64xf32> -> tensor<1x128xf32>
// CHECK-NEXT:      mugraph.output %fin2 to %o2_r omap [1, -1, 0] : tensor<1x128xf32> -> tensor<1x256xf32>
// CHECK-NEXT:    }
// CHECK-NEXT:    func.return %o2 : tensor<1x256xf32>

// kv-splits forces the split (then a merge kernel) and kv-chunk the keys per iteration.
// SPLIT-LABEL: func.func @attention_views
// SPLIT-NEXT:    %o2_o, %o2_m, %o2_l = mugraph.graph_def grid [2, 2, 1] threads 128 forloop 2 (%qf, %k, %v, %kv_len)
// SPLIT:           %kt = mugraph.input %k_a imap [1, 2, 0] fmap 2 : tensor<1x2x64x64xf32> -> tensor<1x1x16x64xf32>
// SPLIT:         %o2 = mugraph.graph_def grid [2, 1, 1] threads 128 forloop 1 (%o2_o, %o2_m, %o2_l)
// SPLIT:           mugraph.output %fin2 to %o2_r omap [1, -1, 0] : tensor<1x128xf32> -> tensor<1x256xf32>

// -----

// Two batch rows: the merge takes a block per KV head and batch row, or with merge-rows=2 a
// block per KV head holding both rows (what mugraph-fuse-loop folds into an o-projection).
func.func @attention_views_rows(%qf: tensor<2x256xf32>, %k: tensor<2x2x64x64xf32>, %v: tensor<2x2x64x64xf32>, %kv_len: tensor<2xi32>) -> tensor<2x256xf32> {
  %q = nn.reshape %qf : (tensor<2x256xf32>) -> tensor<2x4x1x64xf32>
  %o = nn.attention %q, %k, %v, %kv_len {scale = 0.125 : f32, causal = true} : (tensor<2x4x1x64xf32>, tensor<2x2x64x64xf32>, tensor<2x2x64x64xf32>, tensor<2xi32>) -> tensor<2x4x1x64xf32>
  %o2 = nn.reshape %o : (tensor<2x4x1x64xf32>) -> tensor<2x256xf32>
  func.return %o2 : tensor<2x256xf32>
}
// SPLIT-LABEL: func.func @attention_views_rows
// SPLIT:         %o2 = mugraph.graph_def grid [2, 1, 2] threads 128 forloop 1 (%o2_o, %o2_m, %o2_l)
// SPLIT:           %op = mugraph.input %o2_o_a imap [2, -1, 1] fmap -1 : tensor<2x2x4x1x64xf32> -> tensor<2x1x2x1x64xf32>
// SPLIT:           mugraph.output %fin2 to %o2_r omap [1, -1, 0] : tensor<1x128xf32> -> tensor<2x256xf32>
// ROWS-LABEL: func.func @attention_views_rows
// ROWS:         %o2 = mugraph.graph_def grid [2, 1, 1] threads 128 forloop 1 (%o2_o, %o2_m, %o2_l)
// ROWS:           %op = mugraph.input %o2_o_a imap [2, -1, -1] fmap -1 : tensor<2x2x4x1x64xf32> -> tensor<2x2x2x1x64xf32>
// ROWS:           mugraph.output %fin2 to %o2_r omap [1, -1, -1] : tensor<2x128xf32> -> tensor<2x256xf32>

// -----

// A standalone RMSNorm (QK-norm per head) gets one block per row over its two largest leading
// dims, not one library task for all rows.
func.func @qk_norm(%q: tensor<2x16x1x128xbf16>, %w: tensor<128xbf16>) -> tensor<2x16x1x128xbf16> {
  %y = nn.rms_norm %q, %w {epsilon = 1.0e-05 : f32} : (tensor<2x16x1x128xbf16>, tensor<128xbf16>) -> tensor<2x16x1x128xbf16>
  func.return %y : tensor<2x16x1x128xbf16>
}
// CHECK-LABEL: func.func @qk_norm
// CHECK-NEXT:    %y = mugraph.graph_def grid [2, 16, 1] threads 128 forloop 1 (%q, %w)
// CHECK-NEXT:    ^bb0(
// CHECK-NEXT:      %y_x = mugraph.input %q_a imap [0, 1, -1] fmap -1 : tensor<2x16x1x128xbf16> -> tensor<1x1x1x128xbf16>
// CHECK-NEXT:      %y_w = mugraph.input %w_a imap [-1, -1, -1] fmap -1 : tensor<128xbf16> -> tensor<128xbf16>
// CHECK-NEXT:      %y_n = mugraph.rms_norm %y_x, %y_w {epsilon = 1.000000e-05 : f32}
// CHECK-NEXT:      mugraph.output %y_n to %y_r omap [0, 1, -1]

// -----

// A head-splitting reshape feeding it folds in: the blocks read their head of q directly, a
// block per head with both rows (at most 8 rows share a block).
func.func @qk_norm_view(%q: tensor<2x256xbf16>, %w: tensor<64xbf16>) -> tensor<2x4x1x64xbf16> {
  %q4 = nn.reshape %q : (tensor<2x256xbf16>) -> tensor<2x4x1x64xbf16>
  %y = nn.rms_norm %q4, %w {epsilon = 1.0e-06 : f32} : (tensor<2x4x1x64xbf16>, tensor<64xbf16>) -> tensor<2x4x1x64xbf16>
  func.return %y : tensor<2x4x1x64xbf16>
}
// CHECK-LABEL: func.func @qk_norm_view
// CHECK-NEXT:    %y = mugraph.graph_def grid [4, 1, 1] threads 128 forloop 1 (%q, %w)
// CHECK-NEXT:    ^bb0(
// CHECK-NEXT:      %y_x = mugraph.input %q_a imap [1, -1, -1] fmap -1 : tensor<2x256xbf16> -> tensor<2x64xbf16>
// CHECK-NEXT:      %y_xv = mugraph.reshape %y_x : tensor<2x64xbf16> -> tensor<2x1x1x64xbf16>

// -----

// Nine rows are more than a block takes: a block per row and head.
func.func @qk_norm_view_rows(%q: tensor<9x256xbf16>, %w: tensor<64xbf16>) -> tensor<9x4x1x64xbf16> {
  %q4 = nn.reshape %q : (tensor<9x256xbf16>) -> tensor<9x4x1x64xbf16>
  %y = nn.rms_norm %q4, %w {epsilon = 1.0e-06 : f32} : (tensor<9x4x1x64xbf16>, tensor<64xbf16>) -> tensor<9x4x1x64xbf16>
  func.return %y : tensor<9x4x1x64xbf16>
}
// CHECK-LABEL: func.func @qk_norm_view_rows
// CHECK-NEXT:    %y = mugraph.graph_def grid [9, 4, 1] threads 128 forloop 1 (%q, %w)
// CHECK-NEXT:    ^bb0(
// CHECK-NEXT:      %y_x = mugraph.input %q_a imap [0, 1, -1] fmap -1 : tensor<9x256xbf16> -> tensor<1x64xbf16>

// -----

// QK-norm then RoPE on heads split off a linear's output: one graph_def, one block per head,
// reading q through the view and rotating by position tables broadcast to every head.
func.func @qk_norm_rope(%q: tensor<1x256xbf16>, %w: tensor<64xbf16>, %c: tensor<1x32xf32>, %s: tensor<1x32xf32>) -> tensor<1x4x1x64xbf16> {
  %q4 = nn.reshape %q : (tensor<1x256xbf16>) -> tensor<1x4x1x64xbf16>
  %n = nn.rms_norm %q4, %w {epsilon = 1.0e-06 : f32} : (tensor<1x4x1x64xbf16>, tensor<64xbf16>) -> tensor<1x4x1x64xbf16>
  %r = nn.rope %n, %c, %s : (tensor<1x4x1x64xbf16>, tensor<1x32xf32>, tensor<1x32xf32>) -> tensor<1x4x1x64xbf16>
  func.return %r : tensor<1x4x1x64xbf16>
}
// CHECK-LABEL: func.func @qk_norm_rope
// CHECK-NEXT:    %r = mugraph.graph_def grid [4, 1, 1] threads 128 forloop 1 (%q, %w, %c, %s)
// CHECK-NEXT:    ^bb0(
// CHECK-NEXT:      %r_x = mugraph.input %q_a imap [1, -1, -1] fmap -1 : tensor<1x256xbf16> -> tensor<1x64xbf16>
// CHECK-NEXT:      %r_xv = mugraph.reshape %r_x : tensor<1x64xbf16> -> tensor<1x1x1x64xbf16>
// CHECK-NEXT:      %r_w = mugraph.input %w_a imap [-1, -1, -1] fmap -1
// CHECK-NEXT:      %r_n = mugraph.rms_norm %r_xv, %r_w
// CHECK-NEXT:      %r_c = mugraph.input %c_a imap [-1, -1, -1] fmap -1 : tensor<1x32xf32> -> tensor<1x32xf32>
// CHECK-NEXT:      %r_s = mugraph.input %s_a imap [-1, -1, -1] fmap -1 : tensor<1x32xf32> -> tensor<1x32xf32>
// CHECK-NEXT:      %r_rot = mugraph.rope %r_n, %r_c, %r_s : (tensor<1x1x1x64xf32>, tensor<1x32xf32>, tensor<1x32xf32>) -> tensor<1x1x1x64xf32>
// CHECK-NEXT:      mugraph.output %r_rot to %r_r omap [1, -1, -1]

// -----

// A cache write of a reshaped slab reads the reshape's source (the same bytes): no copy kernel.
// A batch's head-split slab written into a donated cache at one position is copied by blocks,
// one per head, which mugraph-append-writes then makes write it in place (cache-rows=0: the
// cache_write kernel reads it too); not into a cache that is not donated, nor one row (batch 1).
// A reshape with another user stays a copy.
func.func @cache_write_view(%cache: tensor<2x2x8x4xbf16> {nn.donated}, %v: tensor<2x8xbf16>, %w: tensor<2x8xbf16>, %cache2: tensor<2x2x8x4xbf16>, %p: tensor<1xi32>, %u: tensor<2x8xbf16>, %cache3: tensor<2x2x8x4xbf16>, %r: tensor<1x8xbf16>, %cache4: tensor<1x2x8x4xbf16> {nn.donated}) -> (tensor<2x2x1x4xbf16>, tensor<2x2x8x4xbf16>, tensor<2x2x8x4xbf16>, tensor<1x2x8x4xbf16>) {
  %v4 = nn.reshape %v : (tensor<2x8xbf16>) -> tensor<2x2x1x4xbf16>
  %c = nn.cache_write %cache, %v4, %p {dim = 2 : i64} : (tensor<2x2x8x4xbf16>, tensor<2x2x1x4xbf16>, tensor<1xi32>) -> tensor<2x2x8x4xbf16>
  %w4 = nn.reshape %w : (tensor<2x8xbf16>) -> tensor<2x2x1x4xbf16>
  %c2 = nn.cache_write %cache2, %w4, %p {dim = 2 : i64} : (tensor<2x2x8x4xbf16>, tensor<2x2x1x4xbf16>, tensor<1xi32>) -> tensor<2x2x8x4xbf16>
  %u4 = nn.reshape %u : (tensor<2x8xbf16>) -> tensor<2x2x1x4xbf16>
  %c3 = nn.cache_write %cache3, %u4, %p {dim = 2 : i64} : (tensor<2x2x8x4xbf16>, tensor<2x2x1x4xbf16>, tensor<1xi32>) -> tensor<2x2x8x4xbf16>
  %r4 = nn.reshape %r : (tensor<1x8xbf16>) -> tensor<1x2x1x4xbf16>
  %c4 = nn.cache_write %cache4, %r4, %p {dim = 2 : i64} : (tensor<1x2x8x4xbf16>, tensor<1x2x1x4xbf16>, tensor<1xi32>) -> tensor<1x2x8x4xbf16>
  func.return %w4, %c2, %c3, %c4 : tensor<2x2x1x4xbf16>, tensor<2x2x8x4xbf16>, tensor<2x2x8x4xbf16>, tensor<1x2x8x4xbf16>
}
// CHECK-LABEL: func.func @cache_write_view
// CHECK-NEXT:    %v4 = mugraph.graph_def grid [2, 1, 1] threads 128 forloop 1 (%v) : (tensor<2x8xbf16>) -> tensor<2x2x1x4xbf16> {
// CHECK-NEXT:    ^bb0(%v_a: tensor<2x8xbf16>, %v4_r: tensor<2x2x1x4xbf16>):
// CHECK-NEXT:      %v4_x = mugraph.input %v_a imap [1, -1, -1] fmap -1 : tensor<2x8xbf16> -> tensor<2x4xbf16>
// CHECK-NEXT:      %v4_xv = mugraph.reshape %v4_x : tensor<2x4xbf16> -> tensor<2x1x1x4xbf16>
// CHECK-NEXT:      mugraph.output %v4_xv to %v4_r omap [1, -1, -1] : tensor<2x1x1x4xbf16> -> tensor<2x2x1x4xbf16>
// CHECK-NEXT:    }
// CHECK-NEXT:    %c = mugraph.kernel "cache_write" (%cache, %v4, %p) {dim = 2 : i64} : (tensor<2x2x8x4xbf16>, tensor<2x2x1x4xbf16>, tensor<1xi32>) -> tensor<2x2x8x4xbf16>
// CHECK-NEXT:    %w4 = mugraph.kernel "reshape" (%w)
// CHECK-NEXT:    %c2 = mugraph.kernel "cache_write" (%cache2, %w4, %p)
// CHECK-NEXT:    %c3 = mugraph.kernel "cache_write" (%cache3, %u, %p) {dim = 2 : i64} : (tensor<2x2x8x4xbf16>, tensor<2x8xbf16>, tensor<1xi32>) -> tensor<2x2x8x4xbf16>
// CHECK-NEXT:    %c4 = mugraph.kernel "cache_write" (%cache4, %r, %p) {dim = 2 : i64} : (tensor<1x2x8x4xbf16>, tensor<1x8xbf16>, tensor<1xi32>) -> tensor<1x2x8x4xbf16>
// CROWS0-LABEL: func.func @cache_write_view
// CROWS0-NEXT:    %c = mugraph.kernel "cache_write" (%cache, %v, %p) {dim = 2 : i64} : (tensor<2x2x8x4xbf16>, tensor<2x8xbf16>, tensor<1xi32>) -> tensor<2x2x8x4xbf16>
// CROWS0-NEXT:    %w4 = mugraph.kernel "reshape" (%w)
// CROWS0-NEXT:    %c2 = mugraph.kernel "cache_write" (%cache2, %w4, %p)
// CROWS0-NEXT:    %c3 = mugraph.kernel "cache_write" (%cache3, %u, %p) {dim = 2 : i64} : (tensor<2x2x8x4xbf16>, tensor<2x8xbf16>, tensor<1xi32>) -> tensor<2x2x8x4xbf16>
// CROWS0-NEXT:    %c4 = mugraph.kernel "cache_write" (%cache4, %r, %p) {dim = 2 : i64} : (tensor<1x2x8x4xbf16>, tensor<1x8xbf16>, tensor<1xi32>) -> tensor<1x2x8x4xbf16>

// -----

// attention-fold=1: the split kernel reads the raw q/k/v rows and the caches before their
// writes; q's and the new K row's QK-norm + RoPE run in its blocks, and each K/V chunk takes
// the new row at position %p. k's own kernel stays, for the cache write, which now comes after
// the attention (a write-after-read instead of a wait before it).
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
// FOLD-LABEL: func.func @step
// FOLD:         %o_o, %o_m, %o_l = mugraph.graph_def grid [2, 2, 1] threads 128 forloop 1 (%q, %k_cache, %v_cache, %len, %qw, %cos, %sin, %k, %p, %kw, %v)
// FOLD:           %qn = mugraph.rms_norm %qxv, %qw_1
// FOLD:           %qrot = mugraph.rope %qn, %qc, %qs {{.*}} -> tensor<1x2x1x16xbf16>
// FOLD:           %kpos = mugraph.position %kt dim 2
// FOLD-NEXT:      %ksel = mugraph.thread_map %kpos, %kat, %knrot, %kt
// FOLD:             arith.cmpi eq
// FOLD:           %vsel = mugraph.thread_map %vpos, %kat, %vrow, %vt
// FOLD:         %o = mugraph.graph_def grid [2, 1, 1]
// FOLD:         %kr = mugraph.graph_def grid [2, 1, 1]
// FOLD:         %vc = mugraph.kernel "cache_write" (%v_cache, %v, %p)
// FOLD-NEXT:    %kc = mugraph.kernel "cache_write" (%k_cache, %kr, %p)

// -----

// A read of a donated cache before its in-place write does not fuse with an op after the write:
// the fused kernel would run after the write and read the cache's new bytes.
func.func @read_before_write(%k: tensor<1x2x1x16xbf16>, %p: tensor<1xi32>, %c: tensor<1x2x4x16xbf16> {nn.donated}) -> tensor<1x2x4x16xbf16> {
  %old = nn.mul %c, %c : (tensor<1x2x4x16xbf16>, tensor<1x2x4x16xbf16>) -> tensor<1x2x4x16xbf16>
  %w = nn.cache_write %c, %k, %p {dim = 2 : i64} : (tensor<1x2x4x16xbf16>, tensor<1x2x1x16xbf16>, tensor<1xi32>) -> tensor<1x2x4x16xbf16>
  %s = nn.add %w, %old : (tensor<1x2x4x16xbf16>, tensor<1x2x4x16xbf16>) -> tensor<1x2x4x16xbf16>
  func.return %s : tensor<1x2x4x16xbf16>
}
// CHECK-LABEL: func.func @read_before_write
// CHECK-NEXT:    %old = mugraph.kernel "mul" (%c, %c)
// CHECK-NEXT:    %w = mugraph.kernel "cache_write" (%c, %k, %p)
// CHECK-NEXT:    %s = mugraph.kernel "add" (%w, %old)

// -----

// A reshape of an embedding (its only user) is the gather's own result type: no copy kernel.
// A reshape of an embedding with another user stays a copy.
func.func @embedding_view(%embed: tensor<64x16xbf16>, %tok: tensor<1x2xi32>, %ids: tensor<2xi32>) -> (tensor<2x16xbf16>, tensor<2x16xbf16>, tensor<1x32xbf16>) {
  %x3 = nn.embedding %embed, %tok : (tensor<64x16xbf16>, tensor<1x2xi32>) -> tensor<1x2x16xbf16>
  %x = nn.reshape %x3 : (tensor<1x2x16xbf16>) -> tensor<2x16xbf16>
  %y = nn.embedding %embed, %ids : (tensor<64x16xbf16>, tensor<2xi32>) -> tensor<2x16xbf16>
  %y2 = nn.reshape %y : (tensor<2x16xbf16>) -> tensor<1x32xbf16>
  func.return %x, %y, %y2 : tensor<2x16xbf16>, tensor<2x16xbf16>, tensor<1x32xbf16>
}
// CHECK-LABEL: func.func @embedding_view
// CHECK-NEXT:    %x = mugraph.kernel "embedding" (%embed, %tok) : (tensor<64x16xbf16>, tensor<1x2xi32>) -> tensor<2x16xbf16>
// CHECK-NEXT:    %y = mugraph.kernel "embedding" (%embed, %ids) : (tensor<64x16xbf16>, tensor<2xi32>) -> tensor<2x16xbf16>
// CHECK-NEXT:    %y2 = mugraph.kernel "reshape" (%y)
// CHECK-NEXT:    func.return %x, %y, %y2

// -----

// The ids of an embedding picked by an embedding (its only user): one kernel gathers
// table[ids[at]]. Picked ids with another user stay a kernel of their own.
func.func @gather_of_gathers(%embed: tensor<64x16xbf16>, %tokens: tensor<8x2xi32>, %p: tensor<1xi32>) -> (tensor<2x16xbf16>, tensor<2x16xbf16>, tensor<1x2xi32>) {
  %tok = nn.embedding %tokens, %p : (tensor<8x2xi32>, tensor<1xi32>) -> tensor<1x2xi32>
  %x3 = nn.embedding %embed, %tok : (tensor<64x16xbf16>, tensor<1x2xi32>) -> tensor<1x2x16xbf16>
  %x = nn.reshape %x3 : (tensor<1x2x16xbf16>) -> tensor<2x16xbf16>
  %kept = nn.embedding %tokens, %p : (tensor<8x2xi32>, tensor<1xi32>) -> tensor<1x2xi32>
  %y3 = nn.embedding %embed, %kept : (tensor<64x16xbf16>, tensor<1x2xi32>) -> tensor<1x2x16xbf16>
  %y = nn.reshape %y3 : (tensor<1x2x16xbf16>) -> tensor<2x16xbf16>
  func.return %x, %y, %kept : tensor<2x16xbf16>, tensor<2x16xbf16>, tensor<1x2xi32>
}
// CHECK-LABEL: func.func @gather_of_gathers
// CHECK-NEXT:    %x = mugraph.kernel "embedding" (%embed, %tokens, %p) : (tensor<64x16xbf16>, tensor<8x2xi32>, tensor<1xi32>) -> tensor<2x16xbf16>
// CHECK-NEXT:    %kept = mugraph.kernel "embedding" (%tokens, %p) : (tensor<8x2xi32>, tensor<1xi32>) -> tensor<1x2xi32>
// CHECK-NEXT:    %y = mugraph.kernel "embedding" (%embed, %kept) : (tensor<64x16xbf16>, tensor<1x2xi32>) -> tensor<2x16xbf16>
// CHECK-NEXT:    func.return %x, %y, %kept
// PAIRS0-LABEL: func.func @gather_of_gathers
// PAIRS0-NEXT:    %tok = mugraph.kernel "embedding" (%tokens, %p)
// PAIRS0-NEXT:    %x = mugraph.kernel "embedding" (%embed, %tok)

// -----

// A decode step's next token: the argmax's reduce writes each row's index at its column of the
// [1, B] reshape (its only user), and the history's cache write reads that (no copy kernel).
func.func @sample(%logits: tensor<3x512xbf16>, %tokens: tensor<16x3xi32> {nn.donated}, %p1: tensor<1xi32>) -> tensor<16x3xi32> {
  %next = nn.argmax %logits {dim = -1 : i64} : (tensor<3x512xbf16>) -> tensor<3xi32>
  %next2 = nn.reshape %next : (tensor<3xi32>) -> tensor<1x3xi32>
  %tokens2 = nn.cache_write %tokens, %next2, %p1 {dim = 0 : i64} : (tensor<16x3xi32>, tensor<1x3xi32>, tensor<1xi32>) -> tensor<16x3xi32>
  func.return %tokens2 : tensor<16x3xi32>
}
// CHECK-LABEL: func.func @sample
// CHECK:         %next2 = mugraph.graph_def grid [3, 1, 1] threads 32 forloop 1 (%next_pv, %next_pi) : (tensor<3x2xf32>, tensor<3x2xi32>) -> tensor<1x3xi32> {
// CHECK:           %bv, %bi = mugraph.argmax %vt, %it dim 1 : (tensor<1x2xf32>, tensor<1x2xi32>) -> (tensor<1x1xf32>, tensor<1x1xi32>)
// CHECK-NEXT:      mugraph.output %bi to %next_r omap [1, -1, -1] : tensor<1x1xi32> -> tensor<1x3xi32>
// CHECK-NEXT:    }
// CHECK-NEXT:    %tokens2 = mugraph.kernel "cache_write" (%tokens, %next2, %p1) {dim = 0 : i64}
