// RUN: mk-opt %s --split-input-file --verify-diagnostics --parsing-diagnostics | filecheck %s

func.func @tile_does_not_divide(%w: tensor<6144x4096xbf16>) -> tensor<6144x4096xbf16> {
  %y = mugraph.graph_def grid [40, 1, 1] threads 128 forloop 1 (%w) : (tensor<6144x4096xbf16>) -> tensor<6144x4096xbf16> {
  ^bb0(%wa: tensor<6144x4096xbf16>, %ya: tensor<6144x4096xbf16>):
// CHECK: invalid.mlir:[[# @LINE + 1]]:{{[0-9]+}}: error: 'mugraph.input' dim 0 of the 6144x4096 tensor (6144) is not divisible by grid axis x (40)
    %t = mugraph.input %wa imap [0, -1, -1] fmap -1 : tensor<6144x4096xbf16> -> tensor<153x4096xbf16>
    mugraph.output %t to %ya omap [0, -1, -1] : tensor<153x4096xbf16> -> tensor<6144x4096xbf16>
  }
  func.return %y : tensor<6144x4096xbf16>
}

// -----

func.func @forloop_does_not_divide(%x: tensor<8x4096xbf16>) -> tensor<8x1xf32> {
  %y = mugraph.graph_def grid [1, 1, 1] threads 128 forloop 48 (%x) : (tensor<8x4096xbf16>) -> tensor<8x1xf32> {
  ^bb0(%xa: tensor<8x4096xbf16>, %ya: tensor<8x1xf32>):
// CHECK: invalid.mlir:[[# @LINE + 1]]:{{[0-9]+}}: error: 'mugraph.input' dim 1 of the block's 8x4096 chunk (4096) is not divisible by forloop 48
    %t = mugraph.input %xa imap [-1, -1, -1] fmap 1 : tensor<8x4096xbf16> -> tensor<8x85xbf16>
    %s = mugraph.accum "sum_last" %t : tensor<8x85xbf16> -> tensor<8x1xf32>
    mugraph.output %s to %ya omap [-1, -1, -1] : tensor<8x1xf32> -> tensor<8x1xf32>
  }
  func.return %y : tensor<8x1xf32>
}

// -----

func.func @imap_out_of_range(%x: tensor<8x4096xbf16>) -> tensor<8x4096xbf16> {
  %y = mugraph.graph_def grid [2, 1, 1] threads 128 forloop 1 (%x) : (tensor<8x4096xbf16>) -> tensor<8x4096xbf16> {
  ^bb0(%xa: tensor<8x4096xbf16>, %ya: tensor<8x4096xbf16>):
// CHECK: invalid.mlir:[[# @LINE + 1]]:{{[0-9]+}}: error: 'mugraph.input' imap maps grid axis x to dim 2, but the tensor has rank 2
    %t = mugraph.input %xa imap [2, -1, -1] fmap -1 : tensor<8x4096xbf16> -> tensor<8x4096xbf16>
    mugraph.output %t to %ya omap [-1, -1, -1] : tensor<8x4096xbf16> -> tensor<8x4096xbf16>
  }
  func.return %y : tensor<8x4096xbf16>
}

// -----

func.func @two_axes_one_dim(%x: tensor<8x4096xbf16>) -> tensor<8x4096xbf16> {
  %y = mugraph.graph_def grid [2, 2, 1] threads 128 forloop 1 (%x) : (tensor<8x4096xbf16>) -> tensor<8x4096xbf16> {
  ^bb0(%xa: tensor<8x4096xbf16>, %ya: tensor<8x4096xbf16>):
// CHECK: invalid.mlir:[[# @LINE + 1]]:{{[0-9]+}}: error: 'mugraph.input' imap [1, 1, -1] maps grid axes x and y to the same dim 1
    %t = mugraph.input %xa imap [1, 1, -1] fmap -1 : tensor<8x4096xbf16> -> tensor<8x1024xbf16>
    mugraph.output %t to %ya omap [1, 0, -1] : tensor<8x1024xbf16> -> tensor<8x4096xbf16>
  }
  func.return %y : tensor<8x4096xbf16>
}

// -----

func.func @wrong_tile_type(%x: tensor<8x4096xbf16>) -> tensor<8x4096xbf16> {
  %y = mugraph.graph_def grid [1, 1, 1] threads 128 forloop 64 (%x) : (tensor<8x4096xbf16>) -> tensor<8x4096xbf16> {
  ^bb0(%xa: tensor<8x4096xbf16>, %ya: tensor<8x4096xbf16>):
// CHECK: invalid.mlir:[[# @LINE + 1]]:{{[0-9]+}}: error: 'mugraph.input' tile type is tensor<8x128xbf16>, but the maps give tensor<8x64xbf16>
    %t = mugraph.input %xa imap [-1, -1, -1] fmap 1 : tensor<8x4096xbf16> -> tensor<8x128xbf16>
    %s = mugraph.accum "sum" %t : tensor<8x128xbf16> -> tensor<8x128xf32>
    mugraph.output %s to %ya omap [-1, -1, -1] : tensor<8x128xf32> -> tensor<8x4096xbf16>
  }
  func.return %y : tensor<8x4096xbf16>
}

// -----

func.func @epilogue_uses_loop_tile(%x: tensor<8x4096xbf16>) -> tensor<8x64xf32> {
  %y = mugraph.graph_def grid [1, 1, 1] threads 128 forloop 64 (%x) : (tensor<8x4096xbf16>) -> tensor<8x64xf32> {
  ^bb0(%xa: tensor<8x4096xbf16>, %ya: tensor<8x64xf32>):
    %t = mugraph.input %xa imap [-1, -1, -1] fmap 1 : tensor<8x4096xbf16> -> tensor<8x64xbf16>
    %s = mugraph.accum "sum_last" %t : tensor<8x64xbf16> -> tensor<8x1xf32>
// CHECK: invalid.mlir:[[# @LINE + 1]]:{{[0-9]+}}: error: 'mugraph.binary' uses accumulator result %s and per-iteration tile %t; after the loop only accumulator results and tiles of fmap -1 inputs exist
    %r = mugraph.binary "mul" %t, %s : (tensor<8x64xbf16>, tensor<8x1xf32>) -> tensor<8x64xf32>
    mugraph.output %r to %ya omap [-1, -1, -1] : tensor<8x64xf32> -> tensor<8x64xf32>
  }
  func.return %y : tensor<8x64xf32>
}

