// RUN: mk-opt %s --split-input-file --verify-diagnostics -p mugraph-to-task | filecheck %s
// RUN: mk-opt %s --split-input-file --verify-diagnostics -p 'mugraph-to-task{iterations=2}' | filecheck %s --check-prefix=ITER
// RUN: mk-opt %s --split-input-file --verify-diagnostics -p 'mugraph-to-task{iterations=2 merge-events=false}' | filecheck %s --check-prefix=NOMERGE
// RUN: mk-opt %S/../../../examples/rmsnorm_linear.mlir -p nn-to-mugraph,mugraph-to-task | filecheck %s --check-prefix=RMS
// RUN: mk-opt %s --split-input-file --verify-diagnostics -p mugraph-to-task | mk-opt --split-input-file | filecheck %s --check-prefix=ROUNDTRIP

// An elementwise chain with changing tiles: 4 tiles -> 4 tiles (identity event), 4 -> 2 (pairs of
// producers per element), 2 -> 8 (each consumer waits on a coarser element), then a library
// kernel reading everything (one element, all producers). @a/@c and @b/@d share arena bytes.
// The result #1 is an argument and result #2 repeats result #0: both are copy tasks.
func.func @chain(%x: tensor<8x256xf32>) -> (tensor<8x256xf32>, tensor<8x256xf32>, tensor<8x256xf32>) {
  %a = mugraph.graph_def grid [4, 1, 1] threads 128 forloop 1 (%x) : (tensor<8x256xf32>) -> tensor<8x256xf32> {
  ^bb0(%x_a: tensor<8x256xf32>, %a_r: tensor<8x256xf32>):
    %t = mugraph.input %x_a imap [1, -1, -1] fmap -1 : tensor<8x256xf32> -> tensor<8x64xf32>
    %e = mugraph.unary "exp" %t : tensor<8x64xf32> -> tensor<8x64xf32>
    mugraph.output %e to %a_r omap [1, -1, -1] : tensor<8x64xf32> -> tensor<8x256xf32>
  }
  %b = mugraph.graph_def grid [4, 1, 1] threads 128 forloop 1 (%a) : (tensor<8x256xf32>) -> tensor<8x256xf32> {
  ^bb0(%a_a: tensor<8x256xf32>, %b_r: tensor<8x256xf32>):
    %t = mugraph.input %a_a imap [1, -1, -1] fmap -1 : tensor<8x256xf32> -> tensor<8x64xf32>
    %e = mugraph.unary "neg" %t : tensor<8x64xf32> -> tensor<8x64xf32>
    mugraph.output %e to %b_r omap [1, -1, -1] : tensor<8x64xf32> -> tensor<8x256xf32>
  }
  %c = mugraph.graph_def grid [2, 1, 1] threads 128 forloop 1 (%b) : (tensor<8x256xf32>) -> tensor<8x256xf32> {
  ^bb0(%b_a: tensor<8x256xf32>, %c_r: tensor<8x256xf32>):
    %t = mugraph.input %b_a imap [1, -1, -1] fmap -1 : tensor<8x256xf32> -> tensor<8x128xf32>
    %e = mugraph.unary "exp" %t : tensor<8x128xf32> -> tensor<8x128xf32>
    mugraph.output %e to %c_r omap [1, -1, -1] : tensor<8x128xf32> -> tensor<8x256xf32>
  }
  %d = mugraph.graph_def grid [8, 1, 1] threads 128 forloop 1 (%c) : (tensor<8x256xf32>) -> tensor<8x256xf32> {
  ^bb0(%c_a: tensor<8x256xf32>, %d_r: tensor<8x256xf32>):
    %t = mugraph.input %c_a imap [1, -1, -1] fmap -1 : tensor<8x256xf32> -> tensor<8x32xf32>
    %e = mugraph.unary "neg" %t : tensor<8x32xf32> -> tensor<8x32xf32>
    mugraph.output %e to %d_r omap [1, -1, -1] : tensor<8x32xf32> -> tensor<8x256xf32>
  }
  %s = mugraph.kernel "softmax" (%d) {dim = -1 : i64} : (tensor<8x256xf32>) -> tensor<8x256xf32>
  func.return %s, %x, %s : tensor<8x256xf32>, tensor<8x256xf32>, tensor<8x256xf32>
}

// -----

// A split producer on a 2-D grid: the merge task for rows d0 needs the 4 split tasks (d0, *),
// so the event has one element per row block, each counting 4 producers.
func.func @split(%x: tensor<8x64xf32>) -> tensor<8x64xf32> {
  %p = mugraph.graph_def grid [2, 4, 1] threads 128 forloop 1 (%x) : (tensor<8x64xf32>) -> tensor<4x8x64xf32> {
  ^bb0(%x_a: tensor<8x64xf32>, %p_r: tensor<4x8x64xf32>):
    %t = mugraph.input %x_a imap [0, -1, -1] fmap -1 : tensor<8x64xf32> -> tensor<4x64xf32>
    %r = mugraph.reshape %t : tensor<4x64xf32> -> tensor<1x4x64xf32>
    mugraph.output %r to %p_r omap [1, 0, -1] : tensor<1x4x64xf32> -> tensor<4x8x64xf32>
  }
  %y = mugraph.graph_def grid [2, 1, 1] threads 128 forloop 1 (%p) : (tensor<4x8x64xf32>) -> tensor<8x64xf32> {
  ^bb0(%p_a: tensor<4x8x64xf32>, %y_r: tensor<8x64xf32>):
    %t = mugraph.input %p_a imap [1, -1, -1] fmap -1 : tensor<4x8x64xf32> -> tensor<4x4x64xf32>
    %s = mugraph.reduce "sum" %t dim 0 : tensor<4x4x64xf32> -> tensor<4x64xf32>
    mugraph.output %s to %y_r omap [0, -1, -1] : tensor<4x64xf32> -> tensor<8x64xf32>
  }
  func.return %y : tensor<8x64xf32>
}

// -----

func.func @callee(%x: tensor<4xf32>) -> tensor<4xf32> {
  func.return %x : tensor<4xf32>
}
func.func @caller(%x: tensor<4xf32>) -> tensor<4xf32> {
  %y = mugraph.kernel "exp" (%x) : (tensor<4xf32>) -> tensor<4xf32>
  %z = func.call @callee(%y) : (tensor<4xf32>) -> tensor<4xf32>
  func.return %z : tensor<4xf32>
}
