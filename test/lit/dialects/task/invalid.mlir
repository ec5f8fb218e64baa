// RUN: mk-opt %s --split-input-file --verify-diagnostics --parsing-diagnostics | filecheck %s

// Each chunk breaks one rule of the task dialect; the error names the op, the symbol and the
// mismatch, at the line of the offending op (or of the bad token for syntax errors).

task.graph @g iterations 1 arena 0 {
  task.buffer @a input 0 : tensor<64xf32>
  task.buffer @b output 0 : tensor<64xf32>
  // CHECK: invalid.mlir:[[# @LINE + 1]]:3: error: 'task.grid' reads @a: out of bounds: task [3] covers [60:76] of a 64 buffer
  task.grid @k [4]
      reads(@a[(d0) -> (d0 * 20)] [16])
      writes(@b[(d0) -> (d0 * 16)] [16]) {
  ^bb0(%a: tensor<64xf32>, %b: tensor<64xf32>):
    task.yield %b : tensor<64xf32>
  }
}

// -----

task.graph @g iterations 1 arena 0 {
  task.buffer @a input 0 : tensor<64xf32>
  task.buffer @b output 0 : tensor<64xf32>
  // CHECK: invalid.mlir:[[# @LINE + 1]]:3: error: 'task.grid' reads @a: map (d0, d1) -> (d0 * 16) takes 2 coordinates, but the grid has rank 1
  task.grid @k [4]
      reads(@a[(d0, d1) -> (d0 * 16)] [16])
      writes(@b[(d0) -> (d0 * 16)] [16]) {
  ^bb0(%a: tensor<64xf32>, %b: tensor<64xf32>):
    task.yield %b : tensor<64xf32>
  }
}

// -----

task.graph @g iterations 1 arena 0 {
  task.buffer @a input 0 : tensor<64x64xf32>
  task.buffer @b output 0 : tensor<64xf32>
  // CHECK: invalid.mlir:[[# @LINE + 1]]:3: error: 'task.grid' reads @a: map gives 1 and sizes give 1 coordinates, but the buffer has rank 2
  task.grid @k [4]
      reads(@a[(d0) -> (d0 * 16)] [16])
      writes(@b[(d0) -> (d0 * 16)] [16]) {
  ^bb0(%a: tensor<64x64xf32>, %b: tensor<64xf32>):
    task.yield %b : tensor<64xf32>
  }
}

// -----

task.graph @g iterations 1 arena 0 {
  task.buffer @a input 0 : tensor<64xf32>
  task.buffer @b output 0 : tensor<64xf32>
  // CHECK: invalid.mlir:[[# @LINE + 1]]:3: error: 'task.event' @e has no producer: no task.grid signals it
  task.event @e [4] count 1
  task.grid @k [4]
      reads(@a[(d0) -> (d0 * 16)] [16])
      writes(@b[(d0) -> (d0 * 16)] [16])
      waits(@e (d0) -> (d0)) {
  ^bb0(%a: tensor<64xf32>, %b: tensor<64xf32>):
    task.yield %b : tensor<64xf32>
  }
}

// -----

task.graph @g iterations 1 arena 0 {
  task.buffer @a input 0 : tensor<64xf32>
  task.buffer @b output 0 : tensor<64xf32>
  // CHECK: invalid.mlir:[[# @LINE + 1]]:3: error: 'task.event' @e has no consumer: no task.grid waits on it
  task.event @e [4] count 1
  task.grid @k [4]
      reads(@a[(d0) -> (d0 * 16)] [16])
      writes(@b[(d0) -> (d0 * 16)] [16])
      signals(@e (d0) -> (d0)) {
  ^bb0(%a: tensor<64xf32>, %b: tensor<64xf32>):
    task.yield %b : tensor<64xf32>
  }
}

// -----

