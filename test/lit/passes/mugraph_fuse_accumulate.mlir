// RUN: mk-opt %s --split-input-file -p 'nn-to-mugraph{tile-n=32},mugraph-fuse-accumulate' | filecheck %s
// RUN: mk-opt %s --split-input-file -p 'nn-to-mugraph{tile-n=32},mugraph-fuse-accumulate' | mk-opt --split-input-file | filecheck %s
// RUN: mk-opt %s --split-input-file -p 'nn-to-mugraph{tile-n=32},mugraph-fuse-accumulate{fuse-accumulate=0}' | filecheck %s --check-prefix=OFF
// RUN: mk-opt %s --split-input-file -p 'nn-to-mugraph{tile-n=32},mugraph-fuse-accumulate{accumulate-columns=16}' | filecheck %s --check-prefix=OFF
// RUN: mk-opt %s --split-input-file -p 'nn-to-mugraph{tile-n=32},mugraph-fuse-accumulate{accumulate-row-columns=33}' | filecheck %s --check-prefix=OFF

// The gated MLP of a decoder layer: its down projection and residual add join the gate/up
// kernel's blocks, each adding its [1, 64] product into y's f32 accumulator, which the
// o-projection kernel starts with r. The next kernel reads the f32 sum; the returned y is the
// sum rounded by a kernel of its own. Each block reads 32 columns of each W row for m's one row:
// with accumulate-columns=16, or accumulate-row-columns=33, the linear keeps its kernel.
func.func @mlp(%a: tensor<1x64xbf16>, %x: tensor<1x64xbf16>, %wo: tensor<64x64xbf16>, %g: tensor<64xbf16>, %wg: tensor<128x64xbf16>, %wu: tensor<128x64xbf16>, %wd: tensor<64x128xbf16>, %g2: tensor<64xbf16>, %wq: tensor<32x64xbf16>) -> (tensor<1x64xbf16>, tensor<1x32xbf16>) {
  %o = nn.linear %a, %wo : (tensor<1x64xbf16>, tensor<64x64xbf16>) -> tensor<1x64xbf16>
  %r = nn.add %x, %o : (tensor<1x64xbf16>, tensor<1x64xbf16>) -> tensor<1x64xbf16>
  %h = nn.rms_norm %r, %g {epsilon = 1.0e-05 : f32} : (tensor<1x64xbf16>, tensor<64xbf16>) -> tensor<1x64xbf16>
  %gt = nn.linear %h, %wg : (tensor<1x64xbf16>, tensor<128x64xbf16>) -> tensor<1x128xbf16>
  %u = nn.linear %h, %wu : (tensor<1x64xbf16>, tensor<128x64xbf16>) -> tensor<1x128xbf16>
  %s = nn.silu %gt : (tensor<1x128xbf16>) -> tensor<1x128xbf16>
  %m = nn.mul %s, %u : (tensor<1x128xbf16>, tensor<1x128xbf16>) -> tensor<1x128xbf16>
  %d = nn.linear %m, %wd : (tensor<1x128xbf16>, tensor<64x128xbf16>) -> tensor<1x64xbf16>
  %y = nn.add %r, %d : (tensor<1x64xbf16>, tensor<1x64xbf16>) -> tensor<1x64xbf16>
  %h2 = nn.rms_norm %y, %g2 {epsilon = 1.0e-05 : f32} : (tensor<1x64xbf16>, tensor<64xbf16>) -> tensor<1x64xbf16>
  %q = nn.linear %h2, %wq : (tensor<1x64xbf16>, tensor<32x64xbf16>) -> tensor<1x32xbf16>
  func.return %y, %q : tensor<1x64xbf16>, tensor<1x32xbf16>
}
// CHECK-LABEL: func.func @mlp
// CHECK:         %r, %y_acc = mugraph.graph_def grid [2, 1, 1] threads 128 forloop 1 (%a, %wo, %x) attributes {mk.fused = "linear+add"} : ({{.*}}) -> (tensor<1x64xbf16>, tensor<1x64xf32>) {
// CHECK:           mugraph.output %rt to %r_r omap [1, -1, -1] : tensor<1x32xbf16> -> tensor<1x64xbf16>
// CHECK-NEXT:      mugraph.output %rt to %y_acc_r omap [1, -1, -1] : tensor<1x32xbf16> -> tensor<1x64xf32>
// CHECK:         %y_sum = mugraph.graph_def grid [4, 1, 1] threads 128 forloop 1 (%r, %g, %wg, %wu, %wd, %y_acc) attributes {mk.fused = "rms_norm+linear+linear+silu+mul+linear+add"} : ({{.*}}) -> tensor<1x64xf32> {
// CHECK:           %mt = mugraph.thread_map %wgacc, %wuacc, %ss
// CHECK:           %wt = mugraph.input %wd_a imap [1, -1, -1] fmap -1 : tensor<64x128xbf16> -> tensor<64x32xbf16>
// CHECK-NEXT:      %d = mugraph.matmul %mt, %wt transpose_b : (tensor<1x32xbf16>, tensor<64x32xbf16>) -> tensor<1x64xf32>
// CHECK-NEXT:      mugraph.output %d to %y_r omap [-1, -1, -1] accumulate over %y_acc_a : tensor<1x64xf32> -> tensor<1x64xf32>
// CHECK:         %y = mugraph.graph_def grid [2, 1, 1] threads 128 forloop 1 (%y_sum) attributes {mk.fused = "round"} : (tensor<1x64xf32>) -> tensor<1x64xbf16> {
// CHECK:         %q = mugraph.graph_def grid [1, 1, 1] threads 128 forloop 1 (%y_sum, %g2, %wq) attributes {mk.fused = "rms_norm+linear"} : (tensor<1x64xf32>, tensor<64xbf16>, tensor<32x64xbf16>) -> tensor<1x32xbf16> {
// CHECK-NEXT:    ^bb0(%y_a: tensor<1x64xf32>,
// CHECK-NEXT:      %xt = mugraph.input %y_a imap [-1, -1, -1] fmap 1 : tensor<1x64xf32> -> tensor<1x64xf32>
// CHECK:         func.return %y, %q : tensor<1x64xbf16>, tensor<1x32xbf16>
// OFF-LABEL: func.func @mlp
// OFF:         %y = mugraph.graph_def grid [2, 1, 1] threads 128 forloop {{[0-9]+}} (%m, %wd, %r)
// OFF-NOT:     accumulate

