// RUN: MK_ROUNDTRIP
// RUN: MK_GENERIC_ROUNDTRIP
// RUN: mk-opt %s --split-input-file --print-op-generic | filecheck %s --check-prefix=GENERIC

// An RMSNorm -> split-K Linear -> activation step, run 4 times (a decode loop) inside the
// kernel. @h and @t share arena offset 0: @t is written only after every reader of @h is done
// (@part_ready counts all 16 linear tasks), and the next iteration's norm waits (distance 1)
// until this iteration's last readers of @t are done. A grid body's block arguments are whole
// buffers (reads, then writes); the footprints bound what one task touches.
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

// CHECK:      builtin.module {
// CHECK-NEXT:   task.graph @rms_linear iterations 4 arena 622592 {
// CHECK-NEXT:     task.buffer @x input 0 : tensor<8x6144xbf16>
// CHECK-NEXT:     task.buffer @g weight 1 : tensor<6144xbf16>
// CHECK-NEXT:     task.buffer @w weight 2 : tensor<6144x1024xbf16>
// CHECK-NEXT:     task.buffer @y output 0 : tensor<8x1024xbf16>
// CHECK-NEXT:     task.buffer @h activation offset 0 : tensor<8x6144xbf16>
// CHECK-NEXT:     task.buffer @t activation offset 0 : tensor<8x1024xbf16>
// CHECK-NEXT:     task.buffer @part workspace offset 98304 : tensor<16x8x1024xf32>
// CHECK-NEXT:     task.event @h_ready [4] count 12
// CHECK-NEXT:     task.event @part_ready [1] count 16
// CHECK-NEXT:     task.event @part_free [1] count 8
// CHECK-NEXT:     task.event @t_ready [8] count 1
// CHECK-NEXT:     task.event @t_free [1] count 8
// CHECK-NEXT:     task.grid @norm [48]
// CHECK-NEXT:         reads(@x[(d0) -> (0, 0)] [8, 6144], @g[(d0) -> (d0 * 128)] [128])
// CHECK-NEXT:         writes(@h[(d0) -> (0, d0 * 128)] [8, 128])
// CHECK-NEXT:         waits(@t_free (d0) -> (0) distance 1)
// CHECK-NEXT:         signals(@h_ready (d0) -> (d0 floordiv 12)) {
// CHECK-NEXT:     ^bb0(%x: tensor<8x6144xbf16>, %g: tensor<6144xbf16>, %h: tensor<8x6144xbf16>):
// CHECK-NEXT:       task.yield %h : tensor<8x6144xbf16>
// CHECK-NEXT:     }
// CHECK-NEXT:     task.grid @linear [16]
// CHECK-NEXT:         reads(@h[(d0) -> (0, d0 * 384)] [8, 384], @w[(d0) -> (d0 * 384, 0)] [384, 1024])
// CHECK-NEXT:         writes(@part[(d0) -> (d0, 0, 0)] [1, 8, 1024])
// CHECK-NEXT:         waits(@h_ready (d0) -> (d0 floordiv 4), @part_free (d0) -> (0) distance 1)
// CHECK-NEXT:         signals(@part_ready (d0) -> (0))
// CHECK-NEXT:         prefetch(@w)
// CHECK-NEXT:         cost(bytes = 792576, flops = 6291456) {
// CHECK-NEXT:     ^bb0(%h: tensor<8x6144xbf16>, %w: tensor<6144x1024xbf16>, %part: tensor<16x8x1024xf32>):
// CHECK-NEXT:       task.yield %part : tensor<16x8x1024xf32>
// CHECK-NEXT:     }
// CHECK-NEXT:     task.grid @reduce [8]
// CHECK-NEXT:         reads(@part[(d0) -> (0, 0, d0 * 128)] [16, 8, 128])
// CHECK-NEXT:         writes(@t[(d0) -> (0, d0 * 128)] [8, 128])
// CHECK-NEXT:         waits(@part_ready (d0) -> (0))
// CHECK-NEXT:         signals(@t_ready (d0) -> (d0), @part_free (d0) -> (0)) {
// CHECK-NEXT:     ^bb0(%part: tensor<16x8x1024xf32>, %t: tensor<8x1024xbf16>):
// CHECK-NEXT:       task.yield %t : tensor<8x1024xbf16>
// CHECK-NEXT:     }
// CHECK-NEXT:     task.grid @act [8]
// CHECK-NEXT:         reads(@t[(d0) -> (0, d0 * 128)] [8, 128])
// CHECK-NEXT:         writes(@y[(d0) -> (0, d0 * 128)] [8, 128])
// CHECK-NEXT:         waits(@t_ready (d0) -> (d0))
// CHECK-NEXT:         signals(@t_free (d0) -> (0)) {
// CHECK-NEXT:     ^bb0(%t: tensor<8x1024xbf16>, %y: tensor<8x1024xbf16>):
// CHECK-NEXT:       task.yield %y : tensor<8x1024xbf16>
// CHECK-NEXT:     }
// CHECK-NEXT:     task.schedule num_sms 4 {
// CHECK-NEXT:       task.queue sm 0 [0, 4, 8, 12, 16, 20, 24, 28, 32, 36, 40, 44, 48, 52, 56, 60, 64, 68, 72, 76]
// CHECK-NEXT:       task.queue sm 1 [1, 5, 9, 13, 17, 21, 25, 29, 33, 37, 41, 45, 49, 53, 57, 61, 65, 69, 73, 77]
// CHECK-NEXT:       task.queue sm 2 [2, 6, 10, 14, 18, 22, 26, 30, 34, 38, 42, 46, 50, 54, 58, 62, 66, 70, 74, 78]
// CHECK-NEXT:       task.queue sm 3 [3, 7, 11, 15, 19, 23, 27, 31, 35, 39, 43, 47, 51, 55, 59, 63, 67, 71, 75, 79]
// CHECK-NEXT:     }
// CHECK-NEXT:   }
// CHECK-NEXT: }