task.graph @g iterations 1 arena 0 {
  task.buffer @a input 0 : tensor<64xf32>
  task.buffer @b output 0 : tensor<64xf32>
  // CHECK: invalid.mlir:[[# @LINE + 1]]:3: error: 'task.event' count 1 of @e does not match its producers: element [0] is signalled by 2 tasks per iteration
  task.event @e [2] count 1
  task.grid @p [4]
      reads(@a[(d0) -> (d0 * 16)] [16])
      signals(@e (d0) -> (d0 floordiv 2)) {
  ^bb0(%a: tensor<64xf32>):
    task.yield
  }
  task.grid @c [2]
      writes(@b[(d0) -> (d0 * 32)] [32])
      waits(@e (d0) -> (d0)) {
  ^bb0(%b: tensor<64xf32>):
    task.yield %b : tensor<64xf32>
  }
}

// -----

task.graph @g iterations 1 arena 0 {
  task.buffer @a input 0 : tensor<64xf32>
  task.buffer @b output 0 : tensor<64xf32>
  // CHECK: invalid.mlir:[[# @LINE + 1]]:3: error: 'task.event' count 2 of @e does not match its producers: element [2] is signalled by 0 tasks per iteration
  task.event @e [3] count 2
  task.grid @p [4]
      reads(@a[(d0) -> (d0 * 16)] [16])
      signals(@e (d0) -> (d0 floordiv 2)) {
  ^bb0(%a: tensor<64xf32>):
    task.yield
  }
  task.grid @c [3]
      writes(@b[(d0) -> (d0 * 16)] [16])
      waits(@e (d0) -> (d0)) {
  ^bb0(%b: tensor<64xf32>):
    task.yield %b : tensor<64xf32>
  }
}

// -----

task.graph @g iterations 1 arena 0 {
  task.buffer @a input 0 : tensor<64xf32>
  task.buffer @b output 0 : tensor<64xf32>
  task.event @e [4] count 1
  task.grid @p [4]
      reads(@a[(d0) -> (d0 * 16)] [16])
      signals(@e (d0) -> (d0)) {
  ^bb0(%a: tensor<64xf32>):
    task.yield
  }
  // CHECK: invalid.mlir:[[# @LINE + 1]]:3: error: 'task.grid' waits on @e: task [3] maps to element [4], outside the event shape [4]
  task.grid @c [4]
      writes(@b[(d0) -> (d0 * 16)] [16])
      waits(@e (d0) -> (d0 + 1)) {
  ^bb0(%b: tensor<64xf32>):
    task.yield %b : tensor<64xf32>
  }
}

// -----

task.graph @g iterations 1 arena 0 {
  task.buffer @a input 0 : tensor<64xf32>
  task.buffer @b output 0 : tensor<64xf32>
  task.grid @k [4]
      reads(@a[(d0) -> (d0 * 16)] [16])
      writes(@b[(d0) -> (d0 * 16)] [16]) {
  ^bb0(%a: tensor<64xf32>, %b: tensor<64xf32>):
    task.yield %b : tensor<64xf32>
  }
  // CHECK: invalid.mlir:[[# @LINE + 1]]:3: error: 'task.schedule' task 1 (@k[1]) is queued twice (SM 0 and SM 1)
  task.schedule num_sms 2 {
    task.queue sm 0 [0, 1, 2]
    task.queue sm 1 [3, 1]
  }
}

// -----

task.graph @g iterations 1 arena 0 {
  task.buffer @a input 0 : tensor<64xf32>
  task.buffer @b output 0 : tensor<64xf32>
  task.grid @k [4]
      reads(@a[(d0) -> (d0 * 16)] [16])
      writes(@b[(d0) -> (d0 * 16)] [16]) {
  ^bb0(%a: tensor<64xf32>, %b: tensor<64xf32>):
    task.yield %b : tensor<64xf32>
  }
  // CHECK: invalid.mlir:[[# @LINE + 1]]:3: error: 'task.schedule' task 2 (@k[2]) is in no queue (1 of 4 tasks unscheduled)
  task.schedule num_sms 2 {
    task.queue sm 0 [0, 1]
    task.queue sm 1 [3]
  }
}

