// RUN: mk-opt %s --split-input-file -p 'task-simulate{seeds=4}' --verify-diagnostics | filecheck %s
// RUN: mk-opt %s --split-input-file -p 'task-simulate{seeds=2 max-delay=1}' --verify-diagnostics | filecheck %s --check-prefix=LOCKSTEP

// A three-kernel chain run twice (iterations 2): @a = exp(x) in 4 column tiles, @b = -@h in 2,
// @c = @h * @t whole. @h and @t live in the arena; @h_free / @t_free (distance 1) keep the
// next iteration's writers behind this iteration's readers. The valid graph passes unchanged.
task.graph @chain iterations 2 arena 4096 {
  task.buffer @x input 0 : tensor<8x64xf32>
  task.buffer @y output 0 : tensor<8x64xf32>
  task.buffer @h activation offset 0 : tensor<8x64xf32>
  task.buffer @t activation offset 2048 : tensor<8x64xf32>
  task.event @h_ready [2] count 2
  task.event @t_ready [1] count 2
  task.event @h_free [1] count 4
  task.event @t_free [1] count 1
  task.grid @a [4]
      reads(@x[(d0) -> (0, d0 * 16)] [8, 16])
      writes(@h[(d0) -> (0, d0 * 16)] [8, 16])
      waits(@h_free (d0) -> (0) distance 1)
      signals(@h_ready (d0) -> (d0 floordiv 2)) {
  ^bb0(%x: tensor<8x64xf32>, %h: tensor<8x64xf32>):
    %r = mugraph.graph_def grid [4, 1, 1] threads 128 forloop 1 (%x) : (tensor<8x64xf32>) -> tensor<8x64xf32> {
    ^bb0(%xa: tensor<8x64xf32>, %ra: tensor<8x64xf32>):
      %xt = mugraph.input %xa imap [1, -1, -1] fmap -1 : tensor<8x64xf32> -> tensor<8x16xf32>
      %e = mugraph.unary "exp" %xt : tensor<8x16xf32> -> tensor<8x16xf32>
      mugraph.output %e to %ra omap [1, -1, -1] : tensor<8x16xf32> -> tensor<8x64xf32>
    }
    task.yield %r : tensor<8x64xf32>
  }
  task.grid @b [2]
      reads(@h[(d0) -> (0, d0 * 32)] [8, 32])
      writes(@t[(d0) -> (0, d0 * 32)] [8, 32])
      waits(@h_ready (d0) -> (d0), @t_free (d0) -> (0) distance 1)
      signals(@t_ready (d0) -> (0), @h_free (d0) -> (0)) {
  ^bb0(%h: tensor<8x64xf32>, %t: tensor<8x64xf32>):
    %r = mugraph.graph_def grid [2, 1, 1] threads 128 forloop 1 (%h) : (tensor<8x64xf32>) -> tensor<8x64xf32> {
    ^bb0(%ha: tensor<8x64xf32>, %ra: tensor<8x64xf32>):
      %ht = mugraph.input %ha imap [1, -1, -1] fmap -1 : tensor<8x64xf32> -> tensor<8x32xf32>
      %n = mugraph.unary "neg" %ht : tensor<8x32xf32> -> tensor<8x32xf32>
      mugraph.output %n to %ra omap [1, -1, -1] : tensor<8x32xf32> -> tensor<8x64xf32>
    }
    task.yield %r : tensor<8x64xf32>
  }
  task.grid @c [1]
      reads(@h[(d0) -> (0, 0)] [8, 64], @t[(d0) -> (0, 0)] [8, 64])
      writes(@y[(d0) -> (0, 0)] [8, 64])
      waits(@t_ready (d0) -> (0), @h_ready (d0) -> (0), @h_ready (d0) -> (1))
      signals(@t_free (d0) -> (0), @h_free (d0) -> (0), @h_free (d0) -> (0)) {
  ^bb0(%h: tensor<8x64xf32>, %t: tensor<8x64xf32>, %y: tensor<8x64xf32>):
    %r = mugraph.kernel "mul" (%h, %t) : (tensor<8x64xf32>, tensor<8x64xf32>) -> tensor<8x64xf32>
    task.yield %r : tensor<8x64xf32>
  }
  task.schedule num_sms 2 {
    task.queue sm 0 [0, 2, 4, 6]
    task.queue sm 1 [1, 3, 5]
  }
}

