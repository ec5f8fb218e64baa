// RUN: mk-opt %s --split-input-file -p mugraph-fuse-epilogue | filecheck %s
// RUN: mk-opt %s --split-input-file -p mugraph-fuse-epilogue | mk-opt --split-input-file | filecheck %s
// RUN: mk-opt %s --split-input-file -p 'mugraph-fuse-epilogue{epilogues=false}' | filecheck %s --check-prefix=OFF

// The partial argmax over the logits runs in the lm_head's blocks: block b takes the 2,048
// vocabulary rows block b computed, and the partials become the lm_head kernel's results.

func.func @argmax_after_lm_head(%x: tensor<1x64xf32>, %w: tensor<32768x64xbf16>) -> (tensor<1x32768xbf16>, tensor<1x1xi32>) {
  %l = mugraph.graph_def grid [16, 1, 1] threads 128 forloop 1 (%x, %w) attributes {mk.fused = "linear"} : (tensor<1x64xf32>, tensor<32768x64xbf16>) -> tensor<1x32768xbf16> {
  ^bb0(%xa: tensor<1x64xf32>, %wa: tensor<32768x64xbf16>, %la: tensor<1x32768xbf16>):
    %xt = mugraph.input %xa imap [-1, -1, -1] fmap -1 : tensor<1x64xf32> -> tensor<1x64xf32>
    %wt = mugraph.input %wa imap [0, -1, -1] fmap -1 : tensor<32768x64xbf16> -> tensor<2048x64xbf16>
    %p = mugraph.matmul %xt, %wt transpose_b : (tensor<1x64xf32>, tensor<2048x64xbf16>) -> tensor<1x2048xf32>
    %lt = mugraph.unary "exp" %p : tensor<1x2048xf32> -> tensor<1x2048xbf16>
    mugraph.output %lt to %la omap [1, -1, -1] : tensor<1x2048xbf16> -> tensor<1x32768xbf16>
  }
  %pv, %pi = mugraph.graph_def grid [16, 1, 1] threads 128 forloop 1 (%l) : (tensor<1x32768xbf16>) -> (tensor<1x16xf32>, tensor<1x16xi32>) {
  ^bb0(%lb: tensor<1x32768xbf16>, %pvb: tensor<1x16xf32>, %pib: tensor<1x16xi32>):
    %t = mugraph.input %lb imap [1, -1, -1] fmap -1 : tensor<1x32768xbf16> -> tensor<1x2048xbf16>
    %pos = mugraph.position %t dim 1 : tensor<1x2048xbf16> -> tensor<1x2048xi32>
    %mv, %mi = mugraph.argmax %t, %pos dim 1 : (tensor<1x2048xbf16>, tensor<1x2048xi32>) -> (tensor<1x1xf32>, tensor<1x1xi32>)
    mugraph.output %mv to %pvb omap [1, -1, -1] : tensor<1x1xf32> -> tensor<1x16xf32>
    mugraph.output %mi to %pib omap [1, -1, -1] : tensor<1x1xi32> -> tensor<1x16xi32>
  }
  %id = mugraph.graph_def grid [1, 1, 1] threads 32 forloop 1 (%pv, %pi) : (tensor<1x16xf32>, tensor<1x16xi32>) -> tensor<1x1xi32> {
  ^bb0(%pvc: tensor<1x16xf32>, %pic: tensor<1x16xi32>, %idc: tensor<1x1xi32>):
    %vt = mugraph.input %pvc imap [-1, -1, -1] fmap -1 : tensor<1x16xf32> -> tensor<1x16xf32>
    %it = mugraph.input %pic imap [-1, -1, -1] fmap -1 : tensor<1x16xi32> -> tensor<1x16xi32>
    %bv, %bi = mugraph.argmax %vt, %it dim 1 : (tensor<1x16xf32>, tensor<1x16xi32>) -> (tensor<1x1xf32>, tensor<1x1xi32>)
    mugraph.output %bi to %idc omap [-1, -1, -1] : tensor<1x1xi32> -> tensor<1x1xi32>
  }
  func.return %l, %id : tensor<1x32768xbf16>, tensor<1x1xi32>
}