// -----

task.graph @g iterations 1 arena 0 {
  task.buffer @a input 0 : tensor<64xf32>
  task.buffer @b output 0 : tensor<64xf32>
  task.grid @k [4]
      reads(@a[(d0) -> (d0 * 16)] [16])
      writes(@b[(d0) -> (d0 * 16)] [16]) {
  ^bb0(%a: tensor<64xf32>, %b: tensor<64xf32>):
    task.yield %b : tensor<64xf32>
  }
  // CHECK: invalid.mlir:[[# @LINE + 1]]:3: error: 'task.schedule' task 4 in the queue of SM 0 is out of range: the graph has 4 tasks
  task.schedule num_sms 2 {
    task.queue sm 0 [0, 1, 2, 3, 4]
  }
}

// -----

task.graph @g iterations 1 arena 0 {
  task.buffer @a input 0 : tensor<64xf32>
  task.buffer @b output 0 : tensor<64xf32>
  task.grid @k [4]
      reads(@a[(d0) -> (d0 * 16)] [16])
      writes(@b[(d0) -> (d0 * 16)] [16]) {
  ^bb0(%a: tensor<64xf32>, %b: tensor<64xf32>):
    task.yield %b : tensor<64xf32>
  }
  // CHECK: invalid.mlir:[[# @LINE + 1]]:3: error: 'task.schedule' SM 0 has two queues
  task.schedule num_sms 2 {
    task.queue sm 0 [0, 1]
    task.queue sm 0 [2, 3]
  }
}

// -----

task.graph @g iterations 1 arena 0 {
  task.buffer @a input 0 : tensor<64xf32>
  task.buffer @b output 0 : tensor<64xf32>
  task.grid @k [4]
      reads(@a[(d0) -> (d0 * 16)] [16])
      writes(@b[(d0) -> (d0 * 16)] [16]) {
  ^bb0(%a: tensor<64xf32>, %b: tensor<64xf32>):
    task.yield %b : tensor<64xf32>
  }
  task.schedule num_sms 2 {
    task.queue sm 0 [0, 1]
    // CHECK: invalid.mlir:[[# @LINE + 1]]:5: error: 'task.queue' SM 2 is out of range: the task.schedule has num_sms 2
    task.queue sm 2 [2, 3]
  }
}

// -----

task.graph @g iterations 1 arena 4096 {
  // CHECK: invalid.mlir:[[# @LINE + 1]]:3: error: 'task.buffer' offset 64 of @h is not a non-negative multiple of 128 bytes
  task.buffer @h activation offset 64 : tensor<16xf32>
}

// -----

task.graph @g iterations 1 arena 4096 {
  task.buffer @h activation offset 0 : tensor<16xf32>
  // CHECK: invalid.mlir:[[# @LINE + 1]]:3: error: 'task.buffer' @w occupies bytes [3968, 4224) but the arena has 4096 bytes
  task.buffer @w workspace offset 3968 : tensor<64xf32>
}

// -----

task.graph @g iterations 1 arena 4096 {
  // CHECK: invalid.mlir:[[# @LINE + 1]]:3: error: 'task.buffer' an input buffer cannot have an arena offset
  task.buffer @x input 0 offset 0 : tensor<16xf32>
}

// -----

task.graph @g iterations 1 arena 4096 {
  // CHECK: invalid.mlir:[[# @LINE + 1]]:3: error: 'task.buffer' a weight buffer needs an index
  task.buffer @w weight : tensor<16xf32>
}

// -----

task.graph @g iterations 1 arena 0 {
  task.buffer @a input 0 : tensor<64xf32>
  task.buffer @b output 0 : tensor<64xf32>
  // CHECK: invalid.mlir:[[# @LINE + 1]]:3: error: 'task.grid' body has 1 block arguments, expected 2: 1 read buffer(s), then 1 write buffer(s)
  task.grid @k [4]
      reads(@a[(d0) -> (d0 * 16)] [16])
      writes(@b[(d0) -> (d0 * 16)] [16]) {
  ^bb0(%b: tensor<64xf32>):
    task.yield %b : tensor<64xf32>
  }
}

