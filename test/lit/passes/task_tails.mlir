// RUN: mk-opt %s --split-input-file -p 'task-tails{max-tail-tasks=64}' | filecheck %s
// RUN: mk-opt %s --split-input-file -p 'task-tails{max-tail-tasks=64}' | mk-opt --split-input-file | filecheck %s
// RUN: mk-opt %s --split-input-file -p 'task-tails{max-tail-tasks=1}' | filecheck %s --check-prefix=ONE
// RUN: mk-opt %s --split-input-file -p 'task-tails{max-tail-tasks=64},task-schedule{num-sms=2 bandwidth-gbs=2.0 fixed-us=0.0}' | filecheck %s --check-prefix=SCHED
// RUN: mk-opt %s --split-input-file -p task-tails | filecheck %s --check-prefix=OFF

// Splits and their merge: each merge task waits on the element its two splits signal, one task
// per element, so the merges become the tails of @parts. @all waits on one element for all of
// its tasks and stays queued. The merge also waits on @e0, signalled by fewer tasks: @parts,
// with more producer signals, is the one whose last signal runs it.
task.graph @split_merge iterations 1 arena 0 {
  task.event @e0 [1] count 1
  task.event @parts [2] count 2
  task.event @merged [1] count 2
  task.grid @first [1] signals(@e0 (d0) -> (0)) {
    task.yield
  }
  task.grid @split [2, 2] waits(@e0 (d0, d1) -> (0)) signals(@parts (d0, d1) -> (d0)) {
    task.yield
  }
  task.grid @merge [2] waits(@e0 (d0) -> (0), @parts (d0) -> (d0)) signals(@merged (d0) -> (0)) {
    task.yield
  }
  task.grid @all [4] waits(@merged (d0) -> (0)) {
    task.yield
  }
}

// CHECK-LABEL: task.graph @split_merge
// CHECK:         task.grid @split [2, 2]
// CHECK-NOT:       mk.tail
// CHECK:         task.grid @merge [2]
// CHECK:             signals(@merged (d0) -> (0)) attributes {mk.tail = "parts"} {
// CHECK:         task.grid @all [4]
// CHECK-NEXT:        waits(@merged (d0) -> (0)) {

// ONE-LABEL: task.graph @split_merge
// ONE-NOT:     mk.tail

// By default (max-tail-tasks=0) no grid is a tail.
// OFF-NOT: mk.tail

// The merges (tasks 5 and 6) are in no queue: the split that signals an element last runs them.
// SCHED-LABEL: task.graph @split_merge
// SCHED:         task.schedule num_sms 2 {
// SCHED-NEXT:      task.queue sm 0 [0, 1, 3, 7, 9]
// SCHED-NEXT:      task.queue sm 1 [2, 4, 8, 10]
// SCHED-NEXT:    }

// -----

// @t would be the tail of @a_done, but it also waits on @slow_done, whose producer the schedule
// tasks the schedule picks after @a (they wait for the long @x): run inline after @a, the tail
// could hold its SM while a @slow task needs it, so task-schedule queues @t after all.
task.graph @late iterations 1 arena 0 {
  task.event @a_done [1] count 3
  task.event @x_done [1] count 1
  task.event @slow_done [1] count 2
  task.grid @a [3] signals(@a_done (d0) -> (0)) cost(bytes = 1000) {
    task.yield
  }
  task.grid @x [1] signals(@x_done (d0) -> (0)) cost(bytes = 3000) {
    task.yield
  }
  task.grid @slow [2] waits(@x_done (d0) -> (0)) signals(@slow_done (d0) -> (0)) cost(bytes = 1000) {
    task.yield
  }
  task.grid @t [1] waits(@a_done (d0) -> (0), @slow_done (d0) -> (0)) cost(bytes = 1000) {
    task.yield
  }
}

// CHECK-LABEL: task.graph @late
// CHECK:         task.grid @t [1]
// CHECK:             attributes {mk.tail = "a_done"} {

// ONE-LABEL: task.graph @late
// ONE:         task.grid @t [1]
// ONE:             attributes {mk.tail = "a_done"} {

// SCHED-LABEL: task.graph @late
// SCHED-NOT:     mk.tail
// SCHED:         task.schedule num_sms 2 {
// SCHED-NEXT:      task.queue sm 0 [3, 4, 6]
// SCHED-NEXT:      task.queue sm 1 [0, 1, 2, 5]
// SCHED-NEXT:    }
