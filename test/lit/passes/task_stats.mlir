// RUN: mk-opt %s --split-input-file -p 'task-stats{num-sms=4 bandwidth-gbs=4.0 peak-tflops=1.0}' --verify-diagnostics | filecheck %s
// RUN: mk-opt %s --split-input-file -p 'task-stats{num-sms=4 bandwidth-gbs=4.0 peak-tflops=1.0}' --verify-diagnostics | mk-opt --split-input-file --verify-diagnostics | filecheck %s
// RUN: mk-opt %s --split-input-file -p task-stats --verify-diagnostics | filecheck %s --check-prefix=DEFAULT
// RUN: mk-opt %s --split-input-file -p 'task-stats{num-sms=4 bandwidth-gbs=4.0 peak-tflops=1.0 task-us=1.0}' --verify-diagnostics | filecheck %s --check-prefix=TASKUS
// RUN: not mk-opt %s --split-input-file -p 'task-stats{task-us=-1.0}' 2>&1 | filecheck %s --check-prefix=BADUS

// On 4 SMs with 4 GB/s and 1 TFLOP/s each SM gets 1000 bytes/µs and 0.25 TFLOP/s: a @linear
// task (792576 bytes, 6291456 flops) takes max(792.576, 25.166) = 792.576 µs, the grids
// without a cost 1 µs each. Critical path: norm, linear, reduce, act = 795.576 µs.
// Round-robin queues: each SM runs 12 norms (t = 12), 4 linears (+3170.304), 2 reduces (+2),
// then its first act waits for its reduce of the second round: 3186.304 µs (printed with six
// significant digits).
// Waits: 48 norms x 1 + 16 linears x 2 + 8 reduces x 1 + 8 acts x 1 = 96 (1.2 per task);
// elements: 4 + 1 + 1 + 8 + 1 = 15.

task.graph @rms_linear iterations 4 arena 622592 {
  task.buffer @x input 0 : tensor<8x6144xbf16>
  task.buffer @g weight 1 : tensor<6144xbf16>
  task.buffer @w weight 2 : tensor<6144x1024xbf16>
  task.buffer @y output 0 : tensor<8x1024xbf16>
  task.buffer @h activation offset 0 : tensor<8x6144xbf16>
  task.buffer @t activation offset 0 : tensor<8x1024xbf16>
  task.buffer @part workspace offset 98304 : tensor<16x8x1024xf32>
  task.event @h_ready [4] count 12
  task.event @part_ready [1] count 16
  task.event @part_free [1] count 8
  task.event @t_ready [8] count 1
  task.event @t_free [1] count 8
  task.grid @norm [48]
      reads(@x[(d0) -> (0, 0)] [8, 6144], @g[(d0) -> (d0 * 128)] [128])
      writes(@h[(d0) -> (0, d0 * 128)] [8, 128])
      waits(@t_free (d0) -> (0) distance 1)
      signals(@h_ready (d0) -> (d0 floordiv 12)) {
  ^bb0(%x: tensor<8x6144xbf16>, %g: tensor<6144xbf16>, %h: tensor<8x6144xbf16>):
    task.yield %h : tensor<8x6144xbf16>
  }
  task.grid @linear [16]
      reads(@h[(d0) -> (0, d0 * 384)] [8, 384], @w[(d0) -> (d0 * 384, 0)] [384, 1024])
      writes(@part[(d0) -> (d0, 0, 0)] [1, 8, 1024])
      waits(@h_ready (d0) -> (d0 floordiv 4), @part_free (d0) -> (0) distance 1)
      signals(@part_ready (d0) -> (0))
      prefetch(@w)
      cost(bytes = 792576, flops = 6291456) {
  ^bb0(%h: tensor<8x6144xbf16>, %w: tensor<6144x1024xbf16>, %part: tensor<16x8x1024xf32>):
    task.yield %part : tensor<16x8x1024xf32>
  }
  task.grid @reduce [8]
      reads(@part[(d0) -> (0, 0, d0 * 128)] [16, 8, 128])
      writes(@t[(d0) -> (0, d0 * 128)] [8, 128])
      waits(@part_ready (d0) -> (0))
      signals(@t_ready (d0) -> (d0), @part_free (d0) -> (0)) {
  ^bb0(%part: tensor<16x8x1024xf32>, %t: tensor<8x1024xbf16>):
    task.yield %t : tensor<8x1024xbf16>
  }
  task.grid @act [8]
      reads(@t[(d0) -> (0, d0 * 128)] [8, 128])
      writes(@y[(d0) -> (0, d0 * 128)] [8, 128])
      waits(@t_ready (d0) -> (d0))
      signals(@t_free (d0) -> (0)) {
  ^bb0(%t: tensor<8x1024xbf16>, %y: tensor<8x1024xbf16>):
    task.yield %y : tensor<8x1024xbf16>
  }
  task.schedule num_sms 4 {
    task.queue sm 0 [0, 4, 8, 12, 16, 20, 24, 28, 32, 36, 40, 44, 48, 52, 56, 60, 64, 68, 72, 76]
    task.queue sm 1 [1, 5, 9, 13, 17, 21, 25, 29, 33, 37, 41, 45, 49, 53, 57, 61, 65, 69, 73, 77]
    task.queue sm 2 [2, 6, 10, 14, 18, 22, 26, 30, 34, 38, 42, 46, 50, 54, 58, 62, 66, 70, 74, 78]
    task.queue sm 3 [3, 7, 11, 15, 19, 23, 27, 31, 35, 39, 43, 47, 51, 55, 59, 63, 67, 71, 75, 79]
  }
}