// -----

task.graph @g iterations 1 arena 0 {
  task.buffer @a input 0 : tensor<64xf32>
  task.buffer @b output 0 : tensor<64xf32>
  // CHECK: invalid.mlir:[[# @LINE + 1]]:3: error: 'task.grid' body argument #1 has type tensor<64xf16>, expected tensor<64xf32> (the buffer @b)
  task.grid @k [4]
      reads(@a[(d0) -> (d0 * 16)] [16])
      writes(@b[(d0) -> (d0 * 16)] [16]) {
  ^bb0(%a: tensor<64xf32>, %b: tensor<64xf16>):
    task.yield
  }
}

// -----

// Body arguments are whole buffers, not the task's tiles.
task.graph @g iterations 1 arena 0 {
  task.buffer @a input 0 : tensor<64xf32>
  task.buffer @b output 0 : tensor<64xf32>
  // CHECK: invalid.mlir:[[# @LINE + 1]]:3: error: 'task.grid' body argument #0 has type tensor<16xf32>, expected tensor<64xf32> (the buffer @a)
  task.grid @k [4]
      reads(@a[(d0) -> (d0 * 16)] [16])
      writes(@b[(d0) -> (d0 * 16)] [16]) {
  ^bb0(%a: tensor<16xf32>, %b: tensor<16xf32>):
    task.yield %b : tensor<16xf32>
  }
}

// -----

// A buffer both read and written is a body argument twice.
task.graph @g iterations 1 arena 0 {
  task.buffer @b output 0 : tensor<64xf32>
  // CHECK: invalid.mlir:[[# @LINE + 1]]:3: error: 'task.grid' body has 1 block arguments, expected 2: 1 read buffer(s), then 1 write buffer(s)
  task.grid @k [4]
      reads(@b[(d0) -> (d0 * 16)] [16])
      writes(@b[(d0) -> (d0 * 16)] [16]) {
  ^bb0(%b: tensor<64xf32>):
    task.yield %b : tensor<64xf32>
  }
}

// -----

task.graph @g iterations 1 arena 0 {
  task.buffer @a input 0 : tensor<64xf32>
  task.buffer @b output 0 : tensor<64xf32>
  task.grid @k [4]
      reads(@a[(d0) -> (d0 * 16)] [16])
      writes(@b[(d0) -> (d0 * 16)] [16]) {
  ^bb0(%a: tensor<64xf32>, %b: tensor<64xf32>):
    // CHECK: invalid.mlir:[[# @LINE + 1]]:5: error: 'task.yield' yields 2 value(s), but @k writes 1 buffer(s)
    task.yield %a, %b : tensor<64xf32>, tensor<64xf32>
  }
}

// -----

task.graph @g iterations 1 arena 0 {
  task.buffer @a input 0 : tensor<32xf32>
  task.buffer @b output 0 : tensor<64xf32>
  task.grid @k [4]
      reads(@a[(d0) -> (0)] [32])
      writes(@b[(d0) -> (d0 * 16)] [16]) {
  ^bb0(%a: tensor<32xf32>, %b: tensor<64xf32>):
    // CHECK: invalid.mlir:[[# @LINE + 1]]:5: error: 'task.yield' value #0 has type tensor<32xf32>, expected tensor<64xf32> (the buffer @b)
    task.yield %a : tensor<32xf32>
  }
}

// -----

task.graph @g iterations 2 arena 0 {
  task.buffer @a input 0 : tensor<64xf32>
  task.buffer @b output 0 : tensor<64xf32>
  task.event @e [4] count 1
  // CHECK: invalid.mlir:[[# @LINE + 1]]:3: error: 'task.grid' waits on and signals @e (a grid cannot depend on itself within an iteration)
  task.grid @k [4]
      reads(@a[(d0) -> (d0 * 16)] [16])
      writes(@b[(d0) -> (d0 * 16)] [16])
      waits(@e (d0) -> (d0))
      signals(@e (d0) -> (d0)) {
  ^bb0(%a: tensor<64xf32>, %b: tensor<64xf32>):
    task.yield %b : tensor<64xf32>
  }
}