// -----

// Kept as it is: the residual is an argument (no kernel writes it to start the accumulator),
// and the MLP's product is read by another kernel too.
func.func @kept(%x: tensor<1x64xbf16>, %g: tensor<64xbf16>, %wg: tensor<128x64xbf16>, %wu: tensor<128x64xbf16>, %wd: tensor<64x128xbf16>) -> (tensor<1x64xbf16>, tensor<1x128xbf16>) {
  %h = nn.rms_norm %x, %g {epsilon = 1.0e-05 : f32} : (tensor<1x64xbf16>, tensor<64xbf16>) -> tensor<1x64xbf16>
  %gt = nn.linear %h, %wg : (tensor<1x64xbf16>, tensor<128x64xbf16>) -> tensor<1x128xbf16>
  %u = nn.linear %h, %wu : (tensor<1x64xbf16>, tensor<128x64xbf16>) -> tensor<1x128xbf16>
  %s = nn.silu %gt : (tensor<1x128xbf16>) -> tensor<1x128xbf16>
  %m = nn.mul %s, %u : (tensor<1x128xbf16>, tensor<1x128xbf16>) -> tensor<1x128xbf16>
  %d = nn.linear %m, %wd : (tensor<1x128xbf16>, tensor<64x128xbf16>) -> tensor<1x64xbf16>
  %y = nn.add %x, %d : (tensor<1x64xbf16>, tensor<1x64xbf16>) -> tensor<1x64xbf16>
  func.return %y, %m : tensor<1x64xbf16>, tensor<1x128xbf16>
}
// CHECK-LABEL: func.func @kept
// CHECK-NOT:     accumulate
// CHECK:         %y = mugraph.graph_def grid [2, 1, 1] threads 128 forloop {{[0-9]+}} (%m, %wd, %x)
// CHECK-NOT:     accumulate
