// RUN: MK_ROUNDTRIP
// RUN: MK_GENERIC_ROUNDTRIP
// The custom form is a fixed point: printing what was printed changes nothing.
// RUN: mk-opt %s --split-input-file > %t.1.mlir
// RUN: mk-opt %t.1.mlir --split-input-file > %t.2.mlir
// RUN: diff %t.1.mlir %t.2.mlir

// CHECK-LABEL: func.func @contractions
func.func @contractions(%x: tensor<8x4096xbf16>, %w: tensor<4096x6144xbf16>, %a3: tensor<2x8x64xf32>, %b2: tensor<64x32xf32>, %a4: tensor<2x1x8x16xf32>, %b3: tensor<3x16x4xf32>, %h: tensor<2x8x64xf16>, %lw: tensor<128x64xf16>) -> tensor<8x6144xbf16> {
  // CHECK-NEXT: %y = nn.matmul %x, %w : (tensor<8x4096xbf16>, tensor<4096x6144xbf16>) -> tensor<8x6144xbf16>
  %y = nn.matmul %x, %w : (tensor<8x4096xbf16>, tensor<4096x6144xbf16>) -> tensor<8x6144xbf16>
  // CHECK-NEXT: %batched = nn.matmul %a3, %b2 : (tensor<2x8x64xf32>, tensor<64x32xf32>) -> tensor<2x8x32xf32>
  %batched = nn.matmul %a3, %b2 : (tensor<2x8x64xf32>, tensor<64x32xf32>) -> tensor<2x8x32xf32>
  // CHECK-NEXT: %bcast = nn.matmul %a4, %b3 : (tensor<2x1x8x16xf32>, tensor<3x16x4xf32>) -> tensor<2x3x8x4xf32>
  %bcast = nn.matmul %a4, %b3 : (tensor<2x1x8x16xf32>, tensor<3x16x4xf32>) -> tensor<2x3x8x4xf32>
  // CHECK-NEXT: %lin = nn.linear %h, %lw : (tensor<2x8x64xf16>, tensor<128x64xf16>) -> tensor<2x8x128xf16>
  %lin = nn.linear %h, %lw : (tensor<2x8x64xf16>, tensor<128x64xf16>) -> tensor<2x8x128xf16>
  // CHECK-NEXT: func.return %y : tensor<8x6144xbf16>
  func.return %y : tensor<8x6144xbf16>
}

// -----

// CHECK-LABEL: func.func @elementwise
func.func @elementwise(%x: tensor<4x8xf32>, %row: tensor<8xf32>, %col: tensor<4x1xf32>, %s: tensor<f32>) -> tensor<4x8xf32> {
  // CHECK-NEXT: %e = nn.exp %x : (tensor<4x8xf32>) -> tensor<4x8xf32>
  // CHECK-NEXT: %sq = nn.sqrt %e : (tensor<4x8xf32>) -> tensor<4x8xf32>
  // CHECK-NEXT: %rs = nn.rsqrt %sq : (tensor<4x8xf32>) -> tensor<4x8xf32>
  // CHECK-NEXT: %sqr = nn.square %rs : (tensor<4x8xf32>) -> tensor<4x8xf32>
  // CHECK-NEXT: %n = nn.neg %sqr : (tensor<4x8xf32>) -> tensor<4x8xf32>
  // CHECK-NEXT: %r = nn.relu %n : (tensor<4x8xf32>) -> tensor<4x8xf32>
  // CHECK-NEXT: %sg = nn.sigmoid %r : (tensor<4x8xf32>) -> tensor<4x8xf32>
  // CHECK-NEXT: %si = nn.silu %sg : (tensor<4x8xf32>) -> tensor<4x8xf32>
  // CHECK-NEXT: %g = nn.gelu %si : (tensor<4x8xf32>) -> tensor<4x8xf32>
  // CHECK-NEXT: %sc = nn.scale %g {factor = 1.250000e-01 : f32} : (tensor<4x8xf32>) -> tensor<4x8xf32>
  %e = nn.exp %x : (tensor<4x8xf32>) -> tensor<4x8xf32>
  %sq = nn.sqrt %e : (tensor<4x8xf32>) -> tensor<4x8xf32>
  %rs = nn.rsqrt %sq : (tensor<4x8xf32>) -> tensor<4x8xf32>
  %sqr = nn.square %rs : (tensor<4x8xf32>) -> tensor<4x8xf32>
  %n = nn.neg %sqr : (tensor<4x8xf32>) -> tensor<4x8xf32>
  %r = nn.relu %n : (tensor<4x8xf32>) -> tensor<4x8xf32>
  %sg = nn.sigmoid %r : (tensor<4x8xf32>) -> tensor<4x8xf32>
  %si = nn.silu %sg : (tensor<4x8xf32>) -> tensor<4x8xf32>
  %g = nn.gelu %si : (tensor<4x8xf32>) -> tensor<4x8xf32>
  %sc = nn.scale %g {factor = 0.125 : f32} : (tensor<4x8xf32>) -> tensor<4x8xf32>
  // CHECK-NEXT: %add = nn.add %sc, %row : (tensor<4x8xf32>, tensor<8xf32>) -> tensor<4x8xf32>
  // CHECK-NEXT: %sub = nn.sub %col, %row : (tensor<4x1xf32>, tensor<8xf32>) -> tensor<4x8xf32>
  // CHECK-NEXT: %mul = nn.mul %add, %s : (tensor<4x8xf32>, tensor<f32>) -> tensor<4x8xf32>
  // CHECK-NEXT: %div = nn.div %mul, %sub : (tensor<4x8xf32>, tensor<4x8xf32>) -> tensor<4x8xf32>
  // CHECK-NEXT: %max = nn.maximum %div, %col : (tensor<4x8xf32>, tensor<4x1xf32>) -> tensor<4x8xf32>
  %add = nn.add %sc, %row : (tensor<4x8xf32>, tensor<8xf32>) -> tensor<4x8xf32>
  %sub = nn.sub %col, %row : (tensor<4x1xf32>, tensor<8xf32>) -> tensor<4x8xf32>
  %mul = nn.mul %add, %s : (tensor<4x8xf32>, tensor<f32>) -> tensor<4x8xf32>
  %div = nn.div %mul, %sub : (tensor<4x8xf32>, tensor<4x8xf32>) -> tensor<4x8xf32>
  %max = nn.maximum %div, %col : (tensor<4x8xf32>, tensor<4x1xf32>) -> tensor<4x8xf32>
  func.return %max : tensor<4x8xf32>
}