// -----

func.func @nested_accumulator(%x: tensor<8x4096xbf16>) -> tensor<8x1xf32> {
  %y = mugraph.graph_def grid [1, 1, 1] threads 128 forloop 64 (%x) : (tensor<8x4096xbf16>) -> tensor<8x1xf32> {
  ^bb0(%xa: tensor<8x4096xbf16>, %ya: tensor<8x1xf32>):
    %t = mugraph.input %xa imap [-1, -1, -1] fmap 1 : tensor<8x4096xbf16> -> tensor<8x64xbf16>
    %s = mugraph.accum "sum_last" %t : tensor<8x64xbf16> -> tensor<8x1xf32>
// CHECK: invalid.mlir:[[# @LINE + 1]]:{{[0-9]+}}: error: 'mugraph.accum' accumulates %s, which depends on an accumulator result; accumulators cannot nest
    %ss = mugraph.accum "max" %s : tensor<8x1xf32> -> tensor<8x1xf32>
    mugraph.output %ss to %ya omap [-1, -1, -1] : tensor<8x1xf32> -> tensor<8x1xf32>
  }
  func.return %y : tensor<8x1xf32>
}

// -----

func.func @output_of_loop_tile(%x: tensor<8x4096xbf16>) -> tensor<8x64xbf16> {
  %y = mugraph.graph_def grid [1, 1, 1] threads 128 forloop 64 (%x) : (tensor<8x4096xbf16>) -> tensor<8x64xbf16> {
  ^bb0(%xa: tensor<8x4096xbf16>, %ya: tensor<8x64xbf16>):
    %t = mugraph.input %xa imap [-1, -1, -1] fmap 1 : tensor<8x4096xbf16> -> tensor<8x64xbf16>
// CHECK: invalid.mlir:[[# @LINE + 1]]:{{[0-9]+}}: error: 'mugraph.output' writes %t, a tile that changes every for-loop iteration (forloop 64); write an accumulator result or a value computed from one
    mugraph.output %t to %ya omap [-1, -1, -1] : tensor<8x64xbf16> -> tensor<8x64xbf16>
  }
  func.return %y : tensor<8x64xbf16>
}

// -----

func.func @written_twice(%x: tensor<8x64xbf16>) -> tensor<8x64xbf16> {
  %y = mugraph.graph_def grid [1, 1, 1] threads 128 forloop 1 (%x) : (tensor<8x64xbf16>) -> tensor<8x64xbf16> {
  ^bb0(%xa: tensor<8x64xbf16>, %ya: tensor<8x64xbf16>):
    %t = mugraph.input %xa imap [-1, -1, -1] fmap -1 : tensor<8x64xbf16> -> tensor<8x64xbf16>
    mugraph.output %t to %ya omap [-1, -1, -1] : tensor<8x64xbf16> -> tensor<8x64xbf16>
// CHECK: invalid.mlir:[[# @LINE + 1]]:{{[0-9]+}}: error: 'mugraph.output' result #0 (%ya) is already written by an earlier mugraph.output
    mugraph.output %t to %ya omap [-1, -1, -1] : tensor<8x64xbf16> -> tensor<8x64xbf16>
  }
  func.return %y : tensor<8x64xbf16>
}

// -----

func.func @not_written(%x: tensor<8x64xbf16>) -> (tensor<8x64xbf16>, tensor<8x64xbf16>) {
// CHECK: invalid.mlir:[[# @LINE + 1]]:{{[0-9]+}}: error: 'mugraph.graph_def' result #1 is never written: no mugraph.output targets %zb
  %y, %z = mugraph.graph_def grid [1, 1, 1] threads 128 forloop 1 (%x) : (tensor<8x64xbf16>) -> (tensor<8x64xbf16>, tensor<8x64xbf16>) {
  ^bb0(%xa: tensor<8x64xbf16>, %ya: tensor<8x64xbf16>, %zb: tensor<8x64xbf16>):
    %t = mugraph.input %xa imap [-1, -1, -1] fmap -1 : tensor<8x64xbf16> -> tensor<8x64xbf16>
    mugraph.output %t to %ya omap [-1, -1, -1] : tensor<8x64xbf16> -> tensor<8x64xbf16>
  }
  func.return %y, %z : tensor<8x64xbf16>, tensor<8x64xbf16>
}

// -----

func.func @racing_blocks(%x: tensor<8x64xbf16>) -> tensor<8x64xbf16> {
  %y = mugraph.graph_def grid [1, 4, 1] threads 128 forloop 1 (%x) : (tensor<8x64xbf16>) -> tensor<8x64xbf16> {
  ^bb0(%xa: tensor<8x64xbf16>, %ya: tensor<8x64xbf16>):
    %t = mugraph.input %xa imap [-1, -1, -1] fmap -1 : tensor<8x64xbf16> -> tensor<8x64xbf16>
// CHECK: invalid.mlir:[[# @LINE + 1]]:{{[0-9]+}}: error: 'mugraph.output' grid axis y (extent 4) partitions no dim of the result, so 4 blocks would write the same tile; give a partial result an extra dim indexed by axis y
    mugraph.output %t to %ya omap [-1, -1, -1] : tensor<8x64xbf16> -> tensor<8x64xbf16>
  }
  func.return %y : tensor<8x64xbf16>
}

// -----

func.func @output_tile_shape(%x: tensor<8x64xbf16>) -> tensor<8x128xbf16> {
  %y = mugraph.graph_def grid [4, 1, 1] threads 128 forloop 1 (%x) : (tensor<8x64xbf16>) -> tensor<8x128xbf16> {
  ^bb0(%xa: tensor<8x64xbf16>, %ya: tensor<8x128xbf16>):
    %t = mugraph.input %xa imap [1, -1, -1] fmap -1 : tensor<8x64xbf16> -> tensor<8x16xbf16>
// CHECK: invalid.mlir:[[# @LINE + 1]]:{{[0-9]+}}: error: 'mugraph.output' tile is 8x16, but omap [1, -1, -1] over grid [4, 1, 1] gives 8x32 tiles of the 8x128 result
    mugraph.output %t to %ya omap [1, -1, -1] : tensor<8x16xbf16> -> tensor<8x128xbf16>
  }
  func.return %y : tensor<8x128xbf16>
}

// -----