// CHECK:      task.graph @chain iterations 2 arena 4096 {
// CHECK:        task.grid @a [4]
// CHECK:        task.schedule num_sms 2 {
// CHECK-NEXT:     task.queue sm 0 [0, 2, 4, 6]
// CHECK-NEXT:     task.queue sm 1 [1, 3, 5]
// LOCKSTEP:   task.graph @chain iterations 2 arena 4096 {

// -----

// Dropped wait: @b no longer waits for the @a tiles it reads (RAW).
task.graph @chain iterations 2 arena 4096 {
  task.buffer @x input 0 : tensor<8x64xf32>
  task.buffer @y output 0 : tensor<8x64xf32>
  task.buffer @h activation offset 0 : tensor<8x64xf32>
  task.buffer @t activation offset 2048 : tensor<8x64xf32>
  task.event @h_ready [2] count 2
  task.event @t_ready [1] count 2
  task.event @h_free [1] count 4
  task.event @t_free [1] count 1
  task.grid @a [4]
      reads(@x[(d0) -> (0, d0 * 16)] [8, 16])
      writes(@h[(d0) -> (0, d0 * 16)] [8, 16])
      waits(@h_free (d0) -> (0) distance 1)
      signals(@h_ready (d0) -> (d0 floordiv 2)) {
  ^bb0(%x: tensor<8x64xf32>, %h: tensor<8x64xf32>):
    %r = mugraph.graph_def grid [4, 1, 1] threads 128 forloop 1 (%x) : (tensor<8x64xf32>) -> tensor<8x64xf32> {
    ^bb0(%xa: tensor<8x64xf32>, %ra: tensor<8x64xf32>):
      %xt = mugraph.input %xa imap [1, -1, -1] fmap -1 : tensor<8x64xf32> -> tensor<8x16xf32>
      %e = mugraph.unary "exp" %xt : tensor<8x16xf32> -> tensor<8x16xf32>
      mugraph.output %e to %ra omap [1, -1, -1] : tensor<8x16xf32> -> tensor<8x64xf32>
    }
    task.yield %r : tensor<8x64xf32>
  }
// CHECK: task_simulate.mlir:[[# @LINE + 1]]:3: error: 'task.grid' task-simulate (seed {{[0-9]+}}): read-after-write: task {{[45]}} (@b[{{[01]}}]) of iteration {{[01]}} reads @h, which task {{[0-3]}} (@a[{{[0-3]}}]) of iteration {{[01]}} writes, {{.*}} (no event element task {{[45]}} (@b[{{[01]}}]) waits on at distance 0 is signalled by task {{[0-3]}} (@a[{{[0-3]}}]))
  task.grid @b [2]
      reads(@h[(d0) -> (0, d0 * 32)] [8, 32])
      writes(@t[(d0) -> (0, d0 * 32)] [8, 32])
      waits(@t_free (d0) -> (0) distance 1)
      signals(@t_ready (d0) -> (0), @h_free (d0) -> (0)) {
  ^bb0(%h: tensor<8x64xf32>, %t: tensor<8x64xf32>):
    %r = mugraph.graph_def grid [2, 1, 1] threads 128 forloop 1 (%h) : (tensor<8x64xf32>) -> tensor<8x64xf32> {
    ^bb0(%ha: tensor<8x64xf32>, %ra: tensor<8x64xf32>):
      %ht = mugraph.input %ha imap [1, -1, -1] fmap -1 : tensor<8x64xf32> -> tensor<8x32xf32>
      %n = mugraph.unary "neg" %ht : tensor<8x32xf32> -> tensor<8x32xf32>
      mugraph.output %n to %ra omap [1, -1, -1] : tensor<8x32xf32> -> tensor<8x64xf32>
    }
    task.yield %r : tensor<8x64xf32>
  }
  task.grid @c [1]
      reads(@h[(d0) -> (0, 0)] [8, 64], @t[(d0) -> (0, 0)] [8, 64])
      writes(@y[(d0) -> (0, 0)] [8, 64])
      waits(@t_ready (d0) -> (0), @h_ready (d0) -> (0), @h_ready (d0) -> (1))
      signals(@t_free (d0) -> (0), @h_free (d0) -> (0), @h_free (d0) -> (0)) {
  ^bb0(%h: tensor<8x64xf32>, %t: tensor<8x64xf32>, %y: tensor<8x64xf32>):
    %r = mugraph.kernel "mul" (%h, %t) : (tensor<8x64xf32>, tensor<8x64xf32>) -> tensor<8x64xf32>
    task.yield %r : tensor<8x64xf32>
  }
  task.schedule num_sms 2 {
    task.queue sm 0 [0, 2, 4, 6]
    task.queue sm 1 [1, 3, 5]
  }
}