// GENERIC:      "task.grid"() <{sym_name = "linear", shape = array<i64: 16>, reads = [#task.footprint<@h[(d0) -> (0, d0 * 384)] [8, 384]>, #task.footprint<@w[(d0) -> (d0 * 384, 0)] [384, 1024]>], writes = [#task.footprint<@part[(d0) -> (d0, 0, 0)] [1, 8, 1024]>], waits = [#task.edge<@h_ready (d0) -> (d0 floordiv 4)>, #task.edge<@part_free (d0) -> (0) distance 1>], signals = [#task.edge<@part_ready (d0) -> (0)>], prefetch = [@w], cost_bytes = 792576 : i64, cost_flops = 6291456 : i64}> ({
// GENERIC-NEXT: ^bb0(%h: tensor<8x6144xbf16>, %w: tensor<6144x1024xbf16>, %part: tensor<16x8x1024xf32>):
// GENERIC-NEXT:   "task.yield"(%part) : (tensor<16x8x1024xf32>) -> ()
// GENERIC:      "task.queue"() <{sm = 3 : i64, tasks = array<i32: 3, 7, 11, 15, 19, 23, 27, 31, 35, 39, 43, 47, 51, 55, 59, 63, 67, 71, 75, 79>}> : () -> ()

// -----


// Rank-2 and rank-3 grids, mod/ceildiv/negative-offset maps, discardable attributes, an
// empty queue, and an SM without a queue.
task.graph @shapes iterations 1 arena 0 attributes {note = "shapes"} {
  task.buffer @a input 0 : tensor<64x64xf32>
  task.buffer @b output 0 : tensor<4x64x64xf32>
  task.event @done [2, 4] count 2
  task.grid @copy [4, 2, 2]
      reads(@a[(d0, d1, d2) -> (d1 * 32, d2 * 32)] [32, 32])
      writes(@b[(d0, d1, d2) -> (d0, d1 * 32, d2 * 32)] [1, 32, 32])
      signals(@done (d0, d1, d2) -> (d0 mod 2, d1 * 2 + d2)) attributes {tag = 1 : i64} {
  ^bb0(%a: tensor<64x64xf32>, %b: tensor<4x64x64xf32>):
    task.yield %b : tensor<4x64x64xf32>
  }
  task.grid @check [2, 4]
      reads(@b[(i, j) -> (i * 2 + 1, (j ceildiv 2) * 16, (j mod 2) * 16 + 16 - (i * 16))] [1, 32, 16])
      waits(@done (i, j) -> (i, j)) {
  ^bb0(%b: tensor<4x64x64xf32>):
    task.yield
  }
  task.schedule num_sms 3 {
    task.queue sm 2 []
    task.queue sm 0 [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23]
  }
}