func.func @bad_threads(%x: tensor<8x64xbf16>) -> tensor<8x64xbf16> {
// CHECK: invalid.mlir:[[# @LINE + 1]]:{{[0-9]+}}: error: 'mugraph.graph_def' threads must be a multiple of 32 in [32, 1024], got 100
  %y = mugraph.graph_def grid [1, 1, 1] threads 100 forloop 1 (%x) : (tensor<8x64xbf16>) -> tensor<8x64xbf16> {
  ^bb0(%xa: tensor<8x64xbf16>, %ya: tensor<8x64xbf16>):
    %t = mugraph.input %xa imap [-1, -1, -1] fmap -1 : tensor<8x64xbf16> -> tensor<8x64xbf16>
    mugraph.output %t to %ya omap [-1, -1, -1] : tensor<8x64xbf16> -> tensor<8x64xbf16>
  }
  func.return %y : tensor<8x64xbf16>
}

// -----

func.func @bad_grid(%x: tensor<8x64xbf16>) -> tensor<8x64xbf16> {
// CHECK: invalid.mlir:[[# @LINE + 1]]:{{[0-9]+}}: error: 'mugraph.graph_def' grid extents must be >= 1, got [0, 1, 1]
  %y = mugraph.graph_def grid [0, 1, 1] threads 128 forloop 1 (%x) : (tensor<8x64xbf16>) -> tensor<8x64xbf16> {
  ^bb0(%xa: tensor<8x64xbf16>, %ya: tensor<8x64xbf16>):
    %t = mugraph.input %xa imap [-1, -1, -1] fmap -1 : tensor<8x64xbf16> -> tensor<8x64xbf16>
    mugraph.output %t to %ya omap [-1, -1, -1] : tensor<8x64xbf16> -> tensor<8x64xbf16>
  }
  func.return %y : tensor<8x64xbf16>
}

// -----

func.func @bad_forloop(%x: tensor<8x64xbf16>) -> tensor<8x64xbf16> {
// CHECK: invalid.mlir:[[# @LINE + 1]]:{{[0-9]+}}: error: 'mugraph.graph_def' forloop must be >= 1, got 0
  %y = mugraph.graph_def grid [1, 1, 1] threads 128 forloop 0 (%x) : (tensor<8x64xbf16>) -> tensor<8x64xbf16> {
  ^bb0(%xa: tensor<8x64xbf16>, %ya: tensor<8x64xbf16>):
    %t = mugraph.input %xa imap [-1, -1, -1] fmap -1 : tensor<8x64xbf16> -> tensor<8x64xbf16>
    mugraph.output %t to %ya omap [-1, -1, -1] : tensor<8x64xbf16> -> tensor<8x64xbf16>
  }
  func.return %y : tensor<8x64xbf16>
}

// -----

func.func @block_args_mismatch(%x: tensor<8x64xbf16>) -> tensor<8x64xbf16> {
// CHECK: invalid.mlir:[[# @LINE + 1]]:{{[0-9]+}}: error: 'mugraph.graph_def' block arguments must be the operand types then the result types (tensor<8x64xbf16>, tensor<8x64xbf16>), got (tensor<8x64xbf16>)
  %y = mugraph.graph_def grid [1, 1, 1] threads 128 forloop 1 (%x) : (tensor<8x64xbf16>) -> tensor<8x64xbf16> {
  ^bb0(%xa: tensor<8x64xbf16>):
    %t = mugraph.input %xa imap [-1, -1, -1] fmap -1 : tensor<8x64xbf16> -> tensor<8x64xbf16>
  }
  func.return %y : tensor<8x64xbf16>
}

// -----

func.func @foreign_op(%x: tensor<8x64xbf16>) -> tensor<8x64xbf16> {
// CHECK: invalid.mlir:[[# @LINE + 1]]:{{[0-9]+}}: error: 'mugraph.graph_def' a block graph holds only mugraph block ops, found 'arith.constant'
  %y = mugraph.graph_def grid [1, 1, 1] threads 128 forloop 1 (%x) : (tensor<8x64xbf16>) -> tensor<8x64xbf16> {
  ^bb0(%xa: tensor<8x64xbf16>, %ya: tensor<8x64xbf16>):
    %c = arith.constant 1.0 : f32
    %t = mugraph.input %xa imap [-1, -1, -1] fmap -1 : tensor<8x64xbf16> -> tensor<8x64xbf16>
    mugraph.output %t to %ya omap [-1, -1, -1] : tensor<8x64xbf16> -> tensor<8x64xbf16>
  }
  func.return %y : tensor<8x64xbf16>
}

// -----

func.func @bad_library_kind(%x: tensor<8x64xbf16>) -> tensor<8x64xbf16> {
// CHECK: invalid.mlir:[[# @LINE + 1]]:{{[0-9]+}}: error: 'mugraph.kernel' unknown library kernel kind 'softplus'
  %y = mugraph.kernel "softplus" (%x) : (tensor<8x64xbf16>) -> tensor<8x64xbf16>
  func.return %y : tensor<8x64xbf16>
}

// -----

func.func @bad_library_arity(%x: tensor<8x64xbf16>) -> tensor<8x64xbf16> {
// CHECK: invalid.mlir:[[# @LINE + 1]]:{{[0-9]+}}: error: 'mugraph.kernel' 'attention' takes 3 to 4 operands, got 2
  %y = mugraph.kernel "attention" (%x, %x) {scale = 1.0 : f32} : (tensor<8x64xbf16>, tensor<8x64xbf16>) -> tensor<8x64xbf16>
  func.return %y : tensor<8x64xbf16>
}

// -----

func.func @library_missing_attribute(%x: tensor<8x64xbf16>) -> tensor<8x1xbf16> {
// CHECK: invalid.mlir:[[# @LINE + 1]]:{{[0-9]+}}: error: 'mugraph.kernel' 'reduce_sum' needs attribute 'dim'
  %y = mugraph.kernel "reduce_sum" (%x) : (tensor<8x64xbf16>) -> tensor<8x1xbf16>
  func.return %y : tensor<8x1xbf16>
}

// -----