// -----

// @t placed on @h's bytes while @h is still live (@c reads both): @b clobbers it (WAR).
task.graph @chain iterations 2 arena 4096 {
  task.buffer @x input 0 : tensor<8x64xf32>
  task.buffer @y output 0 : tensor<8x64xf32>
  task.buffer @h activation offset 0 : tensor<8x64xf32>
  task.buffer @t activation offset 0 : tensor<8x64xf32>
  task.event @h_ready [2] count 2
  task.event @t_ready [1] count 2
  task.event @h_free [1] count 4
  task.event @t_free [1] count 1
  task.grid @a [4]
      reads(@x[(d0) -> (0, d0 * 16)] [8, 16])
      writes(@h[(d0) -> (0, d0 * 16)] [8, 16])
      waits(@h_free (d0) -> (0) distance 1)
      signals(@h_ready (d0) -> (d0 floordiv 2)) {
  ^bb0(%x: tensor<8x64xf32>, %h: tensor<8x64xf32>):
    %r = mugraph.graph_def grid [4, 1, 1] threads 128 forloop 1 (%x) : (tensor<8x64xf32>) -> tensor<8x64xf32> {
    ^bb0(%xa: tensor<8x64xf32>, %ra: tensor<8x64xf32>):
      %xt = mugraph.input %xa imap [1, -1, -1] fmap -1 : tensor<8x64xf32> -> tensor<8x16xf32>
      %e = mugraph.unary "exp" %xt : tensor<8x16xf32> -> tensor<8x16xf32>
      mugraph.output %e to %ra omap [1, -1, -1] : tensor<8x16xf32> -> tensor<8x64xf32>
    }
    task.yield %r : tensor<8x64xf32>
  }
// CHECK: task_simulate.mlir:[[# @LINE + 1]]:3: error: 'task.grid' task-simulate (seed 0): write-after-read: task 4 (@b[0]) of iteration 0 overwrote @h[0, 0] before task 6 (@c[0]) of iteration 0 read it (it expected the value of task 0 (@a[0]) of iteration 0;
  task.grid @b [2]
      reads(@h[(d0) -> (0, d0 * 32)] [8, 32])
      writes(@t[(d0) -> (0, d0 * 32)] [8, 32])
      waits(@h_ready (d0) -> (d0), @t_free (d0) -> (0) distance 1)
      signals(@t_ready (d0) -> (0), @h_free (d0) -> (0)) {
  ^bb0(%h: tensor<8x64xf32>, %t: tensor<8x64xf32>):
    %r = mugraph.graph_def grid [2, 1, 1] threads 128 forloop 1 (%h) : (tensor<8x64xf32>) -> tensor<8x64xf32> {
    ^bb0(%ha: tensor<8x64xf32>, %ra: tensor<8x64xf32>):
      %ht = mugraph.input %ha imap [1, -1, -1] fmap -1 : tensor<8x64xf32> -> tensor<8x32xf32>
      %n = mugraph.unary "neg" %ht : tensor<8x32xf32> -> tensor<8x32xf32>
      mugraph.output %n to %ra omap [1, -1, -1] : tensor<8x32xf32> -> tensor<8x64xf32>
    }
    task.yield %r : tensor<8x64xf32>
  }
  task.grid @c [1]
      reads(@h[(d0) -> (0, 0)] [8, 64], @t[(d0) -> (0, 0)] [8, 64])
      writes(@y[(d0) -> (0, 0)] [8, 64])
      waits(@t_ready (d0) -> (0), @h_ready (d0) -> (0), @h_ready (d0) -> (1))
      signals(@t_free (d0) -> (0), @h_free (d0) -> (0), @h_free (d0) -> (0)) {
  ^bb0(%h: tensor<8x64xf32>, %t: tensor<8x64xf32>, %y: tensor<8x64xf32>):
    %r = mugraph.kernel "mul" (%h, %t) : (tensor<8x64xf32>, tensor<8x64xf32>) -> tensor<8x64xf32>
    task.yield %r : tensor<8x64xf32>
  }
  task.schedule num_sms 2 {
    task.queue sm 0 [0, 2, 4, 6]
    task.queue sm 1 [1, 3, 5]
  }
}

