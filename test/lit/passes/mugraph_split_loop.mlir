// RUN: mk-opt %s --split-input-file -p mugraph-split-loop | filecheck %s
// RUN: mk-opt %s --split-input-file -p mugraph-split-loop | mk-opt --split-input-file | filecheck %s
// RUN: mk-opt %s --split-input-file -p 'mugraph-split-loop{split-loop=0}' | filecheck %s --check-prefix=OFF

// The o-projection with the split-KV merge folded into its loop (one iteration per KV head)
// becomes one block per KV head along grid z: block (n, i) merges head i's partials only and
// adds its product into r, which a one-block graph_def starts as a copy of x. r turns f32; it
// is returned, so a graph_def rounds it back to bf16.

func.func @split_oproj(%att2_o: tensor<4x1x4x1x16xf32>, %att2_m: tensor<4x1x4x1x1xf32>, %att2_l: tensor<4x1x4x1x1xf32>, %wo: tensor<32x64xbf16>, %x: tensor<1x32xbf16>) -> tensor<1x32xbf16> {
  %r = mugraph.graph_def grid [2, 1, 1] threads 128 forloop 2 (%wo, %x, %att2_o, %att2_m, %att2_l) attributes {mk.fused = "loop+linear+add"} : (tensor<32x64xbf16>, tensor<1x32xbf16>, tensor<4x1x4x1x16xf32>, tensor<4x1x4x1x1xf32>, tensor<4x1x4x1x1xf32>) -> tensor<1x32xbf16> {
  ^bb0(%wo_a: tensor<32x64xbf16>, %x_a: tensor<1x32xbf16>, %att2_o_a: tensor<4x1x4x1x16xf32>, %att2_m_a: tensor<4x1x4x1x1xf32>, %att2_l_a: tensor<4x1x4x1x1xf32>, %r_r: tensor<1x32xbf16>):
    %op = mugraph.input %att2_o_a imap [-1, -1, -1] fmap 2 : tensor<4x1x4x1x16xf32> -> tensor<4x1x2x1x16xf32>
    %mp = mugraph.input %att2_m_a imap [-1, -1, -1] fmap 2 : tensor<4x1x4x1x1xf32> -> tensor<4x1x2x1x1xf32>
    %lp = mugraph.input %att2_l_a imap [-1, -1, -1] fmap 2 : tensor<4x1x4x1x1xf32> -> tensor<4x1x2x1x1xf32>
    %mx = mugraph.reduce "max" %mp dim 0 keepdim : tensor<4x1x2x1x1xf32> -> tensor<1x1x2x1x1xf32>
    %w = mugraph.thread_map %mp, %mx : (tensor<4x1x2x1x1xf32>, tensor<1x1x2x1x1xf32>) -> tensor<4x1x2x1x1xf32> {
    ^bb0(%0: f32, %1: f32):
      %2 = arith.subf %0, %1 : f32
      %3 = math.exp %2 : f32
      mugraph.yield %3 : f32
    }
    %lw = mugraph.binary "mul" %lp, %w : (tensor<4x1x2x1x1xf32>, tensor<4x1x2x1x1xf32>) -> tensor<4x1x2x1x1xf32>
    %lsum = mugraph.reduce "sum" %lw dim 0 : tensor<4x1x2x1x1xf32> -> tensor<1x2x1x1xf32>
    %ow = mugraph.binary "mul" %op, %w : (tensor<4x1x2x1x16xf32>, tensor<4x1x2x1x1xf32>) -> tensor<4x1x2x1x16xf32>
    %osum = mugraph.reduce "sum" %ow dim 0 : tensor<4x1x2x1x16xf32> -> tensor<1x2x1x16xf32>
    %mx4 = mugraph.reshape %mx : tensor<1x1x2x1x1xf32> -> tensor<1x2x1x1xf32>
    %fin = mugraph.thread_map %osum, %lsum, %mx4 : (tensor<1x2x1x16xf32>, tensor<1x2x1x1xf32>, tensor<1x2x1x1xf32>) -> tensor<1x2x1x16xbf16> {
    ^bb0(%4: f32, %5: f32, %6: f32):
      %7 = arith.constant -1.000000e+29 : f32
      %8 = arith.cmpf olt, %6, %7 : f32
      %9 = arith.constant 0.000000e+00 : f32
      %10 = arith.divf %4, %5 : f32
      %11 = arith.select %8, %9, %10 : f32
      mugraph.yield %11 : f32
    }
    %fin2 = mugraph.reshape %fin : tensor<1x2x1x16xbf16> -> tensor<1x32xbf16>
    %wot = mugraph.input %wo_a imap [0, -1, -1] fmap 1 : tensor<32x64xbf16> -> tensor<16x32xbf16>
    %wop = mugraph.matmul %fin2, %wot transpose_b : (tensor<1x32xbf16>, tensor<16x32xbf16>) -> tensor<1x16xf32>
    %woacc = mugraph.accum "sum" %wop : tensor<1x16xf32> -> tensor<1x16xf32>
    %x_t = mugraph.input %x_a imap [1, -1, -1] fmap -1 : tensor<1x32xbf16> -> tensor<1x16xbf16>
    %rt = mugraph.thread_map %woacc, %x_t : (tensor<1x16xf32>, tensor<1x16xbf16>) -> tensor<1x16xbf16> {
    ^bb0(%12: f32, %13: f32):
      %14 = arith.addf %13, %12 : f32
      mugraph.yield %14 : f32
    }
    mugraph.output %rt to %r_r omap [1, -1, -1] : tensor<1x16xbf16> -> tensor<1x32xbf16>
  }
  func.return %r : tensor<1x32xbf16>
}

