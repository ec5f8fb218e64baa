// RUN: mk-opt %s --split-input-file -p 'superoptimize{budget-s=10 cache=false num-sms=8}' | filecheck %s
// RUN: mk-opt %s --split-input-file -p 'superoptimize{budget-s=10 cache=false num-sms=8 smem-kb=8}' | filecheck %s --check-prefix=LOOP
// RUN: mk-opt %s --split-input-file -p 'superoptimize{budget-s=10 cache=false num-sms=8 stats=true},nn-to-mugraph' | filecheck %s --check-prefix=STATS
// RUN: mk-opt %s --split-input-file -p 'superoptimize{budget-s=0}' --verify-diagnostics 2>&1 | filecheck %s --check-prefix=ERR

// Gated MLP from its unfused form: both products, silu and the gating in one graph_def.
func.func @gated(%x: tensor<4x128xbf16>, %wg: tensor<256x128xbf16>, %wu: tensor<256x128xbf16>) -> tensor<4x256xbf16> {
  %g = nn.linear %x, %wg : (tensor<4x128xbf16>, tensor<256x128xbf16>) -> tensor<4x256xbf16>
  %u = nn.linear %x, %wu : (tensor<4x128xbf16>, tensor<256x128xbf16>) -> tensor<4x256xbf16>
  %s = nn.silu %g : (tensor<4x256xbf16>) -> tensor<4x256xbf16>
  %m = nn.mul %s, %u : (tensor<4x256xbf16>, tensor<4x256xbf16>) -> tensor<4x256xbf16>
  func.return %m : tensor<4x256xbf16>
}
// CHECK-LABEL: func.func @gated
// CHECK-NEXT:    %m = mugraph.graph_def grid [8, 1, 1] threads 128 forloop 1 (%x, %wg, %wu)
// CHECK:           %t3 = mugraph.matmul %t0, %t2 transpose_b : (tensor<4x128xbf16>, tensor<32x128xbf16>) -> tensor<4x32xf32>
// CHECK-NEXT:      %t4 = mugraph.matmul %t0, %t1 transpose_b : (tensor<4x128xbf16>, tensor<32x128xbf16>) -> tensor<4x32xf32>
// CHECK-NEXT:      %t5 = mugraph.unary "silu" %t4
// CHECK-NEXT:      %t6 = mugraph.binary "mul" %t3, %t5
// CHECK-NEXT:      mugraph.output %t6 to %m_r omap [1, -1, -1] : tensor<4x32xf32> -> tensor<4x256xbf16>
// CHECK-NOT:   nn.

// With 8 KiB of shared memory a block cannot hold whole-K tiles: the for-loop walks K and
// both products accumulate, silu and the gating run after the loop.
// LOOP-LABEL: func.func @gated
// LOOP-NEXT:    %m = mugraph.graph_def grid [8, 1, 1] threads 128 forloop 4
// LOOP:           mugraph.input %x_a imap [-1, -1, -1] fmap 1 : tensor<4x128xbf16> -> tensor<4x32xbf16>
// LOOP:           %t5 = mugraph.accum "sum" %t4
// LOOP-NEXT:      %t6 = mugraph.unary "silu" %t5
// LOOP-NEXT:      %t7 = mugraph.accum "sum" %t3
// LOOP-NEXT:      %t8 = mugraph.binary "mul" %t6, %t7

// STATS-LABEL: func.func @gated
// STATS-SAME:    mk.search = {states = [[#]] : i64,
// STATS-SAME:    duplicate_rate = {{.*}} : f64, bytes_per_state = {{.*}} : f64, digest_bytes = 16 : i64
// STATS-SAME:    chosen = "search"

// ERR: superoptimize: budget-s, max-ops, num-sms, smem-kb and max-kernels must be positive

// -----

// LoRA: x@W + (x@A)@B, one kernel where the rules need two.
func.func @lora(%x: tensor<4x128xbf16>, %w: tensor<128x256xbf16>, %a: tensor<128x16xbf16>, %b: tensor<16x256xbf16>) -> tensor<4x256xbf16> {
  %xw = nn.matmul %x, %w : (tensor<4x128xbf16>, tensor<128x256xbf16>) -> tensor<4x256xbf16>
  %xa = nn.matmul %x, %a : (tensor<4x128xbf16>, tensor<128x16xbf16>) -> tensor<4x16xbf16>
  %xab = nn.matmul %xa, %b : (tensor<4x16xbf16>, tensor<16x256xbf16>) -> tensor<4x256xbf16>
  %y = nn.add %xw, %xab : (tensor<4x256xbf16>, tensor<4x256xbf16>) -> tensor<4x256xbf16>
  func.return %y : tensor<4x256xbf16>
}
// CHECK-LABEL: func.func @lora
// CHECK-NEXT:    %y = mugraph.graph_def grid [8, 1, 1] threads 128 forloop 1 (%x, %w, %a, %b)
// CHECK:           %t4 = mugraph.matmul %t0, %t2 : (tensor<4x128xbf16>, tensor<128x16xbf16>) -> tensor<4x16xf32>
// CHECK-NEXT:      %t5 = mugraph.matmul %t0, %t1 : (tensor<4x128xbf16>, tensor<128x32xbf16>) -> tensor<4x32xf32>
// CHECK-NEXT:      %t6 = mugraph.matmul %t4, %t3 : (tensor<4x16xf32>, tensor<16x32xbf16>) -> tensor<4x32xf32>
// CHECK-NEXT:      %t7 = mugraph.binary "add" %t5, %t6
// CHECK-NEXT:      mugraph.output %t7 to %y_r omap [1, -1, -1]

// x@A accumulates over K next to x@W; B (fmap -1, the same every iteration) multiplies the
// finished x@A after the loop.
// LOOP-LABEL: func.func @lora
// LOOP:           %t3 = mugraph.input %b_a imap [1, -1, -1] fmap -1 : tensor<16x256xbf16> -> tensor<16x32xbf16>
// LOOP:           %t6 = mugraph.accum "sum" %t5
// LOOP-NEXT:      %t7 = mugraph.accum "sum" %t4
// LOOP-NEXT:      %t8 = mugraph.matmul %t7, %t3 : (tensor<4x16xf32>, tensor<16x32xbf16>) -> tensor<4x32xf32>
// LOOP-NEXT:      %t9 = mugraph.binary "add" %t6, %t8

// -----

// Softmax is not modelled by the search: the function is left for nn-to-mugraph.
func.func @softmax(%x: tensor<4x64xf32>) -> tensor<4x64xf32> {
  %y = nn.softmax %x : (tensor<4x64xf32>) -> tensor<4x64xf32>
  func.return %y : tensor<4x64xf32>
}
// CHECK-LABEL: func.func @softmax
// CHECK-NEXT:    nn.softmax
// STATS-LABEL: func.func @softmax
// STATS-NOT:     mk.search
// STATS:         mugraph.kernel "softmax"