// -----

// Swapped queue entries: SM 0 runs consumer @c before producer @a[2] (deadlock).
task.graph @chain iterations 2 arena 4096 {
  task.buffer @x input 0 : tensor<8x64xf32>
  task.buffer @y output 0 : tensor<8x64xf32>
  task.buffer @h activation offset 0 : tensor<8x64xf32>
  task.buffer @t activation offset 2048 : tensor<8x64xf32>
  task.event @h_ready [2] count 2
// CHECK: task_simulate.mlir:[[# @LINE + 1]]:3: error: 'task.event' task-simulate (seed 0): deadlock: no SM can progress: SM 0 at task 6 (@c[0]) of iteration 0 waits on @t_ready[0] (counter 0, needs 2); SM 1 at task 5 (@b[1]) of iteration 0 waits on @h_ready[1] (counter 1, needs 2)
  task.event @t_ready [1] count 2
  task.event @h_free [1] count 4
  task.event @t_free [1] count 1
  task.grid @a [4]
      reads(@x[(d0) -> (0, d0 * 16)] [8, 16])
      writes(@h[(d0) -> (0, d0 * 16)] [8, 16])
      waits(@h_free (d0) -> (0) distance 1)
      signals(@h_ready (d0) -> (d0 floordiv 2)) {
  ^bb0(%x: tensor<8x64xf32>, %h: tensor<8x64xf32>):
    %r = mugraph.graph_def grid [4, 1, 1] threads 128 forloop 1 (%x) : (tensor<8x64xf32>) -> tensor<8x64xf32> {
    ^bb0(%xa: tensor<8x64xf32>, %ra: tensor<8x64xf32>):
      %xt = mugraph.input %xa imap [1, -1, -1] fmap -1 : tensor<8x64xf32> -> tensor<8x16xf32>
      %e = mugraph.unary "exp" %xt : tensor<8x16xf32> -> tensor<8x16xf32>
      mugraph.output %e to %ra omap [1, -1, -1] : tensor<8x16xf32> -> tensor<8x64xf32>
    }
    task.yield %r : tensor<8x64xf32>
  }
  task.grid @b [2]
      reads(@h[(d0) -> (0, d0 * 32)] [8, 32])
      writes(@t[(d0) -> (0, d0 * 32)] [8, 32])
      waits(@h_ready (d0) -> (d0), @t_free (d0) -> (0) distance 1)
      signals(@t_ready (d0) -> (0), @h_free (d0) -> (0)) {
  ^bb0(%h: tensor<8x64xf32>, %t: tensor<8x64xf32>):
    %r = mugraph.graph_def grid [2, 1, 1] threads 128 forloop 1 (%h) : (tensor<8x64xf32>) -> tensor<8x64xf32> {
    ^bb0(%ha: tensor<8x64xf32>, %ra: tensor<8x64xf32>):
      %ht = mugraph.input %ha imap [1, -1, -1] fmap -1 : tensor<8x64xf32> -> tensor<8x32xf32>
      %n = mugraph.unary "neg" %ht : tensor<8x32xf32> -> tensor<8x32xf32>
      mugraph.output %n to %ra omap [1, -1, -1] : tensor<8x32xf32> -> tensor<8x64xf32>
    }
    task.yield %r : tensor<8x64xf32>
  }
  task.grid @c [1]
      reads(@h[(d0) -> (0, 0)] [8, 64], @t[(d0) -> (0, 0)] [8, 64])
      writes(@y[(d0) -> (0, 0)] [8, 64])
      waits(@t_ready (d0) -> (0), @h_ready (d0) -> (0), @h_ready (d0) -> (1))
      signals(@t_free (d0) -> (0), @h_free (d0) -> (0), @h_free (d0) -> (0)) {
  ^bb0(%h: tensor<8x64xf32>, %t: tensor<8x64xf32>, %y: tensor<8x64xf32>):
    %r = mugraph.kernel "mul" (%h, %t) : (tensor<8x64xf32>, tensor<8x64xf32>) -> tensor<8x64xf32>
    task.yield %r : tensor<8x64xf32>
  }
  task.schedule num_sms 2 {
    task.queue sm 0 [0, 6, 4, 2]
    task.queue sm 1 [1, 3, 5]
  }
}