// CHECK:      task.graph @rms_linear iterations 4 arena 622592 attributes {task.stats = {tasks = 80 : i64, grids = 4 : i64, events = 5 : i64, event_elements = 15 : i64, waits = 96 : i64, max_waits_per_task = 2 : i64, mean_waits_per_task = 1.200000e+00 : f64, critical_path_us = 7.955760e+02 : f64, est_us = 3.186300e+03 : f64, coarse_events = 0 : i64, stacked_queues = 0 : i64, flagged_waits = 0 : i64}} {
// CHECK-NEXT:   task.buffer @x input 0 : tensor<8x6144xbf16>
// CHECK:        task.schedule num_sms 4 {
// CHECK-NEXT:     task.queue sm 0 [0, 4, 8, 12, 16, 20, 24, 28, 32, 36, 40, 44, 48, 52, 56, 60, 64, 68, 72, 76]

// The schedule's num_sms (4) sets the SM share whatever num-sms says: with the H200 defaults a
// linear task takes 792576 B / 1025 GB/s = 0.773 µs.
// DEFAULT:    task.graph @rms_linear iterations 4 arena 622592 attributes {task.stats = {{{.*}} critical_path_us = 3.773000e+00 : f64, est_us = 1.909300e+01 : f64, coarse_events = 0 : i64, stacked_queues = 0 : i64, flagged_waits = 0 : i64}}

// task-us=1 adds 1 µs to every task: the critical path's four tasks give 799.576 µs; each SM's
// queue, 12 norms (24) + 4 linears (3174.304) + 2 reduces (4) + 2 acts (4) = 3206.304 µs.
// TASKUS:     task.graph @rms_linear iterations 4 arena 622592 attributes {task.stats = {{{.*}} critical_path_us = 7.995760e+02 : f64, est_us = 3.206300e+03 : f64,
// BADUS:      error: task-stats: task-us must be >= 0, got -1.0

// -----