// -----

task.graph @g iterations 1 arena 0 {
  task.buffer @w weight 0 : tensor<64xf32>
  // CHECK: invalid.mlir:[[# @LINE + 1]]:3: error: 'task.grid' writes weight buffer @w, but weights are read-only
  task.grid @k [4]
      writes(@w[(d0) -> (d0 * 16)] [16]) {
  ^bb0(%w: tensor<64xf32>):
    task.yield %w : tensor<64xf32>
  }
}

// -----

task.graph @g iterations 1 arena 0 {
  task.buffer @a input 0 : tensor<64xf32>
  // CHECK: invalid.mlir:[[# @LINE + 1]]:3: error: 'task.grid' writes unknown buffer @nope
  task.grid @k [4]
      reads(@a[(d0) -> (d0 * 16)] [16])
      writes(@nope[(d0) -> (d0 * 16)] [16]) {
  ^bb0(%a: tensor<64xf32>, %b: tensor<64xf32>):
    task.yield %b : tensor<64xf32>
  }
}

// -----

task.graph @g iterations 1 arena 0 {
  task.buffer @a input 0 : tensor<64xf32>
  // CHECK: invalid.mlir:[[# @LINE + 1]]:3: error: 'task.grid' prefetch @a: only weight buffers the grid reads can be prefetched
  task.grid @k [4]
      reads(@a[(d0) -> (d0 * 16)] [16])
      prefetch(@a) {
  ^bb0(%a: tensor<64xf32>):
    task.yield
  }
}

// -----

task.graph @g iterations 1 arena 0 {
  task.buffer @a input 0 : tensor<64xf32>
  task.event @e [4] count 1
  // CHECK: invalid.mlir:[[# @LINE + 1]]:3: error: 'task.grid' signals @e with a distance; only waits have one
  task.grid @k [4]
      reads(@a[(d0) -> (d0 * 16)] [16])
      signals(@e (d0) -> (d0) distance 1) {
  ^bb0(%a: tensor<64xf32>):
    task.yield
  }
  task.grid @c [4]
      waits(@e (d0) -> (d0)) {
    task.yield
  }
}

// -----

task.graph @g iterations 1 arena 0 {
  task.event @e [4] count 1
  task.grid @p [4]
      signals(@e (d0) -> (d0)) {
    task.yield
  }
  // CHECK: invalid.mlir:[[# @LINE + 1]]:3: error: 'task.grid' waits on @e: map (d0) -> (d0, 0) does not take the grid's 1 coordinates to the event's 1
  task.grid @c [4]
      waits(@e (d0) -> (d0, 0)) {
    task.yield
  }
}

// -----

task.graph @g iterations 1 arena 0 {
  task.event @e [4] count 1
  task.grid @p [4]
      signals(@e (d0) -> (d0)) {
    task.yield
  }
  // CHECK: invalid.mlir:[[# @LINE + 1]]:3: error: 'task.grid' waits on unknown event @f
  task.grid @c [4]
      waits(@e (d0) -> (d0), @f (d0) -> (d0)) {
    task.yield
  }
}

// -----

task.graph @g iterations 1 arena 0 {
  task.event @e [4] count 1
  task.grid @c [4]
      // CHECK: invalid.mlir:[[# @LINE + 1]]:38: error: distance must be >= 0, got -1
      waits(@e (d0) -> (d0) distance -1) {
    task.yield
  }
}

// -----

// CHECK: invalid.mlir:[[# @LINE + 1]]:1: error: 'task.graph' symbol @a is defined twice
task.graph @g iterations 1 arena 0 {
  task.buffer @a input 0 : tensor<64xf32>
  task.buffer @a output 0 : tensor<64xf32>
}