// -----

// Shrunk footprint: @b's kernel reads 32 columns of @h, its footprint says 16.
task.graph @chain iterations 2 arena 4096 {
  task.buffer @x input 0 : tensor<8x64xf32>
  task.buffer @y output 0 : tensor<8x64xf32>
  task.buffer @h activation offset 0 : tensor<8x64xf32>
  task.buffer @t activation offset 2048 : tensor<8x64xf32>
  task.event @h_ready [2] count 2
  task.event @t_ready [1] count 2
  task.event @h_free [1] count 4
  task.event @t_free [1] count 1
  task.grid @a [4]
      reads(@x[(d0) -> (0, d0 * 16)] [8, 16])
      writes(@h[(d0) -> (0, d0 * 16)] [8, 16])
      waits(@h_free (d0) -> (0) distance 1)
      signals(@h_ready (d0) -> (d0 floordiv 2)) {
  ^bb0(%x: tensor<8x64xf32>, %h: tensor<8x64xf32>):
    %r = mugraph.graph_def grid [4, 1, 1] threads 128 forloop 1 (%x) : (tensor<8x64xf32>) -> tensor<8x64xf32> {
    ^bb0(%xa: tensor<8x64xf32>, %ra: tensor<8x64xf32>):
      %xt = mugraph.input %xa imap [1, -1, -1] fmap -1 : tensor<8x64xf32> -> tensor<8x16xf32>
      %e = mugraph.unary "exp" %xt : tensor<8x16xf32> -> tensor<8x16xf32>
      mugraph.output %e to %ra omap [1, -1, -1] : tensor<8x16xf32> -> tensor<8x64xf32>
    }
    task.yield %r : tensor<8x64xf32>
  }
// CHECK: task_simulate.mlir:[[# @LINE + 1]]:3: error: 'task.grid' task-simulate (the sequential run): task 4 (@b[0]) reads outside its read footprint of @h: its writes change when it sees the whole buffer
  task.grid @b [2]
      reads(@h[(d0) -> (0, d0 * 32)] [8, 16])
      writes(@t[(d0) -> (0, d0 * 32)] [8, 32])
      waits(@h_ready (d0) -> (d0), @t_free (d0) -> (0) distance 1)
      signals(@t_ready (d0) -> (0), @h_free (d0) -> (0)) {
  ^bb0(%h: tensor<8x64xf32>, %t: tensor<8x64xf32>):
    %r = mugraph.graph_def grid [2, 1, 1] threads 128 forloop 1 (%h) : (tensor<8x64xf32>) -> tensor<8x64xf32> {
    ^bb0(%ha: tensor<8x64xf32>, %ra: tensor<8x64xf32>):
      %ht = mugraph.input %ha imap [1, -1, -1] fmap -1 : tensor<8x64xf32> -> tensor<8x32xf32>
      %n = mugraph.unary "neg" %ht : tensor<8x32xf32> -> tensor<8x32xf32>
      mugraph.output %n to %ra omap [1, -1, -1] : tensor<8x32xf32> -> tensor<8x64xf32>
    }
    task.yield %r : tensor<8x64xf32>
  }
  task.grid @c [1]
      reads(@h[(d0) -> (0, 0)] [8, 64], @t[(d0) -> (0, 0)] [8, 64])
      writes(@y[(d0) -> (0, 0)] [8, 64])
      waits(@t_ready (d0) -> (0), @h_ready (d0) -> (0), @h_ready (d0) -> (1))
      signals(@t_free (d0) -> (0), @h_free (d0) -> (0), @h_free (d0) -> (0)) {
  ^bb0(%h: tensor<8x64xf32>, %t: tensor<8x64xf32>, %y: tensor<8x64xf32>):
    %r = mugraph.kernel "mul" (%h, %t) : (tensor<8x64xf32>, tensor<8x64xf32>) -> tensor<8x64xf32>
    task.yield %r : tensor<8x64xf32>
  }
  task.schedule num_sms 2 {
    task.queue sm 0 [0, 2, 4, 6]
    task.queue sm 1 [1, 3, 5]
  }
}