func.func @bad_unary_kind(%x: tensor<8x64xbf16>) -> tensor<8x64xbf16> {
  %y = mugraph.graph_def grid [1, 1, 1] threads 128 forloop 1 (%x) : (tensor<8x64xbf16>) -> tensor<8x64xbf16> {
  ^bb0(%xa: tensor<8x64xbf16>, %ya: tensor<8x64xbf16>):
    %t = mugraph.input %xa imap [-1, -1, -1] fmap -1 : tensor<8x64xbf16> -> tensor<8x64xbf16>
// CHECK: invalid.mlir:[[# @LINE + 1]]:{{[0-9]+}}: error: 'mugraph.unary' unknown unary kind 'softplus'
    %s = mugraph.unary "softplus" %t : tensor<8x64xbf16> -> tensor<8x64xbf16>
    mugraph.output %s to %ya omap [-1, -1, -1] : tensor<8x64xbf16> -> tensor<8x64xbf16>
  }
  func.return %y : tensor<8x64xbf16>
}

// -----

func.func @scale_without_factor(%x: tensor<8x64xbf16>) -> tensor<8x64xbf16> {
  %y = mugraph.graph_def grid [1, 1, 1] threads 128 forloop 1 (%x) : (tensor<8x64xbf16>) -> tensor<8x64xbf16> {
  ^bb0(%xa: tensor<8x64xbf16>, %ya: tensor<8x64xbf16>):
    %t = mugraph.input %xa imap [-1, -1, -1] fmap -1 : tensor<8x64xbf16> -> tensor<8x64xbf16>
// CHECK: invalid.mlir:[[# @LINE + 1]]:{{[0-9]+}}: error: 'mugraph.unary' 'factor' is required by scale and only by it
    %s = mugraph.unary "scale" %t : tensor<8x64xbf16> -> tensor<8x64xbf16>
    mugraph.output %s to %ya omap [-1, -1, -1] : tensor<8x64xbf16> -> tensor<8x64xbf16>
  }
  func.return %y : tensor<8x64xbf16>
}

// -----

func.func @bad_accum_kind(%x: tensor<8x64xbf16>) -> tensor<8x64xf32> {
  %y = mugraph.graph_def grid [1, 1, 1] threads 128 forloop 1 (%x) : (tensor<8x64xbf16>) -> tensor<8x64xf32> {
  ^bb0(%xa: tensor<8x64xbf16>, %ya: tensor<8x64xf32>):
    %t = mugraph.input %xa imap [-1, -1, -1] fmap -1 : tensor<8x64xbf16> -> tensor<8x64xbf16>
// CHECK: invalid.mlir:[[# @LINE + 1]]:{{[0-9]+}}: error: 'mugraph.accum' unknown accumulator kind 'prod'
    %s = mugraph.accum "prod" %t : tensor<8x64xbf16> -> tensor<8x64xf32>
    mugraph.output %s to %ya omap [-1, -1, -1] : tensor<8x64xf32> -> tensor<8x64xf32>
  }
  func.return %y : tensor<8x64xf32>
}

// -----

func.func @accum_not_f32(%x: tensor<8x64xbf16>) -> tensor<8x64xbf16> {
  %y = mugraph.graph_def grid [1, 1, 1] threads 128 forloop 1 (%x) : (tensor<8x64xbf16>) -> tensor<8x64xbf16> {
  ^bb0(%xa: tensor<8x64xbf16>, %ya: tensor<8x64xbf16>):
    %t = mugraph.input %xa imap [-1, -1, -1] fmap -1 : tensor<8x64xbf16> -> tensor<8x64xbf16>
// CHECK: invalid.mlir:[[# @LINE + 1]]:{{[0-9]+}}: error: 'mugraph.accum' accumulators are f32, got tensor<8x64xbf16>
    %s = mugraph.accum "sum" %t : tensor<8x64xbf16> -> tensor<8x64xbf16>
    mugraph.output %s to %ya omap [-1, -1, -1] : tensor<8x64xbf16> -> tensor<8x64xbf16>
  }
  func.return %y : tensor<8x64xbf16>
}

// -----

func.func @accum_softmax_shapes(%s: tensor<4x64xf32>, %v: tensor<32x128xbf16>) -> tensor<4x128xf32> {
  %y = mugraph.graph_def grid [1, 1, 1] threads 128 forloop 1 (%s, %v) : (tensor<4x64xf32>, tensor<32x128xbf16>) -> tensor<4x128xf32> {
  ^bb0(%sa: tensor<4x64xf32>, %va: tensor<32x128xbf16>, %ya: tensor<4x128xf32>):
    %st = mugraph.input %sa imap [-1, -1, -1] fmap -1 : tensor<4x64xf32> -> tensor<4x64xf32>
    %vt = mugraph.input %va imap [-1, -1, -1] fmap -1 : tensor<32x128xbf16> -> tensor<32x128xbf16>
// CHECK: invalid.mlir:[[# @LINE + 1]]:{{[0-9]+}}: error: 'mugraph.accum_softmax' scores·v: inner dimensions differ: a is 4x64, b is 32x128 (b is [k, n])
    %o, %m, %l = mugraph.accum_softmax %st, %vt : (tensor<4x64xf32>, tensor<32x128xbf16>) -> (tensor<4x128xf32>, tensor<4x1xf32>, tensor<4x1xf32>)
    mugraph.output %o to %ya omap [-1, -1, -1] : tensor<4x128xf32> -> tensor<4x128xf32>
  }
  func.return %y : tensor<4x128xf32>
}

// -----

func.func @matmul_inner_dims(%x: tensor<8x64xbf16>, %w: tensor<128x32xbf16>) -> tensor<8x128xf32> {
  %y = mugraph.graph_def grid [1, 1, 1] threads 128 forloop 1 (%x, %w) : (tensor<8x64xbf16>, tensor<128x32xbf16>) -> tensor<8x128xf32> {
  ^bb0(%xa: tensor<8x64xbf16>, %wa: tensor<128x32xbf16>, %ya: tensor<8x128xf32>):
    %xt = mugraph.input %xa imap [-1, -1, -1] fmap -1 : tensor<8x64xbf16> -> tensor<8x64xbf16>
    %wt = mugraph.input %wa imap [-1, -1, -1] fmap -1 : tensor<128x32xbf16> -> tensor<128x32xbf16>
// CHECK: invalid.mlir:[[# @LINE + 1]]:{{[0-9]+}}: error: 'mugraph.matmul' inner dimensions differ: a is 8x64, b is 128x32 (b is [n, k])
    %p = mugraph.matmul %xt, %wt transpose_b : (tensor<8x64xbf16>, tensor<128x32xbf16>) -> tensor<8x128xf32>
    mugraph.output %p to %ya omap [-1, -1, -1] : tensor<8x128xf32> -> tensor<8x128xf32>
  }
  func.return %y : tensor<8x128xf32>
}

