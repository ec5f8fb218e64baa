// RUN: mk-opt %s --split-input-file --verify-diagnostics -p mugraph-to-task | filecheck %s
// RUN: mk-opt %s --split-input-file --verify-diagnostics -p 'mugraph-to-task{iterations=2}' | filecheck %s --check-prefix=ITER
// RUN: mk-opt %s --split-input-file --verify-diagnostics -p 'mugraph-to-task{iterations=2 merge-events=false}' | filecheck %s --check-prefix=NOMERGE
// RUN: mk-opt %S/../../../examples/rmsnorm_linear.mlir -p nn-to-mugraph,mugraph-to-task | filecheck %s --check-prefix=RMS
// RUN: mk-opt %S/../../../examples/decode_loop.mlir -p 'nn-to-mugraph,mugraph-append-writes,mugraph-fuse-loop,mugraph-fuse-accumulate,mugraph-split-loop,mugraph-fuse-epilogue,mugraph-to-task{flag-rows=true}' | filecheck %s --check-prefix=ROWS
// RUN: mk-opt %S/../../../examples/decode_loop.mlir -p 'nn-to-mugraph,mugraph-append-writes,mugraph-fuse-loop,mugraph-fuse-accumulate,mugraph-split-loop,mugraph-fuse-epilogue,mugraph-to-task' | filecheck %s --check-prefix=NOROWS

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

// CHECK:      task.graph @chain iterations 1 arena 16384 {
// CHECK-NEXT:   task.buffer @x input 0 : tensor<8x256xf32>
// CHECK-NEXT:   task.buffer @s output 0 : tensor<8x256xf32>
// CHECK-NEXT:   task.buffer @result1 output 1 : tensor<8x256xf32>
// CHECK-NEXT:   task.buffer @result2 output 2 : tensor<8x256xf32>
// CHECK-NEXT:   task.buffer @a activation offset 0 : tensor<8x256xf32>
// CHECK-NEXT:   task.buffer @b activation offset 8192 : tensor<8x256xf32>
// CHECK-NEXT:   task.buffer @c activation offset 0 : tensor<8x256xf32>
// CHECK-NEXT:   task.buffer @d activation offset 8192 : tensor<8x256xf32>
// CHECK-NEXT:   task.event @k0_a_done [4] count 1
// CHECK-NEXT:   task.event @k1_b_done [2] count 2
// CHECK-NEXT:   task.event @k2_c_done [2] count 1
// CHECK-NEXT:   task.event @k3_d_done [1] count 8
// CHECK-NEXT:   task.event @k4_s_done [1] count 1
// CHECK-NEXT:   task.grid @k0_a [4]
// CHECK-NEXT:       reads(@x[(d0) -> (0, d0 * 64)] [8, 64])
// CHECK-NEXT:       writes(@a[(d0) -> (0, d0 * 64)] [8, 64])
// CHECK-NEXT:       signals(@k0_a_done (d0) -> (d0))
// CHECK-NEXT:       cost(bytes = 4096, flops = 2048) {
// CHECK-NEXT:   ^bb0(%x: tensor<8x256xf32>, %a: tensor<8x256xf32>):
// CHECK-NEXT:     %a_1 = mugraph.graph_def grid [4, 1, 1] threads 128 forloop 1 (%x)
// CHECK:          task.yield %a_1 : tensor<8x256xf32>
// CHECK:        task.grid @k1_b [4]
// CHECK-NEXT:       reads(@a[(d0) -> (0, d0 * 64)] [8, 64])
// CHECK-NEXT:       writes(@b[(d0) -> (0, d0 * 64)] [8, 64])
// CHECK-NEXT:       waits(@k0_a_done (d0) -> (d0))
// CHECK-NEXT:       signals(@k1_b_done (d0) -> (d0 floordiv 2))
// CHECK:        task.grid @k2_c [2]
// CHECK-NEXT:       reads(@b[(d0) -> (0, d0 * 128)] [8, 128])
// CHECK-NEXT:       writes(@c[(d0) -> (0, d0 * 128)] [8, 128])
// CHECK-NEXT:       waits(@k1_b_done (d0) -> (d0))
// CHECK-NEXT:       signals(@k2_c_done (d0) -> (d0))
// CHECK:        task.grid @k3_d [8]
// CHECK-NEXT:       reads(@c[(d0) -> (0, d0 * 32)] [8, 32])
// CHECK-NEXT:       writes(@d[(d0) -> (0, d0 * 32)] [8, 32])
// CHECK-NEXT:       waits(@k2_c_done (d0) -> (d0 floordiv 4))
// CHECK-NEXT:       signals(@k3_d_done (d0) -> (0))
// CHECK:        task.grid @k4_s [1]
// CHECK-NEXT:       reads(@d[(d0) -> (0, 0)] [8, 256])
// CHECK-NEXT:       writes(@s[(d0) -> (0, 0)] [8, 256])
// CHECK-NEXT:       waits(@k3_d_done (d0) -> (0))
// CHECK-NEXT:       signals(@k4_s_done (d0) -> (0))
// CHECK-NEXT:       cost(bytes = 16384, flops = 16384) {
// CHECK-NEXT:   ^bb0(%d: tensor<8x256xf32>, %s: tensor<8x256xf32>):
// CHECK-NEXT:     %s_1 = mugraph.kernel "softmax" (%d) {dim = -1 : i64} : (tensor<8x256xf32>) -> tensor<8x256xf32>
// CHECK-NEXT:     task.yield %s_1 : tensor<8x256xf32>
// CHECK-NEXT:   }
// CHECK-NEXT:   task.grid @k5_copy_result1 [1]
// CHECK-NEXT:       reads(@x[(d0) -> (0, 0)] [8, 256])
// CHECK-NEXT:       writes(@result1[(d0) -> (0, 0)] [8, 256])
// CHECK-NEXT:       cost(bytes = 16384, flops = 0) {
// CHECK-NEXT:   ^bb0(%x: tensor<8x256xf32>, %result1: tensor<8x256xf32>):
// CHECK-NEXT:     %0 = mugraph.kernel "reshape" (%x) : (tensor<8x256xf32>) -> tensor<8x256xf32>
// CHECK-NEXT:     task.yield %0 : tensor<8x256xf32>
// CHECK-NEXT:   }
// CHECK-NEXT:   task.grid @k6_copy_result2 [1]
// CHECK-NEXT:       reads(@s[(d0) -> (0, 0)] [8, 256])
// CHECK-NEXT:       writes(@result2[(d0) -> (0, 0)] [8, 256])
// CHECK-NEXT:       waits(@k4_s_done (d0) -> (0))

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