// Without a schedule, est_us is the makespan of the list schedule task-schedule would build:
// here it is the same as the round robin.
task.graph @rms_linear_unscheduled iterations 4 arena 622592 {
  task.buffer @x input 0 : tensor<8x6144xbf16>
  task.buffer @g weight 1 : tensor<6144xbf16>
  task.buffer @w weight 2 : tensor<6144x1024xbf16>
  task.buffer @y output 0 : tensor<8x1024xbf16>
  task.buffer @h activation offset 0 : tensor<8x6144xbf16>
  task.buffer @t activation offset 0 : tensor<8x1024xbf16>
  task.buffer @part workspace offset 98304 : tensor<16x8x1024xf32>
  task.event @h_ready [4] count 12
  task.event @part_ready [1] count 16
  task.event @part_free [1] count 8
  task.event @t_ready [8] count 1
  task.event @t_free [1] count 8
  task.grid @norm [48]
      reads(@x[(d0) -> (0, 0)] [8, 6144], @g[(d0) -> (d0 * 128)] [128])
      writes(@h[(d0) -> (0, d0 * 128)] [8, 128])
      waits(@t_free (d0) -> (0) distance 1)
      signals(@h_ready (d0) -> (d0 floordiv 12)) {
  ^bb0(%x: tensor<8x6144xbf16>, %g: tensor<6144xbf16>, %h: tensor<8x6144xbf16>):
    task.yield %h : tensor<8x6144xbf16>
  }
  task.grid @linear [16]
      reads(@h[(d0) -> (0, d0 * 384)] [8, 384], @w[(d0) -> (d0 * 384, 0)] [384, 1024])
      writes(@part[(d0) -> (d0, 0, 0)] [1, 8, 1024])
      waits(@h_ready (d0) -> (d0 floordiv 4), @part_free (d0) -> (0) distance 1)
      signals(@part_ready (d0) -> (0))
      prefetch(@w)
      cost(bytes = 792576, flops = 6291456) {
  ^bb0(%h: tensor<8x6144xbf16>, %w: tensor<6144x1024xbf16>, %part: tensor<16x8x1024xf32>):
    task.yield %part : tensor<16x8x1024xf32>
  }
  task.grid @reduce [8]
      reads(@part[(d0) -> (0, 0, d0 * 128)] [16, 8, 128])
      writes(@t[(d0) -> (0, d0 * 128)] [8, 128])
      waits(@part_ready (d0) -> (0))
      signals(@t_ready (d0) -> (d0), @part_free (d0) -> (0)) {
  ^bb0(%part: tensor<16x8x1024xf32>, %t: tensor<8x1024xbf16>):
    task.yield %t : tensor<8x1024xbf16>
  }
  task.grid @act [8]
      reads(@t[(d0) -> (0, d0 * 128)] [8, 128])
      writes(@y[(d0) -> (0, d0 * 128)] [8, 128])
      waits(@t_ready (d0) -> (d0))
      signals(@t_free (d0) -> (0)) {
  ^bb0(%t: tensor<8x1024xbf16>, %y: tensor<8x1024xbf16>):
    task.yield %y : tensor<8x1024xbf16>
  }
}

// CHECK:      task.graph @rms_linear_unscheduled iterations 4 arena 622592 attributes {task.stats = {tasks = 80 : i64, grids = 4 : i64, events = 5 : i64, event_elements = 15 : i64, waits = 96 : i64, max_waits_per_task = 2 : i64, mean_waits_per_task = 1.200000e+00 : f64, critical_path_us = 7.955760e+02 : f64, est_us = 3.186300e+03 : f64, coarse_events = 0 : i64, stacked_queues = 0 : i64, flagged_waits = 0 : i64}} {
// CHECK-NOT:  task.schedule

// On 132 SMs each SM has a 1/132 share of 4.1 TB/s (31 GB/s): a linear task takes 25.517 µs,
// and with an SM per task the makespan is the critical path.
// DEFAULT:    task.graph @rms_linear_unscheduled iterations 4 arena 622592 attributes {task.stats = {{{.*}} critical_path_us = 2.851700e+01 : f64, est_us = 2.851700e+01 : f64, coarse_events = 0 : i64, stacked_queues = 0 : i64, flagged_waits = 0 : i64}}

// -----

// Events merged by the lowering carry `mk.coarse`; they are counted. Four 2-D tasks signal one
// element, two tasks wait on it: 2 waits over 6 tasks.
task.graph @coarse iterations 1 arena 0 {
  task.event @all [1] count 4 attributes {mk.coarse}
  task.event @fine [2] count 1
  task.grid @p [2, 2] signals(@all (d0, d1) -> (0)) {
    task.yield
  }
  task.grid @q [2] waits(@all (d0) -> (0)) signals(@fine (d0) -> (d0)) {
    task.yield
  }
  task.grid @r [2] waits(@fine (d0) -> (d0)) {
    task.yield
  }
}

// CHECK:      task.graph @coarse iterations 1 arena 0 attributes {task.stats = {tasks = 8 : i64, grids = 3 : i64, events = 2 : i64, event_elements = 3 : i64, waits = 4 : i64, max_waits_per_task = 1 : i64, mean_waits_per_task = 5.000000e-01 : f64, critical_path_us = 3.000000e+00 : f64, est_us = 3.000000e+00 : f64, coarse_events = 1 : i64, stacked_queues = 0 : i64, flagged_waits = 0 : i64}} {
// CHECK-NEXT:   task.event @all [1] count 4 attributes {mk.coarse}

// -----