// -----

func.func @no_broadcast(%x: tensor<8x64xbf16>, %b: tensor<8x32xbf16>) -> tensor<8x64xf32> {
  %y = mugraph.graph_def grid [1, 1, 1] threads 128 forloop 1 (%x, %b) : (tensor<8x64xbf16>, tensor<8x32xbf16>) -> tensor<8x64xf32> {
  ^bb0(%xa: tensor<8x64xbf16>, %ba: tensor<8x32xbf16>, %ya: tensor<8x64xf32>):
    %xt = mugraph.input %xa imap [-1, -1, -1] fmap -1 : tensor<8x64xbf16> -> tensor<8x64xbf16>
    %bt = mugraph.input %ba imap [-1, -1, -1] fmap -1 : tensor<8x32xbf16> -> tensor<8x32xbf16>
// CHECK: invalid.mlir:[[# @LINE + 1]]:{{[0-9]+}}: error: 'mugraph.binary' operands do not broadcast: 8x64 and 8x32
    %s = mugraph.binary "add" %xt, %bt : (tensor<8x64xbf16>, tensor<8x32xbf16>) -> tensor<8x64xf32>
    mugraph.output %s to %ya omap [-1, -1, -1] : tensor<8x64xf32> -> tensor<8x64xf32>
  }
  func.return %y : tensor<8x64xf32>
}

// -----

func.func @whole_tensor_operand(%x: tensor<8x64xbf16>) -> tensor<8x64xf32> {
  %y = mugraph.graph_def grid [1, 1, 1] threads 128 forloop 1 (%x) : (tensor<8x64xbf16>) -> tensor<8x64xf32> {
  ^bb0(%xa: tensor<8x64xbf16>, %ya: tensor<8x64xf32>):
// CHECK: invalid.mlir:[[# @LINE + 1]]:{{[0-9]+}}: error: 'mugraph.unary' operand #0 (%xa) is a whole tensor; read a tile through mugraph.input
    %s = mugraph.unary "exp" %xa : tensor<8x64xbf16> -> tensor<8x64xf32>
    mugraph.output %s to %ya omap [-1, -1, -1] : tensor<8x64xf32> -> tensor<8x64xf32>
  }
  func.return %y : tensor<8x64xf32>
}

// -----

func.func @input_reads_result(%x: tensor<8x64xbf16>) -> tensor<8x64xbf16> {
  %y = mugraph.graph_def grid [1, 1, 1] threads 128 forloop 1 (%x) : (tensor<8x64xbf16>) -> tensor<8x64xbf16> {
  ^bb0(%xa: tensor<8x64xbf16>, %ya: tensor<8x64xbf16>):
// CHECK: invalid.mlir:[[# @LINE + 1]]:{{[0-9]+}}: error: 'mugraph.input' reads %ya, a result of the kernel, not an operand
    %t = mugraph.input %ya imap [-1, -1, -1] fmap -1 : tensor<8x64xbf16> -> tensor<8x64xbf16>
    mugraph.output %t to %ya omap [-1, -1, -1] : tensor<8x64xbf16> -> tensor<8x64xbf16>
  }
  func.return %y : tensor<8x64xbf16>
}

// -----

func.func @output_to_operand(%x: tensor<8x64xbf16>) -> tensor<8x64xbf16> {
  %y = mugraph.graph_def grid [1, 1, 1] threads 128 forloop 1 (%x) : (tensor<8x64xbf16>) -> tensor<8x64xbf16> {
  ^bb0(%xa: tensor<8x64xbf16>, %ya: tensor<8x64xbf16>):
    %t = mugraph.input %xa imap [-1, -1, -1] fmap -1 : tensor<8x64xbf16> -> tensor<8x64xbf16>
    mugraph.output %t to %ya omap [-1, -1, -1] : tensor<8x64xbf16> -> tensor<8x64xbf16>
// CHECK: invalid.mlir:[[# @LINE + 1]]:{{[0-9]+}}: error: 'mugraph.output' writes to %xa, an operand of the kernel, not a result
    mugraph.output %t to %xa omap [-1, -1, -1] : tensor<8x64xbf16> -> tensor<8x64xbf16>
  }
  func.return %y : tensor<8x64xbf16>
}

// -----

func.func @tile_op_outside_graph(%x: tensor<8x64xf32>) -> tensor<8x64xf32> {
// CHECK: invalid.mlir:[[# @LINE + 1]]:{{[0-9]+}}: error: 'mugraph.unary' expects parent op 'mugraph.graph_def'
  %y = mugraph.unary "exp" %x : tensor<8x64xf32> -> tensor<8x64xf32>
  func.return %y : tensor<8x64xf32>
}

// -----

func.func @thread_map_arity(%x: tensor<8x64xbf16>) -> tensor<8x64xf32> {
  %y = mugraph.graph_def grid [1, 1, 1] threads 128 forloop 1 (%x) : (tensor<8x64xbf16>) -> tensor<8x64xf32> {
  ^bb0(%xa: tensor<8x64xbf16>, %ya: tensor<8x64xf32>):
    %t = mugraph.input %xa imap [-1, -1, -1] fmap -1 : tensor<8x64xbf16> -> tensor<8x64xbf16>
// CHECK: invalid.mlir:[[# @LINE + 1]]:{{[0-9]+}}: error: 'mugraph.thread_map' region has 2 arguments, but there are 1 operands
    %s = mugraph.thread_map %t : (tensor<8x64xbf16>) -> tensor<8x64xf32> {
    ^bb0(%a: f32, %b: f32):
      %r = arith.addf %a, %b : f32
      mugraph.yield %r : f32
    }
    mugraph.output %s to %ya omap [-1, -1, -1] : tensor<8x64xf32> -> tensor<8x64xf32>
  }
  func.return %y : tensor<8x64xf32>
}

// -----

