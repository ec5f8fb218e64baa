// RUN: mk-opt %s --split-input-file -p 'task-schedule{num-sms=2 bandwidth-gbs=2.0 fixed-us=0.0}' --verify-diagnostics | filecheck %s
// RUN: mk-opt %s --split-input-file -p 'task-schedule{num-sms=2 bandwidth-gbs=2.0 fixed-us=0.0}' --verify-diagnostics | mk-opt --split-input-file --verify-diagnostics | filecheck %s
// RUN: mk-opt %s --split-input-file -p 'task-schedule{num-sms=3 bandwidth-gbs=3.0 fixed-us=0.0},task-stats{bandwidth-gbs=3.0}' --verify-diagnostics | filecheck %s --check-prefix=SM3
// RUN: mk-opt %s --split-input-file -p task-schedule --verify-diagnostics | filecheck %s --check-prefix=ERR
// RUN: mk-opt %s --split-input-file -p 'task-schedule{num-sms=2 bandwidth-gbs=2.0 fixed-us=1.0}' --verify-diagnostics | filecheck %s --check-prefix=LOOP

// With bandwidth-gbs=2.0 on 2 SMs each SM gets 1 GB/s: a task moving 1000 bytes takes 1 µs,
// as does a task without a cost. On 3 SMs with 3 GB/s the times are the same. fixed-us=0.0: the
// cases are worked out on bytes alone (the default adds 2 µs a task, the LOOP cases 1 µs).

// A chain of three tasks next to three independent ones, the chain declared last (ids 3, 4, 5).
// Taking tasks by id would run the chain at t = 1, 2, 3 (makespan 4); critical path first runs
// it on SM 0 from t = 0 and the free tasks beside it (makespan 3, the optimum). At t = 2 @c3
// and @free[2] have the same priority: the lower id goes first, on the SM free first.
task.graph @chain iterations 1 arena 0 {
  task.event @e1 [1] count 1
  task.event @e2 [1] count 1
  task.grid @free [3] {
    task.yield
  }
  task.grid @c1 [1] signals(@e1 (d0) -> (0)) {
    task.yield
  }
  task.grid @c2 [1] waits(@e1 (d0) -> (0)) signals(@e2 (d0) -> (0)) {
    task.yield
  }
  task.grid @c3 [1] waits(@e2 (d0) -> (0)) {
    task.yield
  }
}

// CHECK-LABEL: task.graph @chain
// CHECK:         task.schedule num_sms 2 {
// CHECK-NEXT:      task.queue sm 0 [3, 4, 2]
// CHECK-NEXT:      task.queue sm 1 [0, 1, 5]
// CHECK-NEXT:    }
// CHECK-NEXT:  }

// SM3-LABEL: task.graph @chain
// SM3-SAME:    critical_path_us = 3.000000e+00 : f64, est_us = 3.000000e+00 : f64
// SM3:         task.schedule num_sms 3 {
// SM3-NEXT:      task.queue sm 0 [3, 4, 5]
// SM3-NEXT:      task.queue sm 1 [0, 2]
// SM3-NEXT:      task.queue sm 2 [1]
// SM3-NEXT:    }

// -----

// A fan-out with costs: @a (1 µs) releases four 1 µs tasks and two 3 µs tasks, each followed
// by a 2 µs tail on the element it writes. The long chains (priority 5) go first although
// their ids are higher, then the tails (priority 2), then the short tasks (priority 1):
// makespan 1 + 3 + 2 + 2 = 8, the optimum (1 + 14 µs of work on 2 SMs).
task.graph @fan_out iterations 1 arena 0 {
  task.event @a_done [1] count 1
  task.event @big_done [2] count 1
  task.grid @a [1] signals(@a_done (d0) -> (0)) cost(bytes = 1000) {
    task.yield
  }
  task.grid @small [4] waits(@a_done (d0) -> (0)) cost(bytes = 1000) {
    task.yield
  }
  task.grid @big [2] waits(@a_done (d0) -> (0)) signals(@big_done (d0) -> (d0))
      cost(bytes = 3000, flops = 10) {
    task.yield
  }
  task.grid @tail [2] waits(@big_done (d0) -> (d0)) cost(bytes = 2000) {
    task.yield
  }
}

// CHECK-LABEL: task.graph @fan_out
// CHECK:         task.schedule num_sms 2 {
// CHECK-NEXT:      task.queue sm 0 [0, 5, 7, 1, 3]
// CHECK-NEXT:      task.queue sm 1 [6, 8, 2, 4]
// CHECK-NEXT:    }

// SM3-LABEL: task.graph @fan_out
// SM3-SAME:    critical_path_us = 6.000000e+00 : f64, est_us = 6.000000e+00 : f64
// SM3:         task.schedule num_sms 3 {
// SM3-NEXT:      task.queue sm 0 [0, 5, 7]
// SM3-NEXT:      task.queue sm 1 [6, 8]
// SM3-NEXT:      task.queue sm 2 [1, 2, 3, 4]
// SM3-NEXT:    }

// -----

