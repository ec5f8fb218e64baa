// RUN: mk-opt %s --split-input-file -p mugraph-fuse-loop | filecheck %s
// RUN: mk-opt %s --split-input-file -p mugraph-fuse-loop | mk-opt --split-input-file | filecheck %s
// RUN: mk-opt %s --split-input-file -p 'mugraph-fuse-loop{fold-bytes=0}' | filecheck %s --check-prefix=OFF
// RUN: mk-opt %s --split-input-file -p 'mugraph-fuse-loop{fold-bytes=600}' | filecheck %s --check-prefix=SHARE
// RUN: mk-opt %s --split-input-file -p 'mugraph-fuse-loop{fold-bytes=600 split-loop=0}' | filecheck %s --check-prefix=WHOLE

// The split-KV merge (one block per KV head, 32 columns each) folds into the o-projection that
// walks K in 32-column chunks: iteration i merges KV head i's partials, read along the head dim.

func.func @merge_into_oproj(%att2_o: tensor<4x1x4x1x16xf32>, %att2_m: tensor<4x1x4x1x1xf32>, %att2_l: tensor<4x1x4x1x1xf32>, %wo: tensor<32x64xbf16>) -> tensor<1x32xbf16> {
  %att2 = mugraph.graph_def grid [2, 1, 1] threads 128 forloop 1 (%att2_o, %att2_m, %att2_l) : (tensor<4x1x4x1x16xf32>, tensor<4x1x4x1x1xf32>, tensor<4x1x4x1x1xf32>) -> tensor<1x64xbf16> {
  ^bb0(%att2_o_a: tensor<4x1x4x1x16xf32>, %att2_m_a: tensor<4x1x4x1x1xf32>, %att2_l_a: tensor<4x1x4x1x1xf32>, %att2_r: tensor<1x64xbf16>):
    %op = mugraph.input %att2_o_a imap [2, -1, 1] fmap -1 : tensor<4x1x4x1x16xf32> -> tensor<4x1x2x1x16xf32>
    %mp = mugraph.input %att2_m_a imap [2, -1, 1] fmap -1 : tensor<4x1x4x1x1xf32> -> tensor<4x1x2x1x1xf32>
    %lp = mugraph.input %att2_l_a imap [2, -1, 1] fmap -1 : tensor<4x1x4x1x1xf32> -> tensor<4x1x2x1x1xf32>
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
    mugraph.output %fin2 to %att2_r omap [1, -1, 0] : tensor<1x32xbf16> -> tensor<1x64xbf16>
  }
  %o = mugraph.graph_def grid [2, 1, 1] threads 128 forloop 2 (%att2, %wo) : (tensor<1x64xbf16>, tensor<32x64xbf16>) -> tensor<1x32xbf16> {
  ^bb0(%att2_a: tensor<1x64xbf16>, %wo_a: tensor<32x64xbf16>, %o_r: tensor<1x32xbf16>):
    %xt = mugraph.input %att2_a imap [-1, -1, -1] fmap 1 : tensor<1x64xbf16> -> tensor<1x32xbf16>
    %wot = mugraph.input %wo_a imap [0, -1, -1] fmap 1 : tensor<32x64xbf16> -> tensor<16x32xbf16>
    %wop = mugraph.matmul %xt, %wot transpose_b : (tensor<1x32xbf16>, tensor<16x32xbf16>) -> tensor<1x16xf32>
    %woacc = mugraph.accum "sum" %wop : tensor<1x16xf32> -> tensor<1x16xf32>
    mugraph.output %woacc to %o_r omap [1, -1, -1] : tensor<1x16xf32> -> tensor<1x32xbf16>
  }
  func.return %o : tensor<1x32xbf16>
}