func.func @thread_map_scalar_type(%x: tensor<8x64xbf16>) -> tensor<8x64xf32> {
  %y = mugraph.graph_def grid [1, 1, 1] threads 128 forloop 1 (%x) : (tensor<8x64xbf16>) -> tensor<8x64xf32> {
  ^bb0(%xa: tensor<8x64xbf16>, %ya: tensor<8x64xf32>):
    %t = mugraph.input %xa imap [-1, -1, -1] fmap -1 : tensor<8x64xbf16> -> tensor<8x64xbf16>
// CHECK: invalid.mlir:[[# @LINE + 1]]:{{[0-9]+}}: error: 'mugraph.thread_map' region argument #0 is bf16, expected f32 for tensor<8x64xbf16>
    %s = mugraph.thread_map %t : (tensor<8x64xbf16>) -> tensor<8x64xf32> {
    ^bb0(%a: bf16):
      %r = arith.extf %a : bf16 to f32
      mugraph.yield %r : f32
    }
    mugraph.output %s to %ya omap [-1, -1, -1] : tensor<8x64xf32> -> tensor<8x64xf32>
  }
  func.return %y : tensor<8x64xf32>
}

// -----

func.func @thread_map_yield(%x: tensor<8x64xbf16>) -> tensor<8x64xf32> {
  %y = mugraph.graph_def grid [1, 1, 1] threads 128 forloop 1 (%x) : (tensor<8x64xbf16>) -> tensor<8x64xf32> {
  ^bb0(%xa: tensor<8x64xbf16>, %ya: tensor<8x64xf32>):
    %t = mugraph.input %xa imap [-1, -1, -1] fmap -1 : tensor<8x64xbf16> -> tensor<8x64xbf16>
// CHECK: invalid.mlir:[[# @LINE + 1]]:{{[0-9]+}}: error: 'mugraph.thread_map' yields (f32, f32), expected (f32)
    %s = mugraph.thread_map %t : (tensor<8x64xbf16>) -> tensor<8x64xf32> {
    ^bb0(%a: f32):
      mugraph.yield %a, %a : f32, f32
    }
    mugraph.output %s to %ya omap [-1, -1, -1] : tensor<8x64xf32> -> tensor<8x64xf32>
  }
  func.return %y : tensor<8x64xf32>
}

// -----

func.func @thread_map_body(%x: tensor<8x64xbf16>) -> tensor<8x64xf32> {
  %y = mugraph.graph_def grid [1, 1, 1] threads 128 forloop 1 (%x) : (tensor<8x64xbf16>) -> tensor<8x64xf32> {
  ^bb0(%xa: tensor<8x64xbf16>, %ya: tensor<8x64xf32>):
    %t = mugraph.input %xa imap [-1, -1, -1] fmap -1 : tensor<8x64xbf16> -> tensor<8x64xbf16>
// CHECK: invalid.mlir:[[# @LINE + 1]]:{{[0-9]+}}: error: 'mugraph.thread_map' body may hold only arith/math scalar ops, found 'func.call'
    %s = mugraph.thread_map %t : (tensor<8x64xbf16>) -> tensor<8x64xf32> {
    ^bb0(%a: f32):
      %r = func.call @g(%a) : (f32) -> f32
      mugraph.yield %r : f32
    }
    mugraph.output %s to %ya omap [-1, -1, -1] : tensor<8x64xf32> -> tensor<8x64xf32>
  }
  func.return %y : tensor<8x64xf32>
}
func.func private @g(f32) -> f32

// -----

func.func @thread_map_on_tensors(%x: tensor<8x64xbf16>) -> tensor<8x64xf32> {
  %y = mugraph.graph_def grid [1, 1, 1] threads 128 forloop 1 (%x) : (tensor<8x64xbf16>) -> tensor<8x64xf32> {
  ^bb0(%xa: tensor<8x64xbf16>, %ya: tensor<8x64xf32>):
    %t = mugraph.input %xa imap [-1, -1, -1] fmap -1 : tensor<8x64xbf16> -> tensor<8x64xbf16>
// CHECK: invalid.mlir:[[# @LINE + 1]]:{{[0-9]+}}: error: 'mugraph.thread_map' body ops work on scalars, but 'arith.constant' has a tensor<4xf32> value
    %s = mugraph.thread_map %t : (tensor<8x64xbf16>) -> tensor<8x64xf32> {
    ^bb0(%a: f32):
      %c = arith.constant dense<1.0> : tensor<4xf32>
      mugraph.yield %a : f32
    }
    mugraph.output %s to %ya omap [-1, -1, -1] : tensor<8x64xf32> -> tensor<8x64xf32>
  }
  func.return %y : tensor<8x64xf32>
}

// -----

func.func @graph_def_operand_types(%x: tensor<8x64xbf16>) -> tensor<8x64xbf16> {
// CHECK: invalid.mlir:[[# @LINE + 1]]:{{[0-9]+}}: error: 1 operands but 2 operand types
  %y = mugraph.graph_def grid [1, 1, 1] threads 128 forloop 1 (%x) : (tensor<8x64xbf16>, tensor<8x64xbf16>) -> tensor<8x64xbf16> {
  ^bb0(%xa: tensor<8x64xbf16>, %ya: tensor<8x64xbf16>):
    %t = mugraph.input %xa imap [-1, -1, -1] fmap -1 : tensor<8x64xbf16> -> tensor<8x64xbf16>
    mugraph.output %t to %ya omap [-1, -1, -1] : tensor<8x64xbf16> -> tensor<8x64xbf16>
  }
  func.return %y : tensor<8x64xbf16>
}

// -----

func.func @position_of_computed_tile(%x: tensor<8x64xbf16>) -> tensor<8x64xi32> {
  %y = mugraph.graph_def grid [1, 1, 1] threads 128 forloop 1 (%x) : (tensor<8x64xbf16>) -> tensor<8x64xi32> {
  ^bb0(%xa: tensor<8x64xbf16>, %ya: tensor<8x64xi32>):
    %t = mugraph.input %xa imap [-1, -1, -1] fmap -1 : tensor<8x64xbf16> -> tensor<8x64xbf16>
    %e = mugraph.unary "exp" %t : tensor<8x64xbf16> -> tensor<8x64xf32>
// CHECK: invalid.mlir:[[# @LINE + 1]]:{{[0-9]+}}: error: 'mugraph.position' %e must be a mugraph.input tile or one a plain mugraph.output writes
    %p = mugraph.position %e dim 1 : tensor<8x64xf32> -> tensor<8x64xi32>
    mugraph.output %p to %ya omap [-1, -1, -1] : tensor<8x64xi32> -> tensor<8x64xi32>
  }
  func.return %y : tensor<8x64xi32>
}

// -----