// -----

// Grown write footprint: each @b task claims all of @t, but its block makes half of it.
task.graph @chain iterations 2 arena 4096 {
  task.buffer @x input 0 : tensor<8x64xf32>
  task.buffer @y output 0 : tensor<8x64xf32>
  task.buffer @h activation offset 0 : tensor<8x64xf32>
  task.buffer @t activation offset 2048 : tensor<8x64xf32>
  task.event @h_ready [2] count 2
  task.event @t_ready [1] count 2
  task.event @h_free [1] count 4
  task.event @t_free [1] count 1
  task.grid @a [4]
      reads(@x[(d0) -> (0, d0 * 16)] [8, 16])
      writes(@h[(d0) -> (0, d0 * 16)] [8, 16])
      waits(@h_free (d0) -> (0) distance 1)
      signals(@h_ready (d0) -> (d0 floordiv 2)) {
  ^bb0(%x: tensor<8x64xf32>, %h: tensor<8x64xf32>):
    %r = mugraph.graph_def grid [4, 1, 1] threads 128 forloop 1 (%x) : (tensor<8x64xf32>) -> tensor<8x64xf32> {
    ^bb0(%xa: tensor<8x64xf32>, %ra: tensor<8x64xf32>):
      %xt = mugraph.input %xa imap [1, -1, -1] fmap -1 : tensor<8x64xf32> -> tensor<8x16xf32>
      %e = mugraph.unary "exp" %xt : tensor<8x16xf32> -> tensor<8x16xf32>
      mugraph.output %e to %ra omap [1, -1, -1] : tensor<8x16xf32> -> tensor<8x64xf32>
    }
    task.yield %r : tensor<8x64xf32>
  }
// CHECK: task_simulate.mlir:[[# @LINE + 1]]:3: error: 'task.grid' task-simulate (the sequential run): task 4 (@b[0]) writes @t[0, 32], which its kernel does not produce: the write footprint is larger than the task's tile
  task.grid @b [2]
      reads(@h[(d0) -> (0, d0 * 32)] [8, 32])
      writes(@t[(d0) -> (0, 0)] [8, 64])
      waits(@h_ready (d0) -> (d0), @t_free (d0) -> (0) distance 1)
      signals(@t_ready (d0) -> (0), @h_free (d0) -> (0)) {
  ^bb0(%h: tensor<8x64xf32>, %t: tensor<8x64xf32>):
    %r = mugraph.graph_def grid [2, 1, 1] threads 128 forloop 1 (%h) : (tensor<8x64xf32>) -> tensor<8x64xf32> {
    ^bb0(%ha: tensor<8x64xf32>, %ra: tensor<8x64xf32>):
      %ht = mugraph.input %ha imap [1, -1, -1] fmap -1 : tensor<8x64xf32> -> tensor<8x32xf32>
      %n = mugraph.unary "neg" %ht : tensor<8x32xf32> -> tensor<8x32xf32>
      mugraph.output %n to %ra omap [1, -1, -1] : tensor<8x32xf32> -> tensor<8x64xf32>
    }
    task.yield %r : tensor<8x64xf32>
  }
  task.grid @c [1]
      reads(@h[(d0) -> (0, 0)] [8, 64], @t[(d0) -> (0, 0)] [8, 64])
      writes(@y[(d0) -> (0, 0)] [8, 64])
      waits(@t_ready (d0) -> (0), @h_ready (d0) -> (0), @h_ready (d0) -> (1))
      signals(@t_free (d0) -> (0), @h_free (d0) -> (0), @h_free (d0) -> (0)) {
  ^bb0(%h: tensor<8x64xf32>, %t: tensor<8x64xf32>, %y: tensor<8x64xf32>):
    %r = mugraph.kernel "mul" (%h, %t) : (tensor<8x64xf32>, tensor<8x64xf32>) -> tensor<8x64xf32>
    task.yield %r : tensor<8x64xf32>
  }
  task.schedule num_sms 2 {
    task.queue sm 0 [0, 2, 4, 6]
    task.queue sm 1 [1, 3, 5]
  }
}