// CHECK-LABEL: func.func @merge_into_oproj
// CHECK-NOT:     mugraph.graph_def grid [2, 1, 1] threads 128 forloop 1
// CHECK:         %o = mugraph.graph_def grid [2, 1, 1] threads 128 forloop 2 (%wo, %att2_o, %att2_m, %att2_l) attributes {mk.fused = "loop+graph"}
// CHECK:           %op = mugraph.input %att2_o_a imap [-1, -1, -1] fmap 2 : tensor<4x1x4x1x16xf32> -> tensor<4x1x2x1x16xf32>
// CHECK:           %mp = mugraph.input %att2_m_a imap [-1, -1, -1] fmap 2
// CHECK:           %lp = mugraph.input %att2_l_a imap [-1, -1, -1] fmap 2
// CHECK:           %mx = mugraph.reduce "max" %mp dim 0 keepdim
// CHECK:           %fin2 = mugraph.reshape %fin : tensor<1x2x1x16xbf16> -> tensor<1x32xbf16>
// CHECK:           %wot = mugraph.input %wo_a imap [0, -1, -1] fmap 1
// CHECK-NEXT:      %wop = mugraph.matmul %fin2, %wot transpose_b
// CHECK:           mugraph.output %woacc to %o_r omap [1, -1, -1]
// CHECK:         func.return %o

// OFF-LABEL: func.func @merge_into_oproj
// OFF:         %att2 = mugraph.graph_def grid [2, 1, 1] threads 128 forloop 1
// OFF:         %o = mugraph.graph_def grid [2, 1, 1] threads 128 forloop 2 (%att2, %wo)

// A residual o-projection (r = x + att2 @ Wo^T) that mugraph-split-loop will split a KV head a
// block: with split-loop=1 the bound is on a block's half of the 1,152 bytes of partials.