// -----

// CHECK-LABEL: func.func @reductions
func.func @reductions(%x: tensor<2x3x8xbf16>, %v: tensor<8xf32>) -> tensor<2x8xbf16> {
  // CHECK-NEXT: %sum = nn.reduce_sum %x {dim = 1 : i64} : (tensor<2x3x8xbf16>) -> tensor<2x8xbf16>
  %sum = nn.reduce_sum %x {dim = 1 : i64} : (tensor<2x3x8xbf16>) -> tensor<2x8xbf16>
  // An attribute equal to its default (keepdim = false) is left out when printed.
  // CHECK-NEXT: %sum0 = nn.reduce_sum %x {dim = 0 : i64} : (tensor<2x3x8xbf16>) -> tensor<3x8xbf16>
  %sum0 = nn.reduce_sum %x {dim = 0, keepdim = false} : (tensor<2x3x8xbf16>) -> tensor<3x8xbf16>
  // CHECK-NEXT: %max = nn.reduce_max %x {dim = -1 : i64, keepdim = true} : (tensor<2x3x8xbf16>) -> tensor<2x3x1xbf16>
  %max = nn.reduce_max %x {dim = -1 : i64, keepdim = true} : (tensor<2x3x8xbf16>) -> tensor<2x3x1xbf16>
  // CHECK-NEXT: %mean = nn.reduce_mean %x {dim = -3 : i64, keepdim = true} : (tensor<2x3x8xbf16>) -> tensor<1x3x8xbf16>
  %mean = nn.reduce_mean %x {dim = -3 : i64, keepdim = true} : (tensor<2x3x8xbf16>) -> tensor<1x3x8xbf16>
  // CHECK-NEXT: %total = nn.reduce_sum %v {dim = 0 : i64} : (tensor<8xf32>) -> tensor<f32>
  %total = nn.reduce_sum %v {dim = 0 : i64} : (tensor<8xf32>) -> tensor<f32>
  // CHECK-NEXT: %sm = nn.softmax %x : (tensor<2x3x8xbf16>) -> tensor<2x3x8xbf16>
  %sm = nn.softmax %x {dim = -1 : i64} : (tensor<2x3x8xbf16>) -> tensor<2x3x8xbf16>
  // CHECK-NEXT: %sm1 = nn.softmax %x {dim = 1 : i64} : (tensor<2x3x8xbf16>) -> tensor<2x3x8xbf16>
  %sm1 = nn.softmax %x {dim = 1 : i64} : (tensor<2x3x8xbf16>) -> tensor<2x3x8xbf16>
  // CHECK-NEXT: %am = nn.argmax %x : (tensor<2x3x8xbf16>) -> tensor<2x3xi32>
  %am = nn.argmax %x : (tensor<2x3x8xbf16>) -> tensor<2x3xi32>
  // CHECK-NEXT: %am0 = nn.argmax %x {dim = 0 : i64} : (tensor<2x3x8xbf16>) -> tensor<3x8xi32>
  %am0 = nn.argmax %x {dim = 0 : i64} : (tensor<2x3x8xbf16>) -> tensor<3x8xi32>
  func.return %sum : tensor<2x8xbf16>
}