// CHECK-LABEL: func.func @split_oproj
// CHECK-NOT:     forloop 2
// CHECK:         %r_start = mugraph.graph_def grid [1, 1, 1] threads 128 forloop 1 (%x) attributes {mk.fused = "start"}
// CHECK:           %xt = mugraph.input %x_a imap [-1, -1, -1] fmap -1 : tensor<1x32xbf16> -> tensor<1x32xbf16>
// CHECK-NEXT:      mugraph.output %xt to %r_start_r omap [-1, -1, -1] : tensor<1x32xbf16> -> tensor<1x32xf32>
// CHECK:         %r_sum = mugraph.graph_def grid [1, 1, 2] threads 128 forloop 1 (%wo, %att2_o, %att2_m, %att2_l, %r_start) attributes {mk.fused = "split+linear+add"}
// CHECK:           %op = mugraph.input %att2_o_a imap [-1, -1, 2] fmap 2 : tensor<4x1x4x1x16xf32> -> tensor<4x1x2x1x16xf32>
// CHECK:           %mp = mugraph.input %att2_m_a imap [-1, -1, 2] fmap 2
// CHECK:           %lp = mugraph.input %att2_l_a imap [-1, -1, 2] fmap 2
// CHECK:           %wot = mugraph.input %wo_a imap [0, -1, 1] fmap 1 : tensor<32x64xbf16> -> tensor<32x32xbf16>
// CHECK-NEXT:      %wop = mugraph.matmul %fin2, %wot transpose_b : (tensor<1x32xbf16>, tensor<32x32xbf16>) -> tensor<1x32xf32>
// CHECK-NEXT:      %sum = mugraph.accum "sum" %wop
// CHECK-NEXT:      mugraph.output %sum to %r_r omap [1, -1, -1] accumulate over %r_start_a : tensor<1x32xf32> -> tensor<1x32xf32>
// CHECK-NOT:       %x_t
// CHECK:         %r = mugraph.graph_def grid [2, 1, 1] threads 128 forloop 1 (%r_sum) attributes {mk.fused = "round"}
// CHECK:         func.return %r

// OFF-LABEL: func.func @split_oproj
// OFF:         %r = mugraph.graph_def grid [2, 1, 1] threads 128 forloop 2 (%wo, %x, %att2_o, %att2_m, %att2_l) attributes {mk.fused = "loop+linear+add"}
// OFF-NOT:     accumulate

// -----

// The same linear, not made by a fold: its loop stays (a plain residual linear streams x).