// CHECK-LABEL: func.func @argmax_after_lm_head
// CHECK:         %l, %pv, %pi = mugraph.graph_def grid [16, 1, 1] threads 128 forloop 1 (%x, %w) attributes {mk.fused = "linear+epilogue"}
// CHECK-SAME:      -> (tensor<1x32768xbf16>, tensor<1x16xf32>, tensor<1x16xi32>)
// CHECK-NEXT:    ^bb0(%xa: tensor<1x64xf32>, %wa: tensor<32768x64xbf16>, %la: tensor<1x32768xbf16>, %pvb: tensor<1x16xf32>, %pib: tensor<1x16xi32>):
// CHECK:           mugraph.output %lt to %la omap [1, -1, -1]
// CHECK-NEXT:      %pos = mugraph.position %lt dim 1 : tensor<1x2048xbf16> -> tensor<1x2048xi32>
// CHECK-NEXT:      %mv, %mi = mugraph.argmax %lt, %pos dim 1
// CHECK-NEXT:      mugraph.output %mv to %pvb omap [1, -1, -1]
// CHECK-NEXT:      mugraph.output %mi to %pib omap [1, -1, -1]
// CHECK-NEXT:    }
// CHECK-NEXT:    %id = mugraph.graph_def grid [1, 1, 1] threads 32 forloop 1 (%pv, %pi)
// CHECK:         func.return %l, %id

// OFF-LABEL: func.func @argmax_after_lm_head
// OFF:         %l = mugraph.graph_def grid [16, 1, 1]
// OFF:         %pv, %pi = mugraph.graph_def grid [16, 1, 1]

// -----

// Not fused: the consumer's blocks read a different tile than the producer's blocks write (its
// grid splits the vocabulary in 8, the producer's in 16).

func.func @other_tiles(%x: tensor<1x64xf32>, %w: tensor<32768x64xbf16>) -> (tensor<1x8xf32>, tensor<1x8xi32>) {
  %l = mugraph.graph_def grid [16, 1, 1] threads 128 forloop 1 (%x, %w) : (tensor<1x64xf32>, tensor<32768x64xbf16>) -> tensor<1x32768xbf16> {
  ^bb0(%xa: tensor<1x64xf32>, %wa: tensor<32768x64xbf16>, %la: tensor<1x32768xbf16>):
    %xt = mugraph.input %xa imap [-1, -1, -1] fmap -1 : tensor<1x64xf32> -> tensor<1x64xf32>
    %wt = mugraph.input %wa imap [0, -1, -1] fmap -1 : tensor<32768x64xbf16> -> tensor<2048x64xbf16>
    %p = mugraph.matmul %xt, %wt transpose_b : (tensor<1x64xf32>, tensor<2048x64xbf16>) -> tensor<1x2048xf32>
    %lt = mugraph.unary "exp" %p : tensor<1x2048xf32> -> tensor<1x2048xbf16>
    mugraph.output %lt to %la omap [1, -1, -1] : tensor<1x2048xbf16> -> tensor<1x32768xbf16>
  }
  %pv, %pi = mugraph.graph_def grid [8, 1, 1] threads 128 forloop 1 (%l) : (tensor<1x32768xbf16>) -> (tensor<1x8xf32>, tensor<1x8xi32>) {
  ^bb0(%lb: tensor<1x32768xbf16>, %pvb: tensor<1x8xf32>, %pib: tensor<1x8xi32>):
    %t = mugraph.input %lb imap [1, -1, -1] fmap -1 : tensor<1x32768xbf16> -> tensor<1x4096xbf16>
    %pos = mugraph.position %t dim 1 : tensor<1x4096xbf16> -> tensor<1x4096xi32>
    %mv, %mi = mugraph.argmax %t, %pos dim 1 : (tensor<1x4096xbf16>, tensor<1x4096xi32>) -> (tensor<1x1xf32>, tensor<1x1xi32>)
    mugraph.output %mv to %pvb omap [1, -1, -1] : tensor<1x1xf32> -> tensor<1x8xf32>
    mugraph.output %mi to %pib omap [1, -1, -1] : tensor<1x1xi32> -> tensor<1x8xi32>
  }
  func.return %pv, %pi : tensor<1x8xf32>, tensor<1x8xi32>
}

// CHECK-LABEL: func.func @other_tiles
// CHECK:         %l = mugraph.graph_def grid [16, 1, 1]
// CHECK:         %pv, %pi = mugraph.graph_def grid [8, 1, 1]

// -----

// Not fused: the producer writes f32 sums into a bf16 result, so the consumer reads rounded
// values the producer's tile does not hold.