func.func @reduce_dim(%x: tensor<8x64xbf16>) -> tensor<8x64xf32> {
  %y = mugraph.graph_def grid [1, 1, 1] threads 128 forloop 1 (%x) : (tensor<8x64xbf16>) -> tensor<8x64xf32> {
  ^bb0(%xa: tensor<8x64xbf16>, %ya: tensor<8x64xf32>):
    %t = mugraph.input %xa imap [-1, -1, -1] fmap -1 : tensor<8x64xbf16> -> tensor<8x64xbf16>
// CHECK: invalid.mlir:[[# @LINE + 1]]:{{[0-9]+}}: error: 'mugraph.reduce' dim 2 is out of range for a rank-2 tile
    %s = mugraph.reduce "sum" %t dim 2 : tensor<8x64xbf16> -> tensor<8x64xf32>
    mugraph.output %s to %ya omap [-1, -1, -1] : tensor<8x64xf32> -> tensor<8x64xf32>
  }
  func.return %y : tensor<8x64xf32>
}

// -----

func.func @reshape_count(%x: tensor<8x64xbf16>) -> tensor<8x64xbf16> {
  %y = mugraph.graph_def grid [1, 1, 1] threads 128 forloop 1 (%x) : (tensor<8x64xbf16>) -> tensor<8x64xbf16> {
  ^bb0(%xa: tensor<8x64xbf16>, %ya: tensor<8x64xbf16>):
    %t = mugraph.input %xa imap [-1, -1, -1] fmap -1 : tensor<8x64xbf16> -> tensor<8x64xbf16>
// CHECK: invalid.mlir:[[# @LINE + 1]]:{{[0-9]+}}: error: 'mugraph.reshape' element counts differ: 8x64 has 512, 4x64 has 256
    %r = mugraph.reshape %t : tensor<8x64xbf16> -> tensor<4x64xbf16>
    mugraph.output %t to %ya omap [-1, -1, -1] : tensor<8x64xbf16> -> tensor<8x64xbf16>
  }
  func.return %y : tensor<8x64xbf16>
}

// -----

func.func @concat_mismatch(%x: tensor<8x64xbf16>) -> tensor<8x72xf32> {
  %y = mugraph.graph_def grid [1, 1, 1] threads 128 forloop 1 (%x) : (tensor<8x64xbf16>) -> tensor<8x72xf32> {
  ^bb0(%xa: tensor<8x64xbf16>, %ya: tensor<8x72xf32>):
    %t = mugraph.input %xa imap [-1, -1, -1] fmap -1 : tensor<8x64xbf16> -> tensor<8x64xbf16>
    %r = mugraph.reduce "sum" %t dim 0 keepdim : tensor<8x64xbf16> -> tensor<1x64xf32>
// CHECK: invalid.mlir:[[# @LINE + 1]]:{{[0-9]+}}: error: 'mugraph.concat' operands 8x64 and 1x64 differ outside dim 1
    %c = mugraph.concat %t, %r dim 1 : (tensor<8x64xbf16>, tensor<1x64xf32>) -> tensor<8x72xf32>
    mugraph.output %c to %ya omap [-1, -1, -1] : tensor<8x72xf32> -> tensor<8x72xf32>
  }
  func.return %y : tensor<8x72xf32>
}

// -----

func.func @parse_error(%x: tensor<8x64xbf16>) -> tensor<8x64xbf16> {
  %y = mugraph.graph_def grid [1, 1, 1] threads 128 forloop 1 (%x) : (tensor<8x64xbf16>) -> tensor<8x64xbf16> {
  ^bb0(%xa: tensor<8x64xbf16>, %ya: tensor<8x64xbf16>):
// CHECK: invalid.mlir:[[# @LINE + 1]]:{{[0-9]+}}: error: Expected 'fmap'
    %t = mugraph.input %xa imap [-1, -1, -1] : tensor<8x64xbf16> -> tensor<8x64xbf16>
    mugraph.output %t to %ya omap [-1, -1, -1] : tensor<8x64xbf16> -> tensor<8x64xbf16>
  }
  func.return %y : tensor<8x64xbf16>
}

// -----

func.func @rope_table_mismatch(%q: tensor<1x4x1x64xbf16>, %c: tensor<1x16xf32>) -> tensor<1x4x1x64xbf16> {
  %r = mugraph.graph_def grid [4, 1, 1] threads 128 forloop 1 (%q, %c) : (tensor<1x4x1x64xbf16>, tensor<1x16xf32>) -> tensor<1x4x1x64xbf16> {
  ^bb0(%qa: tensor<1x4x1x64xbf16>, %ca: tensor<1x16xf32>, %ra: tensor<1x4x1x64xbf16>):
    %qt = mugraph.input %qa imap [1, -1, -1] fmap -1 : tensor<1x4x1x64xbf16> -> tensor<1x1x1x64xbf16>
    %ct = mugraph.input %ca imap [-1, -1, -1] fmap -1 : tensor<1x16xf32> -> tensor<1x16xf32>
// CHECK: invalid.mlir:[[# @LINE + 1]]:{{[0-9]+}}: error: 'mugraph.rope' cos 1x16 does not fit x 1x1x1x64 (needs [..., D/2])
    %rt = mugraph.rope %qt, %ct, %ct : (tensor<1x1x1x64xbf16>, tensor<1x16xf32>, tensor<1x16xf32>) -> tensor<1x1x1x64xf32>
    mugraph.output %rt to %ra omap [1, -1, -1] : tensor<1x1x1x64xf32> -> tensor<1x4x1x64xbf16>
  }
  func.return %r : tensor<1x4x1x64xbf16>
}

// -----

func.func @append_split_dim(%k: tensor<1x2x10x16xbf16>, %cache: tensor<1x2x8x16xbf16>, %p: tensor<1xi32>) -> tensor<1x2x8x16xbf16> {
  %c = mugraph.graph_def grid [2, 1, 1] threads 128 forloop 1 (%k, %cache, %p) : (tensor<1x2x10x16xbf16>, tensor<1x2x8x16xbf16>, tensor<1xi32>) -> tensor<1x2x8x16xbf16> {
  ^bb0(%ka: tensor<1x2x10x16xbf16>, %cachea: tensor<1x2x8x16xbf16>, %pa: tensor<1xi32>, %ca: tensor<1x2x8x16xbf16>):
    %kt = mugraph.input %ka imap [2, -1, -1] fmap -1 : tensor<1x2x10x16xbf16> -> tensor<1x2x5x16xbf16>
    %pt = mugraph.input %pa imap [-1, -1, -1] fmap -1 : tensor<1xi32> -> tensor<1xi32>
// CHECK: invalid.mlir:[[# @LINE + 1]]:{{[0-9]+}}: error: 'mugraph.output' the blocks' tiles take 10 positions of dim 2, which has 8
    mugraph.output %kt to %ca omap [2, -1, -1] at %pt dim 2 over %cachea : tensor<1x2x5x16xbf16>, tensor<1xi32> -> tensor<1x2x8x16xbf16>
  }
  func.return %c : tensor<1x2x8x16xbf16>
}