// An existing schedule is replaced, and a loop-carried wait (distance 1) orders nothing within
// an iteration: @consume of iteration t waits for @produce of t, and @produce of t + 1 for
// @consume of t, which the queues' program order already guarantees. Buffers and footprints
// are kept as they are. On 3 SMs the element-wise dependence lets @consume[0] start at t = 1,
// beside @produce[3].
task.graph @loop iterations 3 arena 512 {
  task.buffer @x input 0 : tensor<4x32xf32>
  task.buffer @w weight 1 : tensor<4x32xf32>
  task.buffer @t activation offset 0 : tensor<4x32xf32>
  task.buffer @y output 0 : tensor<4x32xf32>
  task.event @t_ready [2] count 2
  task.event @t_free [1] count 2
  task.grid @produce [4]
      reads(@x[(d0) -> (d0, 0)] [1, 32])
      writes(@t[(d0) -> (d0, 0)] [1, 32])
      waits(@t_free (d0) -> (0) distance 1)
      signals(@t_ready (d0) -> (d0 floordiv 2)) {
  ^bb0(%x: tensor<4x32xf32>, %t: tensor<4x32xf32>):
    task.yield %t : tensor<4x32xf32>
  }
  task.grid @consume [2]
      reads(@t[(d0) -> (d0 * 2, 0)] [2, 32], @w[(d0) -> (d0 * 2, 0)] [2, 32])
      writes(@y[(d0) -> (d0 * 2, 0)] [2, 32])
      waits(@t_ready (d0) -> (d0))
      signals(@t_free (d0) -> (0))
      prefetch(@w) {
  ^bb0(%t: tensor<4x32xf32>, %w: tensor<4x32xf32>, %y: tensor<4x32xf32>):
    task.yield %y : tensor<4x32xf32>
  }
  task.schedule num_sms 4 {
    task.queue sm 3 [5, 4, 3, 2, 1, 0]
  }
}

// CHECK-LABEL: task.graph @loop
// CHECK:           prefetch(@w) {
// CHECK:         task.schedule num_sms 2 {
// CHECK-NEXT:      task.queue sm 0 [0, 2, 4]
// CHECK-NEXT:      task.queue sm 1 [1, 3, 5]
// CHECK-NEXT:    }
// CHECK-NEXT:  }
// CHECK-NOT:   task.schedule

// SM3-LABEL: task.graph @loop
// SM3:         task.schedule num_sms 3 {
// SM3-NEXT:      task.queue sm 0 [0, 3, 5]
// SM3-NEXT:      task.queue sm 1 [1, 4]
// SM3-NEXT:      task.queue sm 2 [2]
// SM3-NEXT:    }

// -----

// A decode loop's steady state (fixed-us): @first of iteration t + 1 needs @start of t + 1 and
// @last of t, the end of iteration t's chain. One iteration laid out from t = 0 puts @start on
// SM 0 (ids: start 0, first 1, mid 2-3, last 4), behind @last, so every iteration's chain runs
// last -> start -> first -> mid -> last. With a task's fixed cost of 1 µs in the model (2, 2,
// 5, 2 µs), the second layout starts SM 1 at -2 µs, where iteration t left it: @start moves to
// SM 1 behind @mid[1], off the chain, and an iteration takes 9 µs instead of 11.
task.graph @steady iterations 4 arena 0 {
  task.event @s [1] count 1
  task.event @e1 [1] count 1
  task.event @e2 [1] count 2
  task.event @e3 [1] count 1
  task.grid @start [1] signals(@s (d0) -> (0)) {
    task.yield
  }
  task.grid @first [1] waits(@s (d0) -> (0), @e3 (d0) -> (0) distance 1) signals(@e1 (d0) -> (0)) {
    task.yield
  }
  task.grid @mid [2] waits(@e1 (d0) -> (0)) signals(@e2 (d0) -> (0)) cost(bytes = 4000, flops = 0) {
    task.yield
  }
  task.grid @last [1] waits(@e2 (d0) -> (0)) signals(@e3 (d0) -> (0)) {
    task.yield
  }
}

// CHECK-LABEL: task.graph @steady
// CHECK:         task.schedule num_sms 2 {
// CHECK-NEXT:      task.queue sm 0 [0, 1, 2, 4]
// CHECK-NEXT:      task.queue sm 1 [3]
// CHECK-NEXT:    }

// LOOP-LABEL: task.graph @steady
// LOOP:         task.schedule num_sms 2 {
// LOOP-NEXT:      task.queue sm 0 [1, 2, 4]
// LOOP-NEXT:      task.queue sm 1 [0, 3]
// LOOP-NEXT:    }

// -----

// Two grids that wait on each other within an iteration cannot be scheduled.
// ERR: task_schedule.mlir:[[# @LINE + 1]]:1: error: task-schedule: the dependences of @cycle form a cycle through task 0 (@a[0])
task.graph @cycle iterations 1 arena 0 {
  task.event @ea [1] count 1
  task.event @eb [1] count 1
  task.grid @a [1] waits(@eb (d0) -> (0)) signals(@ea (d0) -> (0)) {
    task.yield
  }
  task.grid @b [1] waits(@ea (d0) -> (0)) signals(@eb (d0) -> (0)) {
    task.yield
  }
}