func.func @rounded_on_store(%x: tensor<1x64xf32>, %w: tensor<32768x64xbf16>) -> (tensor<1x16xf32>, tensor<1x16xi32>) {
  %l = mugraph.graph_def grid [16, 1, 1] threads 128 forloop 1 (%x, %w) : (tensor<1x64xf32>, tensor<32768x64xbf16>) -> tensor<1x32768xbf16> {
  ^bb0(%xa: tensor<1x64xf32>, %wa: tensor<32768x64xbf16>, %la: tensor<1x32768xbf16>):
    %xt = mugraph.input %xa imap [-1, -1, -1] fmap -1 : tensor<1x64xf32> -> tensor<1x64xf32>
    %wt = mugraph.input %wa imap [0, -1, -1] fmap -1 : tensor<32768x64xbf16> -> tensor<2048x64xbf16>
    %p = mugraph.matmul %xt, %wt transpose_b : (tensor<1x64xf32>, tensor<2048x64xbf16>) -> tensor<1x2048xf32>
    mugraph.output %p to %la omap [1, -1, -1] : tensor<1x2048xf32> -> tensor<1x32768xbf16>
  }
  %pv, %pi = mugraph.graph_def grid [16, 1, 1] threads 128 forloop 1 (%l) : (tensor<1x32768xbf16>) -> (tensor<1x16xf32>, tensor<1x16xi32>) {
  ^bb0(%lb: tensor<1x32768xbf16>, %pvb: tensor<1x16xf32>, %pib: tensor<1x16xi32>):
    %t = mugraph.input %lb imap [1, -1, -1] fmap -1 : tensor<1x32768xbf16> -> tensor<1x2048xbf16>
    %pos = mugraph.position %t dim 1 : tensor<1x2048xbf16> -> tensor<1x2048xi32>
    %mv, %mi = mugraph.argmax %t, %pos dim 1 : (tensor<1x2048xbf16>, tensor<1x2048xi32>) -> (tensor<1x1xf32>, tensor<1x1xi32>)
    mugraph.output %mv to %pvb omap [1, -1, -1] : tensor<1x1xf32> -> tensor<1x16xf32>
    mugraph.output %mi to %pib omap [1, -1, -1] : tensor<1x1xi32> -> tensor<1x16xi32>
  }
  func.return %pv, %pi : tensor<1x16xf32>, tensor<1x16xi32>
}

// CHECK-LABEL: func.func @rounded_on_store
// CHECK:         %l = mugraph.graph_def grid [16, 1, 1]
// CHECK:         %pv, %pi = mugraph.graph_def grid [16, 1, 1]

// -----

// Not fused: an element-wise consumer reduces nothing; the producer would write its result and
// the consumer's beside it.

func.func @elementwise(%x: tensor<1x64xf32>, %w: tensor<32768x64xbf16>) -> tensor<1x32768xbf16> {
  %l = mugraph.graph_def grid [16, 1, 1] threads 128 forloop 1 (%x, %w) : (tensor<1x64xf32>, tensor<32768x64xbf16>) -> tensor<1x32768xbf16> {
  ^bb0(%xa: tensor<1x64xf32>, %wa: tensor<32768x64xbf16>, %la: tensor<1x32768xbf16>):
    %xt = mugraph.input %xa imap [-1, -1, -1] fmap -1 : tensor<1x64xf32> -> tensor<1x64xf32>
    %wt = mugraph.input %wa imap [0, -1, -1] fmap -1 : tensor<32768x64xbf16> -> tensor<2048x64xbf16>
    %p = mugraph.matmul %xt, %wt transpose_b : (tensor<1x64xf32>, tensor<2048x64xbf16>) -> tensor<1x2048xf32>
    %lt = mugraph.unary "exp" %p : tensor<1x2048xf32> -> tensor<1x2048xbf16>
    mugraph.output %lt to %la omap [1, -1, -1] : tensor<1x2048xbf16> -> tensor<1x32768xbf16>
  }
  %e = mugraph.graph_def grid [16, 1, 1] threads 128 forloop 1 (%l) : (tensor<1x32768xbf16>) -> tensor<1x32768xbf16> {
  ^bb0(%lb: tensor<1x32768xbf16>, %eb: tensor<1x32768xbf16>):
    %t = mugraph.input %lb imap [1, -1, -1] fmap -1 : tensor<1x32768xbf16> -> tensor<1x2048xbf16>
    %u = mugraph.unary "exp" %t : tensor<1x2048xbf16> -> tensor<1x2048xbf16>
    mugraph.output %u to %eb omap [1, -1, -1] : tensor<1x2048xbf16> -> tensor<1x32768xbf16>
  }
  func.return %e : tensor<1x32768xbf16>
}

// CHECK-LABEL: func.func @elementwise
// CHECK:         %l = mugraph.graph_def grid [16, 1, 1]
// CHECK:         %e = mugraph.graph_def grid [16, 1, 1]