// -----

// CHECK-LABEL: func.func @norms
func.func @norms(%x: tensor<8x4096xbf16>, %g: tensor<4096xbf16>, %q: tensor<1x4x16x64xf32>, %cos: tensor<16x32xf32>, %sin: tensor<1x16x32xf32>, %table: tensor<1000x64xf16>, %ids: tensor<2x5xi64>, %ids32: tensor<7xi32>) -> tensor<8x4096xbf16> {
  // CHECK-NEXT: %y = nn.rms_norm %x, %g : (tensor<8x4096xbf16>, tensor<4096xbf16>) -> tensor<8x4096xbf16>
  %y = nn.rms_norm %x, %g {epsilon = 1.0e-06 : f32} : (tensor<8x4096xbf16>, tensor<4096xbf16>) -> tensor<8x4096xbf16>
  // CHECK-NEXT: %y5 = nn.rms_norm %x, %g {epsilon = 1.000000e-05 : f32} : (tensor<8x4096xbf16>, tensor<4096xbf16>) -> tensor<8x4096xbf16>
  %y5 = nn.rms_norm %x, %g {epsilon = 1.0e-05 : f32} : (tensor<8x4096xbf16>, tensor<4096xbf16>) -> tensor<8x4096xbf16>
  // CHECK-NEXT: %rot = nn.rope %q, %cos, %sin : (tensor<1x4x16x64xf32>, tensor<16x32xf32>, tensor<1x16x32xf32>) -> tensor<1x4x16x64xf32>
  %rot = nn.rope %q, %cos, %sin : (tensor<1x4x16x64xf32>, tensor<16x32xf32>, tensor<1x16x32xf32>) -> tensor<1x4x16x64xf32>
  // CHECK-NEXT: %emb = nn.embedding %table, %ids : (tensor<1000x64xf16>, tensor<2x5xi64>) -> tensor<2x5x64xf16>
  %emb = nn.embedding %table, %ids : (tensor<1000x64xf16>, tensor<2x5xi64>) -> tensor<2x5x64xf16>
  // CHECK-NEXT: %emb32 = nn.embedding %table, %ids32 : (tensor<1000x64xf16>, tensor<7xi32>) -> tensor<7x64xf16>
  %emb32 = nn.embedding %table, %ids32 : (tensor<1000x64xf16>, tensor<7xi32>) -> tensor<7x64xf16>
  func.return %y : tensor<8x4096xbf16>
}

// -----

// CHECK-LABEL: func.func @layout
func.func @layout(%x: tensor<8x4096xbf16>, %y: tensor<8x1024xbf16>, %ids: tensor<2x4xi32>) -> tensor<1x8x32x128xbf16> {
  // CHECK-NEXT: %r = nn.reshape %x : (tensor<8x4096xbf16>) -> tensor<1x8x32x128xbf16>
  %r = nn.reshape %x : (tensor<8x4096xbf16>) -> tensor<1x8x32x128xbf16>
  // CHECK-NEXT: %t = nn.transpose %r {perm = array<i64: 0, 2, 1, 3>} : (tensor<1x8x32x128xbf16>) -> tensor<1x32x8x128xbf16>
  %t = nn.transpose %r {perm = array<i64: 0, 2, 1, 3>} : (tensor<1x8x32x128xbf16>) -> tensor<1x32x8x128xbf16>
  // CHECK-NEXT: %c = nn.concat %x, %y, %x {dim = -1 : i64} : (tensor<8x4096xbf16>, tensor<8x1024xbf16>, tensor<8x4096xbf16>) -> tensor<8x9216xbf16>
  %c = nn.concat %x, %y, %x {dim = -1 : i64} : (tensor<8x4096xbf16>, tensor<8x1024xbf16>, tensor<8x4096xbf16>) -> tensor<8x9216xbf16>
  // CHECK-NEXT: %one = nn.concat %y {dim = 0 : i64} : (tensor<8x1024xbf16>) -> tensor<8x1024xbf16>
  %one = nn.concat %y {dim = 0 : i64} : (tensor<8x1024xbf16>) -> tensor<8x1024xbf16>
  // CHECK-NEXT: %s = nn.slice %c {offsets = array<i64: 2, 4096>, sizes = array<i64: 4, 1024>} : (tensor<8x9216xbf16>) -> tensor<4x1024xbf16>
  %s = nn.slice %c {offsets = array<i64: 2, 4096>, sizes = array<i64: 4, 1024>} : (tensor<8x9216xbf16>) -> tensor<4x1024xbf16>
  // Layout ops also move integer ids around.
  // CHECK-NEXT: %flat = nn.reshape %ids : (tensor<2x4xi32>) -> tensor<8xi32>
  %flat = nn.reshape %ids : (tensor<2x4xi32>) -> tensor<8xi32>
  // CHECK-NEXT: %idt = nn.transpose %ids {perm = array<i64: 1, 0>} : (tensor<2x4xi32>) -> tensor<4x2xi32>
  %idt = nn.transpose %ids {perm = array<i64: 1, 0>} : (tensor<2x4xi32>) -> tensor<4x2xi32>
  func.return %r : tensor<1x8x32x128xbf16>
}