func.func @not_a_fold(%att2_o: tensor<4x1x4x1x16xf32>, %att2_m: tensor<4x1x4x1x1xf32>, %att2_l: tensor<4x1x4x1x1xf32>, %wo: tensor<32x64xbf16>, %x: tensor<1x32xbf16>) -> tensor<1x32xbf16> {
  %r = mugraph.graph_def grid [2, 1, 1] threads 128 forloop 2 (%wo, %x, %att2_o, %att2_m, %att2_l) attributes {mk.fused = "linear+add"} : (tensor<32x64xbf16>, tensor<1x32xbf16>, tensor<4x1x4x1x16xf32>, tensor<4x1x4x1x1xf32>, tensor<4x1x4x1x1xf32>) -> tensor<1x32xbf16> {
  ^bb0(%wo_a: tensor<32x64xbf16>, %x_a: tensor<1x32xbf16>, %att2_o_a: tensor<4x1x4x1x16xf32>, %att2_m_a: tensor<4x1x4x1x1xf32>, %att2_l_a: tensor<4x1x4x1x1xf32>, %r_r: tensor<1x32xbf16>):
    %op = mugraph.input %att2_o_a imap [-1, -1, -1] fmap 2 : tensor<4x1x4x1x16xf32> -> tensor<4x1x2x1x16xf32>
    %mp = mugraph.input %att2_m_a imap [-1, -1, -1] fmap 2 : tensor<4x1x4x1x1xf32> -> tensor<4x1x2x1x1xf32>
    %lp = mugraph.input %att2_l_a imap [-1, -1, -1] fmap 2 : tensor<4x1x4x1x1xf32> -> tensor<4x1x2x1x1xf32>
    %mx = mugraph.reduce "max" %mp dim 0 keepdim : tensor<4x1x2x1x1xf32> -> tensor<1x1x2x1x1xf32>
    %w = mugraph.thread_map %mp, %mx : (tensor<4x1x2x1x1xf32>, tensor<1x1x2x1x1xf32>) -> tensor<4x1x2x1x1xf32> {
    ^bb0(%0: f32, %1: f32):
      %2 = arith.subf %0, %1 : f32
      %3 = math.exp %2 : f32
      mugraph.yield %3 : f32
    }
    %lw = mugraph.binary "mul" %lp, %w : (tensor<4x1x2x1x1xf32>, tensor<4x1x2x1x1xf32>) -> tensor<4x1x2x1x1xf32>
    %lsum = mugraph.reduce "sum" %lw dim 0 : tensor<4x1x2x1x1xf32> -> tensor<1x2x1x1xf32>
    %ow = mugraph.binary "mul" %op, %w : (tensor<4x1x2x1x16xf32>, tensor<4x1x2x1x1xf32>) -> tensor<4x1x2x1x16xf32>
    %osum = mugraph.reduce "sum" %ow dim 0 : tensor<4x1x2x1x16xf32> -> tensor<1x2x1x16xf32>
    %mx4 = mugraph.reshape %mx : tensor<1x1x2x1x1xf32> -> tensor<1x2x1x1xf32>
    %fin = mugraph.thread_map %osum, %lsum, %mx4 : (tensor<1x2x1x16xf32>, tensor<1x2x1x1xf32>, tensor<1x2x1x1xf32>) -> tensor<1x2x1x16xbf16> {
    ^bb0(%4: f32, %5: f32, %6: f32):
      %7 = arith.constant -1.000000e+29 : f32
      %8 = arith.cmpf olt, %6, %7 : f32
      %9 = arith.constant 0.000000e+00 : f32
      %10 = arith.divf %4, %5 : f32
      %11 = arith.select %8, %9, %10 : f32
      mugraph.yield %11 : f32
    }
    %fin2 = mugraph.reshape %fin : tensor<1x2x1x16xbf16> -> tensor<1x32xbf16>
    %wot = mugraph.input %wo_a imap [0, -1, -1] fmap 1 : tensor<32x64xbf16> -> tensor<16x32xbf16>
    %wop = mugraph.matmul %fin2, %wot transpose_b : (tensor<1x32xbf16>, tensor<16x32xbf16>) -> tensor<1x16xf32>
    %woacc = mugraph.accum "sum" %wop : tensor<1x16xf32> -> tensor<1x16xf32>
    %x_t = mugraph.input %x_a imap [1, -1, -1] fmap -1 : tensor<1x32xbf16> -> tensor<1x16xbf16>
    %rt = mugraph.thread_map %woacc, %x_t : (tensor<1x16xf32>, tensor<1x16xbf16>) -> tensor<1x16xbf16> {
    ^bb0(%12: f32, %13: f32):
      %14 = arith.addf %13, %12 : f32
      mugraph.yield %14 : f32
    }
    mugraph.output %rt to %r_r omap [1, -1, -1] : tensor<1x16xbf16> -> tensor<1x32xbf16>
  }
  func.return %r : tensor<1x32xbf16>
}

// CHECK-LABEL: func.func @not_a_fold
// CHECK:         %r = mugraph.graph_def grid [2, 1, 1] threads 128 forloop 2 (%wo, %x, %att2_o, %att2_m, %att2_l) attributes {mk.fused = "linear+add"}
// CHECK-NOT:     accumulate