// -----

// Not scheduled yet.
// CHECK: task_simulate.mlir:[[# @LINE + 1]]:1: error: 'task.graph' @chain has no task.schedule: run task-schedule first
task.graph @chain iterations 2 arena 4096 {
  task.buffer @x input 0 : tensor<8x64xf32>
  task.buffer @y output 0 : tensor<8x64xf32>
  task.buffer @h activation offset 0 : tensor<8x64xf32>
  task.buffer @t activation offset 2048 : tensor<8x64xf32>
  task.event @h_ready [2] count 2
  task.event @t_ready [1] count 2
  task.event @h_free [1] count 4
  task.event @t_free [1] count 1
  task.grid @a [4]
      reads(@x[(d0) -> (0, d0 * 16)] [8, 16])
      writes(@h[(d0) -> (0, d0 * 16)] [8, 16])
      waits(@h_free (d0) -> (0) distance 1)
      signals(@h_ready (d0) -> (d0 floordiv 2)) {
  ^bb0(%x: tensor<8x64xf32>, %h: tensor<8x64xf32>):
    %r = mugraph.graph_def grid [4, 1, 1] threads 128 forloop 1 (%x) : (tensor<8x64xf32>) -> tensor<8x64xf32> {
    ^bb0(%xa: tensor<8x64xf32>, %ra: tensor<8x64xf32>):
      %xt = mugraph.input %xa imap [1, -1, -1] fmap -1 : tensor<8x64xf32> -> tensor<8x16xf32>
      %e = mugraph.unary "exp" %xt : tensor<8x16xf32> -> tensor<8x16xf32>
      mugraph.output %e to %ra omap [1, -1, -1] : tensor<8x16xf32> -> tensor<8x64xf32>
    }
    task.yield %r : tensor<8x64xf32>
  }
  task.grid @b [2]
      reads(@h[(d0) -> (0, d0 * 32)] [8, 32])
      writes(@t[(d0) -> (0, d0 * 32)] [8, 32])
      waits(@h_ready (d0) -> (d0), @t_free (d0) -> (0) distance 1)
      signals(@t_ready (d0) -> (0), @h_free (d0) -> (0)) {
  ^bb0(%h: tensor<8x64xf32>, %t: tensor<8x64xf32>):
    %r = mugraph.graph_def grid [2, 1, 1] threads 128 forloop 1 (%h) : (tensor<8x64xf32>) -> tensor<8x64xf32> {
    ^bb0(%ha: tensor<8x64xf32>, %ra: tensor<8x64xf32>):
      %ht = mugraph.input %ha imap [1, -1, -1] fmap -1 : tensor<8x64xf32> -> tensor<8x32xf32>
      %n = mugraph.unary "neg" %ht : tensor<8x32xf32> -> tensor<8x32xf32>
      mugraph.output %n to %ra omap [1, -1, -1] : tensor<8x32xf32> -> tensor<8x64xf32>
    }
    task.yield %r : tensor<8x64xf32>
  }
  task.grid @c [1]
      reads(@h[(d0) -> (0, 0)] [8, 64], @t[(d0) -> (0, 0)] [8, 64])
      writes(@y[(d0) -> (0, 0)] [8, 64])
      waits(@t_ready (d0) -> (0), @h_ready (d0) -> (0), @h_ready (d0) -> (1))
      signals(@t_free (d0) -> (0), @h_free (d0) -> (0), @h_free (d0) -> (0)) {
  ^bb0(%h: tensor<8x64xf32>, %t: tensor<8x64xf32>, %y: tensor<8x64xf32>):
    %r = mugraph.kernel "mul" (%h, %t) : (tensor<8x64xf32>, tensor<8x64xf32>) -> tensor<8x64xf32>
    task.yield %r : tensor<8x64xf32>
  }
}