// CHECK:      builtin.module {
// CHECK-NEXT:   task.graph @shapes iterations 1 arena 0 attributes {note = "shapes"} {
// CHECK-NEXT:     task.buffer @a input 0 : tensor<64x64xf32>
// CHECK-NEXT:     task.buffer @b output 0 : tensor<4x64x64xf32>
// CHECK-NEXT:     task.event @done [2, 4] count 2
// CHECK-NEXT:     task.grid @copy [4, 2, 2]
// CHECK-NEXT:         reads(@a[(d0, d1, d2) -> (d1 * 32, d2 * 32)] [32, 32])
// CHECK-NEXT:         writes(@b[(d0, d1, d2) -> (d0, d1 * 32, d2 * 32)] [1, 32, 32])
// CHECK-NEXT:         signals(@done (d0, d1, d2) -> (d0 mod 2, d1 * 2 + d2)) attributes {tag = 1 : i64} {
// CHECK-NEXT:     ^bb0(%a: tensor<64x64xf32>, %b: tensor<4x64x64xf32>):
// CHECK-NEXT:       task.yield %b : tensor<4x64x64xf32>
// CHECK-NEXT:     }
// CHECK-NEXT:     task.grid @check [2, 4]
// CHECK-NEXT:         reads(@b[(d0, d1) -> (d0 * 2 + 1, (d1 ceildiv 2) * 16, (d1 mod 2) * 16 + 16 - d0 * 16)] [1, 32, 16])
// CHECK-NEXT:         waits(@done (d0, d1) -> (d0, d1)) {
// CHECK-NEXT:     ^bb0(%b: tensor<4x64x64xf32>):
// CHECK-NEXT:       task.yield
// CHECK-NEXT:     }
// CHECK-NEXT:     task.schedule num_sms 3 {
// CHECK-NEXT:       task.queue sm 2 []
// CHECK-NEXT:       task.queue sm 0 [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23]
// CHECK-NEXT:     }
// CHECK-NEXT:   }
// CHECK-NEXT: }

// GENERIC:      "task.queue"() <{sm = 2 : i64, tasks = array<i32>}> : () -> ()

// -----

// A buffer both read and written (an in-place update) is a body argument twice: once among
// the reads, once among the writes.
task.graph @in_place iterations 1 arena 0 {
  task.buffer @a output 0 : tensor<16x32xf32>
  task.grid @scale [2]
      reads(@a[(d0) -> (d0 * 8, 0)] [8, 32])
      writes(@a[(d0) -> (d0 * 8, 0)] [8, 32]) {
  ^bb0(%old: tensor<16x32xf32>, %new: tensor<16x32xf32>):
    task.yield %old : tensor<16x32xf32>
  }
}

// CHECK:      task.grid @scale [2]
// CHECK-NEXT:     reads(@a[(d0) -> (d0 * 8, 0)] [8, 32])
// CHECK-NEXT:     writes(@a[(d0) -> (d0 * 8, 0)] [8, 32]) {
// CHECK-NEXT: ^bb0(%old: tensor<16x32xf32>, %new: tensor<16x32xf32>):
// CHECK-NEXT:   task.yield %old : tensor<16x32xf32>
// CHECK-NEXT: }

// -----

// A flagged activation (each element stored with its iteration's flag) and the flagged event
// that orders its read: a backend may realise the event by the flags alone.

// CHECK-LABEL: task.graph @flags
// CHECK: task.buffer @h activation flagged offset 0 : tensor<4xf32>
// CHECK: task.event @h_flags [1] count 1 flagged
task.graph @flags iterations 1 arena 128 {
  task.buffer @x input 0 : tensor<4xf32>
  task.buffer @y output 0 : tensor<4xf32>
  task.buffer @h activation flagged offset 0 : tensor<4xf32>
  task.event @h_flags [1] count 1 flagged
  task.grid @a [1]
      reads(@x[(d0) -> (0)] [4])
      writes(@h[(d0) -> (0)] [4])
      signals(@h_flags (d0) -> (0)) {
  ^bb0(%x: tensor<4xf32>, %h: tensor<4xf32>):
    task.yield %x : tensor<4xf32>
  }
  task.grid @b [1]
      reads(@h[(d0) -> (0)] [4])
      writes(@y[(d0) -> (0)] [4])
      waits(@h_flags (d0) -> (0)) {
  ^bb0(%h: tensor<4xf32>, %y: tensor<4xf32>):
    task.yield %h : tensor<4xf32>
  }
}