func.func @merge_into_residual_oproj(%att2_o: tensor<4x1x4x1x16xf32>, %att2_m: tensor<4x1x4x1x1xf32>, %att2_l: tensor<4x1x4x1x1xf32>, %wo: tensor<32x64xbf16>, %x: tensor<1x32xbf16>) -> tensor<1x32xbf16> {
  %att2 = mugraph.graph_def grid [2, 1, 1] threads 128 forloop 1 (%att2_o, %att2_m, %att2_l) : (tensor<4x1x4x1x16xf32>, tensor<4x1x4x1x1xf32>, tensor<4x1x4x1x1xf32>) -> tensor<1x64xbf16> {
  ^bb0(%att2_o_a: tensor<4x1x4x1x16xf32>, %att2_m_a: tensor<4x1x4x1x1xf32>, %att2_l_a: tensor<4x1x4x1x1xf32>, %att2_r: tensor<1x64xbf16>):
    %op = mugraph.input %att2_o_a imap [2, -1, 1] fmap -1 : tensor<4x1x4x1x16xf32> -> tensor<4x1x2x1x16xf32>
    %mp = mugraph.input %att2_m_a imap [2, -1, 1] fmap -1 : tensor<4x1x4x1x1xf32> -> tensor<4x1x2x1x1xf32>
    %lp = mugraph.input %att2_l_a imap [2, -1, 1] fmap -1 : tensor<4x1x4x1x1xf32> -> tensor<4x1x2x1x1xf32>
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
    mugraph.output %fin2 to %att2_r omap [1, -1, 0] : tensor<1x32xbf16> -> tensor<1x64xbf16>
  }
  %r = mugraph.graph_def grid [2, 1, 1] threads 128 forloop 2 (%att2, %wo, %x) attributes {mk.fused = "linear+add"} : (tensor<1x64xbf16>, tensor<32x64xbf16>, tensor<1x32xbf16>) -> tensor<1x32xbf16> {
  ^bb0(%att2_a: tensor<1x64xbf16>, %wo_a: tensor<32x64xbf16>, %x_a: tensor<1x32xbf16>, %r_r: tensor<1x32xbf16>):
    %xt = mugraph.input %att2_a imap [-1, -1, -1] fmap 1 : tensor<1x64xbf16> -> tensor<1x32xbf16>
    %wot = mugraph.input %wo_a imap [0, -1, -1] fmap 1 : tensor<32x64xbf16> -> tensor<16x32xbf16>
    %wop = mugraph.matmul %xt, %wot transpose_b : (tensor<1x32xbf16>, tensor<16x32xbf16>) -> tensor<1x16xf32>
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

// CHECK-LABEL: func.func @merge_into_residual_oproj
// CHECK:         %r = mugraph.graph_def grid [2, 1, 1] threads 128 forloop 2 (%wo, %x, %att2_o, %att2_m, %att2_l) attributes {mk.fused = "loop+linear+add"}

// SHARE-LABEL: func.func @merge_into_oproj
// SHARE:         %att2 = mugraph.graph_def grid [2, 1, 1] threads 128 forloop 1
// SHARE-LABEL: func.func @merge_into_residual_oproj
// SHARE-NOT:     %att2 = mugraph.graph_def
// SHARE:         %r = mugraph.graph_def grid [2, 1, 1] threads 128 forloop 2 (%wo, %x, %att2_o, %att2_m, %att2_l) attributes {mk.fused = "loop+linear+add"}

// WHOLE-LABEL: func.func @merge_into_residual_oproj
// WHOLE:         %att2 = mugraph.graph_def grid [2, 1, 1] threads 128 forloop 1
// WHOLE:         %r = mugraph.graph_def grid [2, 1, 1] threads 128 forloop 2 (%att2, %wo, %x) attributes {mk.fused = "linear+add"}

// -----

// The merged result is also returned: the merge stays.
func.func @merge_also_returned(%att2_o: tensor<4x1x4x1x16xf32>, %att2_m: tensor<4x1x4x1x1xf32>, %att2_l: tensor<4x1x4x1x1xf32>, %wo: tensor<32x64xbf16>) -> (tensor<1x32xbf16>, tensor<1x64xbf16>) {
  %att2 = mugraph.graph_def grid [2, 1, 1] threads 128 forloop 1 (%att2_o, %att2_m, %att2_l) : (tensor<4x1x4x1x16xf32>, tensor<4x1x4x1x1xf32>, tensor<4x1x4x1x1xf32>) -> tensor<1x64xbf16> {
  ^bb0(%att2_o_a: tensor<4x1x4x1x16xf32>, %att2_m_a: tensor<4x1x4x1x1xf32>, %att2_l_a: tensor<4x1x4x1x1xf32>, %att2_r: tensor<1x64xbf16>):
    %op = mugraph.input %att2_o_a imap [2, -1, 1] fmap -1 : tensor<4x1x4x1x16xf32> -> tensor<4x1x2x1x16xf32>
    %mp = mugraph.input %att2_m_a imap [2, -1, 1] fmap -1 : tensor<4x1x4x1x1xf32> -> tensor<4x1x2x1x1xf32>
    %lp = mugraph.input %att2_l_a imap [2, -1, 1] fmap -1 : tensor<4x1x4x1x1xf32> -> tensor<4x1x2x1x1xf32>
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
    mugraph.output %fin2 to %att2_r omap [1, -1, 0] : tensor<1x32xbf16> -> tensor<1x64xbf16>
  }
  %o = mugraph.graph_def grid [2, 1, 1] threads 128 forloop 2 (%att2, %wo) : (tensor<1x64xbf16>, tensor<32x64xbf16>) -> tensor<1x32xbf16> {
  ^bb0(%att2_a: tensor<1x64xbf16>, %wo_a: tensor<32x64xbf16>, %o_r: tensor<1x32xbf16>):
    %xt = mugraph.input %att2_a imap [-1, -1, -1] fmap 1 : tensor<1x64xbf16> -> tensor<1x32xbf16>
    %wot = mugraph.input %wo_a imap [0, -1, -1] fmap 1 : tensor<32x64xbf16> -> tensor<16x32xbf16>
    %wop = mugraph.matmul %xt, %wot transpose_b : (tensor<1x32xbf16>, tensor<16x32xbf16>) -> tensor<1x16xf32>
    %woacc = mugraph.accum "sum" %wop : tensor<1x16xf32> -> tensor<1x16xf32>
    mugraph.output %woacc to %o_r omap [1, -1, -1] : tensor<1x16xf32> -> tensor<1x32xbf16>
  }
  func.return %o, %att2 : tensor<1x32xbf16>, tensor<1x64xbf16>
}

// CHECK-LABEL: func.func @merge_also_returned
// CHECK:         %att2 = mugraph.graph_def grid [2, 1, 1] threads 128 forloop 1
// CHECK:         %o = mugraph.graph_def grid [2, 1, 1] threads 128 forloop 2 (%att2, %wo)

// -----

// The consumer walks K in 16-column chunks, half a merge block: the merge stays.
func.func @chunk_mismatch(%att2_o: tensor<4x1x4x1x16xf32>, %att2_m: tensor<4x1x4x1x1xf32>, %att2_l: tensor<4x1x4x1x1xf32>, %wo: tensor<32x64xbf16>) -> tensor<1x32xbf16> {
  %att2 = mugraph.graph_def grid [2, 1, 1] threads 128 forloop 1 (%att2_o, %att2_m, %att2_l) : (tensor<4x1x4x1x16xf32>, tensor<4x1x4x1x1xf32>, tensor<4x1x4x1x1xf32>) -> tensor<1x64xbf16> {
  ^bb0(%att2_o_a: tensor<4x1x4x1x16xf32>, %att2_m_a: tensor<4x1x4x1x1xf32>, %att2_l_a: tensor<4x1x4x1x1xf32>, %att2_r: tensor<1x64xbf16>):
    %op = mugraph.input %att2_o_a imap [2, -1, 1] fmap -1 : tensor<4x1x4x1x16xf32> -> tensor<4x1x2x1x16xf32>
    %mp = mugraph.input %att2_m_a imap [2, -1, 1] fmap -1 : tensor<4x1x4x1x1xf32> -> tensor<4x1x2x1x1xf32>
    %lp = mugraph.input %att2_l_a imap [2, -1, 1] fmap -1 : tensor<4x1x4x1x1xf32> -> tensor<4x1x2x1x1xf32>
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
    mugraph.output %fin2 to %att2_r omap [1, -1, 0] : tensor<1x32xbf16> -> tensor<1x64xbf16>
  }
  %o = mugraph.graph_def grid [2, 1, 1] threads 128 forloop 4 (%att2, %wo) : (tensor<1x64xbf16>, tensor<32x64xbf16>) -> tensor<1x32xbf16> {
  ^bb0(%att2_a: tensor<1x64xbf16>, %wo_a: tensor<32x64xbf16>, %o_r: tensor<1x32xbf16>):
    %xt = mugraph.input %att2_a imap [-1, -1, -1] fmap 1 : tensor<1x64xbf16> -> tensor<1x16xbf16>
    %wot = mugraph.input %wo_a imap [0, -1, -1] fmap 1 : tensor<32x64xbf16> -> tensor<16x16xbf16>
    %wop = mugraph.matmul %xt, %wot transpose_b : (tensor<1x16xbf16>, tensor<16x16xbf16>) -> tensor<1x16xf32>
    %woacc = mugraph.accum "sum" %wop : tensor<1x16xf32> -> tensor<1x16xf32>
    mugraph.output %woacc to %o_r omap [1, -1, -1] : tensor<1x16xf32> -> tensor<1x32xbf16>
  }
  func.return %o : tensor<1x32xbf16>
}

// CHECK-LABEL: func.func @chunk_mismatch
// CHECK:         %att2 = mugraph.graph_def grid [2, 1, 1] threads 128 forloop 1
// CHECK:         %o = mugraph.graph_def grid [2, 1, 1] threads 128 forloop 4 (%att2, %wo)
