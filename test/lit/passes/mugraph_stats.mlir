// RUN: mk-opt %s --split-input-file -p mugraph-stats | filecheck %s
// RUN: mk-opt %s --split-input-file -p mugraph-stats | mk-opt --split-input-file | filecheck %s
// RUN: mk-opt %s --split-input-file -p mugraph-stats --print-op-generic | mk-opt --split-input-file | filecheck %s
// RUN: mk-opt %s --split-input-file -p 'mugraph-stats{num_sms=48 bandwidth_gbs=1000.0 peak_tflops=100.0}' | filecheck %s --check-prefix=TARGET

// RMSNorm fused into the linear (Mirage's RMSNorm+Linear): x and g are replicated over the 48
// blocks and W is split by them, but each is read from global memory exactly once
// (x 8·4096·2 = 65536 B, g 4096·2 = 8192 B, W 6144·4096·2 = 50331648 B: 50405376 B in all)
// and y written once (8·6144·2 = 98304 B). Shared-memory loads count the replication:
// x 48·65536 + g 48·8192 + W 50331648 = 53870592 B.
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
// FLOPs: matmul 2·8·6144·4096 = 402653184; accumulating it 8·6144·4096/64 = 3145728; per block
// (48 of them) x·g 8·4096 = 32768, Σx² 2·8·4096 = 65536 and the mean 8: 48·98312 = 4718976;
// rsqrt(m + ε) 48·8·(1 + 4) = 1920; acc·r 8·6144 = 49152. Total 410568960.
// CHECK-LABEL: func.func @rms_norm_linear
// CHECK-SAME:  attributes {mugraph.cost = {read_bytes = 50405376 : i64, write_bytes = 98304 : i64, tile_load_bytes = 53870592 : i64, flops = 410568960 : i64, blocks = 48 : i64, kernels = 1 : i64, est_us = {{[0-9.e+]+}} : f64}}
// CHECK:       %y = mugraph.graph_def grid [48, 1, 1] threads 128 forloop 64 (%x, %g, %w) attributes {mugraph.cost = {read_bytes = 50405376 : i64, write_bytes = 98304 : i64, tile_load_bytes = 53870592 : i64, flops = 410568960 : i64, blocks = 48 : i64}} : (tensor<8x4096xbf16>, tensor<4096xbf16>, tensor<6144x4096xbf16>) -> tensor<8x6144xbf16> {
// CHECK-NEXT:  ^bb0(%xa: tensor<8x4096xbf16>, %ga: tensor<4096xbf16>, %wa: tensor<6144x4096xbf16>, %ya: tensor<8x6144xbf16>):
// CHECK-NEXT:    %xt = mugraph.input %xa imap [-1, -1, -1] fmap 1 : tensor<8x4096xbf16> -> tensor<8x64xbf16>
// CHECK:         mugraph.output %yt to %ya omap [1, -1, -1] : tensor<8x128xbf16> -> tensor<8x6144xbf16>

// With 48 SMs the 48 blocks fill the GPU: max(50503680 B / 1e12 B/s, 410568960 / 1e14) + 1 µs.
// TARGET-LABEL: func.func @rms_norm_linear
// TARGET-SAME:  blocks = 48 : i64, kernels = 1 : i64, est_us = 5.150400e+01 : f64}}

// -----

// Library kernels: each distinct operand read once (%n twice as an operand, counted once), the
// result written once; an embedding reads only the 8 rows it gathers (8·4096·2 + 8·4 B), a
// slice only its window.
func.func @library(%table: tensor<32000x4096xbf16>, %ids: tensor<8xi32>, %w: tensor<6144x4096xbf16>) -> (tensor<8x6144xbf16>, tensor<8x1024xbf16>) {
  %e = mugraph.kernel "embedding" (%table, %ids) : (tensor<32000x4096xbf16>, tensor<8xi32>) -> tensor<8x4096xbf16>
  %n = mugraph.kernel "mul" (%e, %e) : (tensor<8x4096xbf16>, tensor<8x4096xbf16>) -> tensor<8x4096xbf16>
  %y = mugraph.kernel "linear" (%n, %w) : (tensor<8x4096xbf16>, tensor<6144x4096xbf16>) -> tensor<8x6144xbf16>
  %s = mugraph.kernel "slice" (%y) {offsets = array<i64: 0, 1024>, sizes = array<i64: 8, 1024>} : (tensor<8x6144xbf16>) -> tensor<8x1024xbf16>
  func.return %y, %s : tensor<8x6144xbf16>, tensor<8x1024xbf16>
}
// CHECK-LABEL: func.func @library
// CHECK-SAME:  attributes {mugraph.cost = {read_bytes = 50544672 : i64, write_bytes = 245760 : i64, tile_load_bytes = 50544672 : i64, flops = 402685952 : i64, blocks = 150 : i64, kernels = 4 : i64, est_us =
// CHECK:       %e = mugraph.kernel "embedding" (%table, %ids) {mugraph.cost = {read_bytes = 65568 : i64, write_bytes = 65536 : i64, tile_load_bytes = 65568 : i64, flops = 0 : i64, blocks = 8 : i64}}
// CHECK-NEXT:  %n = mugraph.kernel "mul" (%e, %e) {mugraph.cost = {read_bytes = 65536 : i64, write_bytes = 65536 : i64, tile_load_bytes = 65536 : i64, flops = 32768 : i64, blocks = 8 : i64}}
// CHECK-NEXT:  %y = mugraph.kernel "linear" (%n, %w) {mugraph.cost = {read_bytes = 50397184 : i64, write_bytes = 98304 : i64, tile_load_bytes = 50397184 : i64, flops = 402653184 : i64, blocks = 132 : i64}}
// CHECK-NEXT:  %s = mugraph.kernel "slice" (%y) {offsets = array<i64: 0, 1024>, sizes = array<i64: 8, 1024>, mugraph.cost = {read_bytes = 16384 : i64, write_bytes = 16384 : i64, tile_load_bytes = 16384 : i64, flops = 0 : i64, blocks = 2 : i64}}