// A schedule that puts both tasks of the two-task grid @q on SM 0 while SM 1 runs nothing of
// it: one stacked queue. @p has more tasks (4) than the SMs (2), so two of them on one SM are not.
task.graph @stacked iterations 1 arena 0 {
  task.event @all [1] count 4
  task.grid @p [4] signals(@all (d0) -> (0)) {
    task.yield
  }
  task.grid @q [2] waits(@all (d0) -> (0)) {
    task.yield
  }
  task.schedule num_sms 2 {
    task.queue sm 0 [0, 1, 4, 5]
    task.queue sm 1 [2, 3]
  }
}

// CHECK:      task.graph @stacked iterations 1 arena 0 attributes {task.stats = {{{.*}} coarse_events = 0 : i64, stacked_queues = 1 : i64, flagged_waits = 0 : i64}}

// -----

// Stacked tasks with slack delay nothing: @s's two tasks (1 µs each, no reader) share SM 2 and
// end at 2 µs, while the chain @p, @q, @r ends at 3. Not counted. Moved behind @r1 on SM 1, they
// would end the schedule and count (next case).
task.graph @stacked_slack iterations 1 arena 0 {
  task.event @all [1] count 2
  task.event @q_done [1] count 2
  task.grid @p [2] signals(@all (d0) -> (0)) {
    task.yield
  }
  task.grid @q [2] waits(@all (d0) -> (0)) signals(@q_done (d0) -> (0)) {
    task.yield
  }
  task.grid @r [2] waits(@q_done (d0) -> (0)) {
    task.yield
  }
  task.grid @s [2] {
    task.yield
  }
  task.schedule num_sms 3 {
    task.queue sm 0 [0, 2, 4]
    task.queue sm 1 [1, 3, 5]
    task.queue sm 2 [6, 7]
  }
}

// CHECK:      task.graph @stacked_slack iterations 1 arena 0 attributes {task.stats = {{{.*}} critical_path_us = 3.000000e+00 : f64, est_us = 3.000000e+00 : f64, coarse_events = 0 : i64, stacked_queues = 0 : i64, flagged_waits = 0 : i64}}

// -----

// The same tasks with @s behind @r1 on SM 1: the second ends the schedule. Counted.
task.graph @stacked_late iterations 1 arena 0 {
  task.event @all [1] count 2
  task.event @q_done [1] count 2
  task.grid @p [2] signals(@all (d0) -> (0)) {
    task.yield
  }
  task.grid @q [2] waits(@all (d0) -> (0)) signals(@q_done (d0) -> (0)) {
    task.yield
  }
  task.grid @r [2] waits(@q_done (d0) -> (0)) {
    task.yield
  }
  task.grid @s [2] {
    task.yield
  }
  task.schedule num_sms 3 {
    task.queue sm 0 [0, 2, 4]
    task.queue sm 1 [1, 3, 5, 6, 7]
    task.queue sm 2 []
  }
}

// CHECK:      task.graph @stacked_late iterations 1 arena 0 attributes {task.stats = {{{.*}} critical_path_us = 3.000000e+00 : f64, est_us = 5.000000e+00 : f64, coarse_events = 0 : i64, stacked_queues = 1 : i64, flagged_waits = 0 : i64}}

// -----

// An empty graph.
task.graph @empty iterations 1 arena 0 {
}

// CHECK:      task.graph @empty iterations 1 arena 0 attributes {task.stats = {tasks = 0 : i64, grids = 0 : i64, events = 0 : i64, event_elements = 0 : i64, waits = 0 : i64, max_waits_per_task = 0 : i64, mean_waits_per_task = 0.000000e+00 : f64, critical_path_us = 0.000000e+00 : f64, est_us = 0.000000e+00 : f64, coarse_events = 0 : i64, stacked_queues = 0 : i64, flagged_waits = 0 : i64}} {

// -----

// Queues that can deadlock have no makespan: the error tells the cycle.
task.graph @swapped iterations 1 arena 0 {
  task.event @e [1] count 1
  task.grid @a [1] signals(@e (d0) -> (0)) {
    task.yield
  }
  task.grid @b [1] waits(@e (d0) -> (0)) {
    task.yield
  }
  // DEFAULT: task_stats.mlir:[[# @LINE + 1]]:3: error: task-stats: queues deadlock: task 0 (@a[0]) signals @e[0]; task 1 (@b[0]) waits on @e[0]; SM 0 runs task 1 (@b[0]) before task 0 (@a[0])
  task.schedule num_sms 1 {
    task.queue sm 0 [1, 0]
  }
}