// -----

func.func @append_float_position(%k: tensor<1x2x1x16xbf16>, %cache: tensor<1x2x8x16xbf16>, %p: tensor<1xf32>) -> tensor<1x2x8x16xbf16> {
  %c = mugraph.graph_def grid [2, 1, 1] threads 128 forloop 1 (%k, %cache, %p) : (tensor<1x2x1x16xbf16>, tensor<1x2x8x16xbf16>, tensor<1xf32>) -> tensor<1x2x8x16xbf16> {
  ^bb0(%ka: tensor<1x2x1x16xbf16>, %cachea: tensor<1x2x8x16xbf16>, %pa: tensor<1xf32>, %ca: tensor<1x2x8x16xbf16>):
    %kt = mugraph.input %ka imap [1, -1, -1] fmap -1 : tensor<1x2x1x16xbf16> -> tensor<1x1x1x16xbf16>
    %pt = mugraph.input %pa imap [-1, -1, -1] fmap -1 : tensor<1xf32> -> tensor<1xf32>
// CHECK: invalid.mlir:[[# @LINE + 1]]:{{[0-9]+}}: error: 'mugraph.output' the position %pt must be a one-element integer tile
    mugraph.output %kt to %ca omap [1, -1, -1] at %pt dim 2 over %cachea : tensor<1x1x1x16xbf16>, tensor<1xf32> -> tensor<1x2x8x16xbf16>
  }
  func.return %c : tensor<1x2x8x16xbf16>
}

// -----

func.func @append_over_result(%k: tensor<1x2x1x16xbf16>, %p: tensor<1xi32>) -> tensor<1x2x8x16xbf16> {
  %c = mugraph.graph_def grid [2, 1, 1] threads 128 forloop 1 (%k, %p) : (tensor<1x2x1x16xbf16>, tensor<1xi32>) -> tensor<1x2x8x16xbf16> {
  ^bb0(%ka: tensor<1x2x1x16xbf16>, %pa: tensor<1xi32>, %ca: tensor<1x2x8x16xbf16>):
    %kt = mugraph.input %ka imap [1, -1, -1] fmap -1 : tensor<1x2x1x16xbf16> -> tensor<1x1x1x16xbf16>
    %pt = mugraph.input %pa imap [-1, -1, -1] fmap -1 : tensor<1xi32> -> tensor<1xi32>
// CHECK: invalid.mlir:[[# @LINE + 1]]:{{[0-9]+}}: error: 'mugraph.output' %ca must be an operand of the kernel
    mugraph.output %kt to %ca omap [1, -1, -1] at %pt dim 2 over %ca : tensor<1x1x1x16xbf16>, tensor<1xi32> -> tensor<1x2x8x16xbf16>
  }
  func.return %c : tensor<1x2x8x16xbf16>
}

// -----

func.func @accumulate_bf16(%x: tensor<4x64xbf16>, %acc: tensor<4x8xbf16>) -> tensor<4x8xbf16> {
  %y = mugraph.graph_def grid [8, 1, 1] threads 128 forloop 1 (%x, %acc) : (tensor<4x64xbf16>, tensor<4x8xbf16>) -> tensor<4x8xbf16> {
  ^bb0(%xa: tensor<4x64xbf16>, %acca: tensor<4x8xbf16>, %ya: tensor<4x8xbf16>):
    %xt = mugraph.input %xa imap [1, -1, -1] fmap -1 : tensor<4x64xbf16> -> tensor<4x8xbf16>
// CHECK: invalid.mlir:[[# @LINE + 1]]:{{[0-9]+}}: error: 'mugraph.output' an accumulating output adds in f32, not bf16
    mugraph.output %xt to %ya omap [-1, -1, -1] accumulate over %acca : tensor<4x8xbf16> -> tensor<4x8xbf16>
  }
  func.return %y : tensor<4x8xbf16>
}

// -----

func.func @accumulate_other_type(%x: tensor<4x64xbf16>, %acc: tensor<4x16xf32>) -> tensor<4x8xf32> {
  %y = mugraph.graph_def grid [8, 1, 1] threads 128 forloop 1 (%x, %acc) : (tensor<4x64xbf16>, tensor<4x16xf32>) -> tensor<4x8xf32> {
  ^bb0(%xa: tensor<4x64xbf16>, %acca: tensor<4x16xf32>, %ya: tensor<4x8xf32>):
    %xt = mugraph.input %xa imap [1, -1, -1] fmap -1 : tensor<4x64xbf16> -> tensor<4x8xbf16>
// The syntax gives the operand the result's type: another type is a parse error.
// CHECK: invalid.mlir:[[# @LINE + 1]]:{{[0-9]+}}: error: operand is used with type tensor<4x8xf32>, but has been previously used or defined with type tensor<4x16xf32>
    mugraph.output %xt to %ya omap [-1, -1, -1] accumulate over %acca : tensor<4x8xbf16> -> tensor<4x8xf32>
  }
  func.return %y : tensor<4x8xf32>
}

// -----

func.func @accumulate_over_result(%x: tensor<4x64xbf16>) -> tensor<4x8xf32> {
  %y = mugraph.graph_def grid [8, 1, 1] threads 128 forloop 1 (%x) : (tensor<4x64xbf16>) -> tensor<4x8xf32> {
  ^bb0(%xa: tensor<4x64xbf16>, %ya: tensor<4x8xf32>):
    %xt = mugraph.input %xa imap [1, -1, -1] fmap -1 : tensor<4x64xbf16> -> tensor<4x8xbf16>
// CHECK: invalid.mlir:[[# @LINE + 1]]:{{[0-9]+}}: error: 'mugraph.output' %ya must be an operand of the kernel
    mugraph.output %xt to %ya omap [-1, -1, -1] accumulate over %ya : tensor<4x8xbf16> -> tensor<4x8xf32>
  }
  func.return %y : tensor<4x8xf32>
}