// -----

// CHECK: invalid.mlir:[[# @LINE + 1]]:1: error: 'task.graph' @b and @a are both argument #0
task.graph @g iterations 1 arena 0 {
  task.buffer @a input 0 : tensor<64xf32>
  task.buffer @b weight 0 : tensor<64xf32>
}

// -----

// CHECK: invalid.mlir:[[# @LINE + 1]]:1: error: 'task.graph' iterations must be >= 1, got 0
task.graph @g iterations 0 arena 0 {
  task.buffer @a input 0 : tensor<64xf32>
}

// -----

task.graph @g iterations 1 arena 0 {
  // CHECK: invalid.mlir:[[# @LINE + 1]]:18: error: expected a buffer kind, one of input, weight, output, activation, workspace
  task.buffer @a scratch 0 : tensor<64xf32>
}

// -----

task.graph @g iterations 1 arena 0 {
  task.buffer @a input 0 : tensor<64xf32>
  task.grid @k [4]
      // CHECK: invalid.mlir:[[# @LINE + 1]]:16: error: not an affine task map: Multiplication with non-constant (semi-affine) is not supported yet self: d0 other: d0
      reads(@a[(d0) -> (d0 * d0)] [16]) {
  ^bb0(%a: tensor<64xf32>):
    task.yield
  }
}

// -----

task.graph @g iterations 1 arena 0 {
  task.buffer @a input 0 : tensor<64xf32>
  task.grid @k [4]
      // CHECK: invalid.mlir:[[# @LINE + 1]]:16: error: map (d0)[s0] -> (d0 + s0) has symbols; task maps take grid coordinates only
      reads(@a[(d0)[s0] -> (d0 + s0)] [16]) {
  ^bb0(%a: tensor<64xf32>):
    task.yield
  }
}

// -----

task.graph @g iterations 1 arena 0 {
  task.buffer @a input 0 : tensor<64xf32>
  task.grid @k [4]
      // CHECK: invalid.mlir:[[# @LINE + 1]]:16: error: map (d0) -> (d0 floordiv 0) divides by a non-positive constant
      reads(@a[(d0) -> (d0 floordiv 0)] [16]) {
  ^bb0(%a: tensor<64xf32>):
    task.yield
  }
}

// -----

task.graph @g iterations 1 arena 0 {
  task.buffer @a input 0 : tensor<64xf32>
  // CHECK: invalid.mlir:[[# @LINE + 1]]:3: error: 'task.grid' shape must have 1 to 3 extents >= 1, got [0]
  task.grid @k [0]
      reads(@a[(d0) -> (d0 * 16)] [16]) {
  ^bb0(%a: tensor<64xf32>):
    task.yield
  }
}

// -----

task.graph @g iterations 1 arena 0 {
  task.buffer @a input 0 : tensor<64xf32>
  task.grid @k [4]
      reads(@a[(d0) -> (d0 * 16)] [16])
      // CHECK: invalid.mlir:[[# @LINE + 1]]:12: error: expected a cost entry, `bytes` or `flops`
      cost(latency = 3) {
  ^bb0(%a: tensor<64xf32>):
    task.yield
  }
}

// -----

task.graph @g iterations 1 arena 0 {
  task.buffer @a input 0 : tensor<64xf32>
  // CHECK: invalid.mlir:[[# @LINE + 1]]:3: error: 'task.event' count must be >= 1, got 0
  task.event @e [1] count 0
}

// -----

func.func @f() {
  func.return
}
// CHECK: invalid.mlir:[[# @LINE + 1]]:1: error: 'task.graph' 'func.func' is not allowed in a task.graph
task.graph @g iterations 1 arena 0 {
  func.func @inner() {
    func.return
  }
}

// -----

task.graph @g iterations 1 arena 0 {
  // CHECK: invalid.mlir:[[# @LINE + 1]]:3: error: 'task.buffer' only an activation buffer can be flagged, not an input
  task.buffer @a input flagged 0 : tensor<64xf32>
}