// CHECK:      task.graph @split iterations 1 arena 8192 {
// CHECK-NEXT:   task.buffer @x input 0 : tensor<8x64xf32>
// CHECK-NEXT:   task.buffer @y output 0 : tensor<8x64xf32>
// CHECK-NEXT:   task.buffer @p workspace offset 0 : tensor<4x8x64xf32>
// CHECK-NEXT:   task.event @k0_p_done [2] count 4
// CHECK-NEXT:   task.grid @k0_p [2, 4]
// CHECK-NEXT:       reads(@x[(d0, d1) -> (d0 * 4, 0)] [4, 64])
// CHECK-NEXT:       writes(@p[(d0, d1) -> (d1, d0 * 4, 0)] [1, 4, 64])
// CHECK-NEXT:       signals(@k0_p_done (d0, d1) -> (d0))
// CHECK:        task.grid @k1_y [2]
// CHECK-NEXT:       reads(@p[(d0) -> (0, d0 * 4, 0)] [4, 4, 64])
// CHECK-NEXT:       writes(@y[(d0) -> (d0 * 4, 0)] [4, 64])
// CHECK-NEXT:       waits(@k0_p_done (d0) -> (d0))

// -----

func.func @callee(%x: tensor<4xf32>) -> tensor<4xf32> {
  func.return %x : tensor<4xf32>
}
func.func @caller(%x: tensor<4xf32>) -> tensor<4xf32> {
  %y = mugraph.kernel "exp" (%x) : (tensor<4xf32>) -> tensor<4xf32>
  // CHECK: mugraph_to_task.mlir:[[# @LINE + 1]]:3: error: 'func.call' is not a mugraph kernel: mugraph-to-task lowers kernel graphs only
  %z = func.call @callee(%y) : (tensor<4xf32>) -> tensor<4xf32>
  func.return %z : tensor<4xf32>
}

// Two iterations: each writer also waits (distance 1) for the previous iteration's last
// readers of its bytes: @a's bytes are @c's, read by @k3_d tiles 2*d0 and 2*d0+1.
// ITER:      task.graph @chain iterations 2 arena 16384 {
// ITER:        task.event @k3_d_done [1] count 8
// ITER-NEXT:   task.event @k4_s_done [1] count 1
// ITER-NEXT:   task.event @k3_d_done_1 [4] count 2
// ITER-NEXT:   task.event @k6_copy_result2_done [1] count 1
// ITER-NEXT:   task.grid @k0_a [4]
// ITER:            waits(@k3_d_done_1 (d0) -> (d0) distance 1)
// ITER-NEXT:       signals(@k0_a_done (d0) -> (d0))
// ITER:        task.grid @k1_b [4]
// ITER:            waits(@k0_a_done (d0) -> (d0), @k4_s_done (d0) -> (0) distance 1)
// ITER:        task.grid @k3_d [8]
// ITER:            signals(@k3_d_done (d0) -> (0), @k3_d_done_1 (d0) -> (d0 floordiv 2))
// ITER:        task.grid @k4_s [1]
// ITER:            waits(@k3_d_done (d0) -> (0), @k6_copy_result2_done (d0) -> (0) distance 1)
// ITER-NEXT:       signals(@k4_s_done (d0) -> (0))
// ITER:      task.graph @split iterations 2