// -----

// CHECK-LABEL: func.func @attention
func.func @attention(%q: tensor<2x8x1x64xf16>, %k: tensor<2x8x32x64xf16>, %gq: tensor<2x32x4x128xbf16>, %gk: tensor<2x8x256x128xbf16>, %gv: tensor<2x8x256x128xbf16>, %len: tensor<2xi32>) -> tensor<2x8x1x64xf16> {
  // CHECK-NEXT: %mha = nn.attention %q, %k, %k {scale = 1.250000e-01 : f32} : (tensor<2x8x1x64xf16>, tensor<2x8x32x64xf16>, tensor<2x8x32x64xf16>) -> tensor<2x8x1x64xf16>
  %mha = nn.attention %q, %k, %k {scale = 0.125 : f32, causal = false} : (tensor<2x8x1x64xf16>, tensor<2x8x32x64xf16>, tensor<2x8x32x64xf16>) -> tensor<2x8x1x64xf16>
  // Grouped-query: 32 query heads share 8 key/value heads; keys past kv_len are masked.
  // CHECK-NEXT: %gqa = nn.attention %gq, %gk, %gv, %len {scale = 0.0883883461 : f32, causal = true} : (tensor<2x32x4x128xbf16>, tensor<2x8x256x128xbf16>, tensor<2x8x256x128xbf16>, tensor<2xi32>) -> tensor<2x32x4x128xbf16>
  %gqa = nn.attention %gq, %gk, %gv, %len {scale = 0.0883883461 : f32, causal = true} : (tensor<2x32x4x128xbf16>, tensor<2x8x256x128xbf16>, tensor<2x8x256x128xbf16>, tensor<2xi32>) -> tensor<2x32x4x128xbf16>
  func.return %mha : tensor<2x8x1x64xf16>
}

// -----

// A decode function: the body runs `nn.steps` times per call; donated arguments are written in place.
// CHECK-LABEL: func.func @decode(%tokens: tensor<16x2xi32> {nn.donated}, %pos: tensor<1xi32>, %kc: tensor<2x4x16x8xbf16> {nn.donated}, %k: tensor<2x4x1x8xbf16>) -> tensor<16x2xi32> attributes {nn.steps = 3 : i64} {
func.func @decode(%tokens: tensor<16x2xi32> {nn.donated}, %pos: tensor<1xi32>, %kc: tensor<2x4x16x8xbf16> {nn.donated}, %k: tensor<2x4x1x8xbf16>) -> tensor<16x2xi32> attributes {nn.steps = 3 : i64} {
  // CHECK-NEXT: %p = nn.step %pos : (tensor<1xi32>) -> tensor<1xi32>
  %p = nn.step %pos : (tensor<1xi32>) -> tensor<1xi32>
  // CHECK-NEXT: %len = nn.step %pos {offset = 1 : i64} : (tensor<1xi32>) -> tensor<2xi32>
  %len = nn.step %pos {offset = 1 : i64} : (tensor<1xi32>) -> tensor<2xi32>
  // CHECK-NEXT: %kc2 = nn.cache_write %kc, %k, %len {dim = 2 : i64} : (tensor<2x4x16x8xbf16>, tensor<2x4x1x8xbf16>, tensor<2xi32>) -> tensor<2x4x16x8xbf16>
  %kc2 = nn.cache_write %kc, %k, %len {dim = 2 : i64} : (tensor<2x4x16x8xbf16>, tensor<2x4x1x8xbf16>, tensor<2xi32>) -> tensor<2x4x16x8xbf16>
  // CHECK-NEXT: %t = nn.embedding %tokens, %p : (tensor<16x2xi32>, tensor<1xi32>) -> tensor<1x2xi32>
  %t = nn.embedding %tokens, %p : (tensor<16x2xi32>, tensor<1xi32>) -> tensor<1x2xi32>
  // CHECK-NEXT: %t2 = nn.cache_write %tokens, %t, %p {dim = 0 : i64} : (tensor<16x2xi32>, tensor<1x2xi32>, tensor<1xi32>) -> tensor<16x2xi32>
  %t2 = nn.cache_write %tokens, %t, %p {dim = 0 : i64} : (tensor<16x2xi32>, tensor<1x2xi32>, tensor<1xi32>) -> tensor<16x2xi32>
  func.return %t2 : tensor<16x2xi32>
}