// -----

// Split-K: grid x splits N (8 × 128), grid y splits K (4 × 1024), the loop walks 64 of each
// 1024-chunk. x is replicated over grid x yet read once (65536 B); shared memory loads it
// 8 times (524288 B). Partials carry a leading dim indexed by y (4·8·1024·4 = 131072 B), which
// the merge kernel reads once and sums into y (8·1024·2 = 16384 B).
func.func @split_k(%x: tensor<8x4096xbf16>, %w: tensor<1024x4096xbf16>) -> tensor<8x1024xbf16> {
  %part = mugraph.graph_def grid [8, 4, 1] threads 128 forloop 16 (%x, %w) : (tensor<8x4096xbf16>, tensor<1024x4096xbf16>) -> tensor<4x8x1024xf32> {
  ^bb0(%xa: tensor<8x4096xbf16>, %wa: tensor<1024x4096xbf16>, %pa: tensor<4x8x1024xf32>):
    %xt = mugraph.input %xa imap [-1, 1, -1] fmap 1 : tensor<8x4096xbf16> -> tensor<8x64xbf16>
    %wt = mugraph.input %wa imap [0, 1, -1] fmap 1 : tensor<1024x4096xbf16> -> tensor<128x64xbf16>
    %p = mugraph.matmul %xt, %wt transpose_b : (tensor<8x64xbf16>, tensor<128x64xbf16>) -> tensor<8x128xf32>
    %acc = mugraph.accum "sum" %p : tensor<8x128xf32> -> tensor<8x128xf32>
    %acc3 = mugraph.reshape %acc : tensor<8x128xf32> -> tensor<1x8x128xf32>
    mugraph.output %acc3 to %pa omap [2, 0, -1] : tensor<1x8x128xf32> -> tensor<4x8x1024xf32>
  }
  %y = mugraph.graph_def grid [8, 1, 1] threads 128 forloop 1 (%part) : (tensor<4x8x1024xf32>) -> tensor<8x1024xbf16> {
  ^bb0(%pb: tensor<4x8x1024xf32>, %yb: tensor<8x1024xbf16>):
    %pt = mugraph.input %pb imap [2, -1, -1] fmap -1 : tensor<4x8x1024xf32> -> tensor<4x8x128xf32>
    %s = mugraph.reduce "sum" %pt dim 0 : tensor<4x8x128xf32> -> tensor<8x128xbf16>
    mugraph.output %s to %yb omap [1, -1, -1] : tensor<8x128xbf16> -> tensor<8x1024xbf16>
  }
  func.return %y : tensor<8x1024xbf16>
}
// FLOPs: 2·8·1024·4096 = 67108864 for the partial matmuls plus 8·1024·4096/64 = 524288 to
// accumulate them; 4·8·1024 = 32768 for the merge.
// CHECK-LABEL: func.func @split_k
// CHECK-SAME:  attributes {mugraph.cost = {read_bytes = 8585216 : i64, write_bytes = 147456 : i64, tile_load_bytes = 9043968 : i64, flops = 67665920 : i64, blocks = 40 : i64, kernels = 2 : i64, est_us =
// CHECK:       %part = mugraph.graph_def grid [8, 4, 1] threads 128 forloop 16 (%x, %w) attributes {mugraph.cost = {read_bytes = 8454144 : i64, write_bytes = 131072 : i64, tile_load_bytes = 8912896 : i64, flops = 67633152 : i64, blocks = 32 : i64}}
// CHECK:       %y = mugraph.graph_def grid [8, 1, 1] threads 128 forloop 1 (%part) attributes {mugraph.cost = {read_bytes = 131072 : i64, write_bytes = 16384 : i64, tile_load_bytes = 131072 : i64, flops = 32768 : i64, blocks = 8 : i64}}

// -----

// A function without kernels gets zero totals; declarations are left alone.
func.func private @extern(tensor<4xf32>) -> tensor<4xf32>
func.func @empty(%a: tensor<4xf32>) -> tensor<4xf32> {
  func.return %a : tensor<4xf32>
}
// CHECK:       func.func private @extern(tensor<4xf32>) -> tensor<4xf32>
// CHECK-NEXT:  func.func @empty(%a: tensor<4xf32>) -> tensor<4xf32> attributes {mugraph.cost = {read_bytes = 0 : i64, write_bytes = 0 : i64, tile_load_bytes = 0 : i64, flops = 0 : i64, blocks = 0 : i64, kernels = 0 : i64, est_us = 0.000000e+00 : f64}}