// Without merging, @k4_s's readers get one event each (the copy task and @k1_b's next iteration).
// NOMERGE:      task.event @k4_s_done [1] count 1
// NOMERGE-NEXT: task.event @k3_d_done_1 [4] count 2
// NOMERGE-NEXT: task.event @k4_s_done_1 [1] count 1
// NOMERGE:      waits(@k0_a_done (d0) -> (d0), @k4_s_done_1 (d0) -> (0) distance 1)
// NOMERGE:      signals(@k4_s_done (d0) -> (0), @k4_s_done_1 (d0) -> (0))

// RMS:      task.graph @rmsnorm_linear iterations 1 arena 0 {
// RMS-NEXT:   task.buffer @x input 0 : tensor<8x512xbf16>
// RMS-NEXT:   task.buffer @g weight 1 : tensor<512xbf16>
// RMS-NEXT:   task.buffer @w weight 2 : tensor<1024x512xbf16>
// RMS-NEXT:   task.buffer @y output 0 : tensor<8x1024xbf16>
// RMS-NEXT:   task.grid @k0_y [16]
// RMS-NEXT:       reads(@x[(d0) -> (0, 0)] [8, 512], @g[(d0) -> (0)] [512], @w[(d0) -> (d0 * 64, 0)] [64, 512])
// RMS-NEXT:       writes(@y[(d0) -> (0, d0 * 64)] [8, 64])
// RMS-NEXT:       prefetch(@g, @w)
// RMS-NEXT:       cost(bytes = {{[0-9]+}}, flops = {{[0-9]+}}) {
// RMS-NEXT:   ^bb0(%x: tensor<8x512xbf16>, %g: tensor<512xbf16>, %w: tensor<1024x512xbf16>, %y: tensor<8x1024xbf16>):
// RMS-NEXT:     %y_1 = mugraph.graph_def grid [16, 1, 1] threads 128 forloop 8 (%x, %g, %w)
// RMS:          task.yield %y_1 : tensor<8x1024xbf16>

// flag-rows: the attention's query rows and the new K/V rows are flagged buffers; its wait on
// the projection that writes them is a flagged event (a backend polls the words instead), and so
// are the cache writes' waits on the new rows. Without the option nothing is flagged.
// ROWS:       task.buffer @q activation flagged
// ROWS:       task.buffer @k4 activation flagged
// ROWS:       task.buffer @v4 activation flagged
// ROWS:       task.event @k6_q_flags [1] count 1 flagged
// The projection's reads are over once the attention saw its flags: the next step's write of
// x (its input) and the logits' write over x's arena bytes need no wait on it, so it signals
// only its flagged event.
// ROWS-LABEL: task.grid @k3_x
// ROWS:         waits(@k0_p_done (d0) -> (0), @k12_tokens_done (d0) -> (0) distance 1)
// ROWS-LABEL: task.grid @k6_q
// ROWS:         signals(@k6_q_flags (d0) -> (0))
// The attention's flagged read of q implies nothing of what q waited for: it waits for x itself
// (one wait met long before, where its q wait implied x's ancestors).
// ROWS-LABEL: task.grid @k7_att2
// ROWS:         waits(@k2_kv_len_done (d0, d1, d2) -> (0), @k3_x_done (d0, d1, d2) -> (0), @k4_c_done (d0, d1, d2) -> (0), @k5_s_done (d0, d1, d2) -> (0), @k6_q_flags (d0, d1, d2) -> (0))
// ROWS-LABEL: task.grid @k8_k_cache
// ROWS:         waits(@k6_q_flags (d0, d1) -> (0), @k7_att2_done
// ROWS-LABEL: task.grid @k9_v_cache
// ROWS:         waits(@k6_q_flags (d0) -> (0), @k7_att2_done_1
// ROWS-LABEL: task.grid @k11_logits
// ROWS:         waits(@k10_r_done (d0) -> (0))
// NOROWS-NOT: flagged
